"""Datasets, noise protocols and the training input pipeline."""

from __future__ import annotations

from ncjax.data import digits, synthetic
from ncjax.data.types import PairSplit

DATASETS = {"digits": digits.load, "synthetic": synthetic.load}


def load_split(input_config, split: str, image_size: int) -> PairSplit:
  name = input_config.dataset
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; available: {sorted(DATASETS)}")
  return DATASETS[name](split, image_size=image_size)


__all__ = ["PairSplit", "load_split", "DATASETS"]
