"""Loading built tfds datasets as PairSplits whose images are read lazily from ArrayRecord (no TensorFlow)."""

from __future__ import annotations

import io
import json

import numpy as np

from ncjax import fileio
from ncjax.data import preprocess, readers, tfds_builders
from ncjax.data.types import PairSplit


class RecordImages:
  """Random access to the images of a built split by image id: encoded bytes, or feature arrays (precomp)."""

  def __init__(self, data_source, positions: np.ndarray, kind: str, name: str):
    self.ds, self.positions, self.kind, self.name = data_source, positions, kind, name

  def __len__(self):
    return len(self.positions)

  def record(self, image_id: int) -> dict:
    return self.ds[int(self.positions[image_id])]

  def raw(self, image_id: int):
    return self.record(image_id)["image"]

  def field(self, image_id: int, key: str):
    return self.record(image_id)[key]


class TransformedImages:
  """A view applying the evaluation transform when sliced (what evaluators batch over)."""

  def __init__(self, images: RecordImages, size: int, normalization: str, resize: str = "shortest"):
    self.images, self.size, self.normalization, self.resize = images, size, normalization, resize

  def __len__(self):
    return len(self.images)

  def load(self, image_id: int) -> np.ndarray:
    raw = self.images.raw(image_id)
    if self.images.kind == "features":
      return np.asarray(raw, np.float32)
    return preprocess.eval_transform(readers.decode_image(raw), self.size, self.normalization, self.resize)

  def __getitem__(self, key):
    if isinstance(key, slice):
      return np.stack([self.load(i) for i in range(*key.indices(len(self)))])
    if isinstance(key, (np.ndarray, list)):
      return np.stack([self.load(int(i)) for i in key])
    return self.load(int(key))


def parse_tfds_name(dataset: str) -> tuple[str, str | None]:
  """'tfds:karpathy/flickr30k' -> ('karpathy', 'flickr30k')."""
  body = dataset.split(":", 1)[1]
  name, _, config = body.partition("/")
  return name, (config or None)


def load_tfds_split(dataset: str, data_dir: str, split: str) -> PairSplit:
  name, config = parse_tfds_name(dataset)
  builder = tfds_builders.builder_for(name, config, data_dir)
  index_path = fileio.join(str(builder.data_dir), tfds_builders.INDEX_FILE)
  if not fileio.isfile(index_path):
    raise readers.DataFormatError(
        f"dataset {name}/{config or 'default'} is not built under {data_dir or '~/tensorflow_datasets'} "
        f"(no {index_path}); build it first: python -m ncjax.data.build --dataset={name}"
        f"{'/' + config if config else ''} --manual_dir=<your files> --data_dir={data_dir or '<dir>'}")
  if split not in builder.info.splits:
    raise readers.DataFormatError(f"{name}/{config}: no split {split!r}; built splits: {list(builder.info.splits)}")
  index = np.load(io.BytesIO(fileio.read_bytes(index_path)))   # a local path or gs://
  tables = json.loads(fileio.read_text(fileio.join(str(builder.data_dir), "ncjax_captions.json")))
  captions = tables[split]
  meta = {"subreddit": tables[f"{split}:subreddit"]} if f"{split}:subreddit" in tables else None
  ds = builder.as_data_source(split=split)
  kind = "features" if name == "precomp" else "encoded"
  images = RecordImages(ds, index[f"{split}/positions"], kind, f"{name}/{split}")
  labels = class_names = pair_clean = None
  if name == "digits":
    from ncjax.data.digits import CLASS_NAMES
    labels = np.asarray([int(images.field(i, "label")) for i in range(len(images))])
    class_names = CLASS_NAMES
  elif f"{split}/labels" in index.files:    # a table's label column (web_pairs/custom_table --label_column)
    labels = index[f"{split}/labels"]
    class_names = tuple(tables.get("class_names", ())) or tuple(str(i) for i in range(int(labels.max()) + 1))
    if (labels < 0).any():
      raise readers.DataFormatError(f"{name}/{config}/{split}: {int((labels < 0).sum())} images have no label")
  if f"{split}/clean" in index.files:       # a ground-truth clean flag per pair (diagnostics only)
    pair_clean = index[f"{split}/clean"] > 0
  vocabulary = None
  vocab_path = fileio.join(str(builder.data_dir), tfds_builders.VOCAB_FILE)
  if fileio.isfile(vocab_path):    # NCR's precomp vocabulary, kept at build time
    vocabulary = tuple(json.loads(fileio.read_text(vocab_path))["words"])
  return PairSplit(images=images, captions=captions, caption_to_image=index[f"{split}/caption_to_image"],
                   image_labels=labels, class_names=class_names or (), name=f"{name}/{config or 'default'}/{split}",
                   image_meta=meta, pair_clean=pair_clean, vocabulary=vocabulary)
