"""Optimal transport: masked entropic OT (NCU's transport targets) on ott-jax."""

from ncjax.ot.masked import masked_sinkhorn, masked_sinkhorn_with_info, reference_sinkhorn

__all__ = ["masked_sinkhorn", "masked_sinkhorn_with_info", "reference_sinkhorn"]
