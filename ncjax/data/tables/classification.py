"""Labelled image datasets from local files, for zero-shot classification and linear probes. Nothing is downloaded.

  image_folder:PATH     an ImageNet-style tree PATH/[SPLIT/]CLASS/*.{jpg,jpeg,png,webp,bmp} (classes = the sorted
                        folder names), or a table PATH/SPLIT.csv (else PATH/labels.csv) with columns `path,label`
                        (label: a class index, or a class name) and PATH/classnames.txt (one name per line, in
                        index order). For folder trees, classnames.txt may give readable names for the folders
                        ('n01440764<TAB>tench' lines, or one name per line in sorted-folder order). A SPLIT
                        sub-folder (or SPLIT.csv) is used when present; otherwise PATH itself serves every split.
  table:PATH            a CSV / TSV table of (image, caption) pairs, read as it is (no build step): PATH a .csv/.tsv
                        file, or a directory holding SPLIT.csv / SPLIT.tsv. The image column is the first of
                        filepath, image, image_path, path, file, url; the caption column the first of title, caption,
                        text, sentence (open_clip's `filepath` / `title` included); tab-separated when the header
                        holds a tab. Rows naming the same image are one image with several captions (retrieval's
                        any-caption protocol); an optional `label` column (index or name; names from classnames.txt
                        beside the table, else the sorted label strings) makes it a zero-shot dataset too; an
                        optional `clean` column (0/1) is a ground-truth flag per pair (noise detection, audits).
  tfds:NAME[/CONFIG]    a TensorFlow Datasets dataset you already prepared under `input.data_dir` (e.g. cifar10,
                        cifar100, oxford_iiit_pet, imagenet2012), in ArrayRecord or TFRecord files; read without
                        TensorFlow, with the image / label features of its supervised keys.

Class names come from the dataset (folders, classnames.txt, tfds ClassLabel names with '_' read as ' '), except
where CLIP_benchmark ships curated names (ImageNet's are OpenAI's: 'tench', not 'n01440764'); `zeroshot_templates`
gives each known dataset its CLIP prompts. Each split is a PairSplit whose images are read lazily and whose caption
for image i is "a photo of a {class}." (so retrieval evaluators run too).
"""

from __future__ import annotations

import csv
import functools
import json
import os
import struct

import numpy as np

from ncjax.data.tables import readers
from ncjax.data.types import PairSplit

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_META_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metadata")

# tfds dataset name -> CLIP_benchmark's key for its class names / templates.
TFDS_TO_CLIP_BENCHMARK = {
    "imagenet2012": "imagenet1k", "imagenet_v2": "imagenet1k", "imagenet2012_real": "imagenet1k",
    "imagenet2012_subset": "imagenet1k", "imagenet_a": "imagenet1k", "imagenet_r": "imagenet1k",
    "oxford_iiit_pet": "pets", "oxford_flowers102": "flowers", "caltech101": "caltech101", "eurosat": "eurosat",
    "mnist": "mnist", "svhn_cropped": "svhn", "food101": "food101", "cifar10": "cifar10", "cifar100": "cifar100",
    "dtd": "dtd", "stl10": "stl10", "sun397": "sun397", "cars196": "cars", "gtsrb": "gtsrb", "fer2013": "fer2013",
    "patch_camelyon": "pcam", "resisc45": "resisc45",
}


@functools.lru_cache(maxsize=None)
def _metadata(name: str) -> dict:
  with open(os.path.join(_META_DIR, name), encoding="utf-8") as f:
    return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def curated_class_names(dataset: str) -> list[str] | None:
  return _metadata("classnames.json").get(TFDS_TO_CLIP_BENCHMARK.get(dataset, dataset))


def zeroshot_templates(dataset: str) -> tuple[str, ...] | None:
  """CLIP's prompt templates for a known dataset (tfds or CLIP_benchmark name), or None."""
  found = _metadata("zeroshot_templates.json").get(TFDS_TO_CLIP_BENCHMARK.get(dataset, dataset))
  return tuple(t.replace("{c}", "{}") for t in found) if found else None   # CLIP_benchmark writes {c}


def _captions(labels, class_names) -> list[str]:
  return [f"a photo of a {class_names[int(k)]}." for k in labels]


