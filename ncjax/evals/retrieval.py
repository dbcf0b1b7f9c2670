"""Image-text retrieval recall (the NCR/SCAN/CLIP_benchmark protocol).

image->text: an image counts as a hit at K if *any* of its captions ranks in the top K (denominator: images).
text->image: each caption's single image must rank in the top K (denominator: captions).
The caption->image index is explicit: images may have any number of captions. Ranks are computed on float32 scores
with deterministic tie-breaking: among equal scores the lower index ranks first (a stable sort's order).
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from ncjax.evals import common, plots
from ncjax.evals.base import Evaluator, register


@jax.jit
def _ranks(similarity, caption_to_image):
  s = jnp.asarray(similarity, jnp.float32)
  n_img, n_cap = s.shape
  gt = caption_to_image[None, :] == jnp.arange(n_img)[:, None]           # (images, captions)
  cap_idx = jnp.arange(n_cap)
  # i2t: the ground-truth caption ranked best is the one with the highest score, ties -> lowest index.
  gt_scores = jnp.where(gt, s, -jnp.inf)
  best_score = gt_scores.max(axis=1)
  best_cap = jnp.argmax(jnp.where(gt & (s == best_score[:, None]), 1, 0), axis=1)  # first max = lowest index
  above = (s > best_score[:, None]) | ((s == best_score[:, None]) & (cap_idx[None, :] < best_cap[:, None]))
  i2t = jnp.sum(above, axis=1)
  # t2i: rank of each caption's image among all images for that caption.
  own = s[caption_to_image, cap_idx]                                      # (captions,)
  img_idx = jnp.arange(n_img)
  above_t = (s > own[None, :]) | ((s == own[None, :]) & (img_idx[:, None] < caption_to_image[None, :]))
  t2i = jnp.sum(above_t, axis=0)
  has_caption = gt.any(axis=1)
  return i2t, t2i, has_caption


def ranks(similarity, caption_to_image):
  """0-based ranks: (i2t rank per image, t2i rank per caption); images without captions are dropped."""
  similarity = np.asarray(similarity, np.float32)
  c2i = np.asarray(caption_to_image, np.int32)
  if similarity.ndim != 2 or similarity.shape[1] != c2i.shape[0]:
    raise ValueError(f"similarity must be (n_images, n_captions) with n_captions = len(caption_to_image) = "
                     f"{c2i.shape[0]}; got {similarity.shape}")
  if c2i.size and (c2i.min() < 0 or c2i.max() >= similarity.shape[0]):
    raise ValueError("caption_to_image refers to an image outside the similarity matrix")
  i2t, t2i, has = jax.device_get(_ranks(similarity, c2i))
  return np.asarray(i2t)[np.asarray(has)], np.asarray(t2i)


def recall_at_k(similarity, caption_to_image, ks=(1, 5, 10)) -> dict:
  """R@K both ways (percent), rsum, median and mean rank (1-based, NCR's convention).

  Also CLIP_benchmark-style keys (fractions): text_retrieval_recall@K (= image->text) and
  image_retrieval_recall@K (= text->image).
  """
  i2t, t2i = ranks(similarity, caption_to_image)
  out = {}
  for k in ks:
    out[f"i2t_R@{k}"] = 100.0 * float(np.mean(i2t < k))
    out[f"t2i_R@{k}"] = 100.0 * float(np.mean(t2i < k))
    out[f"text_retrieval_recall@{k}"] = float(np.mean(i2t < k))
    out[f"image_retrieval_recall@{k}"] = float(np.mean(t2i < k))
  out["rsum"] = sum(out[f"i2t_R@{k}"] + out[f"t2i_R@{k}"] for k in ks)
  out["i2t_medr"] = float(np.floor(np.median(i2t)) + 1)
  out["i2t_meanr"] = float(np.mean(i2t) + 1)
  out["t2i_medr"] = float(np.floor(np.median(t2i)) + 1)
  out["t2i_meanr"] = float(np.mean(t2i) + 1)
  return out


def recall_at_k_folds(similarity, caption_to_image, n_folds: int = 5, ks=(1, 5, 10)) -> dict:
  """NCR's COCO 1K protocol: split the images into `n_folds` consecutive folds, evaluate each, average."""
  similarity = np.asarray(similarity, np.float32)
  c2i = np.asarray(caption_to_image, np.int64)
  n_img = similarity.shape[0]
  if n_img % n_folds:
    raise ValueError(f"{n_img} images do not split into {n_folds} equal folds")
  size = n_img // n_folds
  results = []
  for f in range(n_folds):
    caps = np.flatnonzero((c2i >= f * size) & (c2i < (f + 1) * size))
    results.append(recall_at_k(similarity[f * size:(f + 1) * size][:, caps], c2i[caps] - f * size, ks))
  return {k: float(np.mean([r[k] for r in results])) for k in results[0]}


@register("retrieval")
class Retrieval(Evaluator):
  """Image-text retrieval on the split's pairs.

  Args:
    folds: if > 0, also NCR's k-fold average (COCO 1K: folds=5).
    plot: write the similarity-distribution PNG.
    dataset, split: see Evaluator.
  """
  task = "zeroshot_retrieval"

  def __init__(self, context, *, folds: int = 0, plot: bool = True, dataset: str = "", split: str = "test",
               data_dir: str = ""):
    super().__init__(context, dataset=dataset, split=split, data_dir=data_dir)
    self.folds, self.plot = int(folds), plot

  def run(self, eval_model) -> dict:
    split = self.data()
    ctx = self.context
    img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
    txt = common.embed_texts(eval_model, ctx.tokenizer.encode(split.captions), self.batch_size, ctx.mesh)
    sim = common.score_matrix(eval_model, img, txt)
    out = recall_at_k(sim, split.caption_to_image)
    if self.folds:
      out.update({f"{self.folds}fold_{k}": v for k, v in
                  recall_at_k_folds(sim, split.caption_to_image, self.folds).items()})
    path = ctx.plot_path("similarity")
    if path and self.plot:
      plots.plot_similarity_distributions(sim, split.caption_to_image, path, f"{split.name}: similarities")
    return out
