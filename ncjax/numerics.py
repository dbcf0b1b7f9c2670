"""Numerical conventions shared by every layer: float32 for logits, softmax, transport and hyperbolic maps, and
the CLIP logit-scale cap."""

from __future__ import annotations

import math

import jax.numpy as jnp

# open_clip and MERU cap the logit multiplier exp(logit_scale) at 100.
MAX_LOGIT_SCALE = math.log(100.0)


def f32(x):
  """`x` as a float32 array (towers may compute in bf16; losses never do)."""
  return jnp.asarray(x, jnp.float32)


def scaled_dot(a, b, logit_scale):
  """exp(logit_scale) * a @ b.T in float32, with the multiplier folded into `b` before the matmul.

  Why not `exp(s) * (a @ b.T)`: XLA fuses that multiply into the log-sum-exp's `z - max(z)` and the backend
  contracts the pair into a fused multiply-add, whose unrounded product leaves the row maximum `ulp(s * x)` away
  from its own max instead of exactly 0 — harmless at CLIP's s <= 100, but `exp` of that residue overflows once
  the logits pass ~1e10 (e^25). A matmul output is one rounded value, so the shifted maximum is exactly 0 at any
  scale. It also scales N x D numbers rather than N x N."""
  return f32(a) @ (jnp.exp(f32(logit_scale)) * f32(b)).T


def diagonal(matrix):
  """The diagonal of a square matrix, as a masked row sum: the same values as `jnp.diagonal` (each row adds one
  entry to zeros), but its gradient is an elementwise select rather than a scatter. Under jit with the N x N logits
  sharded by rows, GSPMD partitions `jnp.diagonal`'s scatter-add gradient into a conditional with all-gathers of
  the indices (7% of the `small` CLIP step at batch 2048 on 8 devices); the select stays local to each row block."""
  if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
    raise ValueError(f"diagonal needs a square matrix, got shape {matrix.shape}")
  n = matrix.shape[0]
  on_diagonal = jnp.arange(n)[:, None] == jnp.arange(n)[None, :]
  return jnp.sum(jnp.where(on_diagonal, matrix, jnp.zeros((), matrix.dtype)), axis=1)
