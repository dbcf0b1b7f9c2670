"""Synthetic region features with a planted caption signal ('precomp_synthetic'): an offline stand-in for NCR's
F30K / COCO precomp data, small enough to train SGRAF, GSC and DisNCL on a CPU in minutes.

Each image has `regions` region features of `feature_dim` floats: `objects_per_image` of them are the vectors of
its objects (a fixed random vector per object word, plus noise); the others are background regions drawn around a
per-image "scene" vector that no caption mentions (modality-exclusive information on the image side). Each image has
`captions_per_image` consecutive captions naming two or three of its objects in random order, some with words that
no region shows ("a famous", "historic": modality-exclusive information on the text side). Caption k belongs to
image k // captions_per_image, as NCR's layout. Train and test share the object vectors (seed 0) and draw different
images. `write_ncr_layout` writes the same data as NCR's `{split}_ims.npy` + `{split}_caps.txt` files.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ncjax.data.types import PairSplit

OBJECTS = ("dog", "cat", "horse", "bird", "car", "bike", "boat", "tree", "house", "bench", "ball", "kite", "train",
           "bus", "chair", "table", "cup", "phone", "book", "clock", "lamp", "bridge", "tower", "river", "hill",
           "flower", "fence", "road", "sign", "umbrella")
EXCLUSIVE = ("famous", "historic", "beautiful", "old", "legendary", "classic", "quiet", "busy")
SIZES = dict(train=1200, test=200, dev=200)


def generate(num_images: int, *, seed: int, captions_per_image: int = 2, regions: int = 12, feature_dim: int = 64,
             objects_per_image: int = 3, noise: float = 0.35):
  """(features (n, regions, feature_dim) float32, captions list, caption_to_image); the arrays read-only, shared
  by every call with the same arguments (each experiment on this data loads its splits again: ~1 s each)."""
  feats, captions, c2i = _generate(num_images, seed, captions_per_image, regions, feature_dim, objects_per_image,
                                   noise)
  return feats, list(captions), c2i


@functools.lru_cache(maxsize=8)
def _generate(num_images, seed, captions_per_image, regions, feature_dim, objects_per_image, noise):
  concept_rng = np.random.default_rng(0)
  concepts = concept_rng.normal(size=(len(OBJECTS), feature_dim)) / np.sqrt(feature_dim) * 3.0
  rng = np.random.default_rng(seed)
  feats = np.empty((num_images, regions, feature_dim), np.float32)
  captions, c2i = [], []
  for i in range(num_images):
    objs = rng.choice(len(OBJECTS), size=objects_per_image, replace=False)
    scene = rng.normal(size=feature_dim) / np.sqrt(feature_dim) * 3.0
    rows = [concepts[o] + noise * rng.normal(size=feature_dim) / np.sqrt(feature_dim) * 3.0 for o in objs]
    rows += [scene + rng.normal(size=feature_dim) / np.sqrt(feature_dim) * 3.0
             for _ in range(regions - objects_per_image)]
    feats[i] = np.asarray(rows)[rng.permutation(regions)]
    for _ in range(captions_per_image):
      named = rng.permutation(objs)[: rng.integers(2, objects_per_image + 1)]
      words = [OBJECTS[o] for o in named]
      text = "a " + " and a ".join(words[:-1]) + " near a " + words[-1]
      if rng.random() < 0.5:
        text = f"a {EXCLUSIVE[rng.integers(len(EXCLUSIVE))]} scene with " + text
      captions.append(text)
      c2i.append(i)
  c2i = np.asarray(c2i, np.int64)
  feats.flags.writeable = c2i.flags.writeable = False
  return feats, tuple(captions), c2i


def load(split: str, image_size: int = 0, *, num_images: int | None = None, **kwargs) -> PairSplit:
  """The in-memory split (`input.dataset='precomp_synthetic'`); `image_size` is unused (features, not pixels)."""
  del image_size
  if split not in SIZES:
    raise ValueError(f"precomp_synthetic has splits {sorted(SIZES)}, not {split!r}")
  n = SIZES[split] if num_images is None else num_images
  feats, caps, c2i = generate(n, seed=1 + sorted(SIZES).index(split), **kwargs)
  return PairSplit(images=feats, captions=caps, caption_to_image=c2i, name=f"precomp_synthetic/{split}")


def write_ncr_layout(directory: str, sizes: dict[str, int] | None = None, *, captions_per_image: int = 5,
                     **kwargs) -> str:
  """Write the synthetic data as NCR's precomp files ({split}_ims.npy, {split}_caps.txt with five consecutive
  captions per image, as F30K / COCO), buildable with
  `python -m ncjax.data.build --dataset=precomp/f30k_precomp --manual_dir=DIR --data_dir=...`."""
  os.makedirs(directory, exist_ok=True)
  for split, n in (sizes or SIZES).items():
    feats, caps, _ = generate(n, seed=1 + sorted(SIZES).index(split), captions_per_image=captions_per_image,
                              **kwargs)
    np.save(os.path.join(directory, f"{split}_ims.npy"), feats)
    with open(os.path.join(directory, f"{split}_caps.txt"), "w", encoding="utf-8") as f:
      f.write("\n".join(caps) + "\n")
  return directory
