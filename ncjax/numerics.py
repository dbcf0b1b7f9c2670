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
