"""Readers for the on-disk formats users already have. Pure Python + numpy; nothing is downloaded.

* WebDataset tar shards as written by img2dataset: members `<key>.jpg|png|webp` + `<key>.txt` and/or `<key>.json`.
* CSV / TSV tables of (image path, caption) with configurable column names and separator.
* Karpathy split JSON (Flickr30K / MSCOCO) + an image folder: every caption of an image is kept.
* NCR "precomp" features: `{split}_ims.npy` (N, 36, 2048) with `{split}_caps.txt` (or CC152K's `{split}_caps.tsv`);
  caption k belongs to image k // im_div.
Every reader fails on a missing or malformed input with a message naming what was expected and what was found.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import io
import json
import os
import tarfile
from typing import Iterator, Sequence

import numpy as np

from ncjax import errors

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp")


class DataFormatError(errors.DataError):
  """The user's files are missing or not in the expected layout."""


def _listing(directory: str, limit: int = 12) -> str:
  if not os.path.isdir(directory):
    return f"{directory} does not exist"
  names = sorted(os.listdir(directory))
  shown = ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")
  return f"found in {directory}: [{shown}]" if names else f"{directory} is empty"


# ---------------------------------------------------------------------------------------------------------------
# WebDataset
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class WebDatasetSample:
  key: str
  shard: str
  image: bytes | None
  caption: str | None
  meta: dict


def wds_shards(manual_dir: str, pattern: str = "*.tar") -> list[str]:
  shards = sorted(glob.glob(os.path.join(manual_dir, "**", pattern), recursive=True))
  if not shards:
    raise DataFormatError(f"no WebDataset shards matching {pattern!r} under {manual_dir} (expected img2dataset "
                          f"output: 00000.tar, 00001.tar, ... each holding <key>.jpg + <key>.txt/.json); "
                          f"{_listing(manual_dir)}")
  return shards


def read_webdataset(shard: str, caption_key: str = "caption") -> Iterator[WebDatasetSample]:
  """Samples of one tar shard in member order; members are grouped by key (the basename up to its first dot)."""
  current_key, parts = None, {}

  def emit(key, parts):
    image = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
    meta = {}
    if "json" in parts:
      try:
        meta = json.loads(parts["json"].decode("utf-8"))
      except (UnicodeDecodeError, json.JSONDecodeError):
        meta = {"_json_error": True}
    caption = parts["txt"].decode("utf-8", errors="replace") if "txt" in parts else meta.get(caption_key)
    return WebDatasetSample(key, os.path.basename(shard), image, caption, meta)

  try:
    with tarfile.open(shard, "r|*") as tar:
      for member in tar:
        if not member.isfile():
          continue
        base = os.path.basename(member.name)
        if base.startswith("."):
          continue
        key, _, ext = base.partition(".")
        key = os.path.join(os.path.dirname(member.name), key)
        if current_key is not None and key != current_key:
          yield emit(current_key, parts)
          parts = {}
        current_key = key
        parts[ext.lower()] = tar.extractfile(member).read()
  except tarfile.TarError as e:
    raise DataFormatError(f"{shard} is not a readable tar archive: {e}") from e
  if current_key is not None:
    yield emit(current_key, parts)


# ---------------------------------------------------------------------------------------------------------------
# CSV / TSV
# ---------------------------------------------------------------------------------------------------------------
def read_table(path: str, image_column: str = "filepath", caption_column: str = "title", separator: str = "\t",
               images_root: str | None = None, extra_columns: Sequence[str] = ()) -> list[dict]:
  """Rows {'image_path', 'caption', **extra} of a CSV/TSV (open_clip's default columns and tab separator)."""
  if not os.path.isfile(path):
    raise DataFormatError(f"caption table {path} not found; {_listing(os.path.dirname(path) or '.')}")
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f, delimiter=separator)
    columns = reader.fieldnames or []
    missing = [c for c in (image_column, caption_column, *extra_columns) if c not in columns]
    if missing:
      raise DataFormatError(f"{path}: missing column(s) {missing}; the header (split on {separator!r}) has "
                            f"{columns}. Set input.image_column / input.caption_column / input.separator.")
    root = images_root or os.path.dirname(os.path.abspath(path))
    rows = []
    for row in reader:
      p = row[image_column]
      rows.append(dict(image_path=p if os.path.isabs(p) else os.path.join(root, p), caption=row[caption_column],
                       **{c: row[c] for c in extra_columns}))
  return rows


# ---------------------------------------------------------------------------------------------------------------
# Karpathy splits
# ---------------------------------------------------------------------------------------------------------------
KARPATHY_SPLITS = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}


