"""A fixed held-out part of a split, for data without a validation split of its own.

`SPLIT:fit` is the split without its held-out images (what a run trains on), `SPLIT:holdout` those images with
their captions (what a sweep selects on). The held-out images are a fixed 10% of the split's images (at least one),
drawn by a fixed seed: the same for every run, sweep and process. Whole images are held out, every caption with its
image, so no held-out image is seen in training. The carve happens before any noise is injected, so the held-out
captions are the data's own.
"""

from __future__ import annotations

import numpy as np

from ncjax.data.types import PairSplit

FRACTION = 0.1
SEED = 52   # fixed: a held-out set must not move between the runs it compares
PARTS = ("fit", "holdout")


def parse(split: str) -> tuple[str, str]:
  """'train:holdout' -> ('train', 'holdout'); 'train' -> ('train', '')."""
  base, sep, part = split.partition(":")
  if sep and part not in PARTS:
    raise ValueError(f"split {split!r}: a split's part is {' or '.join(PARTS)} ({base}:fit trains without the "
                     f"held-out images, {base}:holdout evaluates on them)")
  return base, part


def held_out_images(num_images: int) -> np.ndarray:
  """The held-out image indices of a split of `num_images` images, sorted."""
  if num_images < 2:
    raise ValueError(f"a split of {num_images} image(s) has none to hold out")
  count = min(num_images - 1, max(1, int(round(FRACTION * num_images))))
  rng = np.random.Generator(np.random.PCG64(SEED))
  return np.sort(rng.permutation(num_images)[:count])


def carve(split: PairSplit, part: str) -> PairSplit:
  """The `part` ('fit' or 'holdout') of `split`: its images, their captions (in their order) with the caption ->
  image index renumbered, and every per-image and per-pair field cut alike."""
  held = np.zeros(split.num_images, bool)
  held[held_out_images(split.num_images)] = True
  keep_images = np.flatnonzero(held if part == "holdout" else ~held)
  renumber = np.full(split.num_images, -1, np.int64)
  renumber[keep_images] = np.arange(len(keep_images))
  keep_captions = np.flatnonzero(renumber[split.caption_to_image] >= 0)

  def per_image(values):
    return None if values is None else np.asarray(values)[keep_images]

  if isinstance(split.images, np.ndarray):
    images = split.images[keep_images]
  elif hasattr(split.images, "subset"):
    images = split.images.subset(keep_images)
  else:
    raise ValueError(f"{split.name}: its images ({type(split.images).__name__}) cannot be held out in part; name a "
                     f"validation split of the data instead")
  meta = None if split.image_meta is None else {k: [v[i] for i in keep_images] for k, v in split.image_meta.items()}
  return PairSplit(
      images=images, captions=[split.captions[i] for i in keep_captions],
      caption_to_image=renumber[split.caption_to_image[keep_captions]], image_labels=per_image(split.image_labels),
      image_ids=per_image(split.image_ids), class_names=split.class_names, name=f"{split.name}:{part}",
      image_meta=meta, pair_clean=None if split.pair_clean is None else np.asarray(split.pair_clean)[keep_captions],
      vocabulary=split.vocabulary)
