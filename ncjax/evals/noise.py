"""Noise detection: how well a method's per-sample clean scores separate clean from noisy pairs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ncjax.data.scores import save_clean_scores
from ncjax.evals import common, plots
from ncjax.evals.base import Evaluator, register


def roc_auc(scores, positive) -> float:
  """ROC-AUC of `scores` for the positive class (Mann-Whitney U with average ranks for ties)."""
  scores = np.asarray(scores, np.float64)
  positive = np.asarray(positive, bool)
  n_pos, n_neg = int(positive.sum()), int((~positive).sum())
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  # average ranks (1-based; tied scores share the mean of their positions), as scipy.stats.rankdata's default,
  # whose import costs ~1-2 s of every evaluating process's start
  _, group, counts = np.unique(scores, return_inverse=True, return_counts=True)
  r = (np.cumsum(counts) - (counts - 1) / 2.0)[group.reshape(-1)]
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

  Scores come from the method (`EvalModel.clean_scores`, e.g. GSC's labels) when it keeps them, else the model's
  score of each training pair as the loss saw it (`context.pairs`: the run's training pairs and clean flags).

  Args:
    plot: write the clean-vs-noisy histogram PNG, and the scores with the clean flags beside it
      (`<tag>_clean_scores.npz`, what NC-bench draws ROC curves from).
  """
  task = "noise_detection"

  def __init__(self, context, *, plot: bool = True, dataset: str = "", split: str = "train"):
    super().__init__(context, dataset=dataset, split=split)
    self.plot = plot

  def check(self):
    """Nothing to load: it scores the run's own training pairs."""
    if self.context.pairs is None:
      raise ValueError("noise_detection scores a run's training pairs, and this evaluation has none")

  def run(self, eval_model) -> dict:
    pairs = self.context.pairs
    if pairs is None:
      raise ValueError("noise_detection needs the run's training pairs (their noisy caption->image index and "
                       "clean flags)")
    n = pairs.num_examples
    flagged = None
    if eval_model.clean_scores is not None:
      scores, flagged = eval_model.clean_scores
      scores = common.host_values(scores)[:n]
      flagged = None if flagged is None else common.host_values(flagged)[:n]
    else:
      scores = pair_scores(eval_model, pairs, self.context.tokenizer, self.batch_size, self.context.mesh)
    metrics = detection_metrics(scores, pairs.clean, flagged)
    path = self.context.plot_path("clean_noisy")
    if path and self.plot:
      name = self.context.method_name
      plots.plot_clean_noisy_histogram(scores, pairs.clean, path, f"{name}: training pairs")
      # scores in example-id order with the noise index they were computed on: NC-bench's ROC curves, and the
      # prior scores of a composed method (NCU's `method.forget_from='scores'`)
      save_clean_scores(path[:-len("clean_noisy.png")] + "clean_scores.npz", scores, pairs.clean,
                        pairs.noise_sha256, name)
    return metrics


def pair_scores(eval_model, pairs, tokenizer, batch_size, mesh) -> np.ndarray:
  """The model's score of every training pair (image caption_to_image[k] with caption k), in id order."""
  img = common.embed_images(eval_model, pairs.images(), batch_size, mesh)
  txt = common.embed_texts(eval_model, pairs.token_ids(tokenizer), batch_size, mesh)
  pairs_img = img[pairs.caption_to_image]
  out = np.empty(len(txt), np.float32)
  if eval_model.pair_score is not None:    # aligned pairs only (a learned similarity's full block is costly)
    fn = eval_model.jitted("pair_score")
    for s in range(0, len(txt), batch_size):
      out[s:s + batch_size] = np.asarray(fn(jnp.asarray(pairs_img[s:s + batch_size]),
                                            jnp.asarray(txt[s:s + batch_size])), np.float32)
    return out
  for s in range(0, len(txt), 4096):
    block = common.score_matrix(eval_model, pairs_img[s:s + 4096], txt[s:s + 4096])
    out[s:s + 4096] = np.diagonal(block)
  return out
