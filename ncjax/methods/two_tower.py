"""Shared bases: methods built around one two-tower model ('model'), and those with a single loss and stage."""

from __future__ import annotations

import abc

import jax.numpy as jnp

from ncjax import models
from ncjax.contract import PostUpdate
from ncjax.methods.base import Method, Update


def clamp_logit_scale(low: float, high: float, module: str = "model") -> PostUpdate:
  """A post-update clamping the stored `logit_scale` of `params[module]` into [low, high] (as the public code of
  NCU and open_clip clamp the parameter itself after each optimiser step)."""

  def clamp(params):
    sub = dict(params[module], logit_scale=jnp.clip(params[module]["logit_scale"], low, high))
    return dict(params, **{module: sub})
  return clamp


def stored_clamps(spec: models.ModelSpec, modules=("model",)) -> PostUpdate:
  """The post-update keeping each module's stored scalars in range, as the model kind defines them
  (`ModelSpec.clamp_stored`: a two-tower's logit scale <= ln 100, MERU's curvature and alphas; nothing for a region
  model), as open_clip and MERU clamp the parameters themselves after every step."""

  def clamp(params):
    out = dict(params)
    for name in modules:
      out[name] = spec.clamp_stored(params[name])
    return out
  return clamp


class TwoTowerMethod(Method):
  """A method whose main module is one TwoTower named 'model' (built from the model spec and the tokenizer)."""

  def create_modules(self):
    tok = self.tokenizer
    model = models.build_two_tower(self.model_spec, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                   pad_id=tok.pad_id, seed=self.setup.seed, micro_batches=self.setup.micro_batches)
    return {"model": model}


class SingleModelMethod(TwoTowerMethod):
  """One TwoTower under the name 'model', one stage of `num_epochs`, one update of `model_loss`."""

  @abc.abstractmethod
  def model_loss(self, model, batch, rng, state):
    """(loss, metrics) of the bound model on a batch; `state` is the per-sample method state (read-only here:
    `update_state` writes it), e.g. a forget set selected by prior per-sample scores."""

  def update_state(self, state, batch, metrics):
    """Per-sample state after a step (default: unchanged). `metrics` may carry per-sample arrays."""
    del batch, metrics
    return state

  def post_update(self) -> PostUpdate | None:
    """What runs on the parameters after every update of the stage (default: the stored-value clamps)."""
    return stored_clamps(self.model_spec)

  def loss_fn(self, params, state, batch, rng):
    loss, metrics = self.model_loss(self.bind(params).model, batch, rng, state)
    return loss, (metrics, self.update_state(state, batch, metrics))

  def stages(self):
    return (self.main_stage("train", (Update("main", self.loss_fn, self.default_param_groups()),),
                            post_update=self.post_update()),)
