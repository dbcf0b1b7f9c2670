"""tfds builders (ArrayRecord, built and read without TensorFlow) for the datasets of this literature.

Every builder reads files the user already has from `manual_dir`; none downloads anything. Images are stored as
their original encoded bytes (not re-encoded, not validated), so a corrupt image in the user's data survives the
build and is skipped — and counted — by the input pipeline instead of failing a multi-hour build.

tfds shuffles records at write time, so every record stores a stable `id` (its index in the source's own order:
shard/member order, table row order, the Karpathy JSON order). After building, `build()` writes `ncjax_index.npz`
next to the tfds files: the id -> record position map, and for multi-caption datasets the caption table (caption
-> image id). Loading then costs one small file read, never a scan of the records.

Builders (name: configs):
  web_pairs: cc3m, cc12m, yfcc15m_r, redcaps, custom    (img2dataset WebDataset shards, or a CSV/TSV table)
  karpathy: flickr30k, coco                             (dataset_{flickr30k,coco}.json + image folder)
  precomp: f30k_precomp, coco_precomp, cc152k_precomp    (NCR {split}_ims.npy + {split}_caps.txt|tsv)
  digits: default                                        (scikit-learn's bundled handwritten digits)
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os

import numpy as np
import tensorflow_datasets as tfds

from ncjax.data.tables import readers

_BYTES = dict(shape=(), dtype=np.object_)
INDEX_FILE = "ncjax_index.npz"


@dataclasses.dataclass
class WebPairsConfig(tfds.core.BuilderConfig):
  source: str = "webdataset"          # 'webdataset' | 'table'
  shard_pattern: str = "*.tar"
  table: str = "train.tsv"            # relative to manual_dir, for source='table'
  separator: str = "\t"
  image_column: str = "filepath"
  caption_column: str = "title"
  extra_columns: tuple = ()
  caption_key: str = "caption"        # where a WebDataset .json keeps the caption when there is no .txt
  # Tables only. label_column: a class label per row (an integer, or a name; names are indexed in sorted order
  # unless class_names lists them in index order), for zero-shot and linear probes on the user's data.
  # clean_column: a ground-truth clean flag (1/0, true/false) for noise-detection diagnostics; it never reaches
  # a loss. holdout: the fraction of *images* (all their rows together) put in a 'test' split, chosen by a hash
  # of the image path (deterministic, stable when rows are added); split_column: an explicit split per row
  # (values become split names; 'val' and 'test' rows are held out).
  label_column: str = ""
  clean_column: str = ""
  class_names: tuple = ()
  holdout: float = 0.0
  split_column: str = ""


WEB_CONFIGS = [
    WebPairsConfig(name="cc3m", description="Conceptual Captions 3M (img2dataset WebDataset shards)"),
    WebPairsConfig(name="cc12m", description="Conceptual 12M (img2dataset WebDataset shards)"),
    WebPairsConfig(name="yfcc15m_r", description="YFCC15M-R (img2dataset WebDataset shards)"),
    WebPairsConfig(name="redcaps", description="RedCaps (WebDataset shards; the .json keeps 'subreddit')"),
    WebPairsConfig(name="custom", description="Any WebDataset shards"),
    WebPairsConfig(name="custom_table", source="table", description="A CSV/TSV table of (image path, caption)"),
]


def holdout_split(image_path: str, fraction: float) -> str:
  """'test' for a `fraction` of images, by a hash of the path (every row of an image lands in the same split)."""
  digest = hashlib.sha256(image_path.encode("utf-8")).digest()
  return "test" if int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction else "train"


_clean_flag = readers.clean_flag


class WebPairs(tfds.core.GeneratorBasedBuilder):
  """Web-scale image-caption pairs: one caption per image."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "label and clean fields (tables' label/clean columns; -1 when absent); held-out splits"}
  BUILDER_CONFIGS = WEB_CONFIGS
  MANUAL_DOWNLOAD_INSTRUCTIONS = ("Point manual_dir at img2dataset output (00000.tar, ...) or, for custom_table, a "
                                  "directory holding the CSV/TSV and the images its paths refer to.")

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "id": np.int64, "image": tfds.features.Tensor(**_BYTES), "caption": tfds.features.Text(),
        "key": tfds.features.Text(), "subreddit": tfds.features.Text(), "label": np.int64, "clean": np.int64}))

  def _table_rows(self, manual_dir) -> dict[str, list[dict]]:
    """The table's rows by split, each with its label index and clean flag (-1 when the table has none)."""
    cfg = self.builder_config
    extra = tuple(c for c in (*cfg.extra_columns, cfg.label_column, cfg.clean_column, cfg.split_column) if c)
    table = os.path.join(manual_dir, cfg.table)
    rows = readers.read_table(table, cfg.image_column, cfg.caption_column,
                              cfg.separator, extra_columns=tuple(dict.fromkeys(extra)))
    names = list(cfg.class_names) or (sorted({r[cfg.label_column] for r in rows}, key=_label_order)
                                      if cfg.label_column else [])
    index = {n: i for i, n in enumerate(names)}
    by_split: dict[str, list[dict]] = {}
    for k, row in enumerate(rows):
      label = -1
      if cfg.label_column:
        value = row[cfg.label_column].strip()
        if value in index:
          label = index[value]
        elif value.lstrip("-").isdigit() and cfg.class_names:
          label = int(value)
        else:
          raise readers.DataFormatError(f"row {k}: label {value!r} is not one of the class names {names[:20]}")
      clean = _clean_flag(row[cfg.clean_column], f"row {k}") if cfg.clean_column else -1
      if cfg.split_column:
        split = row[cfg.split_column].strip() or "train"
      elif cfg.holdout > 0:   # by the path as the table names it: the split must not depend on where data lives
        split = holdout_split(os.path.relpath(row["image_path"], os.path.dirname(table)), cfg.holdout)
      else:
        split = "train"
      by_split.setdefault(split, []).append(dict(row, label=label, clean=clean))
    self.class_names_found = names
    return by_split

  def _split_generators(self, dl_manager):
    manual_dir = str(dl_manager.manual_dir)
    cfg = self.builder_config
    if cfg.source == "table":
      return {split: self._generate_examples(rows=rows) for split, rows in self._table_rows(manual_dir).items()}
    self.class_names_found = list(cfg.class_names)
    if cfg.holdout > 0:   # held-out images by a hash of the sample key (shard/key)
      return {split: self._generate_examples(manual_dir=manual_dir, split=split) for split in ("train", "test")}
    return {"train": self._generate_examples(manual_dir=manual_dir)}

  def _generate_examples(self, rows=None, manual_dir=None, split=None):
    """A table's rows of one split (`rows`), or the WebDataset shards under `manual_dir` (of one held-out split)."""
    if rows is None:
      yield from self._generate_webdataset(manual_dir, split)
      return
    for i, row in enumerate(rows):
      try:
        with open(row["image_path"], "rb") as f:
          data = f.read()
      except OSError:
        data = b""  # recorded as a bad record; the pipeline skips it and counts it
      yield i, dict(id=i, image=data, caption=row["caption"], key=row["image_path"],
                    subreddit=row.get("subreddit", ""), label=row["label"], clean=row["clean"])

  def _webdataset_label(self, meta: dict, where: str) -> tuple[int, int]:
    """(label, clean) of a WebDataset sample from its .json (the configured keys; -1 when not configured).
    Labels are integers, or names listed in class_names (a web-scale build cannot look ahead for the names)."""
    cfg = self.builder_config
    label = clean = -1
    if cfg.label_column:
      value = str(meta.get(cfg.label_column, "")).strip()
      if value in cfg.class_names:
        label = list(cfg.class_names).index(value)
      elif value.lstrip("-").isdigit():
        label = int(value)
      else:
        raise readers.DataFormatError(f"{where}: label {value!r} (json key {cfg.label_column!r}) is neither an "
                                      f"integer nor one of --class_names")
    if cfg.clean_column:
      clean = _clean_flag(meta.get(cfg.clean_column, ""), where)
    return label, clean

  def _generate_webdataset(self, manual_dir, split=None):
    cfg = self.builder_config
    i = 0
    for shard in readers.wds_shards(manual_dir, cfg.shard_pattern):
      for sample in readers.read_webdataset(shard, cfg.caption_key):
        key = f"{sample.shard}/{sample.key}"
        if split is not None and holdout_split(key, cfg.holdout) != split:
          continue
        label, clean = self._webdataset_label(sample.meta, key)
        yield i, dict(id=i, image=sample.image or b"", caption=sample.caption or "", key=key,
                      subreddit=str(sample.meta.get("subreddit", "")), label=label, clean=clean)
        i += 1


