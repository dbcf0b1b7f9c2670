"""Diagnostic plots (PNG): similarity distributions (as NCU's Figure 5) and clean-vs-noisy score histograms
(as GSC's Figure 5 and the Bayesian-CL paper's Figure 3)."""

from __future__ import annotations

import numpy as np

from ncjax import fileio


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _finish(plt, fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> str:
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=120)   # a local path or gs://
  plt.close(fig)
  return path


def similarity_statistics(similarity, caption_to_image, top_fraction: float = 0.05) -> dict:
  """Per caption: the positive pair's similarity, the mean over its negatives, and the mean of its top-5% negatives."""
  s = np.asarray(similarity, np.float32).T           # (captions, images)
  c2i = np.asarray(caption_to_image)
  n_cap, n_img = s.shape
  pos = s[np.arange(n_cap), c2i]
  neg = s.copy()
  neg[np.arange(n_cap), c2i] = np.nan
  k = max(1, int(round(top_fraction * (n_img - 1))))
  top = -np.sort(-np.nan_to_num(neg, nan=-np.inf), axis=1)[:, :k]
  return dict(positive=pos, mean_negative=np.nanmean(neg, axis=1), top_negative=top.mean(axis=1))


def plot_similarity_distributions(similarity, caption_to_image, path: str, title: str = "") -> str:
  stats = similarity_statistics(similarity, caption_to_image)
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for key, label in (("positive", "positive pairs"), ("mean_negative", "mean of negatives"),
                     ("top_negative", "top-5% negatives")):
    ax.hist(stats[key], bins=50, alpha=0.55, density=True, label=label)
  return _finish(plt, fig, ax, path, "similarity", "density", title or "similarity distributions")


def plot_clean_noisy_histogram(scores, clean, path: str, title: str = "", xlabel: str = "clean score") -> str:
  scores = np.asarray(scores, np.float64)
  clean = np.asarray(clean, bool)
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  bins = np.linspace(np.nanmin(scores), np.nanmax(scores) + 1e-12, 50)
  ax.hist(scores[clean], bins=bins, alpha=0.6, label=f"clean pairs (n={int(clean.sum())})", color="tab:blue")
  ax.hist(scores[~clean], bins=bins, alpha=0.6, label=f"noisy pairs (n={int((~clean).sum())})", color="tab:red")
  return _finish(plt, fig, ax, path, xlabel, "count", title or "clean vs noisy")


def plot_norm_distributions(norms: dict, path: str, title: str = "") -> str:
  """Histograms of embedding norms by group, e.g. {'forget images': ..., 'retain images': ..., ...} (HAC's
  hyperbolic norms: how far from the generic origin each embedding sits)."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  values = [np.asarray(v, np.float64) for v in norms.values()]
  lo, hi = min(float(v.min()) for v in values), max(float(v.max()) for v in values)
  bins = np.linspace(lo, hi + 1e-9, 40)
  for (label, v) in zip(norms, values):
    ax.hist(v, bins=bins, alpha=0.5, density=True, label=f"{label} (n={len(v)})")
  return _finish(plt, fig, ax, path, "Lorentz norm d(O, x)", "density", title or "embedding norms")


def roc_curve(scores, positive) -> tuple[np.ndarray, np.ndarray]:
  """(false-positive rate, true-positive rate) of `scores` ranking the `positive` items first (ties together)."""
  scores = np.asarray(scores, np.float64)
  positive = np.asarray(positive, bool)
  order = np.argsort(-scores, kind="stable")
  s, p = scores[order], positive[order]
  last_of_tie = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]
  tp = np.cumsum(p)[last_of_tie]
  fp = np.cumsum(~p)[last_of_tie]
  return (np.r_[0.0, fp / max(int((~positive).sum()), 1)], np.r_[0.0, tp / max(int(positive.sum()), 1)])


def plot_roc_curves(curves: dict, path: str, title: str = "") -> str:
  """Noise-detection ROC curves, one per method: {label: (scores, clean)}; clean pairs are the positives."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(5, 5))
  for label, (scores, clean) in curves.items():
    fpr, tpr = roc_curve(scores, clean)
    ax.plot(fpr, tpr, label=label)
  ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
  return _finish(plt, fig, ax, path, "noisy pairs ranked as clean (FPR)", "clean pairs ranked as clean (TPR)",
                 title or "noise detection ROC")


def plot_metric_vs_noise(series: dict, path: str, ylabel: str, title: str = "") -> str:
  """{method: (noise levels, means, stds)} as lines with error bars."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, (x, mean, std) in series.items():
    ax.errorbar(np.asarray(x) * 100, mean, yerr=std, marker="o", capsize=3, label=label)
  return _finish(plt, fig, ax, path, "noise (% of pairs)", ylabel, title or f"{ylabel} vs noise")
