"""In-memory image-caption datasets: the record layout every source is converted to.

A split holds images, captions, and an explicit caption->image index (never "k captions per image" assumed).
Training iterates over captions: example k is (image caption_to_image[k], caption k) with stable id k.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class PairSplit:
  images: np.ndarray             # (n_images, H, W, C) float32, already normalised for the model
  captions: list[str]            # (n_captions,)
  caption_to_image: np.ndarray   # int64 (n_captions,), the true image of each caption
  image_labels: np.ndarray | None = None  # int (n_images,) class label where the dataset has one
  image_ids: np.ndarray | None = None     # stable per-image ids (source row numbers)
  class_names: tuple[str, ...] = ()
  name: str = ""
  image_meta: dict | None = None           # per-image metadata lists (e.g. 'subreddit' for RedCaps)
  pair_clean: np.ndarray | None = None     # bool (n_captions,): a ground-truth clean flag of the data's own
                                           # pairs (a table's clean column), for diagnostics only
  vocabulary: tuple[str, ...] | None = None  # the dataset's own word list (NCR's precomp vocabulary), if it has one

  def __post_init__(self):
    self.caption_to_image = np.asarray(self.caption_to_image, np.int64)
    if len(self.captions) != len(self.caption_to_image):
      raise ValueError(f"{self.name}: {len(self.captions)} captions but a caption->image index of length "
                       f"{len(self.caption_to_image)}")
    if len(self.caption_to_image) and (self.caption_to_image.min() < 0 or
                                       self.caption_to_image.max() >= len(self.images)):
      raise ValueError(f"{self.name}: caption->image index refers to images outside [0, {len(self.images)})")

  @property
  def num_images(self) -> int:
    return len(self.images)

  @property
  def num_captions(self) -> int:
    return len(self.captions)
