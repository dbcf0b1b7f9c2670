"""SigLIP: pairwise sigmoid loss with a learnable bias (Zhai et al., 2023)."""

from __future__ import annotations

import jax.numpy as jnp

from ncjax.losses import contrastive
from ncjax.methods.base import BenchEntry
from ncjax.methods.registry import register
from ncjax.methods.two_tower import SingleModelMethod


@register("siglip")
class SigLIP(SingleModelMethod):
  """The pairwise sigmoid loss on the model's contrastive logits plus its bias (cosine, or negative Lorentz
  distance)."""

  supported_geometries = ("sphere", "lorentz")
  bench = (BenchEntry("siglip", "SigLIP sigmoid loss", "siglip"),)

  def __init__(self, setup, options=None):
    super().__init__(setup, options)
    if self.model_spec.logit_bias_init is None:
      raise ValueError("SigLIP needs a learnable bias: set model.logit_bias_init (the paper uses -10 with "
                       "model.logit_scale_init=log(10))")

  def model_loss(self, model, batch, rng, state):
    del rng, state
    image_emb = model.encode_image(batch["image"])
    text_emb = model.encode_text(batch["tokens"])
    loss, metrics = contrastive.sigmoid_from_logits(model.contrastive_logits(image_emb, text_emb)
                                                    + model.get_logit_bias())
    metrics.update(pos_similarity=jnp.mean(model.paired_similarity(image_emb, text_emb)),
                   logit_scale=jnp.exp(model.get_logit_scale()), logit_bias=model.get_logit_bias())
    return loss, metrics
