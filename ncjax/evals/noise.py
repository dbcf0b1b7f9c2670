"""Noise detection: how well a method's per-sample clean scores separate clean from noisy pairs."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


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
