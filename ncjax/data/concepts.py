"""Concept splits for unlearning: choose a forget set by class labels, subreddit groups or caption keywords, and
build forget / retain training iterators over the same split (ids stay the split's ids)."""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from ncjax.data.pipeline import train_data
from ncjax.data.specs import ConceptSpec, InputSpec
from ncjax.data.types import PairSplit

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


def forget_retain_data(spec: InputSpec, split: PairSplit, tokenizer, mesh, mask: np.ndarray, noisy=None, *,
                       image_size: int):
  """Two TrainData over the forget and the retain examples (same batch size, seed and transforms)."""
  forget, retain = forget_retain(split, mask)
  return (train_data(spec, split, tokenizer, mesh, noisy, image_size=image_size, subset=forget),
          train_data(spec, split, tokenizer, mesh, noisy, image_size=image_size, subset=retain))


class ForgetRetainData:
  """Global batches of N retain and N forget pairs, the slides' batch for alignment calibration (AC / HAC).

  Two input streams over the same split: the retain examples and the forget examples, each in its own
  deterministic epoch order (as TrainData's). Step s takes the s-th batch of N of each (the
  smaller forget set cycles through fresh permutations). An epoch is one pass over the retain set. Each process
  builds its part of both halves; the batch carries `forget` (bool), which tells the method which pairs to forget
  (a method input, not a diagnostic). N must be divisible by the device count.
  """

  def __init__(self, spec: InputSpec, split: PairSplit, tokenizer, mesh, mask: np.ndarray, noisy=None, *,
               image_size: int):
    from ncjax.data.pipeline import batch_axes
    from jax.sharding import NamedSharding, PartitionSpec as P
    if spec.global_batch_size % 2:
      raise ValueError(f"a forget/retain batch holds N retain and N forget pairs: global batch size "
                       f"{spec.global_batch_size} is odd")
    n = spec.global_batch_size // 2
    forget, retain = forget_retain(split, mask)
    if len(forget) < n:
      raise ValueError(f"the forget set has {len(forget)} pairs, fewer than the N = {n} per batch (global batch "
                       f"{spec.global_batch_size} = 2N); lower input.global_batch_size")
    half = dataclasses.replace(spec, global_batch_size=n)
    self.forget_data = train_data(half, split, tokenizer, mesh, noisy, image_size=image_size, subset=forget)
    self.retain_data = train_data(half, split, tokenizer, mesh, noisy, image_size=image_size, subset=retain)
    self.forget_ids, self.retain_ids = forget, retain
    self.global_batch_size = 2 * n
    self.sharding = NamedSharding(mesh, P(batch_axes(mesh)))

  def __getattr__(self, name):
    # The split, its size, clean flags, tokens, transforms: shared by both streams.
    if name in ("split", "tokenizer", "num_examples", "caption_to_image", "clean", "noise_sha256", "tokens", "pairs",
                "image_size", "normalization", "mesh", "seed", "in_memory"):
      return getattr(self.retain_data, name)
    raise AttributeError(name)

  @property
  def steps_per_epoch(self) -> int:
    return self.retain_data.steps_per_epoch

  def indices(self, step: int) -> np.ndarray:
    return np.concatenate([self.retain_data.indices(step), self.forget_data.indices(step)])

  def iterator_state(self, step: int) -> dict:
    return dict(kind="forget_retain", order_version=self.retain_data.iterator_state(step)["order_version"],
                next_step=int(step), retain=self.retain_data.iterator_state(step),
                forget=self.forget_data.iterator_state(step))

  def batches(self, start_step: int, stop_step: int):
    import jax
    streams = zip(range(start_step, stop_step), self.retain_data.host_batches(start_step, stop_step),
                  self.forget_data.host_batches(start_step, stop_step))
    for step, r, f in streams:
      host = {k: np.concatenate([r[k], f[k]]) for k in r if not k.startswith("_")}
      host["forget"] = np.concatenate([np.zeros(len(r["id"]), bool), np.ones(len(f["id"]), bool)])
      arrays = {k: jax.make_array_from_process_local_data(self.sharding, v, (self.global_batch_size,) + v.shape[1:])
                for k, v in host.items()}
      ids = np.asarray(host["id"]) if jax.process_count() == 1 else self.indices(step)
      yield arrays, ids, {"skipped_records": int(np.sum(r["_skipped"]) + np.sum(f["_skipped"]))}


def concept_mask_of(concept: ConceptSpec, split: PairSplit) -> np.ndarray | None:
  """The forget mask of a concept (classes, subreddits, keywords), or None when no concept is set."""
  if not concept.named:
    return None
  return concept_mask(split, classes=tuple(concept.classes), subreddits=tuple(concept.subreddits),
                      keywords=tuple(concept.keywords))


def concept_train_data(spec: InputSpec, concept: ConceptSpec, split: PairSplit, tokenizer, mesh, noisy, *,
                       image_size: int):
  """The training pipeline `concept.train_on` asks for: 'all' pairs (an ordinary TrainData), the 'retain' pairs
  only (fine-tuning without the concept: f-C-R / f-M-R), or 'forget_retain' batches (AC / HAC)."""
  train_on = concept.train_on
  mask = concept_mask_of(concept, split)
  if mask is None:
    if train_on != "all":
      raise ValueError(f"concept.train_on={train_on!r} needs a concept: set concept.classes, concept.subreddits or "
                       f"concept.keywords")
    return train_data(spec, split, tokenizer, mesh, noisy, image_size=image_size)
  if not mask.any():
    raise ValueError(f"the concept {dataclasses.asdict(concept)} selects no pair of {split.name}")
  if train_on == "all":
    return train_data(spec, split, tokenizer, mesh, noisy, image_size=image_size)
  if train_on == "retain":
    return train_data(spec, split, tokenizer, mesh, noisy, image_size=image_size,
                      subset=forget_retain(split, mask)[1])
  return ForgetRetainData(spec, split, tokenizer, mesh, mask, noisy, image_size=image_size)