class Karpathy(tfds.core.GeneratorBasedBuilder):
  """Flickr30K / MSCOCO with the Karpathy splits: one record per image with *all* its captions."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="flickr30k"), tfds.core.BuilderConfig(name="coco")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = ("manual_dir must hold dataset_flickr30k.json (or dataset_coco.json) and the "
                                  "images: flickr30k-images/<filename>, or COCO's train2014/ and val2014/ folders.")

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "id": np.int64, "image": tfds.features.Tensor(**_BYTES), "image_id": np.int64,
        "captions": tfds.features.Sequence(tfds.features.Text()),
        "caption_ids": tfds.features.Sequence(np.int64)}))

  def _paths(self, manual_dir):
    name = self.builder_config.name
    json_path = os.path.join(manual_dir, f"dataset_{name}.json")
    images_dir = os.path.join(manual_dir, "flickr30k-images") if name == "flickr30k" else manual_dir
    if name == "flickr30k" and not os.path.isdir(images_dir):
      images_dir = manual_dir
    return json_path, images_dir

  def _split_generators(self, dl_manager):
    json_path, images_dir = self._paths(str(dl_manager.manual_dir))
    return {s: self._generate_examples(json_path, images_dir, s) for s in ("train", "val", "test")}

  def _generate_examples(self, json_path, images_dir, split):
    images = readers.read_karpathy(json_path, images_dir, split)
    missing = [im["image_path"] for im in images if not os.path.isfile(im["image_path"])]
    if len(missing) == len(images):
      raise readers.DataFormatError(f"none of the {len(images)} {split} images exist, e.g. {missing[0]}; "
                                    f"{readers._listing(images_dir)}")
    cap = 0
    for i, im in enumerate(images):
      try:
        with open(im["image_path"], "rb") as f:
          data = f.read()
      except OSError:
        data = b""
      n = len(im["captions"])
      yield i, dict(id=i, image=data, image_id=im["image_id"], captions=im["captions"],
                    caption_ids=list(range(cap, cap + n)))
      cap += n


class Precomp(tfds.core.GeneratorBasedBuilder):
  """NCR's precomputed BUTD region features: one record per image, (36, 2048) float32 + its captions."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=n) for n in ("f30k_precomp", "coco_precomp", "cc152k_precomp")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = "manual_dir must hold {train,dev,test}_ims.npy and {split}_caps.txt (CC152K: .tsv)."

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "id": np.int64, "image": tfds.features.Tensor(shape=(None, None), dtype=np.float32, encoding="bytes"),
        "captions": tfds.features.Sequence(tfds.features.Text()),
        "caption_ids": tfds.features.Sequence(np.int64)}))

  def _split_generators(self, dl_manager):
    d = str(dl_manager.manual_dir)
    splits = [s for s in ("train", "dev", "test", "testall") if os.path.isfile(os.path.join(d, f"{s}_ims.npy"))]
    if "train" not in splits:
      readers.precomp_files(d, "train")  # raises with the expected/found listing
    return {s: self._generate_examples(d, s) for s in splits}

  def _generate_examples(self, data_dir, split):
    sp = readers.read_precomp(data_dir, split)
    for i in range(sp.features.shape[0]):
      ids = list(range(i * sp.im_div, (i + 1) * sp.im_div))
      yield i, dict(id=i, image=np.asarray(sp.features[i], np.float32), captions=[sp.captions[k] for k in ids],
                    caption_ids=ids)


