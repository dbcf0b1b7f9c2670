"""Unlearning metrics: forget-set and retain-set accuracy (F-acc, R-acc) and retrieval, with explicit switches.

Definitions differ between papers, so the choices are arguments, never implicit:
  keep_forget_classes_in_labelset: whether the zero-shot classifier still offers the forget classes. If not, the
    label set is the retained classes only (F-acc is then 0 by construction; R-acc changes).
  average: 'micro' (over images) or 'macro' (mean of per-class accuracies).
"""

from __future__ import annotations

import numpy as np

from ncjax.evals import common, plots, retrieval
from ncjax.evals.base import Evaluator, register
from ncjax.evals.zeroshot import ZeroShot


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


@register("unlearning")
class Unlearning(Evaluator):
  """F-acc / R-acc of zero-shot classification for `forget_classes`, retrieval R@K on forget vs retain pairs, and
  for MERU models the Lorentz norms of forget vs retain embeddings (means, and a PNG of their distributions).

  Args:
    forget_classes: class names or indices of the forgotten concept (required).
    templates: the zero-shot template set (see evals.zeroshot.templates_for).
    keep_forget_classes_in_labelset: whether the classifier still offers the forget classes.
    average: 'micro' (over images) or 'macro' (mean of per-class accuracies).
    retrieval: also report R@K on forget vs retain pairs.
    dataset, split: see Evaluator.
  """
  task = "unlearning"

  def __init__(self, context, *, forget_classes, templates: str = "auto",
               keep_forget_classes_in_labelset: bool = True, average: str = "micro", retrieval: bool = True,
               dataset: str = "", split: str = "test", data_dir: str = ""):
    super().__init__(context, dataset=dataset, split=split, data_dir=data_dir)
    if average not in ("micro", "macro"):
      raise ValueError(f"average must be 'micro' or 'macro', got {average!r}")
    self.forget_classes = list(forget_classes)
    self.templates, self.keep, self.average, self.with_retrieval = templates, keep_forget_classes_in_labelset, \
        average, retrieval

  def check(self):
    zs = ZeroShot(self.context, templates=self.templates, dataset=self.dataset, split=self.split,
                  data_dir=self.data_dir)
    zs.check()
    names = zs.data().class_names
    unknown = [c for c in self.forget_classes if isinstance(c, str) and c not in names]
    if unknown:
      raise ValueError(f"forget classes {unknown} are not classes of {zs.data().name}: {list(names)}")

  def run(self, eval_model) -> dict:
    zs = ZeroShot(self.context, templates=self.templates, dataset=self.dataset, split=self.split,
                  data_dir=self.data_dir)
    scores, split = zs.scores(eval_model)
    forget_ids = [split.class_names.index(c) if isinstance(c, str) else int(c) for c in self.forget_classes]
    out = forget_retain_accuracy(scores, split.image_labels, forget_ids,
                                 keep_forget_classes_in_labelset=self.keep, average=self.average)
    if self.with_retrieval or eval_model.norm is not None:
      ctx = self.context
      img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
      txt = common.embed_texts(eval_model, ctx.tokenizer.encode(split.captions), self.batch_size, ctx.mesh)
      forget_images = np.isin(split.image_labels, forget_ids)
      if self.with_retrieval:
        sim = common.score_matrix(eval_model, img, txt)
        out.update(forget_retain_retrieval(sim, split.caption_to_image, forget_images))
      if eval_model.norm is not None:
        out.update(self._norms(eval_model, img, txt, forget_images, split.caption_to_image))
    return {k: v for k, v in out.items() if not isinstance(v, (bool, str))}

  def _norms(self, eval_model, img, txt, forget_images, caption_to_image) -> dict:
    norm = eval_model.jitted("norm")
    img_n, txt_n = np.asarray(norm(img)), np.asarray(norm(txt))
    forget_caps = forget_images[np.asarray(caption_to_image)]
    groups = {"forget images": img_n[forget_images], "retain images": img_n[~forget_images],
              "forget texts": txt_n[forget_caps], "retain texts": txt_n[~forget_caps]}
    path = self.context.plot_path("norms")
    if path and all(len(v) for v in groups.values()):
      plots.plot_norm_distributions(groups, path, "Lorentz norms: forget vs retain")
    return {f"norm_{k.replace(' ', '_')}": float(np.mean(v)) if len(v) else float("nan") for k, v in groups.items()}
