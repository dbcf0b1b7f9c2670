"""Concept unlearning by alignment calibration: AC on CLIP and HAC / HAC-reg on MERU (ncjax.losses.ac), and MERU
itself (contrastive loss on -s d_L plus its entailment term).

AC and HAC train on forget/retain batches (`concept.train_on='forget_retain'`: N retain and N forget pairs per
global batch, the `forget` flag of the batch says which); every parameter trains at optim.lr from the starting
checkpoint (`method.init_from`), and the stored scalars are clamped after every update as CLIP / MERU do. The
fine-tuning baselines the slides compare are CLIP / MERU runs from the same checkpoint on the retain pairs
(`concept.train_on='retain'`: f-C-R, f-M-R) or on all pairs ('all': f-C, f-M); the original model (O-C, O-M) is
the checkpoint evaluated as it is. configs/ac.py and configs/hac.py set all of these up.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ncjax.losses import ac
from ncjax.methods.clip import CLIP, CLIPOptions
from ncjax.methods.registry import register
from ncjax.methods.two_tower import SingleModelMethod
from ncjax.models import lorentz
from ncjax.options import Options, loss_option


def split_forget_retain(embeddings, forget):
  """(retain rows, forget rows) of a batch holding N of each, in batch order within each half."""
  n = forget.shape[0] // 2
  order = jnp.argsort(forget, stable=True)   # retain (False) first
  return embeddings[order[:n]], embeddings[order[n:]]


@dataclasses.dataclass(frozen=True)
class ACOptions(Options):
  """AC's weights (the slides' eq. 3-6): AC's best row, alpha = gamma = 0.75, beta = 0.5 (HACOptions: HAC's)."""
  alpha: float = loss_option(0.75)
  beta: float = loss_option(0.5)
  gamma: float = loss_option(0.75)
  epsilon: float = loss_option(0.1)


@dataclasses.dataclass(frozen=True)
class HACOptions(ACOptions):
  """HAC / HAC-reg (eq. 7-11): the entailment calibration and the Lorentz-norm regulariser (lam = 0: HAC); HAC's
  best row alpha = gamma = 0.5, beta = 0.5."""
  alpha: float = loss_option(0.5)
  gamma: float = loss_option(0.5)
  omega_r: float = loss_option(0.2)
  omega_f: float = loss_option(1.0)
  lam: float = loss_option(0.5)
  f_ent_on: str = loss_option("forget")
  norm_reg: str = loss_option("toward_origin")
  min_radius: float = loss_option(0.1)


@dataclasses.dataclass(frozen=True)
class MERUOptions(CLIPOptions):
  entail_weight: float = loss_option(0.2)
  min_radius: float = loss_option(0.1)


class _CalibrationMethod(SingleModelMethod):
  """Shared by AC and HAC: encodes the two halves of a forget/retain batch (`concept.train_on='forget_retain'`:
  N retain and N forget pairs per global batch, the batch's `forget` flag says which)."""
  needs_trained_start = "unlearns a concept from a trained model (CLIP, or MERU for hac)"

  needs_forget_retain_batches = True

  def embed_halves(self, model, batch):
    if "forget" not in batch:
      raise ValueError(f"method {self.name!r} needs the batch's 'forget' flags (forget/retain batches)")
    img = model.encode_image(batch["image"])
    txt = model.encode_text(batch["tokens"])
    xr, xf = split_forget_retain(img, batch["forget"])
    tr, tf = split_forget_retain(txt, batch["forget"])
    return xr, tr, xf, tf


@register("ac")
class AlignmentCalibration(_CalibrationMethod):
  """AC on a CLIP model (cosine similarity)."""

  Options = ACOptions

  def model_loss(self, model, batch, rng, state):
    del rng, state
    o = self.options
    xr, tr, xf, tf = self.embed_halves(model, batch)
    loss, metrics = ac.ac_loss(xr, tr, xf, tf, model.get_logit_scale(), alpha=o.alpha, beta=o.beta,
                               gamma=o.gamma, epsilon=o.epsilon)
    return loss, dict(metrics, logit_scale=jnp.exp(model.get_logit_scale()))


@register("hac")
class HyperbolicAlignmentCalibration(_CalibrationMethod):
  """HAC (lam = 0) or HAC-reg (lam > 0) on a MERU model (negative Lorentz distance, entailment cones)."""

  Options = HACOptions
  supported_geometries = ("lorentz",)

  def model_loss(self, model, batch, rng, state):
    del rng, state
    o = self.options
    xr, tr, xf, tf = self.embed_halves(model, batch)
    curv = model.geometry.curvature()
    loss, metrics = ac.hac_loss(xr, tr, xf, tf, model.get_logit_scale(), curv, alpha=o.alpha, beta=o.beta,
                                gamma=o.gamma, epsilon=o.epsilon, omega_r=o.omega_r, omega_f=o.omega_f,
                                lam=o.lam, f_ent_on=o.f_ent_on, norm_reg=o.norm_reg, min_radius=o.min_radius)
    return loss, dict(metrics, logit_scale=jnp.exp(model.get_logit_scale()), curvature=curv)


@register("meru")
class MERU(CLIP):
  """MERU (Desai et al. 2023): the contrastive loss on -s d_L plus `loss.entail_weight` times the entailment loss
  mean_i relu(oxy_angle(t_i, x_i) - half_aperture(t_i)) (the text's cone should contain its image)."""

  Options = MERUOptions
  supported_geometries = ("lorentz",)
  bench = ()

  def embedding_loss(self, model, img, txt):
    loss, metrics = super().embedding_loss(model, img, txt)
    curv = model.geometry.curvature()
    entail = lorentz.entailment_loss(txt, img, curv, self.options.min_radius)
    metrics = dict(metrics, loss_contrastive=loss, loss_entailment=entail, curvature=curv,
                   logit_scale=jnp.exp(model.get_logit_scale()))
    return loss + self.options.entail_weight * entail, metrics


__all__ = ["AlignmentCalibration", "HyperbolicAlignmentCalibration", "MERU", "split_forget_retain"]
