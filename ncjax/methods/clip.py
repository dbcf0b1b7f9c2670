"""CLIP: symmetric InfoNCE over the global batch (Radford et al., 2021)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ncjax.losses import chunked, contrastive
from ncjax.methods.base import BenchEntry
from ncjax.methods.registry import register
from ncjax.methods.two_tower import SingleModelMethod
from ncjax.models.geometry import GEOMETRIES
from ncjax.options import Options, loss_option


@dataclasses.dataclass(frozen=True)
class CLIPOptions(Options):
  # > 0: InfoNCE without any N x N array, rows in chunks of this size (ncjax/losses/chunked.py; very large batches)
  chunk_rows: int = loss_option(0)


@register("clip")
class CLIP(SingleModelMethod):
  """Symmetric InfoNCE on the model's contrastive logits: exp(s) times the geometry's similarity — cosine on the
  sphere, negative Lorentz distance for MERU's geometry (MERU's contrastive loss; `meru` adds its entailment
  term)."""

  Options = CLIPOptions
  supported_geometries = ("sphere", "lorentz")
  bench = (BenchEntry("clip", "CLIP InfoNCE (the baseline; at noise 0: the clean-caption reference)", "clip"),
           BenchEntry("oracle", "CLIP on only the pairs the noise left intact, the same steps (a perfect filter)",
                      "clip", args="train_on=clean"))

  def __init__(self, setup, options=None):
    super().__init__(setup, options)
    geometry = GEOMETRIES.get(self.model_spec.geometry)
    if self.options.chunk_rows and not geometry.dot_product_logits:
      raise ValueError(f"loss.chunk_rows computes scaled dot-product logits; the {geometry.name} geometry's are "
                       "not: set loss.chunk_rows=0")

  def model_loss(self, model, batch, rng, state):
    del rng, state
    return self.embedding_loss(model, model.encode_image(batch["image"]), model.encode_text(batch["tokens"]))

  def embedding_loss(self, model, image_emb, text_emb):
    if self.options.chunk_rows:   # very large batches: no N x N array (ncjax.losses.chunked)
      return chunked.infonce(image_emb, text_emb, model.get_logit_scale(), chunk=self.options.chunk_rows)
    loss, metrics = contrastive.infonce_from_logits(model.contrastive_logits(image_emb, text_emb))
    metrics.update(pos_similarity=jnp.mean(model.paired_similarity(image_emb, text_emb)),
                   logit_scale=jnp.exp(model.get_logit_scale()))
    return loss, metrics
