"""Noise detection: how well a method's per-sample clean scores separate clean from noisy pairs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import rankdata

from ncjax.evals import common, plots
from ncjax.evals.base import Evaluator, register


def roc_auc(scores, positive) -> float:
  """ROC-AUC of `scores` for the positive class (Mann-Whitney U with average ranks for ties)."""
  scores = np.asarray(scores, np.float64)
  positive = np.asarray(positive, bool)
  n_pos, n_neg = int(positive.sum()), int((~positive).sum())
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  r = rankdata(scores)
  return float((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def detection_metrics(scores, clean, flagged=None) -> dict:
  """ROC-AUC of clean scores (higher = cleaner) against the ground-truth clean flags, and — when a method says
  which samples it treats as noisy (`flagged`, bool) — precision, recall and F1 of that noisy set."""
  clean = np.asarray(clean, bool)
  out = {"auc": roc_auc(scores, clean), "noise_rate": float(1.0 - clean.mean()) if clean.size else float("nan")}
  if flagged is not None:
    flagged = np.asarray(flagged, bool)
    noisy = ~clean
    tp = int((flagged & noisy).sum())
    precision = tp / max(int(flagged.sum()), 1)
    recall = tp / max(int(noisy.sum()), 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    out.update(precision=precision, recall=recall, f1=f1, flagged_fraction=float(flagged.mean()))
  return out


@register("noise_detection")
class NoiseDetection(Evaluator):
  """ROC-AUC (and precision/recall of a flagged set) of per-training-pair clean scores against the ground truth.

  Scores come from the method (`Method.clean_scores(params, method_state)`, e.g. GSC's labels) when it provides
  them, else the model's similarity of each training pair as the loss saw it.

  Args:
    plot: write the clean-vs-noisy histogram PNG, and the scores with the clean flags beside it
      (`<tag>_clean_scores.npz`, what NC-bench draws ROC curves from).
  """
  task = "noise_detection"

  def __init__(self, context, *, plot: bool = True, dataset: str = "", split: str = "train"):
    super().__init__(context, dataset=dataset, split=split)
    self.plot = plot

  def check(self):
    """Nothing to load: it scores the training pairs of the run's own experiment."""

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
    metrics = detection_metrics(scores, td.clean, flagged)
    path = self.context.plot_path("clean_noisy")
    if path and self.plot:
      plots.plot_clean_noisy_histogram(scores, td.clean, path, f"{exp.method.name}: training pairs")
      # scores in example-id order with the noise index they were computed on: NC-bench's ROC curves, and the
      # prior scores of a composed method (NCU's `method.forget_from='scores'`)
      np.savez_compressed(path[:-len("clean_noisy.png")] + "clean_scores.npz", scores=np.asarray(scores, np.float32),
                          clean=np.asarray(td.clean, bool), noise_sha256=np.asarray(td.noise_sha256 or ""),
                          method=np.asarray(exp.method.name))
    return metrics


def pair_scores(eval_model, train_data, batch_size, mesh) -> np.ndarray:
  """The model's score of every training pair (image caption_to_image[k] with caption k), in id order."""
  split = train_data.split
  img = common.embed_images(eval_model, train_data_images(train_data), batch_size, mesh)
  tokens = train_data.tokens if train_data.tokens is not None else train_data.tokenizer.encode(split.captions)
  txt = common.embed_texts(eval_model, tokens, batch_size, mesh)
  pairs_img = img[train_data.caption_to_image]
  out = np.empty(len(txt), np.float32)
  if eval_model.pair_score is not None:    # aligned pairs only (a learned similarity's full block is costly)
    fn = jax.jit(eval_model.pair_score)
    for s in range(0, len(txt), batch_size):
      out[s:s + batch_size] = np.asarray(fn(jnp.asarray(pairs_img[s:s + batch_size]),
                                            jnp.asarray(txt[s:s + batch_size])), np.float32)
    return out
  for s in range(0, len(txt), 4096):
    block = common.score_matrix(eval_model, pairs_img[s:s + 4096], txt[s:s + 4096])
    out[s:s + 4096] = np.diagonal(block)
  return out


def train_data_images(train_data):
  from ncjax import data as data_lib
  return data_lib.eval_images(train_data.split, train_data.image_size or 0, train_data.normalization)
