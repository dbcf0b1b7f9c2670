"""Optimal transport: masked entropic OT (NCU's transport targets) on ott-jax, and solver objects."""

from ncjax.ot.masked import (SOLVERS, KernelSinkhorn, OttSinkhorn, ReferenceSinkhorn, SinkhornOutput,
                             masked_sinkhorn, masked_sinkhorn_with_info, reference_sinkhorn, solver_from_name)

__all__ = ["masked_sinkhorn", "masked_sinkhorn_with_info", "reference_sinkhorn", "OttSinkhorn", "ReferenceSinkhorn",
           "KernelSinkhorn", "SinkhornOutput", "SOLVERS", "solver_from_name"]
