"""Jitted samplers and estimators: a 1-D two-component GMM (GSC's label update) and the Gamma Gibbs sampler
(Bayesian CL's pair weights)."""

from ncjax.samplers import gamma, gmm

__all__ = ["gamma", "gmm"]
