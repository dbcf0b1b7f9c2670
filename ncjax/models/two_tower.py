"""The two-tower model: an image tower, a text tower, a geometry, a learnable logit scale and optional bias.

Towers are looked up in registries by `type`, so new towers (region features with their own text encoder,
timm-style ViTs) plug in with `register_image_tower` / `register_text_tower` and touch neither this file nor the
trainer. `logit_scale` is the log of the logit multiplier (CLIP convention). Its cap (<= log 100) and MERU's
curvature and alpha bounds are applied to the *stored* parameters after every optimiser update (`clamp_stored`,
run by each method's stages), as open_clip and MERU do: a value clamped where it is read would get zero gradient
and could never come back.
"""

from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp
from flax import nnx

from ncjax.contract import EvalModel
from ncjax.models.microbatch import micro_batched
from ncjax.models.text import TextTransformer
from ncjax.models.vit import VisionTransformer
from ncjax.numerics import MAX_LOGIT_SCALE
from ncjax.registry import Registry

IMAGE_TOWERS: Registry[Callable[..., nnx.Module]] = Registry("image tower")
TEXT_TOWERS: Registry[Callable[..., nnx.Module]] = Registry("text tower")
IMAGE_TOWERS.add("vit", VisionTransformer)
TEXT_TOWERS.add("transformer", TextTransformer)


def register_image_tower(name: str):
  return IMAGE_TOWERS.register(name)


def register_text_tower(name: str):
  return TEXT_TOWERS.register(name)


class TwoTower(nnx.Module):
  """Image and text towers over a shared embedding geometry.

  encode_image / encode_text return float32 embeddings in the model's geometry (L2-normalised on the sphere,
  points on the hyperboloid for Lorentz); `similarity` is what logits are built from, `score` what evaluators rank by.
  """

  def __init__(self, image_tower: nnx.Module, text_tower: nnx.Module, geometry: nnx.Module, *,
               logit_scale_init: float = math.log(1 / 0.07), logit_bias_init: float | None = None,
               micro_batches: int = 1):
    # > 1: both towers encode a batch in this many device-local micro-batches under jax.checkpoint (GradCache:
    # the full-batch gradient with one micro-batch's activations alive; ncjax.models.microbatch)
    self.micro_batches = int(micro_batches)
    self.img = image_tower
    self.txt = text_tower
    self.geometry = geometry
    self.logit_scale = nnx.Param(jnp.asarray(logit_scale_init, jnp.float32))
    self.has_bias = logit_bias_init is not None
    if self.has_bias:
      self.logit_bias = nnx.Param(jnp.asarray(logit_bias_init, jnp.float32))

  def get_logit_scale(self):
    return self.logit_scale[...]

  def get_logit_bias(self):
    return self.logit_bias[...] if self.has_bias else jnp.zeros((), jnp.float32)

  def encode_image(self, images, *, return_features: bool = False):
    def encode(x):
      emb, features = self.img(x, return_features=True)
      return self.geometry.embed(emb, "image"), features

    emb, features = micro_batched(encode, images, micro_batches=self.micro_batches)
    return (emb, features) if return_features else emb

  def encode_text(self, tokens, rng=None, *, token_embeddings=None, return_features: bool = False):
    """`rng` is accepted as a region model's encoder takes it (its word dropout); the towers use none."""
    del rng
    def encode(t, *embedded):
      emb, features = self.txt(t, token_embeddings=embedded[0] if embedded else None, return_features=True)
      return self.geometry.embed(emb, "text"), features

    args = (tokens,) if token_embeddings is None else (tokens, token_embeddings)
    emb, features = micro_batched(encode, *args, micro_batches=self.micro_batches)
    return (emb, features) if return_features else emb

  def similarity(self, image_emb, text_emb, rng=None):
    del rng   # (a region model's learned head takes its dropout key here)
    return self.geometry.logits_similarity(image_emb, text_emb)

  def score(self, image_emb, text_emb):
    return self.geometry.score(image_emb, text_emb)

  def paired_similarity(self, image_emb, text_emb):
    return self.geometry.paired_similarity(image_emb, text_emb)

  def contrastive_logits(self, image_emb, text_emb):
    """The N x M training logits of CLIP / SigLIP in this model's geometry: exp(logit_scale) times the geometry's
    similarity (cosine on the sphere, negative Lorentz distance for MERU), float32, without the bias."""
    return self.geometry.contrastive_logits(image_emb, text_emb, self.get_logit_scale())

  def eval_model(self) -> EvalModel:
    """What evaluators need: the encoders, the geometry's score, pre-projection image features (linear probe),
    its prompt ensemble and (MERU) the Lorentz norm."""
    return EvalModel(encode_image=self.encode_image, encode_text=self.encode_text, score=self.score,
                     image_features=lambda x: self.encode_image(x, return_features=True)[1],
                     ensemble=self.geometry.ensemble, norm=self.geometry.norm)

  # image_structure / text_structure are the embeddings' Gram matrices: a loss may use their D x D form
  # (ncjax.losses.gsc.batch_loss_gram) instead of building N x N matrices.
  gram_structures = True

  def image_structure(self, image_emb, rng=None):
    """Image-image structure (GSC's A): cosine similarities of the batch's image embeddings."""
    del rng
    return image_emb @ image_emb.T

  def text_structure(self, text_emb, rng=None):
    del rng
    return text_emb @ text_emb.T

  def __call__(self, images, tokens):
    return dict(image_emb=self.encode_image(images), text_emb=self.encode_text(tokens),
                logit_scale=self.get_logit_scale(), logit_bias=self.get_logit_bias())


def clamp_stored(params: dict, *, geometry: str = "sphere", curv_init: float = 1.0,
                 max_logit_scale: float = MAX_LOGIT_SCALE) -> dict:
  """A TwoTower's parameters with the stored scalars clamped into their ranges (after an optimiser update):
  logit_scale <= ln 100; for MERU's Lorentz geometry, log-curvature in [log(c0/10), log(10 c0)] and the log-alphas
  <= 0 (MERU clamps these at every forward pass, on the stored values)."""
  out = dict(params, logit_scale=jnp.minimum(params["logit_scale"], max_logit_scale))
  if geometry == "lorentz":
    geo = dict(params["geometry"])
    geo["curv"] = jnp.clip(geo["curv"], math.log(curv_init / 10), math.log(curv_init * 10))
    geo["visual_alpha"] = jnp.minimum(geo["visual_alpha"], 0.0)
    geo["textual_alpha"] = jnp.minimum(geo["textual_alpha"], 0.0)
    out["geometry"] = geo
  return out
