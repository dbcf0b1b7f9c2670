"""Datasets, noise protocols and the training input pipeline."""

from __future__ import annotations

import numpy as np

from ncjax.data import digits, synthetic
from ncjax.data.types import PairSplit
from ncjax.registry import Registry

# In-memory datasets by name: load(split, image_size=...) -> PairSplit. Built tfds datasets are 'tfds:<builder>/...'.
DATASETS: Registry = Registry("dataset")
DATASETS.add("digits", digits.load)
DATASETS.add("synthetic", synthetic.load)


def load_split(input_config, split: str, image_size: int) -> PairSplit:
  """In-memory datasets by name; built tfds datasets as 'tfds:<builder>/<config>' (images read lazily)."""
  name = input_config.dataset
  if name.startswith("tfds:"):
    from ncjax.data import sources
    return sources.load_tfds_split(name, input_config.data_dir, split)
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; available: {DATASETS.names()} or a built 'tfds:<builder>/<config>'")
  return DATASETS[name](split, image_size=image_size)


def eval_images(split: PairSplit, image_size: int, normalization: str = "openai"):
  """The split's images as evaluators batch over them: arrays, or a view applying the evaluation transform."""
  if isinstance(split.images, np.ndarray):
    return split.images
  from ncjax.data.sources import TransformedImages
  return TransformedImages(split.images, image_size, normalization)


__all__ = ["PairSplit", "load_split", "eval_images", "DATASETS"]
