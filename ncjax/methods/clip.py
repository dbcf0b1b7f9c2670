"""CLIP: symmetric InfoNCE over the global batch (Radford et al., 2021)."""

from __future__ import annotations

import jax.numpy as jnp

from ncjax.losses import chunked, contrastive
from ncjax.methods.registry import register
from ncjax.methods.two_tower import SingleModelMethod


@register("clip")
class CLIP(SingleModelMethod):
  """Symmetric InfoNCE on the model's similarity: cosine on the sphere, negative Lorentz distance for MERU's
  geometry (MERU's contrastive loss; `meru` adds its entailment term)."""

  supported_geometries = ("sphere", "lorentz")

  def model_loss(self, model, batch, rng):
    del rng
    return self.embedding_loss(model, model.encode_image(batch["image"]), model.encode_text(batch["tokens"]))

  def embedding_loss(self, model, image_emb, text_emb):
    logits = model.get_logit_scale()
    chunk = self.config.loss.get("chunk_rows", 0)
    if model.geometry.name == "sphere" and chunk:   # very large batches: no N x N array (ncjax.losses.chunked)
      return chunked.infonce(image_emb, text_emb, logits, chunk=chunk)
    if model.geometry.name == "sphere":
      return contrastive.infonce(image_emb, text_emb, logits)
    # Other geometries (MERU's Lorentz): logits from the geometry's similarity (negative distance).
    return contrastive.infonce_from_logits(jnp.exp(logits) * model.similarity(image_emb, text_emb))
