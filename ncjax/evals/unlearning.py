"""Unlearning metrics: forget-set and retain-set accuracy (F-acc, R-acc) and retrieval, with explicit switches.

Definitions differ between papers, so the choices are arguments, never implicit:
  keep_forget_classes_in_labelset: whether the zero-shot classifier still offers the forget classes. If not, the
    label set is the retained classes only (F-acc is then 0 by construction; R-acc changes).
  average: 'micro' (over images) or 'macro' (mean of per-class accuracies).
"""

from __future__ import annotations

import numpy as np

from ncjax.evals import retrieval


def _acc(pred, labels, average: str):
  if len(labels) == 0:
    return float("nan")
  if average == "micro":
    return float(np.mean(pred == labels))
  if average == "macro":
    return float(np.mean([np.mean(pred[labels == k] == k) for k in np.unique(labels)]))
  raise ValueError(f"average must be 'micro' or 'macro', got {average!r}")


def forget_retain_accuracy(scores, labels, forget_classes, *, keep_forget_classes_in_labelset: bool = True,
                           average: str = "micro") -> dict:
  """F-acc / R-acc of a zero-shot classifier's scores (N, C) on images with `labels`."""
  scores = np.asarray(scores, np.float32)
  labels = np.asarray(labels)
  forget_classes = np.asarray(sorted(set(int(c) for c in forget_classes)))
  if forget_classes.size == 0:
    raise ValueError("forget_classes is empty")
  allowed = np.ones(scores.shape[1], bool)
  if not keep_forget_classes_in_labelset:
    allowed[forget_classes] = False
  masked = np.where(allowed[None, :], scores, -np.inf)
  pred = np.argmax(masked, axis=1)
  is_forget = np.isin(labels, forget_classes)
  return dict(F_acc=_acc(pred[is_forget], labels[is_forget], average),
              R_acc=_acc(pred[~is_forget], labels[~is_forget], average),
              n_forget=int(is_forget.sum()), n_retain=int((~is_forget).sum()),
              keep_forget_classes_in_labelset=keep_forget_classes_in_labelset, average=average)


def forget_retain_retrieval(similarity, caption_to_image, forget_images, ks=(1, 5, 10)) -> dict:
  """R@K on forget vs retain pairs, each query searching the whole gallery.

  forget_images: bool (n_images,) or image indices. i2t averages over forget (retain) images, t2i over the captions
  of forget (retain) images.
  """
  c2i = np.asarray(caption_to_image)
  n_img = np.asarray(similarity).shape[0]
  mask = np.zeros(n_img, bool)
  forget_images = np.asarray(forget_images)
  mask[forget_images if forget_images.dtype != bool else np.flatnonzero(forget_images)] = True
  i2t, t2i = retrieval.ranks(similarity, c2i)
  has = np.zeros(n_img, bool)
  has[c2i] = True
  img_forget = mask[has]
  cap_forget = mask[c2i]
  out = {}
  for name, im_sel, cap_sel in (("forget", img_forget, cap_forget), ("retain", ~img_forget, ~cap_forget)):
    for k in ks:
      out[f"{name}_i2t_R@{k}"] = 100.0 * float(np.mean(i2t[im_sel] < k)) if im_sel.any() else float("nan")
      out[f"{name}_t2i_R@{k}"] = 100.0 * float(np.mean(t2i[cap_sel] < k)) if cap_sel.any() else float("nan")
  return out