class FileImages:
  """Lazy access to image files by index (encoded bytes), what the evaluation transform reads."""

  kind = "encoded"

  def __init__(self, paths: list[str], name: str):
    self.paths, self.name = paths, name

  def __len__(self):
    return len(self.paths)

  def raw(self, image_id: int) -> bytes:
    with open(self.paths[int(image_id)], "rb") as f:
      return f.read()

  def subset(self, image_ids) -> "FileImages":
    """These images only, renumbered 0.. in the given order (a held-out part: ncjax.data.holdout)."""
    return FileImages([self.paths[int(i)] for i in image_ids], self.name)


def _read_classnames(path: str) -> list[str] | dict[str, str] | None:
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    lines = [ln.rstrip("\n") for ln in f if ln.strip()]
  if all("\t" in ln for ln in lines):
    return dict(ln.split("\t", 1) for ln in lines)
  return [ln.strip() for ln in lines]


def load_image_folder(root: str, split: str) -> PairSplit:
  """An `image_folder:` split (see the module docstring)."""
  root = os.path.expanduser(root)
  if not os.path.isdir(root):
    raise readers.DataFormatError(f"image_folder: {root} is not a directory; expected ROOT/[SPLIT/]CLASS/*.jpg or "
                                  f"ROOT/SPLIT.csv (path,label) with ROOT/classnames.txt")
  names_file = _read_classnames(os.path.join(root, "classnames.txt"))
  table = next((p for p in (os.path.join(root, f"{split}.csv"), os.path.join(root, "labels.csv"))
                if os.path.isfile(p)), None)
  if table is not None:
    return _load_table(root, table, names_file, split)
  base = os.path.join(root, split) if os.path.isdir(os.path.join(root, split)) else root
  folders = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)) and not d.startswith("."))
  paths, labels = [], []
  for k, folder in enumerate(folders):
    files = sorted(f for f in os.listdir(os.path.join(base, folder)) if f.lower().endswith(IMAGE_EXTENSIONS))
    paths += [os.path.join(base, folder, f) for f in files]
    labels += [k] * len(files)
  if not paths:
    raise readers.DataFormatError(
        f"image_folder: no images under {base} (expected CLASS/*.{{{','.join(e[1:] for e in IMAGE_EXTENSIONS)}}}); "
        f"found {sorted(os.listdir(base))[:10]}")
  if isinstance(names_file, dict):
    class_names = [names_file.get(f, f) for f in folders]
  elif isinstance(names_file, list):
    if len(names_file) != len(folders):
      raise readers.DataFormatError(f"{root}/classnames.txt has {len(names_file)} names for {len(folders)} class "
                                    f"folders")
    class_names = names_file
  else:
    class_names = [f.replace("_", " ") for f in folders]
  labels = np.asarray(labels, np.int64)
  return PairSplit(images=FileImages(paths, f"image_folder/{split}"), captions=_captions(labels, class_names),
                   caption_to_image=np.arange(len(paths)), image_labels=labels, class_names=tuple(class_names),
                   name=f"image_folder:{root}/{split}")


