"""Shared bases: methods built around one two-tower model ('model'), and those with a single loss and stage."""

from __future__ import annotations

import abc

import jax.numpy as jnp

from ncjax import models
from ncjax.contract import PostUpdate
from ncjax.methods.base import Method, Stage, Update
from ncjax.models.two_tower import clamp_stored


def clamp_logit_scale(low: float, high: float, module: str = "model") -> PostUpdate:
  """A post-update clamping the stored `logit_scale` of `params[module]` into [low, high] (as the public code of
  NCU and open_clip clamp the parameter itself after each optimiser step)."""

  def clamp(params):
    sub = dict(params[module], logit_scale=jnp.clip(params[module]["logit_scale"], low, high))
    return dict(params, **{module: sub})
  return clamp


def stored_clamps(config, modules=("model",)) -> PostUpdate:
  """The post-update keeping each two-tower module's stored scalars in range (logit scale <= ln 100; MERU's
  curvature and alphas), as open_clip and MERU clamp the parameters themselves after every step."""
  geometry, curv_init = config.model.get("geometry", "sphere"), float(config.model.get("curv_init", 1.0))

  def clamp(params):
    out = dict(params)
    for name in modules:
      out[name] = clamp_stored(params[name], geometry=geometry, curv_init=curv_init)
    return out
  return clamp


class TwoTowerMethod(Method):
  """A method whose main module is one TwoTower named 'model' (built from config.model and the tokenizer)."""

  def create_modules(self):
    tok = self.tokenizer
    model = models.build_two_tower(self.config.model, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                   pad_id=tok.pad_id, seed=self.config.seed)
    return {"model": model}


class SingleModelMethod(TwoTowerMethod):
  """One TwoTower under the name 'model', one stage of `config.num_epochs`, one update of `model_loss`."""

  # True: model_loss also takes the per-sample method state (model_loss(model, batch, rng, state)), e.g. a forget
  # set selected by prior per-sample scores.
  loss_reads_state: bool = False

  @abc.abstractmethod
  def model_loss(self, model, batch, rng):
    """(loss, metrics) of the bound model on a batch."""

  def update_state(self, state, batch, metrics):
    """Per-sample state after a step (default: unchanged). `metrics` may carry per-sample arrays."""
    del batch, metrics
    return state

  def post_update(self) -> PostUpdate | None:
    """What runs on the parameters after every update of the stage (default: the stored-value clamps)."""
    return stored_clamps(self.config)

  def loss_fn(self, params, state, batch, rng):
    model = self.bind(params).model
    if self.loss_reads_state:
      loss, metrics = self.model_loss(model, batch, rng, state)
    else:
      loss, metrics = self.model_loss(model, batch, rng)
    return loss, (metrics, self.update_state(state, batch, metrics))

  def stages(self):
    return (Stage("train", self.config.num_epochs,
                  (Update("main", self.loss_fn, self.default_param_groups()),), post_update=self.post_update()),)
