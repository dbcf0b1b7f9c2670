"""Shared bases: methods built around one two-tower model ('model'), and those with a single loss and stage."""

from __future__ import annotations

import abc

from ncjax import models
from ncjax.methods.base import Method, Stage, Update


class TwoTowerMethod(Method):
  """A method whose main module is one TwoTower named 'model' (built from config.model and the tokenizer)."""

  def create_modules(self):
    tok = self.tokenizer
    model = models.build_two_tower(self.config.model, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                   pad_id=tok.pad_id, seed=self.config.seed)
    return {"model": model}


class SingleModelMethod(TwoTowerMethod):
  """One TwoTower under the name 'model', one stage of `config.num_epochs`, one update of `model_loss`."""

  @abc.abstractmethod
  def model_loss(self, model, batch, rng):
    """(loss, metrics) of the bound model on a batch."""

  def update_state(self, state, batch, metrics):
    """Per-sample state after a step (default: unchanged). `metrics` may carry per-sample arrays."""
    del batch, metrics
    return state

  def loss_fn(self, params, state, batch, rng):
    model = self.bind(params).model
    loss, metrics = self.model_loss(model, batch, rng)
    return loss, (metrics, self.update_state(state, batch, metrics))

  def stages(self):
    return (Stage("train", self.config.num_epochs,
                  (Update("main", self.loss_fn, self.default_param_groups()),)),)
