"""SGRAF's hinge baseline on region features (VSE++ / SGRAF: max-violation triplet loss, margin 0.2).

  python -m ncjax.main --config=configs/sgraf.py:noise=0.4 --workdir=/tmp/sgraf --cpu_devices=8

The similarity H is SGRAF's learned function of regions and words over all B x B pairs of the global batch
(ncjax.models.sgraf); the loss is ncjax.losses.disncl.align_loss with a constant margin on every pair (no
filtration), summed over the batch as the public code. With loss.all_negatives_epochs = k the run starts with k
epochs of the hinge summed over every negative (VSE++'s remedy for max violation's collapse from a random start).
"""

from __future__ import annotations

from ncjax import models
from ncjax.losses import disncl as disncl_loss
from ncjax.methods.base import EvalModel, Method, Stage, Update
from ncjax.methods.registry import register


def region_eval_model(model) -> EvalModel:
  """Evaluators' view of a region retrieval model: region / packed word features, the learned score H."""
  return EvalModel(encode_image=model.encode_image, encode_text=model.encode_text, score=model.similarity,
                   pair_score=model.pair_score)


class RegionMethod(Method):
  """A method over one region retrieval model named 'model' (config.model.image_type = 'regions')."""

  def check_region_model(self):
    if not models.is_region_model(self.config.model):
      raise ValueError(f"method {self.name!r} runs on region features: set model.image_type='regions' and "
                       f"model.text_type='bigru' (configs/{self.name}.py does), not {self.config.model.image_type!r}")

  def create_modules(self):
    self.check_region_model()
    tok = self.tokenizer
    return {"model": models.build_model(self.config.model, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                        pad_id=tok.pad_id, seed=self.config.seed)}

  def eval_model(self, params):
    return region_eval_model(self.bind(params).model)


@register("sgraf")
class SGRAF(RegionMethod):

  def hinge_loss_fn(self, negatives: str):
    def loss_fn(params, state, batch, rng):
      model = self.bind(params).model
      h = model.similarity(model.encode_image(batch["image"]), model.encode_text(batch["tokens"], rng))
      lc = self.config.loss
      loss, metrics = disncl_loss.align_loss(h, lc.margin, reduction=lc.reduction, negatives=negatives)
      return loss, (metrics, state)
    return loss_fn

  def stages(self):
    """loss.all_negatives_epochs of the hinge summed over every negative (VSE++'s start), then max violation."""
    groups = self.default_param_groups()
    stages = []
    if self.config.loss.all_negatives_epochs:
      stages.append(Stage("all_negatives", self.config.loss.all_negatives_epochs,
                          (Update("main", self.hinge_loss_fn("all"), groups),)))
    stages.append(Stage("train", self.config.num_epochs, (Update("main", self.hinge_loss_fn("hardest"), groups),)))
    return tuple(stages)
