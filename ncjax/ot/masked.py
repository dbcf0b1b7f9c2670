"""Masked entropic optimal transport (NCU, Eq. 9 and Supplementary B).

min_{Gamma in Pi(a, b), Gamma = 0 where mask = 0} <Gamma, C> - eps H(Gamma), solved in the log domain.

`masked_sinkhorn` uses ott-jax: the cost is set to +inf where the mask is 0 (exp(-inf) = 0, so masked entries of the
plan are exactly 0), epsilon is explicit (ott's default epsilon is derived from cost statistics and becomes NaN with
infinite costs), and `threshold` / `max_iterations` are explicit (ott's default 1e-3 is loose at large N). A large
finite cost instead of inf would silently put mass on masked entries of a row with nothing else allowed.

`OttSinkhorn` and `ReferenceSinkhorn` are the same two solvers as objects — `solver(cost, mask, a, b) ->
SinkhornOutput` with epsilon, iteration cap and stopping threshold bound at construction — which is how losses take
a solver (passed in, never selected by a string inside the loss; `SOLVERS` maps config names to them).

`reference_sinkhorn` is the loop of NCU's public code, kept as a named option for parity: u, v start at 0;
u <- eps (log a - LSE_j K) + u, then v with the new u; masked log-kernel entries are -1e6; LSE adds 1e-10 inside
the log; stop when sum |u - u_prev| < threshold. Its last update is v, so its column marginals are exact.
Everything runs in float32 (or higher); the plan is a stop-gradient target.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from ott.geometry import geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn

from ncjax.registry import Registry


def _check(cost, mask, a, b):
  cost = jnp.asarray(cost)
  if cost.dtype not in (jnp.float32, jnp.float64):
    cost = cost.astype(jnp.float32)
  mask = jnp.asarray(mask, bool)
  if mask.shape != cost.shape:
    raise ValueError(f"mask shape {mask.shape} differs from cost shape {cost.shape}")
  n, m = cost.shape
  a = jnp.full((n,), 1.0 / n, cost.dtype) if a is None else jnp.asarray(a, cost.dtype)
  b = jnp.full((m,), 1.0 / m, cost.dtype) if b is None else jnp.asarray(b, cost.dtype)
  if a.shape != (n,) or b.shape != (m,):
    raise ValueError(f"marginals must have shapes ({n},) and ({m},); got {a.shape} and {b.shape}")
  return cost, mask, a, b


def masked_sinkhorn_with_info(cost, mask, a=None, b=None, *, epsilon: float, max_iterations: int = 100,
                              threshold: float = 1e-4, inner_iterations: int = 1):
  """(plan, info) with ott-jax; info = {'iterations', 'converged', 'row_error', 'col_error'}.

  The problem is posed transposed (columns as ott's first marginal) so that ott's last update fixes the column
  marginals exactly, as the reference loop does; rows match within the threshold.
  """
  if epsilon is None or not epsilon > 0:
    raise ValueError(f"masked_sinkhorn needs an explicit epsilon > 0 (got {epsilon}); with +inf costs ott's "
                     f"default epsilon is NaN")
  cost, mask, a, b = _check(cost, mask, a, b)
  masked_cost = jnp.where(mask, cost, jnp.inf).T
  geom = geometry.Geometry(cost_matrix=masked_cost, epsilon=epsilon)
  problem = linear_problem.LinearProblem(geom, a=b, b=a)
  solver = sinkhorn.Sinkhorn(lse_mode=True, threshold=threshold, max_iterations=max_iterations,
                             min_iterations=0, inner_iterations=inner_iterations)
  out = solver(problem)
  plan = jnp.where(mask, out.matrix.T, 0.0)
  info = dict(iterations=out.n_iters, converged=out.converged, row_error=jnp.abs(plan.sum(1) - a).sum(),
              col_error=jnp.abs(plan.sum(0) - b).sum())
  return plan, info


def masked_sinkhorn(cost, mask, a=None, b=None, epsilon: float = 0.03, max_iterations: int = 100,
                    threshold: float = 1e-4):
  """Masked entropic OT plan (ott-jax, log domain). Masked entries are exactly 0; no NaN for any mask with at
  least one allowed entry per row and column. a, b default to uniform marginals."""
  return masked_sinkhorn_with_info(cost, mask, a, b, epsilon=epsilon, max_iterations=max_iterations,
                                   threshold=threshold)[0]


def _lse_rows(x):
  m = jnp.max(x, axis=1, keepdims=True)
  return (m + jnp.log(jnp.sum(jnp.exp(x - m), axis=1, keepdims=True) + 1e-10))[:, 0]


def reference_sinkhorn(cost, mask, a=None, b=None, *, epsilon: float = 0.03, max_iterations: int = 100,
                       threshold: float = 1e-4):
  """NCU's public log-domain loop (see module docstring); returns (plan, iterations)."""
  cost, mask, a, b = _check(cost, mask, a, b)
  log_a, log_b = jnp.log(a), jnp.log(b)

  def kernel(u, v):
    k = (-cost + u[:, None] + v[None, :]) / epsilon
    return jnp.where(mask, k, -1e6)

  def body(carry):
    u, v, it, _ = carry
    u_new = epsilon * (log_a - _lse_rows(kernel(u, v))) + u
    v_new = epsilon * (log_b - _lse_rows(kernel(u_new, v).T)) + v
    return u_new, v_new, it + 1, jnp.sum(jnp.abs(u_new - u))

  def cond(carry):
    _, _, it, err = carry
    return (it < max_iterations) & (err >= threshold)

  u0 = jnp.zeros_like(a)
  v0 = jnp.zeros_like(b)
  u, v, it, _ = jax.lax.while_loop(cond, body, (u0, v0, jnp.asarray(0), jnp.asarray(jnp.inf, cost.dtype)))
  plan = jnp.where(mask, jnp.exp(kernel(u, v)), 0.0)
  return plan, it


@functools.partial(jax.tree_util.register_dataclass, data_fields=["plan", "iterations"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SinkhornOutput:
  plan: jax.Array        # (n, m), exactly 0 where the mask is 0
  iterations: jax.Array  # int, iterations run


SOLVERS: Registry = Registry("Sinkhorn solver")


@SOLVERS.register("ott")
@dataclasses.dataclass(frozen=True)
class OttSinkhorn:
  """ott-jax's log-domain Sinkhorn on the masked cost.

  `threshold` is NCU's public stopping rule, sum_i |u_i - u_i'| < threshold. Since u changes by
  eps * log(a_i / r_i), that is, to first order, an L1 row-marginal error below threshold / (eps * n_rows) — ott's
  own stopping quantity, which this solver passes to ott.
  """
  epsilon: float = 0.03
  max_iterations: int = 100
  threshold: float = 1e-4

  def __call__(self, cost, mask, a=None, b=None) -> SinkhornOutput:
    rows = jnp.shape(cost)[0]
    plan, info = masked_sinkhorn_with_info(cost, mask, a, b, epsilon=self.epsilon,
                                           max_iterations=self.max_iterations,
                                           threshold=self.threshold / (self.epsilon * rows))
    return SinkhornOutput(plan, info["iterations"])


@SOLVERS.register("reference")
@dataclasses.dataclass(frozen=True)
class ReferenceSinkhorn:
  """NCU's public log-domain loop (`reference_sinkhorn`), with its own stopping rule."""
  epsilon: float = 0.03
  max_iterations: int = 100
  threshold: float = 1e-4

  def __call__(self, cost, mask, a=None, b=None) -> SinkhornOutput:
    plan, it = reference_sinkhorn(cost, mask, a, b, epsilon=self.epsilon, max_iterations=self.max_iterations,
                                  threshold=self.threshold)
    return SinkhornOutput(plan, it)


def solver_from_name(name: str, *, epsilon: float, max_iterations: int, threshold: float):
  """A solver object from its config name ('ott', 'reference', ...)."""
  return SOLVERS.get(name)(epsilon=epsilon, max_iterations=max_iterations, threshold=threshold)
