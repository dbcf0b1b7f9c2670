"""Gibbs sampling of the Gamma pair weights of Bayesian contrastive learning (paper Eq. 5-6, rate parameterised).

For anchor i with positive score s_i+ and negative scores s_ik- (s = exp(logit)):
  u_i    | .  ~ Ga(a_u, b_u + w_i+ s_i+ + sum_k w_ik- s_ik-)
  w_i+   | .  ~ Ga(1 + a_+, u_i s_i+ + b_+)
  w_ik-  | .  ~ Ga(a_-, u_i s_ik- + b_-)
Everything is sampled in log space (`log_gamma`, rates by logsumexp): with the paper's b = 0 the scale of
(u, w) drifts by about K a_- per sweep (methods.md §3.2) and linear-space float32 under/overflows within two sweeps
on sharp logits. `gibbs_log` returns logs; `gibbs` exponentiates them (and may overflow exactly where the model is
degenerate). jax.random draws unit-rate Gammas, so a draw is divided by (log: minus) its rate.

Each anchor row is sampled with its own key (split from the step key), so the draws do not depend on how the batch
is sharded; under a mesh context (jax.set_mesh, as the trainer runs) the rows are sampled device-locally with
shard_map. That matters beyond speed: jax's Gamma draws are rejection loops, and on batch-sharded arrays every
loop iteration would need a cross-device reduction.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _static_at_least_one(a) -> bool:
  """True when `a` is a concrete value (not traced) with every entry >= 1: then no draw needs the a < 1 boost."""
  try:
    return bool(np.all(np.asarray(a) >= 1.0))
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
    return False


def _marsaglia_tsang(key, d, c, trials: int):
  """`trials` Marsaglia & Tsang proposals for each entry of d = a - 1/3, c = 1 / sqrt(9 d) (a >= 1): the log of
  the first accepted v^3 (so Gamma(a, 1) = d v^3) and whether any was accepted."""
  kx, ku = jax.random.split(key)
  x = jax.random.normal(kx, (trials,) + d.shape)
  u = jax.random.uniform(ku, (trials,) + d.shape, minval=jnp.finfo(jnp.float32).tiny)
  v = 1.0 + c * x
  ok = v > 0
  v3 = jnp.where(ok, v * v * v, 1.0)
  log_v3 = jnp.log(v3)
  accept = ok & (jnp.log(u) < 0.5 * x * x + d - d * v3 + d * log_v3)
  first = jnp.argmax(accept, axis=0)
  return jnp.take_along_axis(log_v3, first[None], 0)[0], accept.any(axis=0)


def log_gamma(key, a, shape, refill: int | None = None):
  """log of Gamma(a, 1) draws of `shape` (a may broadcast), exact: Marsaglia & Tsang's method (a < 1 through the
  boost Gamma(a) = Gamma(a + 1) U^(1/a)).

  One vectorised proposal per entry, then only the rejected entries are redrawn: up to `refill` of them at a time
  (default n / 16 + 1; at most 5% are rejected for a >= 1, 0.3% at a = 10) are gathered by index, given 3 proposals
  each, and scattered back, in a while loop that ends when every entry has accepted (usually after one pass). Each
  entry keeps its first accepted proposal, all proposals independent: the Gamma distribution (KS tests). Against
  3 full-size proposals per entry this draws ~2.4 instead of 6-7 random numbers per entry, the cost of a Gibbs
  sweep over the N^2 pair weights; against jax.random.loggamma's per-element rejection loop, ~5x fewer."""
  shape = tuple(shape)
  n = math.prod(shape)
  a_flat = jnp.broadcast_to(jnp.asarray(a, jnp.float32), shape).reshape(n)
  boost = a_flat < 1.0
  d = jnp.where(boost, a_flat + 1.0, a_flat) - 1.0 / 3.0
  c = jax.lax.rsqrt(9.0 * d)
  k_first, k_boost, k_more = jax.random.split(key, 3)
  log_v3, done = _marsaglia_tsang(k_first, d, c, trials=1)
  slots = min(n, n // 16 + 1) if refill is None else max(1, min(n, int(refill)))

  def redraw(carry):
    lv, dn, k = carry
    k, sub = jax.random.split(k)
    idx = jnp.nonzero(~dn, size=slots, fill_value=n)[0]   # the first `slots` rejected entries; n = no entry
    take = jnp.minimum(idx, n - 1)
    new, ok = _marsaglia_tsang(sub, d[take], c[take], trials=3)
    ok = ok & (idx < n)
    lv = lv.at[idx].set(jnp.where(ok, new, lv[take]), mode="drop")
    dn = dn.at[idx].set(ok | dn[take], mode="drop")
    return lv, dn, k

  log_v3, _, _ = jax.lax.while_loop(lambda carry: ~jnp.all(carry[1]), redraw, (log_v3, done, k_more))
  out = jnp.log(d) + log_v3
  if not _static_at_least_one(a):  # the boost's uniform only where some a may be < 1
    u = jax.random.uniform(k_boost, (n,), minval=jnp.finfo(jnp.float32).tiny)
    out = jnp.where(boost, out + jnp.log(u) / a_flat, out)
  return out.reshape(shape)


def _log_rate(log_terms, b):
  """log(b + exp(log_terms)) with b >= 0 (b = 0 -> log_terms)."""
  return jnp.logaddexp(jnp.log(jnp.asarray(b, jnp.float32)), log_terms)


def sample_log_u(key, log_pos, log_neg, log_w_pos, log_w_neg, mask, a_u, b_u):
  """log u | w ~ log Ga(a_u, b_u + w+ s+ + sum_k w_k- s_k-) (Eq. 5); any leading shape, negatives on the last axis."""
  terms = jnp.concatenate([(log_w_pos + log_pos)[..., None], jnp.where(mask, log_w_neg + log_neg, -jnp.inf)],
                          axis=-1)
  return log_gamma(key, a_u, jnp.shape(log_pos)) - _log_rate(jax.nn.logsumexp(terms, axis=-1), b_u)


def sample_log_w_pos(key, log_u, log_pos, a_pos, b_pos):
  """log w+ | u ~ log Ga(1 + a_+, u s+ + b_+) (Eq. 6)."""
  return log_gamma(key, 1.0 + a_pos, jnp.shape(log_pos)) - _log_rate(log_u + log_pos, b_pos)


def sample_log_w_neg(key, log_u, log_neg, mask, a_neg, b_neg):
  """log w_k- | u ~ log Ga(a_-, u s_k- + b_-) (Eq. 6); -inf (w = 0) where mask is False."""
  draw = log_gamma(key, a_neg, log_neg.shape) - _log_rate(
      jnp.expand_dims(log_u, -1) + log_neg, b_neg)
  return jnp.where(mask, draw, -jnp.inf)


def _gibbs_rows(keys, log_pos, log_neg, mask, hyper, n_sweeps, w_init):
  """Gibbs sweeps for a block of rows, each row with its own key."""
  a_u, b_u, a_pos, b_pos, a_neg, b_neg = hyper

  def one_row(key, lp, ln, m):
    log_wp = jnp.asarray(jnp.log(w_init), jnp.float32)
    log_wn = jnp.where(m, jnp.log(w_init), -jnp.inf).astype(jnp.float32)
    log_u = jnp.zeros((), jnp.float32)

    def sweep(i, carry):
      log_u, log_wp, log_wn = carry
      k_u, k_p, k_n = jax.random.split(jax.random.fold_in(key, i), 3)
      log_u = sample_log_u(k_u, lp, ln, log_wp, log_wn, m, a_u, b_u)
      log_wp = sample_log_w_pos(k_p, log_u, lp, a_pos, b_pos)
      log_wn = sample_log_w_neg(k_n, log_u, ln, m, a_neg, b_neg)
      return log_u, log_wp, log_wn

    # A loop, not unrolled sweeps: each sweep holds three rejection loops, and unrolled they made the program (and
    # its compile) grow with n_sweeps. The keys are the unrolled form's (fold_in of the sweep index).
    return jax.lax.fori_loop(0, n_sweeps, sweep, (log_u, log_wp, log_wn))

  return jax.vmap(one_row)(keys, log_pos, log_neg, mask)


def gibbs_log(key, log_pos, log_neg, a_u=1.0, b_u=0.0, a_pos=5.0, b_pos=0.0, a_neg=10.0, b_neg=0.0,
              n_sweeps: int = 2, w_init: float = 1.0, neg_mask=None):
  """(log u, log w_pos, log w_neg) after `n_sweeps` sweeps from w = w_init (Algorithm 1, lines 4-8).

  log_pos: (B,) positive logits; log_neg: (B, K) negative logits; neg_mask (B, K) marks real negatives.
  """
  log_pos = jnp.asarray(log_pos, jnp.float32)
  log_neg = jnp.asarray(log_neg, jnp.float32)
  mask = jnp.ones(log_neg.shape, bool) if neg_mask is None else jnp.asarray(neg_mask, bool)
  keys = jax.random.split(key, log_pos.shape[0])
  hyper = (a_u, b_u, a_pos, b_pos, a_neg, b_neg)
  fn = lambda k, p, n, m: _gibbs_rows(k, p, n, m, hyper, n_sweeps, w_init)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and log_pos.shape[0] % mesh.size == 0:
    rows = jax.sharding.PartitionSpec(tuple(mesh.axis_names))
    fn = jax.shard_map(fn, in_specs=(rows, rows, rows, rows), out_specs=(rows, rows, rows), check_vma=False)
  return fn(keys, log_pos, log_neg, mask)


def gibbs(key, s_pos, s_neg, a_u=1.0, b_u=0.0, a_pos=5.0, b_pos=0.0, a_neg=10.0, b_neg=0.0, n_sweeps: int = 2,
          w_init: float = 1.0, neg_mask=None, log_space: bool = False):
  """(u, w_pos, w_neg) in linear space. s_pos (B,), s_neg (B, K) are scores (their logs with log_space=True)."""
  if not log_space:
    s_pos, s_neg = jnp.log(jnp.asarray(s_pos, jnp.float32)), jnp.log(jnp.asarray(s_neg, jnp.float32))
  log_u, log_wp, log_wn = gibbs_log(key, s_pos, s_neg, a_u, b_u, a_pos, b_pos, a_neg, b_neg, n_sweeps, w_init,
                                    neg_mask)
  return jnp.exp(log_u), jnp.exp(log_wp), jnp.exp(log_wn)
