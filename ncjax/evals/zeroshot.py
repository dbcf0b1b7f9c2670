"""Zero-shot classification with prompt ensembles (CLIP / open_clip / CLIP_benchmark convention).

Per class: encode every template filled with the class name, normalise each embedding, average over templates and
renormalise. Images are scored against the class embeddings with the model's own score (cosine for CLIP; the
Lorentzian inner product for MERU). Reported: top-1, top-5 (NaN with fewer than 5 classes) and mean per-class recall.
"""

from __future__ import annotations

import numpy as np

from ncjax.evals import common


def ensemble_sphere(template_embeddings: np.ndarray) -> np.ndarray:
  """(C, T, D) -> (C, D): normalise each template embedding, mean over templates, renormalise."""
  e = template_embeddings / np.maximum(np.linalg.norm(template_embeddings, axis=-1, keepdims=True), 1e-12)
  m = e.mean(axis=1)
  return m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)


def classifier(eval_model, tokenizer, class_names, templates, mesh, batch_size: int = 512) -> np.ndarray:
  texts = [t.format(c) for c in class_names for t in templates]
  emb = common.embed_texts(eval_model, tokenizer.encode(texts), batch_size, mesh)
  emb = emb.reshape(len(class_names), len(templates), -1)
  ensemble = getattr(eval_model, "ensemble", None) or ensemble_sphere
  return ensemble(emb)


def accuracy(scores: np.ndarray, labels: np.ndarray, num_classes: int | None = None) -> dict:
  """top-1 / top-5 accuracy (fractions) and mean per-class recall (balanced accuracy). Ties: lower class first."""
  scores = np.asarray(scores, np.float32)
  labels = np.asarray(labels)
  n, c = scores.shape
  order = np.argsort(-scores, axis=1, kind="stable")
  pred = order[:, 0]
  top1 = pred == labels
  out = {"acc1": float(top1.mean()) if n else float("nan")}
  out["acc5"] = float((order[:, :5] == labels[:, None]).any(axis=1).mean()) if c >= 5 else float("nan")
  classes = np.unique(labels) if num_classes is None else np.arange(num_classes)
  recalls = [top1[labels == k].mean() for k in classes if np.any(labels == k)]
  out["mean_per_class_recall"] = float(np.mean(recalls)) if recalls else float("nan")
  return out