def _load_table(root: str, table: str, names_file, split: str) -> PairSplit:
  with open(table, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  if not rows or not {"path", "label"} <= set(rows[0]):
    raise readers.DataFormatError(f"{table}: expected a CSV with columns 'path' and 'label'; found "
                                  f"{sorted(rows[0]) if rows else 'no rows'}")
  if not isinstance(names_file, list):
    raise readers.DataFormatError(f"{table} needs {root}/classnames.txt (one class name per line, index order)")
  index = {n: k for k, n in enumerate(names_file)}
  labels = []
  for r in rows:
    lab = r["label"].strip()
    if lab.isdigit():
      labels.append(int(lab))
    elif lab in index:
      labels.append(index[lab])
    else:
      raise readers.DataFormatError(f"{table}: label {lab!r} is neither an index nor a name in classnames.txt")
  labels = np.asarray(labels, np.int64)
  if labels.max() >= len(names_file):
    raise readers.DataFormatError(f"{table}: label {labels.max()} but classnames.txt has {len(names_file)} names")
  paths = [r["path"] if os.path.isabs(r["path"]) else os.path.join(os.path.dirname(table), r["path"]) for r in rows]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise readers.DataFormatError(f"{table}: {len(missing)} image files do not exist, e.g. {missing[:3]}")
  return PairSplit(images=FileImages(paths, f"image_folder/{split}"), captions=_captions(labels, names_file),
                   caption_to_image=np.arange(len(paths)), image_labels=labels, class_names=tuple(names_file),
                   name=f"image_folder:{table}")


TABLE_IMAGE_COLUMNS = ("filepath", "image", "image_path", "path", "file", "url")
TABLE_CAPTION_COLUMNS = ("title", "caption", "text", "sentence")


def load_pair_table(path: str, split: str) -> PairSplit:
  """A `table:` split (see the module docstring): image-caption pairs of a CSV / TSV, images read lazily."""
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    found = [os.path.join(path, f"{split}.{ext}") for ext in ("csv", "tsv")]
    table = next((f for f in found if os.path.isfile(f)), None)
    if table is None:
      raise readers.DataFormatError(f"table: {path} holds no {split}.csv or {split}.tsv; "
                                    f"found {sorted(os.listdir(path))[:10]}")
  elif os.path.isfile(path):
    table = path
  else:
    raise readers.DataFormatError(f"table: no such file or directory {path} (expected a .csv/.tsv of image, caption "
                                  f"pairs, or a directory of SPLIT.csv)")
  with open(table, newline="", encoding="utf-8") as f:
    header = f.readline()
    f.seek(0)
    rows = list(csv.DictReader(f, delimiter="\t" if "\t" in header else ","))
  columns = list(rows[0]) if rows else []
  image_col = next((c for c in TABLE_IMAGE_COLUMNS if c in columns), None)
  caption_col = next((c for c in TABLE_CAPTION_COLUMNS if c in columns), None)
  if image_col is None or caption_col is None:
    raise readers.DataFormatError(
        f"{table}: expected an image column (one of {list(TABLE_IMAGE_COLUMNS)}) and a caption column (one of "
        f"{list(TABLE_CAPTION_COLUMNS)}); the header has {columns or 'no rows'}")
  base = os.path.dirname(os.path.abspath(table))
  image_index, paths, captions, c2i, image_rows = {}, [], [], [], []
  for k, r in enumerate(rows):
    p = r[image_col].strip()
    p = p if os.path.isabs(p) else os.path.join(base, p)
    if p not in image_index:
      image_index[p] = len(paths)
      paths.append(p)
      image_rows.append(k)
    captions.append(r[caption_col])
    c2i.append(image_index[p])
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise readers.DataFormatError(f"{table}: {len(missing)} image files do not exist, e.g. {missing[:3]}")
  labels = class_names = None
  if "label" in columns:
    raw = [rows[k]["label"].strip() for k in image_rows]
    names_file = _read_classnames(os.path.join(base, "classnames.txt"))
    if isinstance(names_file, list):
      class_names = names_file
    elif all(x.isdigit() for x in raw):
      class_names = [str(i) for i in range(max(int(x) for x in raw) + 1)]
    else:
      class_names = sorted(set(raw))
    index = {n: i for i, n in enumerate(class_names)}
    labels = np.asarray([int(x) if x.isdigit() else index.get(x, -1) for x in raw], np.int64)
    if (labels < 0).any() or labels.max() >= len(class_names):
      raise readers.DataFormatError(f"{table}: labels outside classnames.txt's {len(class_names)} names")
  pair_clean = None
  if "clean" in columns:    # a ground-truth clean flag per pair (diagnostics: noise detection, `ncjax audit`)
    flags = [r["clean"].strip().lower() for r in rows]
    bad = sorted({f for f in flags if f not in ("0", "1", "true", "false")})
    if bad:
      raise readers.DataFormatError(f"{table}: the clean column holds {bad[:3]}; expected 0/1 or true/false")
    pair_clean = np.asarray([f in ("1", "true") for f in flags], bool)
  return PairSplit(images=FileImages(paths, f"table/{split}"), captions=captions, caption_to_image=np.asarray(c2i),
                   image_labels=labels, class_names=tuple(class_names or ()), name=f"table:{table}",
                   pair_clean=pair_clean)


# ---------------------------------------------------------------------------------------------------------------
# Prepared tfds datasets (ArrayRecord or TFRecord), without TensorFlow
# ---------------------------------------------------------------------------------------------------------------
class TFRecordFile:
  """Random access to the records of TFRecord files: one scan of the length headers builds the offset index."""

  def __init__(self, paths: list[str]):
    self.paths, self.index = paths, []
    for fi, path in enumerate(paths):
      size = os.path.getsize(path)
      with open(path, "rb") as f:
        pos = 0
        while pos < size:
          head = f.read(12)
          if len(head) < 12:
            raise readers.DataFormatError(f"{path}: truncated TFRecord header at byte {pos}")
          (n,) = struct.unpack("<Q", head[:8])
          if pos + 12 + n + 4 > size:
            raise readers.DataFormatError(f"{path}: truncated TFRecord record at byte {pos}")
          self.index.append((fi, pos + 12, n))
          pos += 12 + n + 4
          f.seek(pos)

  def __len__(self):
    return len(self.index)

  def __getitem__(self, i: int) -> bytes:
    fi, offset, n = self.index[int(i)]
    with open(self.paths[fi], "rb") as f:
      f.seek(offset)
      return f.read(n)


class TfdsImages:
  """Images (encoded bytes) and labels of a prepared tfds split."""

  kind = "encoded"

  def __init__(self, source, image_key: str, label_key: str, serialized: bool, name: str):
    self.source, self.image_key, self.label_key, self.serialized, self.name = \
        source, image_key, label_key, serialized, name

  def __len__(self):
    return len(self.source)

  def record(self, i: int) -> dict:
    raw = self.source[int(i)]
    if not self.serialized:
      return raw
    from tensorflow_datasets.proto import tf_example_pb2
    feats = tf_example_pb2.Example.FromString(raw).features.feature
    return {self.image_key: feats[self.image_key].bytes_list.value[0],
            self.label_key: int(feats[self.label_key].int64_list.value[0])}

  def raw(self, i: int) -> bytes:
    return self.record(i)[self.image_key]

  def label(self, i: int) -> int:
    return int(self.record(i)[self.label_key])


def prepared_tfds_dir(data_dir: str, name: str, builder_config: str | None) -> str:
  """data_dir/NAME[/CONFIG]/VERSION of a prepared dataset (the latest version present)."""
  base = os.path.join(os.path.expanduser(data_dir or "~/tensorflow_datasets"), name,
                      *([builder_config] if builder_config else []))
  versions = []
  if os.path.isdir(base):
    for v in os.listdir(base):
      if os.path.isfile(os.path.join(base, v, "dataset_info.json")):
        try:
          versions.append((tuple(int(x) for x in v.split(".")), v))
        except ValueError:
          continue
  if not versions:
    raise readers.DataFormatError(
        f"tfds:{name}{'/' + builder_config if builder_config else ''} is not prepared under {base} (expected "
        f"{base}/<version>/dataset_info.json and its record files). ncjax never downloads: prepare it with "
        f"TensorFlow Datasets on a machine with network access (tfds build {name} --data_dir=...) and copy it here")
  return os.path.join(base, max(versions)[1])


def load_prepared_tfds(name: str, builder_config: str | None, data_dir: str, split: str) -> PairSplit:
  import tensorflow_datasets as tfds
  path = prepared_tfds_dir(data_dir, name, builder_config)
  builder = tfds.builder_from_directory(path)
  info = builder.info
  if split not in info.splits:
    raise readers.DataFormatError(f"tfds:{name}: no split {split!r}; prepared splits: {list(info.splits)}")
  image_key, label_key = (info.supervised_keys or ("image", "label"))[:2]
  features = info.features
  if image_key not in features or label_key not in features or not hasattr(features[label_key], "names"):
    raise readers.DataFormatError(f"tfds:{name} has no image/ClassLabel pair (supervised keys {info.supervised_keys},"
                                  f" features {list(features)})")
  fmt = str(info.file_format).lower()
  if "array_record" in fmt:
    source = builder.as_data_source(split=split, decoders={image_key: tfds.decode.SkipDecoding()})
    images = TfdsImages(source, image_key, label_key, serialized=False, name=f"{name}/{split}")
  elif "tfrecord" in fmt:
    files = [str(p) for p in info.splits[split].filepaths]
    images = TfdsImages(TFRecordFile(files), image_key, label_key, serialized=True, name=f"{name}/{split}")
  else:
    raise readers.DataFormatError(f"tfds:{name}: unsupported file format {info.file_format}")
  labels = np.asarray([images.label(i) for i in range(len(images))], np.int64)
  class_names = curated_class_names(name) or [n.replace("_", " ") for n in features[label_key].names]
  if len(class_names) != features[label_key].num_classes:
    class_names = [n.replace("_", " ") for n in features[label_key].names]
  return PairSplit(images=images, captions=_captions(labels, class_names), caption_to_image=np.arange(len(images)),
                   image_labels=labels, class_names=tuple(class_names), name=f"tfds:{name}/{split}")
