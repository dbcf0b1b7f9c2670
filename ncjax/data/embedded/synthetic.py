"""A synthetic image-caption set of any size (random pixels, captions from a small word list).

For benchmarks and smoke runs where only shapes matter; it carries no signal worth learning.
"""

from __future__ import annotations

import numpy as np

from ncjax.data.types import PairSplit

_WORDS = ("a", "photo", "of", "the", "red", "green", "blue", "small", "large", "cat", "dog", "car", "tree", "house",
          "on", "in", "with", "near", "bright", "dark")


def load(split: str, image_size: int = 32, num_examples: int = 4096, seed: int = 0) -> PairSplit:
  rng = np.random.Generator(np.random.PCG64([seed, split == "test"]))
  n = num_examples if split == "train" else max(64, num_examples // 8)
  images = rng.normal(size=(n, image_size, image_size, 3)).astype(np.float32)
  lengths = rng.integers(4, 12, size=n)
  captions = [" ".join(rng.choice(_WORDS, size=k)) for k in lengths]
  return PairSplit(images=images, captions=captions, caption_to_image=np.arange(n), name=f"synthetic/{split}")
