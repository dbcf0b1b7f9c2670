"""Concept splits for unlearning: choose a forget set by class labels, subreddit groups or caption keywords, and
build forget / retain training iterators over the same split (ids stay the split's ids)."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ncjax.data.pipeline import train_data_from_config
from ncjax.data.types import PairSplit
from ncjax.models import image_size_of

# Subreddit groups in the spirit of RedCaps' topical communities; extend or pass your own lists.
SUBREDDIT_GROUPS = {
    "cats": ("cats", "catpictures", "catsstandingup", "supermodelcats", "blackcats", "kitty"),
    "dogs": ("dogs", "dogpictures", "puppies", "rarepuppers", "corgi", "goldenretrievers"),
    "food": ("food", "foodporn", "breakfastfood", "baking", "pizza", "sushi"),
    "birds": ("birds", "birding", "birdpics", "parrots", "owls"),
}


def concept_mask(split: PairSplit, *, classes: Sequence[int | str] = (), subreddits: Sequence[str] = (),
                 keywords: Sequence[str] = ()) -> np.ndarray:
  """Boolean mask over the split's examples (captions) belonging to the concept.

  classes: class indices or names (by the image's label); subreddits: names or group names of SUBREDDIT_GROUPS
  (by the image's subreddit); keywords: whole words, case-insensitive, in the caption. Criteria are OR-ed.
  """
  if not (classes or subreddits or keywords):
    raise ValueError("a concept needs at least one of classes, subreddits or keywords")
  mask = np.zeros(split.num_captions, bool)
  if classes:
    if split.image_labels is None:
      raise ValueError(f"{split.name} has no class labels; select the concept by keywords instead")
    ids = [split.class_names.index(c) if isinstance(c, str) else int(c) for c in classes]
    mask |= np.isin(split.image_labels[split.caption_to_image], ids)
  if subreddits:
    sub = split.image_meta.get("subreddit") if split.image_meta else None
    if sub is None:
      raise ValueError(f"{split.name} carries no subreddit per image (RedCaps keeps it)")
    names = set()
    for s in subreddits:
      names.update(n.lower() for n in SUBREDDIT_GROUPS.get(s.lower(), (s,)))
    per_image = np.asarray([str(x).lower() in names for x in sub])
    mask |= per_image[split.caption_to_image]
  if keywords:
    rx = re.compile(r"\b(" + "|".join(re.escape(k.lower()) for k in keywords) + r")\b")
    mask |= np.asarray([bool(rx.search(c.lower())) for c in split.captions])
  return mask


def forget_retain(split: PairSplit, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(forget example ids, retain example ids)."""
  mask = np.asarray(mask, bool)
  if mask.shape != (split.num_captions,):
    raise ValueError(f"concept mask has shape {mask.shape}; expected ({split.num_captions},)")
  return np.flatnonzero(mask), np.flatnonzero(~mask)


def forget_retain_data(config, split: PairSplit, tokenizer, mesh, mask: np.ndarray, noisy=None):
  """Two TrainData over the forget and the retain examples (same batch size, seed and transforms)."""
  forget, retain = forget_retain(split, mask)
  size = image_size_of(config.model)
  return (train_data_from_config(config.input, split, tokenizer, mesh, noisy, image_size=size, subset=forget),
          train_data_from_config(config.input, split, tokenizer, mesh, noisy, image_size=size, subset=retain))
