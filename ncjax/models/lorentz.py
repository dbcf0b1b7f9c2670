"""Lorentz-model hyperbolic geometry as used by MERU (Desai et al., 2023).

Points are stored by their space components x in R^D; the time component is x_t = sqrt(1/c + ||x||^2) on the
hyperboloid of curvature -c (c > 0). All maps run in float32, whatever the tower's compute dtype.
Constants (1e-8 clamps, asinh(2^15) sinh bound) follow MERU's public implementation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ncjax.numerics import f32

_EPS = 1e-8
_SINH_BOUND = math.asinh(2.0 ** 15)


def _f32(*xs):
  return tuple(f32(x) for x in xs)


def _norm(x):
  """||x|| over the last axis with a finite (zero) gradient at x = 0, where sqrt's derivative is infinite and the
  direction x / ||x|| undefined; values equal jnp.linalg.norm down to 1e-15."""
  return jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1), 1e-30))


def time_component(x, curv):
  x, curv = _f32(x, curv)
  return jnp.sqrt(1.0 / curv + jnp.sum(x * x, axis=-1))


def pairwise_inner(x, y, curv):
  """Lorentzian inner product <x, y>_L = x.y - x_t y_t for all pairs (N, M); always <= -1/c."""
  x, y, curv = _f32(x, y, curv)
  xt = time_component(x, curv)
  yt = time_component(y, curv)
  return x @ y.T - xt[:, None] * yt[None, :]


def paired_inner(x, y, curv):
  x, y, curv = _f32(x, y, curv)
  return jnp.sum(x * y, axis=-1) - time_component(x, curv) * time_component(y, curv)


@jax.custom_jvp
def _arccosh_clamped(z):
  """MERU's acosh(max(z, 1 + 1e-8)) in the forward pass. Its derivative 1/sqrt(z^2 - 1) is infinite at z = 1 (the
  distance between identical points, e.g. two zero embeddings at the origin); here it is capped at 1e4 (z^2 - 1
  floored at 1e-8), so a degenerate batch gets finite gradients instead of NaN, and every distance above 1e-4
  differentiates exactly."""
  return jnp.arccosh(jnp.maximum(z, 1.0 + _EPS))


@_arccosh_clamped.defjvp
def _arccosh_clamped_jvp(primals, tangents):
  (z,), (dz,) = primals, tangents
  slope = jnp.where(z > 1.0, jax.lax.rsqrt(jnp.maximum(z * z - 1.0, 1e-8)), 0.0)
  return _arccosh_clamped(z), slope * dz


@jax.custom_jvp
def _arcsin_clamped(z):
  """asin(clip(z, -1 + 1e-8, 1 - 1e-8)) as MERU; in float32 the clip bounds round to +-1, where asin's slope is
  infinite and a clipped input would get 0 * inf = NaN. The slope is 0 outside (-1, 1), capped at 1e4 inside."""
  return jnp.arcsin(jnp.clip(z, -1.0 + _EPS, 1.0 - _EPS))


@_arcsin_clamped.defjvp
def _arcsin_clamped_jvp(primals, tangents):
  (z,), (dz,) = primals, tangents
  slope = jnp.where(jnp.abs(z) < 1.0, jax.lax.rsqrt(jnp.maximum(1.0 - z * z, 1e-8)), 0.0)
  return _arcsin_clamped(z), slope * dz


@jax.custom_jvp
def _arccos_clamped(z):
  """acos(clip(z, -1 + 1e-8, 1 - 1e-8)) with the same finite slope as `_arcsin_clamped` (negated)."""
  return jnp.arccos(jnp.clip(z, -1.0 + _EPS, 1.0 - _EPS))


@_arccos_clamped.defjvp
def _arccos_clamped_jvp(primals, tangents):
  (z,), (dz,) = primals, tangents
  slope = jnp.where(jnp.abs(z) < 1.0, -jax.lax.rsqrt(jnp.maximum(1.0 - z * z, 1e-8)), 0.0)
  return _arccos_clamped(z), slope * dz


def _dist_from_inner(inner, curv):
  return _arccosh_clamped(-curv * inner) / jnp.sqrt(curv)


def pairwise_dist(x, y, curv):
  """Geodesic distance acosh(-c <x,y>_L) / sqrt(c) for all pairs.

  In float32 the 1 + 1e-8 clamp rounds to 1, so d(x, x) = 0 exactly (as MERU); its derivative there, infinite for
  acosh, is capped (see `_arccosh_clamped`).
  """
  curv = jnp.asarray(curv, jnp.float32)
  return _dist_from_inner(pairwise_inner(x, y, curv), curv)


def paired_dist(x, y, curv):
  curv = jnp.asarray(curv, jnp.float32)
  return _dist_from_inner(paired_inner(x, y, curv), curv)


def exp_map0(v, curv):
  """Exponential map at the origin: sinh(r) v / r with r = sqrt(c) ||v|| (MERU clamps r for the sinh)."""
  v, curv = _f32(v, curv)
  r = jnp.sqrt(curv) * _norm(v)[..., None]
  sinh_r = jnp.sinh(jnp.clip(r, _EPS, _SINH_BOUND))
  return sinh_r * v / jnp.maximum(r, _EPS)


def log_map0(x, curv):
  """Inverse of exp_map0."""
  x, curv = _f32(x, curv)
  norm = jnp.sqrt(curv) * _norm(x)[..., None]
  rc_xnorm = jnp.sqrt(1.0 + norm * norm)
  return jnp.arccosh(jnp.maximum(rc_xnorm, 1.0 + _EPS)) * x / jnp.maximum(norm, _EPS)


def hyperbolic_norm(x, curv):
  """Distance from the origin, d(O, x) = asinh(sqrt(c) ||x||) / sqrt(c) (equals ||v|| for x = exp_map0(v))."""
  x, curv = _f32(x, curv)
  return jnp.arcsinh(jnp.sqrt(curv) * _norm(x)) / jnp.sqrt(curv)


def half_aperture(x, curv, min_radius: float = 0.1):
  """Half-aperture of the entailment cone at x: asin(2K / (sqrt(c) ||x||)), K = min_radius."""
  x, curv = _f32(x, curv)
  s = 2.0 * min_radius / (jnp.sqrt(curv) * _norm(x) + _EPS)
  return _arcsin_clamped(s)


def oxy_angle(x, y, curv):
  """Exterior angle at x of the triangle O-x-y (paired, row by row)."""
  x, y, curv = _f32(x, y, curv)
  xt = time_component(x, curv)
  yt = time_component(y, curv)
  c_inner = curv * (jnp.sum(x * y, axis=-1) - xt * yt)
  num = yt + c_inner * xt
  den = _norm(x) * jnp.sqrt(jnp.maximum(c_inner * c_inner - 1.0, _EPS)) + _EPS
  return _arccos_clamped(num / den)


def entailment_loss(parent, child, curv, min_radius: float = 0.1):
  """MERU's entailment term: mean relu(oxy_angle(parent, child) - half_aperture(parent)); text is the parent."""
  ext = oxy_angle(parent, child, curv)
  aper = half_aperture(parent, curv, min_radius)
  return jnp.mean(jnp.maximum(ext - aper, 0.0))
