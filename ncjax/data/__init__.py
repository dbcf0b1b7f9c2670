"""Datasets, noise protocols and the training input pipeline.

Sub-packages: `embedded` (the datasets generated here: digits, scenes, synthetic pairs and precomp features),
`tables` (datasets built from the user's files through tfds, and evaluation datasets read as they are), `web`
(img2dataset output at any size, streamed or indexed, local or gs://). Modules here: `pipeline` (the in-memory and
built-dataset training input, `TrainData`, `TrainingPairs`), `noise` (the noise protocols), `streams` (independent
random streams), `preprocess` (image transforms), `types` (`PairSplit`), `scores` (per-sample score files),
`concepts` (forget / retain splits for concept unlearning), `specs` (the run's input, noise and concept as typed
values: what this package takes, never a config section), `build` (`python -m ncjax.data.build`).

`input.dataset` names: an in-memory dataset ('digits', 'scenes', 'synthetic'); 'tfds:<builder>/<config>' for a dataset built
by `python -m ncjax.data.build` (web_pairs, karpathy, precomp, digits); 'tfds:<name>' for any other tfds dataset
prepared under input.data_dir (cifar10, imagenet2012, ...: classification, for evaluation); 'image_folder:PATH' for
a local labelled image tree or table, 'table:PATH' for a CSV / TSV of image-caption pairs read as it is
(ncjax.data.tables.classification); 'web:ROOT[::ROOT2...]' for img2dataset output at any size, streamed or indexed
(training only: ncjax.data.web.pipeline).
"""

from __future__ import annotations

import numpy as np

from ncjax.data import holdout
from ncjax.data.embedded import digits, precomp_synthetic, scenes, synthetic
from ncjax.data.specs import ConceptSpec, InputSpec, NoiseSpec, WebSpec
from ncjax.data.types import PairSplit
from ncjax.registry import Registry

# In-memory datasets by name: load(split, image_size=...) -> PairSplit. Built tfds datasets are 'tfds:<builder>/...'.
DATASETS: Registry = Registry("dataset")
DATASETS.add("digits", digits.load)
DATASETS.add("scenes", scenes.load)
DATASETS.add("synthetic", synthetic.load)
DATASETS.add("precomp_synthetic", precomp_synthetic.load)


def load_split(spec: InputSpec, split: str, image_size: int) -> PairSplit:
  """A split of `spec.dataset`: in-memory datasets by name; built tfds datasets as 'tfds:<builder>/<config>' under
  `spec.data_dir` (images read lazily); image folders and tables as their paths say. 'SPLIT:fit' / 'SPLIT:holdout':
  the split without / with only its fixed held-out images (ncjax.data.holdout)."""
  base, part = holdout.parse(split)
  if part:
    if spec.dataset.startswith("web:"):
      raise ValueError(f"input.split={split!r}: web data cannot hold out a part; evaluate on another dataset")
    return holdout.carve(load_split(spec, base, image_size), part)
  name = spec.dataset
  if name.startswith("web:"):
    raise ValueError(f"{name!r} is web-scale training data (ncjax.data.web.pipeline), read only by the trainer: "
                     f"evaluate on another dataset (--config.evals.NAME.dataset=...) or switch the evaluator off "
                     f"(--config.evals.NAME.enabled=False)")
  if name.startswith("image_folder:"):
    from ncjax.data.tables import classification
    return classification.load_image_folder(name[len("image_folder:"):], split)
  if name.startswith("table:"):
    from ncjax.data.tables import classification
    return classification.load_pair_table(name[len("table:"):], split)
  if name.startswith("tfds:"):
    from ncjax.data.tables import sources
    from ncjax.data.tables import builders as tfds_builders
    builder, _, config = name[len("tfds:"):].partition("/")
    if builder not in tfds_builders.BUILDERS:   # a standard tfds dataset the user prepared (cifar10, ...)
      from ncjax.data.tables import classification
      return classification.load_prepared_tfds(builder, config or None, spec.data_dir, split)
    return sources.load_tfds_split(name, spec.data_dir, split)
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; available: {DATASETS.names()} or a built 'tfds:<builder>/<config>'")
  return DATASETS[name](split, image_size=image_size)


# The validation split of an in-memory dataset that has one (the others: none; a built dataset: its own splits).
OWN_VALIDATION = {"precomp_synthetic": "dev"}
VALIDATION_NAMES = ("validation", "val", "dev")


def validation_split(spec: InputSpec) -> str | None:
  """The data's own validation split, or None where it has none (then a sweep holds out part of its training
  split, or the user names one)."""
  name = spec.dataset
  if name in OWN_VALIDATION:
    return OWN_VALIDATION[name]
  if name.startswith("tfds:"):
    from ncjax.data.tables import builders as tfds_builders
    builder, _, config = name[len("tfds:"):].partition("/")
    if builder in tfds_builders.BUILDERS:
      try:
        splits = tfds_builders.builder_for(builder, config or None, spec.data_dir).info.splits
      except Exception:  # noqa: BLE001 - not built: the run's own start-up check names the problem
        return None
      return next((s for s in VALIDATION_NAMES if s in splits), None)
  return None


def eval_images(split: PairSplit, image_size: int, normalization: str = "openai", resize: str = "shortest",
                workers: int = -1, decode: str = "thread"):
  """The split's images as evaluators batch over them: arrays, or a view applying the evaluation transform, each
  slice decoded by `workers` threads or processes (-1: one per usable core; 0: serially)."""
  if isinstance(split.images, np.ndarray):
    return split.images
  from ncjax.data.tables.sources import TransformedImages
  return TransformedImages(split.images, image_size, normalization, resize, workers=workers, decode=decode)


__all__ = ["PairSplit", "InputSpec", "NoiseSpec", "ConceptSpec", "WebSpec", "load_split", "eval_images", "DATASETS",
           "validation_split"]
