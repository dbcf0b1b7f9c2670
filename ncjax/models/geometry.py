"""Embedding geometries: how tower outputs become embeddings and how pairs are scored.

A geometry owns any learnable geometry scalars (curvature, scaling alphas) and exposes
  embed(features, modality) -> embeddings          (float32)
  logits_similarity(a, b) -> (N, M) float32        (what training logits are built from: higher = closer)
  contrastive_logits(a, b, log_scale) -> (N, M)    (exp(log_scale) * logits_similarity: CLIP's / SigLIP's logits)
  score(a, b) -> (N, M) float32                    (what evaluation ranks by)
  paired_similarity(a, b) -> (N,) float32
so losses and evaluators never assume the unit sphere.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from ncjax.models import lorentz
from ncjax.numerics import scaled_dot
from ncjax.registry import Registry


def l2_normalize(x, eps: float = 1e-12):
  """x / ||x||, returning 0 (not NaN) for a zero vector."""
  x = jnp.asarray(x, jnp.float32)
  return x * jnp.reciprocal(jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps)))


class Sphere(nnx.Module):
  """CLIP's geometry: L2-normalised embeddings scored by cosine similarity."""

  name = "sphere"
  # Logits are scaled dot products: the memory-lean chunked losses (ncjax.losses.chunked) apply.
  dot_product_logits = True
  norm = None   # no distance from the origin on the sphere

  def __init__(self, *, embed_dim: int, rngs: nnx.Rngs | None = None):
    del embed_dim, rngs

  def embed(self, features, modality: str):
    del modality
    return l2_normalize(features)

  def logits_similarity(self, a, b):
    return jnp.asarray(a, jnp.float32) @ jnp.asarray(b, jnp.float32).T

  score = logits_similarity

  def contrastive_logits(self, a, b, log_scale):
    """exp(log_scale) * a @ b.T, the scale folded into `b` before the matmul (ncjax.numerics.scaled_dot)."""
    return scaled_dot(a, b, log_scale)

  def paired_similarity(self, a, b):
    return jnp.sum(jnp.asarray(a, jnp.float32) * jnp.asarray(b, jnp.float32), axis=-1)

  def ensemble(self, template_embeddings):
    """Prompt ensemble (C, T, D) -> (C, D): normalise each template embedding, average, renormalise (CLIP)."""
    return l2_normalize(jnp.mean(l2_normalize(template_embeddings), axis=1))


class Lorentz(nnx.Module):
  """MERU's geometry: features scaled by exp(alpha) (alpha <= 0) and lifted with exp_map0 onto the hyperboloid.

  Training logits use negative geodesic distance; evaluation ranks by the Lorentzian inner product (as MERU's
  zero-shot and retrieval evaluators do). Curvature c = exp(curv). MERU keeps curv in [log(c0/10), log(10 c0)] and
  the alphas <= 0 by clamping the stored parameters (`ncjax.models.two_tower.clamp_stored`, run after every update).
  """

  name = "lorentz"
  dot_product_logits = False

  def __init__(self, *, embed_dim: int, curv_init: float = 1.0, learn_curv: bool = True,
               rngs: nnx.Rngs | None = None):
    del rngs
    self.curv_init = curv_init
    self.learn_curv = learn_curv
    alpha0 = math.log(embed_dim ** -0.5)
    self.curv = nnx.Param(jnp.asarray(math.log(curv_init), jnp.float32))
    self.visual_alpha = nnx.Param(jnp.asarray(alpha0, jnp.float32))
    self.textual_alpha = nnx.Param(jnp.asarray(alpha0, jnp.float32))

  def curvature(self):
    return jnp.exp(self.curv[...])

  def embed(self, features, modality: str):
    alpha = self.visual_alpha[...] if modality == "image" else self.textual_alpha[...]
    return lorentz.exp_map0(jnp.asarray(features, jnp.float32) * jnp.exp(alpha), self.curvature())

  def logits_similarity(self, a, b):
    return -lorentz.pairwise_dist(a, b, self.curvature())

  def contrastive_logits(self, a, b, log_scale):
    """exp(log_scale) * (-d_L(a, b)): MERU's contrastive logits."""
    return jnp.exp(jnp.asarray(log_scale, jnp.float32)) * self.logits_similarity(a, b)

  def score(self, a, b):
    return lorentz.pairwise_inner(a, b, self.curvature())

  def paired_similarity(self, a, b):
    return -lorentz.paired_dist(a, b, self.curvature())

  def norm(self, x):
    """The Lorentz norm d_L(O, x): how generic (near the origin) or specific an embedding is."""
    return lorentz.hyperbolic_norm(x, self.curvature())

  def ensemble(self, template_embeddings):
    """MERU's prompt ensemble: average in the tangent space at the origin, then exp-map back (C, T, D) -> (C, D).

    log_map0 recovers exp(alpha) * features exactly, so this equals MERU's mean of scaled text features.
    """
    curv = self.curvature()
    return lorentz.exp_map0(jnp.mean(lorentz.log_map0(template_embeddings, curv), axis=1), curv)


GEOMETRIES: Registry = Registry("geometry")
GEOMETRIES.add("sphere", Sphere)
GEOMETRIES.add("lorentz", Lorentz)
