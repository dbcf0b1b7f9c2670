"""Evaluators: plug-ins named in `config.evals.<name>.type`, each `run(eval_model, state) -> dict`.

Built in: zeroshot, retrieval, linear_probe, noise_detection, unlearning. Register more with `@register(name)`.
Each evaluator config may set `every_steps` (periodic evaluation during training; 0 = only at the end / in
`ncjax eval`), `dataset` and `split` (default: the training dataset's 'test' split).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import os
from typing import Any

import numpy as np

from ncjax.evals import common, linear_probe, noise, plots, retrieval, unlearning, zeroshot

EVALUATORS: dict[str, type] = {}


def register(name: str):
  def deco(cls):
    EVALUATORS[name] = cls
    return cls
  return deco


@dataclasses.dataclass
class EvalContext:
  """What evaluators share: the config, the tokenizer the model was trained with, the mesh, cached splits, and
  optionally the experiment (training pairs, method) and where to write plots."""
  config: Any
  tokenizer: Any
  mesh: Any
  experiment: Any = None
  plot_dir: str | None = None
  tag: str = ""

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

  def plot_path(self, name: str) -> str | None:
    if not self.plot_dir:
      return None
    return os.path.join(self.plot_dir, f"{self.tag + '_' if self.tag else ''}{name}.png")


class Evaluator(abc.ABC):
  task = ""  # CLIP_benchmark task name

  def __init__(self, cfg, context: EvalContext):
    self.cfg, self.context = cfg, context

  @property
  def batch_size(self) -> int:
    return self.context.config.input.eval_batch_size

  def data(self, split: str | None = None):
    dataset = self.cfg.get("dataset", "") or self.context.config.input.dataset
    return self.context.split(dataset, split or self.cfg.get("split", "test"))

  def images(self, split):
    from ncjax import data as data_lib
    from ncjax.train import image_size_of
    cfg = self.context.config
    return data_lib.eval_images(split, image_size_of(cfg.model), cfg.input.normalization)

  @abc.abstractmethod
  def run(self, eval_model, state=None) -> dict:
    """Evaluate and return flat metrics."""


@register("zeroshot")
class ZeroShot(Evaluator):
  task = "zeroshot_classification"

  def scores(self, eval_model):
    split = self.data()
    if split.image_labels is None:
      raise ValueError(f"{split.name} has no class labels: zero-shot classification needs them")
    ctx = self.context
    weights = zeroshot.classifier(eval_model, ctx.tokenizer, split.class_names,
                                  zeroshot.templates_for(self.cfg.get("templates", "digits")), ctx.mesh,
                                  self.batch_size)
    img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
    return common.score_matrix(eval_model, img, weights), split

  def run(self, eval_model, state=None) -> dict:
    scores, split = self.scores(eval_model)
    return zeroshot.accuracy(scores, split.image_labels, len(split.class_names))


@register("retrieval")
class Retrieval(Evaluator):
  task = "zeroshot_retrieval"

  def run(self, eval_model, state=None) -> dict:
    split = self.data()
    ctx = self.context
    img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
    txt = common.embed_texts(eval_model, ctx.tokenizer.encode(split.captions), self.batch_size, ctx.mesh)
    sim = common.score_matrix(eval_model, img, txt)
    folds = int(self.cfg.get("folds", 0))
    out = retrieval.recall_at_k(sim, split.caption_to_image)
    if folds:
      out.update({f"{folds}fold_{k}": v for k, v in
                  retrieval.recall_at_k_folds(sim, split.caption_to_image, folds).items()})
    path = ctx.plot_path("similarity")
    if path and self.cfg.get("plot", True):
      plots.plot_similarity_distributions(sim, split.caption_to_image, path, f"{split.name}: similarities")
    return out


@register("linear_probe")
class LinearProbe(Evaluator):
  task = "linear_probe"

  def run(self, eval_model, state=None) -> dict:
    if eval_model.image_features is None:
      raise ValueError("this model exposes no pre-projection image features for a linear probe")
    ctx = self.context
    train = self.data(self.cfg.get("train_split", "train"))
    test = self.data(self.cfg.get("split", "test"))
    feats = {k: common.image_features(eval_model, self.images(sp), self.batch_size, ctx.mesh)
             for k, sp in (("train", train), ("test", test))}
    tr_idx, val_idx = linear_probe.train_val_split(len(feats["train"]), self.cfg.get("val_fraction", 0.2))
    y = train.image_labels
    return linear_probe.linear_probe(feats["train"][tr_idx], y[tr_idx], feats["train"][val_idx], y[val_idx],
                                     feats["test"], test.image_labels, len(train.class_names) or None,
                                     protocol=self.cfg.get("protocol", "jax"))


@register("noise_detection")
class NoiseDetection(Evaluator):
  """ROC-AUC (and precision/recall of a flagged set) of per-training-pair clean scores against the ground truth.

  Scores come from the method (`Method.clean_scores(params, method_state)`, e.g. GSC's labels) when it provides
  them, else the model's similarity of each training pair as the loss saw it.
  """
  task = "noise_detection"

  def run(self, eval_model, state=None) -> dict:
    exp = self.context.experiment
    if exp is None:
      raise ValueError("noise_detection needs the training experiment (its noisy pairs and clean flags)")
    td = exp.train_data
    scores = flagged = None
    if state is not None:
      out = exp.method.clean_scores(state["params"], state["method_state"])
      if out is not None:
        scores, flagged = out
        scores = np.asarray(scores)[:td.num_examples]
        flagged = None if flagged is None else np.asarray(flagged)[:td.num_examples]
    if scores is None:
      scores = pair_scores(eval_model, td, self.batch_size, self.context.mesh)
    metrics = noise.detection_metrics(scores, td.clean, flagged)
    path = self.context.plot_path("clean_noisy")
    if path and self.cfg.get("plot", True):
      plots.plot_clean_noisy_histogram(scores, td.clean, path, f"{exp.method.name}: training pairs")
    return metrics


def pair_scores(eval_model, train_data, batch_size, mesh) -> np.ndarray:
  """The model's score of every training pair (image caption_to_image[k] with caption k), in id order."""
  split = train_data.split
  img = common.embed_images(eval_model, train_data_images(train_data), batch_size, mesh)
  tokens = train_data.tokens if train_data.tokens is not None else train_data.tokenizer.encode(split.captions)
  txt = common.embed_texts(eval_model, tokens, batch_size, mesh)
  pairs_img = img[train_data.caption_to_image]
  out = np.empty(len(txt), np.float32)
  for s in range(0, len(txt), 4096):
    block = common.score_matrix(eval_model, pairs_img[s:s + 4096], txt[s:s + 4096])
    out[s:s + 4096] = np.diagonal(block)
  return out


def train_data_images(train_data):
  from ncjax import data as data_lib
  return data_lib.eval_images(train_data.split, train_data.image_size or 0, train_data.normalization)


@register("unlearning")
class Unlearning(Evaluator):
  """F-acc / R-acc of zero-shot classification for `forget_classes` (switches: keep_forget_classes_in_labelset,
  average), and retrieval R@K on forget vs retain pairs."""
  task = "unlearning"

  def run(self, eval_model, state=None) -> dict:
    forget = list(self.cfg.forget_classes)
    zs = ZeroShot(self.cfg, self.context)
    scores, split = zs.scores(eval_model)
    forget_ids = [split.class_names.index(c) if isinstance(c, str) else int(c) for c in forget]
    out = unlearning.forget_retain_accuracy(
        scores, split.image_labels, forget_ids,
        keep_forget_classes_in_labelset=self.cfg.get("keep_forget_classes_in_labelset", True),
        average=self.cfg.get("average", "micro"))
    if self.cfg.get("retrieval", True):
      ctx = self.context
      img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
      txt = common.embed_texts(eval_model, ctx.tokenizer.encode(split.captions), self.batch_size, ctx.mesh)
      sim = common.score_matrix(eval_model, img, txt)
      out.update(unlearning.forget_retain_retrieval(sim, split.caption_to_image,
                                                     np.isin(split.image_labels, forget_ids)))
    return {k: v for k, v in out.items() if not isinstance(v, (bool, str))}


def build_evaluators(evals_config, context: EvalContext) -> dict[str, Evaluator]:
  out = {}
  for name, cfg in evals_config.items():
    kind = cfg.get("type", name)
    if kind not in EVALUATORS:
      raise ValueError(f"evals.{name}: unknown evaluator type {kind!r}; registered: {sorted(EVALUATORS)}")
    out[name] = EVALUATORS[kind](cfg, context)
  return out


def run_evaluators(evaluators: dict[str, Evaluator], eval_model, state=None) -> dict[str, dict]:
  return {name: ev.run(eval_model, state) for name, ev in evaluators.items()}


def clip_benchmark_records(results: dict[str, dict], evaluators: dict[str, Evaluator], model: str,
                           dataset: str) -> list[dict]:
  """CLIP_benchmark-style result records: {dataset, model, task, metrics}."""
  return [dict(dataset=evaluators[name].cfg.get("dataset", "") or dataset, model=model,
               task=evaluators[name].task or name, evaluator=name, metrics=metrics)
          for name, metrics in results.items()]


__all__ = ["EVALUATORS", "EvalContext", "Evaluator", "build_evaluators", "run_evaluators", "register",
           "clip_benchmark_records", "pair_scores", "common", "linear_probe", "noise", "plots", "retrieval",
           "unlearning", "zeroshot"]
