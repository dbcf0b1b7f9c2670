"""A 1-D Gaussian mixture fitted by EM in JAX, matching scikit-learn's GaussianMixture (GSC's settings:
n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, k-means initialisation, 'full' covariance = a variance).

Mirrors scikit-learn's order of operations: initial responsibilities from k-means labels -> M-step; then per
iteration E-step -> M-step, lower bound = mean log-likelihood, stop when its change is below tol; the returned
parameters are those of the last M-step. k-means here is Lloyd's algorithm started from the data's min and max
(scikit-learn uses k-means++ with a random state; on bimodal 1-D data both reach the same partition), so the fit is
deterministic. Everything is elementwise or a reduction over the data, so `x` may be sharded over devices: fitting
millions of per-sample scores runs where they live.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

_EPS = float(jnp.finfo(jnp.float32).eps)


class GMMParams(NamedTuple):
  weights: jax.Array     # (K,)
  means: jax.Array       # (K,)
  variances: jax.Array   # (K,)
  n_iter: jax.Array
  converged: jax.Array
  lower_bound: jax.Array


def _kmeans_labels(x, w, n_components: int, iters: int = 50):
  """Lloyd's algorithm in 1-D from evenly spread initial centres between min and max (weights w mask samples)."""
  big = jnp.finfo(x.dtype).max
  lo = jnp.min(jnp.where(w > 0, x, big))
  hi = jnp.max(jnp.where(w > 0, x, -big))
  centres = lo + (hi - lo) * jnp.linspace(0.0, 1.0, n_components)

  def body(_, c):
    labels = jnp.argmin(jnp.abs(x[:, None] - c[None, :]), axis=1)
    onehot = jax.nn.one_hot(labels, n_components) * w[:, None]
    counts = onehot.sum(0)
    return jnp.where(counts > 0, (onehot * x[:, None]).sum(0) / jnp.maximum(counts, 1e-30), c)

  centres = jax.lax.fori_loop(0, iters, body, centres)
  return jnp.argmin(jnp.abs(x[:, None] - centres[None, :]), axis=1)


def _m_step(x, w, resp, reg_covar):
  resp = resp * w[:, None]
  nk = resp.sum(0) + 10 * _EPS
  means = (resp * x[:, None]).sum(0) / nk
  variances = (resp * (x[:, None] - means[None, :]) ** 2).sum(0) / nk + reg_covar
  return nk / jnp.sum(w), means, variances


def _log_joint(x, weights, means, variances):
  """log pi_k + log N(x | mu_k, var_k), (N, K)."""
  return (jnp.log(weights)[None, :] - 0.5 * (jnp.log(2 * jnp.pi * variances)[None, :]
                                             + (x[:, None] - means[None, :]) ** 2 / variances[None, :]))


@functools.partial(jax.jit, static_argnames=("n_components", "max_iter"))
def _fit(x, w, n_components, max_iter, tol, reg_covar):
  labels = _kmeans_labels(x, w, n_components)
  resp = jax.nn.one_hot(labels, n_components)
  weights, means, variances = _m_step(x, w, resp, reg_covar)
  n_total = jnp.sum(w)

  def body(carry):
    weights, means, variances, lower, it, _ = carry
    log_joint = _log_joint(x, weights, means, variances)
    log_norm = jax.nn.logsumexp(log_joint, axis=1)
    resp = jnp.exp(log_joint - log_norm[:, None])
    weights, means, variances = _m_step(x, w, resp, reg_covar)
    new_lower = jnp.sum(w * log_norm) / n_total
    return weights, means, variances, new_lower, it + 1, jnp.abs(new_lower - lower) < tol

  def cond(carry):
    *_, it, converged = carry
    return (it < max_iter) & ~converged

  init = (weights, means, variances, jnp.asarray(-jnp.inf, x.dtype), jnp.asarray(0), jnp.asarray(False))
  weights, means, variances, lower, it, converged = jax.lax.while_loop(cond, body, init)
  return GMMParams(weights, means, variances, it, converged, lower)


def fit(x, n_components: int = 2, max_iter: int = 10, tol: float = 1e-2, reg_covar: float = 5e-4,
        init: str = "kmeans", sample_mask=None) -> GMMParams:
  """Fit a 1-D GMM to `x` (any shape; flattened). `sample_mask` excludes entries (e.g. padding of sharded state)."""
  if init != "kmeans":
    raise ValueError(f"unknown init {init!r}; only 'kmeans' (scikit-learn's default) is implemented")
  x = jnp.ravel(jnp.asarray(x, jnp.float32))
  w = jnp.ones_like(x) if sample_mask is None else jnp.ravel(jnp.asarray(sample_mask, jnp.float32))
  return _fit(x, w, n_components, max_iter, jnp.asarray(tol, jnp.float32), jnp.asarray(reg_covar, jnp.float32))


@jax.jit
def posterior(params: GMMParams, x):
  """Responsibilities p(component | x), shape x.shape + (K,)."""
  x = jnp.asarray(x, jnp.float32)
  lj = _log_joint(jnp.ravel(x), params.weights, params.means, params.variances)
  return jnp.exp(lj - jax.nn.logsumexp(lj, axis=1, keepdims=True)).reshape(x.shape + (-1,))


def posterior_of_larger_mean(params: GMMParams, x):
  """Posterior of the component with the larger mean (GSC's clean probability: higher structure score = clean)."""
  return posterior(params, x)[..., jnp.argmax(params.means)]


def posterior_of_smaller_mean(params: GMMParams, x):
  """Posterior of the component with the smaller mean (NCR's clean probability over per-sample losses)."""
  return posterior(params, x)[..., jnp.argmin(params.means)]