class Digits(tfds.core.GeneratorBasedBuilder):
  """The embedded digits data behind the same interface: PNG-encoded 8x8 scans, captions, class labels."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "id": np.int64, "image": tfds.features.Tensor(**_BYTES), "label": np.int64,
        "captions": tfds.features.Sequence(tfds.features.Text()),
        "caption_ids": tfds.features.Sequence(np.int64)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {s: self._generate_examples(s) for s in ("train", "test")}

  def _generate_examples(self, split):
    from PIL import Image
    from ncjax.data.embedded import digits
    raw, _ = digits._raw()
    sp = digits.load(split, image_size=8)
    rows = sp.image_ids
    per_image = [[] for _ in range(sp.num_images)]
    for k, img in enumerate(sp.caption_to_image):
      per_image[img].append(k)
    for i, row in enumerate(rows):
      buf = io.BytesIO()
      Image.fromarray(np.round(raw[row] * 255).astype(np.uint8)).save(buf, format="PNG")
      yield i, dict(id=i, image=buf.getvalue(), label=int(sp.image_labels[i]),
                    captions=[sp.captions[k] for k in per_image[i]], caption_ids=per_image[i])


BUILDERS = {"web_pairs": WebPairs, "karpathy": Karpathy, "precomp": Precomp, "digits": Digits}


def builder_for(name: str, builder_config: str | None, data_dir: str):
  if name not in BUILDERS:
    raise ValueError(f"unknown ncjax builder {name!r}; builders: {sorted(BUILDERS)}")
  kwargs = dict(data_dir=data_dir, file_format="array_record")
  if builder_config:
    kwargs["config"] = builder_config
  return BUILDERS[name](**kwargs)


def _staged(build_fn, data_dir: str, reopen):
  """Build into a local staging directory when `data_dir` is in object storage (gs://: tfds' ArrayRecord writer
  opens local files), then upload the built tree file by file; returns the builder reopened on `data_dir`."""
  import tempfile
  from ncjax import fileio
  with tempfile.TemporaryDirectory(prefix="ncjax-build-") as local:
    builder = build_fn(local)
    tree = str(builder.data_dir)
    remote = fileio.join(data_dir, os.path.relpath(tree, local).replace(os.sep, "/"))
    for name in sorted(os.listdir(tree)):
      fileio.copy_file(os.path.join(tree, name), fileio.join(remote, name))
  return reopen()


def build(name: str, builder_config: str | None, manual_dir: str | None, data_dir: str):
  """Build a dataset from the user's files, then write its index (id -> position, caption table). A `gs://`
  data_dir is built locally and uploaded."""
  from ncjax import fileio
  if fileio.is_remote(data_dir):
    return _staged(lambda local: build(name, builder_config, manual_dir, local), data_dir,
                   lambda: builder_for(name, builder_config, data_dir))
  if name != "digits":
    if not manual_dir or not os.path.isdir(manual_dir):
      raise readers.DataFormatError(f"manual_dir {manual_dir!r} is not a directory; the {name} builder reads the "
                                    f"user's files from it")
  builder = builder_for(name, builder_config, data_dir)
  dl_config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
  builder.download_and_prepare(download_config=dl_config)
  write_index(builder)
  if name == "precomp":
    copy_ncr_vocabulary(manual_dir, builder_config, builder.data_dir)
  return builder


VOCAB_FILE = "ncjax_vocab.json"


def copy_ncr_vocabulary(manual_dir: str, builder_config: str | None, data_dir: str) -> str | None:
  """NCR's vocabulary (`{f30k,coco,cc152k}_precomp_vocab.json` or `{name}_vocab.json`: word2idx / idx2word, built
  from train + dev captions with count >= 4), when it sits in manual_dir, saved with the built dataset as its words
  in index order; the word tokenizer of a run on this dataset then uses it instead of counting the captions."""
  stem = builder_config or ""
  candidates = [f"{stem}_vocab.json", f"{stem.replace('_precomp', '')}_precomp_vocab.json",
                f"{stem.replace('_precomp', '')}_vocab.json"]
  found = next((os.path.join(manual_dir, c) for c in candidates if os.path.isfile(os.path.join(manual_dir, c))), None)
  if found is None:
    return None
  with open(found, encoding="utf-8") as f:
    vocab = json.load(f)
  if "idx2word" in vocab:
    words = [w for _, w in sorted(((int(i), w) for i, w in vocab["idx2word"].items()))]
  elif "word2idx" in vocab:
    words = [w for w, _ in sorted(vocab["word2idx"].items(), key=lambda kv: int(kv[1]))]
  else:
    raise readers.DataFormatError(f"{found}: expected NCR's vocabulary with 'word2idx' or 'idx2word'")
  out = os.path.join(data_dir, VOCAB_FILE)
  with open(out, "w", encoding="utf-8") as f:
    json.dump(dict(source=os.path.basename(found), words=words), f)
  return out


def build_table(builder_config: str | None, manual_dir: str | None, data_dir: str, **columns):
  """web_pairs with these options (`columns`: a table's file name, separator, image / caption / label / clean /
  split columns, class names, holdout; for WebDataset shards the label / clean keys of each sample's .json and the
  holdout; None keeps the config's default). The built dataset reads back as
  web_pairs/<config>. The builder class is made here, not in the caller: tfds locates a builder through its module,
  which must be an importable package module (a class defined in `python -m ncjax.data.build`'s __main__ is not).
  A `gs://` data_dir is built locally and uploaded."""
  from ncjax import fileio
  if fileio.is_remote(data_dir):
    return _staged(lambda local: build_table(builder_config, manual_dir, local, **columns), data_dir,
                   lambda: builder_for("web_pairs", builder_config or "custom_table", data_dir))
  if not manual_dir or not os.path.isdir(manual_dir):
    raise readers.DataFormatError(f"manual_dir {manual_dir!r} is not a directory; the web_pairs builder reads the "
                                  f"table and its images from it")
  base = next(c for c in WEB_CONFIGS if c.name == (builder_config or "custom_table"))
  config_obj = dataclasses.replace(base, **{k: v for k, v in columns.items() if v is not None})

  class CustomTablePairs(WebPairs, skip_registration=True):
    """web_pairs with this table's columns."""
    name = "web_pairs"
    BUILDER_CONFIGS = [config_obj]

  builder = CustomTablePairs(data_dir=data_dir, file_format="array_record", config=config_obj.name)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  write_index(builder)
  return builder


def write_index(builder) -> str:
  """One read pass (images not decoded) recording, per split, where each id lives and the caption table (plus
  per-image labels and per-caption clean flags where the records carry them, and the class names)."""
  arrays, captions = {}, {}
  for split in builder.info.splits:
    ds = builder.as_data_source(split=split)
    n = len(ds)
    positions = np.full(n, -1, np.int64)
    labels, clean = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    caption_image, subreddit = [], [""] * n
    for pos in range(n):
      rec = ds[pos]
      positions[int(rec["id"])] = pos
      if "label" in rec and "caption" in rec:   # one caption per record: label per image, clean per caption
        labels[int(rec["id"])], clean[int(rec["id"])] = int(rec["label"]), int(rec["clean"])
      if "subreddit" in rec:
        subreddit[int(rec["id"])] = _text(rec["subreddit"])
      if "captions" in rec:
        for cid, text in zip(rec["caption_ids"], rec["captions"]):
          caption_image.append((int(cid), int(rec["id"]), _text(text)))
      else:
        caption_image.append((int(rec["id"]), int(rec["id"]), _text(rec["caption"])))
    if (positions < 0).any():
      raise RuntimeError(f"{builder.name}/{split}: ids are not 0..{n - 1}")
    caption_image.sort()
    arrays[f"{split}/positions"] = positions
    arrays[f"{split}/caption_to_image"] = np.asarray([c[1] for c in caption_image], np.int64)
    if (labels >= 0).any():
      arrays[f"{split}/labels"] = labels
    if (clean >= 0).any():
      arrays[f"{split}/clean"] = clean
    captions[split] = [c[2] for c in caption_image]
    if any(subreddit):
      captions[f"{split}:subreddit"] = subreddit
  names = getattr(builder, "class_names_found", None) or list(getattr(builder.builder_config, "class_names", ()))
  if names:
    captions["class_names"] = list(names)
  path = os.path.join(builder.data_dir, INDEX_FILE)
  np.savez(path, **arrays)
  with open(os.path.join(builder.data_dir, "ncjax_captions.json"), "w", encoding="utf-8") as f:
    json.dump(captions, f)
  return path


def _label_order(name: str):
  """Class names sort numerically when they are integers ('2' before '10'), else alphabetically."""
  return (0, int(name), "") if name.lstrip("-").isdigit() else (1, 0, name)


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)
