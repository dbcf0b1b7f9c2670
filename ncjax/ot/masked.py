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
  # ott is imported here, not at module level: its package import pulls in scipy.stats, jaxopt and all of ott's
  # solvers (~2 s per process), which every `ncjax` command and trainer process would pay for a solver that only
  # `loss.solver=ott` uses.
  from ott.geometry import geometry
  from ott.problems.linear import linear_problem
  from ott.solvers.linear import sinkhorn
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


class _ValidatedOptions:
  """Checks a solver's options when it is built, so a bad config fails at assembly with the option named."""

  def __post_init__(self):
    name = type(self).__name__
    if self.epsilon is None or not float(self.epsilon) > 0:
      raise ValueError(f"{name} needs an explicit epsilon > 0 (loss.epsilon), got {self.epsilon!r}")
    if int(self.max_iterations) < 1:
      raise ValueError(f"{name} needs max_iterations >= 1 (loss.max_iterations), got {self.max_iterations!r}")
    if not self.threshold >= 0:
      raise ValueError(f"{name} needs threshold >= 0 (loss.threshold), got {self.threshold!r}")


@SOLVERS.register("ott")
@dataclasses.dataclass(frozen=True)
class OttSinkhorn(_ValidatedOptions):
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
class ReferenceSinkhorn(_ValidatedOptions):
  """NCU's public log-domain loop (`reference_sinkhorn`), with its own stopping rule."""
  epsilon: float = 0.03
  max_iterations: int = 100
  threshold: float = 1e-4

  def __call__(self, cost, mask, a=None, b=None) -> SinkhornOutput:
    plan, it = reference_sinkhorn(cost, mask, a, b, epsilon=self.epsilon, max_iterations=self.max_iterations,
                                  threshold=self.threshold)
    return SinkhornOutput(plan, it)


def solver_from_name(name: str, *, epsilon: float, max_iterations: int, threshold: float,
                     kernel_dtype: str = "float32"):
  """A solver object from its config name ('kernel', 'ott', 'reference')."""
  cls = SOLVERS.get(name)
  extra = dict(kernel_dtype=kernel_dtype) if "kernel_dtype" in {f.name for f in dataclasses.fields(cls)} else {}
  return cls(epsilon=epsilon, max_iterations=max_iterations, threshold=threshold, **extra)


@SOLVERS.register("kernel")
@dataclasses.dataclass(frozen=True)
class KernelSinkhorn(_ValidatedOptions):
  """NCU's Sinkhorn iterations in scaling (kernel) form: the same iterates as the public log-domain loop, at the
  cost of two mat-vecs per iteration instead of two N^2 log-sum-exps.

  With the cost in [0, 1] (NCU max-normalises it) and epsilon = 0.03, K = M * exp(-C / eps) >= e^-34 is
  representable in float32 (and bfloat16, which has float32's exponent range: `kernel_dtype='bfloat16'` halves the
  memory traffic of the mat-vecs; accumulation stays float32). Starting from v = 1 (the loop's u = v = 0):
  u <- a / (K v), v <- b / (K^T u), stopping as the public code when eps * sum_i |log u_i - log u_i'| < threshold.
  Masked entries of K are exactly 0, so the plan diag(u) K diag(v) is exactly 0 there. The kernel may be sharded
  over its rows (the batch axis): K v stays local and K^T u is one reduction of an (m,)-vector per iteration.
  """
  epsilon: float = 0.03
  max_iterations: int = 100
  threshold: float = 1e-4
  kernel_dtype: str = "float32"

  def kernel(self, cost, mask):
    cost = jnp.asarray(cost, jnp.float32)
    k = jnp.where(jnp.asarray(mask, bool), jnp.exp(-cost / self.epsilon), 0.0)
    return k.astype(jnp.bfloat16 if self.kernel_dtype == "bfloat16" else jnp.float32)

  def scalings(self, kernel, a, b):
    """(u, v, iterations) of the scaling iterations on a kernel K (n, m) with marginals a (n,), b (m,)."""
    eps = self.epsilon
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    kv = lambda v: jnp.matmul(kernel, v.astype(kernel.dtype), preferred_element_type=jnp.float32)
    ktu = lambda u: jnp.matmul(u.astype(kernel.dtype), kernel, preferred_element_type=jnp.float32)

    # A row or column with no allowed entry (NCU's negative column when the forget set is empty) cannot take its
    # mass: its scaling is 0 (the log-domain loop gives it -1e6 and so the same plan).
    def scale(marginal, total):
      return jnp.where(total > 0, marginal / jnp.where(total > 0, total, 1.0), 0.0)

    def body(carry):
      u, v, it, _ = carry
      u_new = scale(a, kv(v))
      v_new = scale(b, ktu(u_new))
      live = (u_new > 0) & (u > 0)
      change = jnp.where(live, jnp.log(jnp.where(live, u_new, 1.0)) - jnp.log(jnp.where(live, u, 1.0)), 0.0)
      return u_new, v_new, it + 1, eps * jnp.sum(jnp.abs(change))

    def cond(carry):
      _, _, it, err = carry
      return (it < self.max_iterations) & (err >= self.threshold)

    u0, v0 = jnp.ones_like(a), jnp.ones_like(b)
    u, v, it, _ = jax.lax.while_loop(cond, body, (u0, v0, jnp.asarray(0), jnp.asarray(jnp.inf, jnp.float32)))
    return u, v, it

  def __call__(self, cost, mask, a=None, b=None) -> SinkhornOutput:
    cost, mask, a, b = _check(cost, mask, a, b)
    k = self.kernel(cost, mask)
    u, v, it = self.scalings(k, a, b)
    plan = u[:, None] * k.astype(jnp.float32) * v[None, :]
    return SinkhornOutput(plan, it)
