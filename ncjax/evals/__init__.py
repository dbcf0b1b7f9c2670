"""Evaluators: plug-ins named in `config.evals.<name>.type`, each `run(eval_model) -> dict`."""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any

import numpy as np

from ncjax.evals import common, noise, retrieval, zeroshot

EVALUATORS: dict[str, type] = {}


def register(name: str):
  def deco(cls):
    EVALUATORS[name] = cls
    return cls
  return deco


@dataclasses.dataclass
class EvalContext:
  """What evaluators share: the config, the tokenizer the model was trained with, the mesh, cached splits."""
  config: Any
  tokenizer: Any
  mesh: Any

  @functools.lru_cache(maxsize=8)
  def split(self, dataset: str, split: str):
    from ncjax import data as data_lib
    from ncjax.train import image_size_of
    input_cfg = self.config.input.copy_and_resolve_references()
    with input_cfg.unlocked():
      input_cfg.dataset = dataset
    return data_lib.load_split(input_cfg, split, image_size_of(self.config.model))

  def __hash__(self):
    return id(self)


class Evaluator(abc.ABC):

  def __init__(self, cfg, context: EvalContext):
    self.cfg, self.context = cfg, context

  @property
  def batch_size(self) -> int:
    return self.context.config.input.eval_batch_size

  def data(self):
    dataset = self.cfg.get("dataset", "") or self.context.config.input.dataset
    return self.context.split(dataset, self.cfg.get("split", "test"))

  def images(self, split):
    from ncjax import data as data_lib
    from ncjax.train import image_size_of
    cfg = self.context.config
    return data_lib.eval_images(split, image_size_of(cfg.model), cfg.input.normalization)

  @abc.abstractmethod
  def run(self, eval_model) -> dict:
    """Evaluate and return flat metrics."""


def templates_for(name: str) -> tuple[str, ...]:
  if name == "digits":
    from ncjax.data.digits import ZEROSHOT_TEMPLATES
    return ZEROSHOT_TEMPLATES
  raise ValueError(f"unknown template set {name!r}; known: ['digits']")


@register("zeroshot")
class ZeroShot(Evaluator):

  def run(self, eval_model) -> dict:
    split = self.data()
    if split.image_labels is None:
      raise ValueError(f"{split.name} has no class labels: zero-shot classification needs them")
    ctx = self.context
    weights = zeroshot.classifier(eval_model, ctx.tokenizer, split.class_names,
                                  templates_for(self.cfg.get("templates", "digits")), ctx.mesh, self.batch_size)
    img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
    scores = common.score_matrix(eval_model, img, weights)
    return zeroshot.accuracy(scores, split.image_labels, len(split.class_names))


@register("retrieval")
class Retrieval(Evaluator):

  def run(self, eval_model) -> dict:
    split = self.data()
    ctx = self.context
    img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
    txt = common.embed_texts(eval_model, ctx.tokenizer.encode(split.captions), self.batch_size, ctx.mesh)
    sim = common.score_matrix(eval_model, img, txt)
    return retrieval.recall_at_k(sim, split.caption_to_image)


def build_evaluators(evals_config, context: EvalContext) -> dict[str, Evaluator]:
  out = {}
  for name, cfg in evals_config.items():
    kind = cfg.get("type", name)
    if kind not in EVALUATORS:
      raise ValueError(f"evals.{name}: unknown evaluator type {kind!r}; registered: {sorted(EVALUATORS)}")
    out[name] = EVALUATORS[kind](cfg, context)
  return out


def run_evaluators(evaluators: dict[str, Evaluator], eval_model) -> dict[str, dict]:
  return {name: ev.run(eval_model) for name, ev in evaluators.items()}


__all__ = ["EVALUATORS", "EvalContext", "Evaluator", "build_evaluators", "run_evaluators", "register", "common",
           "noise", "retrieval", "zeroshot", "np"]