def read_karpathy(json_path: str, images_dir: str, split: str) -> list[dict]:
  """Images of a Karpathy split: [{'image_path', 'captions' (all of them), 'image_id', 'sentids'}].

  'train' includes 'restval' (the 113,287-image COCO train set); the order is the JSON's.
  """
  if not os.path.isfile(json_path):
    raise DataFormatError(f"Karpathy split file {json_path} not found (dataset_flickr30k.json / "
                          f"dataset_coco.json); {_listing(os.path.dirname(json_path) or '.')}")
  with open(json_path, encoding="utf-8") as f:
    data = json.load(f)
  if "images" not in data:
    raise DataFormatError(f"{json_path} has no 'images' list (keys: {sorted(data)[:10]}); expected Karpathy format")
  if split not in KARPATHY_SPLITS:
    raise DataFormatError(f"unknown Karpathy split {split!r}; expected one of {sorted(KARPATHY_SPLITS)}")
  out = []
  for im in data["images"]:
    if im.get("split") not in KARPATHY_SPLITS[split]:
      continue
    rel = os.path.join(im.get("filepath", ""), im["filename"])
    out.append(dict(image_path=os.path.join(images_dir, rel), captions=[s["raw"] for s in im["sentences"]],
                    image_id=int(im.get("cocoid", im.get("imgid", len(out)))),
                    sentids=[int(s.get("sentid", -1)) for s in im["sentences"]]))
  if not out:
    raise DataFormatError(f"{json_path} has no images in split {split!r}")
  return out


# ---------------------------------------------------------------------------------------------------------------
# NCR precomputed region features
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class PrecompSplit:
  features: np.ndarray          # (n_images, 36, 2048), memory-mapped
  captions: list[str]
  caption_to_image: np.ndarray  # int64, k // im_div
  im_div: int


def precomp_files(data_dir: str, split: str) -> tuple[str, str]:
  ims = os.path.join(data_dir, f"{split}_ims.npy")
  caps = [os.path.join(data_dir, f"{split}_caps.{e}") for e in ("txt", "tsv")]
  found_caps = [c for c in caps if os.path.isfile(c)]
  if not os.path.isfile(ims) or not found_caps:
    raise DataFormatError(f"precomputed-feature split {split!r} needs {split}_ims.npy (N, 36, 2048) and "
                          f"{split}_caps.txt (or CC152K's {split}_caps.tsv) in {data_dir}; {_listing(data_dir)}")
  return ims, found_caps[0]


def read_precomp(data_dir: str, split: str, dev_images: int | None = 1000) -> PrecompSplit:
  """NCR's PrecompDataset layout: caption k belongs to image k // im_div (im_div = 5 when #images != #captions).

  The dev split is truncated to `dev_images` images (NCR evaluates on the first 1000 dev images).
  """
  ims_path, caps_path = precomp_files(data_dir, split)
  feats = np.load(ims_path, mmap_mode="r")
  if feats.ndim != 3:
    raise DataFormatError(f"{ims_path} has shape {feats.shape}; expected (n_images, n_regions, feature_dim)")
  with open(caps_path, encoding="utf-8") as f:
    lines = [l.rstrip("\n") for l in f]
  if caps_path.endswith(".tsv"):
    captions = [l.split("\t", 1)[1] if "\t" in l else l for l in lines if l.strip()]
  else:
    captions = [l.strip() for l in lines if l.strip()]
  n_img, n_cap = feats.shape[0], len(captions)
  im_div = 1 if n_img == n_cap else 5
  if n_cap != n_img * im_div:
    raise DataFormatError(f"{caps_path} has {n_cap} captions for {n_img} images in {ims_path}; expected one or "
                          f"five captions per image")
  if split == "dev" and dev_images is not None and n_img > dev_images:
    feats, captions, n_img = feats[:dev_images], captions[:dev_images * im_div], dev_images
  return PrecompSplit(feats, captions, np.arange(len(captions), dtype=np.int64) // im_div, im_div)


def clean_flag(value, where: str) -> int:
  """A ground-truth clean flag of a table cell or a .json value: 1/0, true/false, yes/no, clean/noisy."""
  low = str(value).strip().lower()
  if low in ("1", "true", "yes", "clean"):
    return 1
  if low in ("0", "false", "no", "noisy"):
    return 0
  raise DataFormatError(f"{where}: clean flag {value!r} is not 1/0/true/false/yes/no/clean/noisy")


def decode_image(data: bytes) -> "np.ndarray":
  """Encoded bytes -> uint8 RGB array (raises on corrupt data)."""
  from PIL import Image
  with Image.open(io.BytesIO(data)) as im:
    return np.asarray(im.convert("RGB"))
