"""SigLIP: pairwise sigmoid loss with a learnable bias (Zhai et al., 2023)."""

from __future__ import annotations

import jax.numpy as jnp

from ncjax.losses import contrastive
from ncjax.methods.registry import register
from ncjax.methods.two_tower import SingleModelMethod


@register("siglip")
class SigLIP(SingleModelMethod):
  """The pairwise sigmoid loss on the model's similarity (cosine, or negative Lorentz distance)."""

  supported_geometries = ("sphere", "lorentz")

  def create_modules(self):
    if self.config.model.get("logit_bias_init", None) is None:
      raise ValueError("SigLIP needs a learnable bias: set model.logit_bias_init (the paper uses -10 with "
                       "model.logit_scale_init=log(10))")
    return super().create_modules()

  def model_loss(self, model, batch, rng):
    del rng
    image_emb = model.encode_image(batch["image"])
    text_emb = model.encode_text(batch["tokens"])
    if model.geometry.name == "sphere":
      return contrastive.sigmoid(image_emb, text_emb, model.get_logit_scale(), model.get_logit_bias())
    logits = jnp.exp(model.get_logit_scale()) * model.similarity(image_emb, text_emb) + model.get_logit_bias()
    return contrastive.sigmoid_from_logits(logits)
