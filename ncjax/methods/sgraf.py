"""SGRAF's hinge baseline on region features (VSE++ / SGRAF: max-violation triplet loss, margin 0.2).

  python -m ncjax.main --config=configs/sgraf.py:noise=0.4 --workdir=/tmp/sgraf --cpu_devices=8

The similarity H is SGRAF's learned function of regions and words over all B x B pairs of the global batch
(ncjax.models.sgraf); the loss is ncjax.losses.disncl.align_loss with a constant margin on every pair (no
filtration), summed over the batch as the public code. With loss.all_negatives_epochs = k the run starts with k
epochs of the hinge summed over every negative (VSE++'s remedy for max violation's collapse from a random start).
"""

from __future__ import annotations

import dataclasses

import jax

from ncjax import models
from ncjax.losses import disncl as disncl_loss
from ncjax.methods.base import BenchEntry, Method, Stage, Update
from ncjax.methods.registry import register
from ncjax.options import Options, loss_option


@dataclasses.dataclass(frozen=True)
class HingeOptions(Options):
  """VSE++ / SGRAF's hinge: margin 0.2, summed over the batch; `all_negatives_epochs` of the hinge over every
  negative before max violation (a preparatory stage, before the num_epochs of the main one)."""
  margin: float = loss_option(0.2)
  reduction: str = loss_option("sum")
  all_negatives_epochs: int = loss_option(0)


class RegionMethod(Method):
  """A method over one region retrieval model named 'model' (model.image_type = 'regions')."""

  model_kinds = ("region",)

  def __init__(self, setup, options=None):
    super().__init__(setup, options)
    if setup.micro_batches > 1:
      raise ValueError(models.REGION_MICRO_BATCHES)

  def create_modules(self):
    tok = self.tokenizer
    return {"model": models.build_model(self.model_spec, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                        pad_id=tok.pad_id, seed=self.setup.seed)}


@register("sgraf")
class SGRAF(RegionMethod):

  Options = HingeOptions
  bench = (BenchEntry("sgraf", "SGRAF hinge on region features", "sgraf", model_kind="region"),)

  def hinge_loss_fn(self, negatives: str):
    def loss_fn(params, state, batch, rng):
      model = self.bind(params).model
      h = model.similarity(model.encode_image(batch["image"]), model.encode_text(batch["tokens"], rng),
                           jax.random.fold_in(rng, 1))   # SGRAF's word dropout, then its pooling dropout
      o = self.options
      loss, metrics = disncl_loss.align_loss(h, o.margin, reduction=o.reduction, negatives=negatives)
      return loss, (metrics, state)
    return loss_fn

  def stages(self):
    """loss.all_negatives_epochs of the hinge summed over every negative (VSE++'s start), then max violation."""
    groups = self.default_param_groups()
    stages = []
    if self.options.all_negatives_epochs:
      stages.append(Stage("all_negatives", self.options.all_negatives_epochs,
                          (Update("main", self.hinge_loss_fn("all"), groups),)))
    stages.append(self.main_stage("train", (Update("main", self.hinge_loss_fn("hardest"), groups),)))
    return tuple(stages)
