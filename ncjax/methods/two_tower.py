"""Shared base for methods that train one two-tower model with a single loss."""

from __future__ import annotations

import abc

from ncjax import models
from ncjax.methods.base import Method, Stage, Update


class SingleModelMethod(Method):
  """One TwoTower under the name 'model', one stage of `config.num_epochs`, one update of `model_loss`."""

  def create_modules(self):
    tok = self.tokenizer
    model = models.build_two_tower(self.config.model, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                   pad_id=tok.pad_id, seed=self.config.seed)
    return {"model": model}

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
