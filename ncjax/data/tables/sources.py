"""Loading built tfds datasets as PairSplits whose images are read lazily from ArrayRecord (no TensorFlow)."""

from __future__ import annotations

import io
import json
import os

import numpy as np

from ncjax import fileio
from ncjax.data import preprocess
from ncjax.data.tables import readers
from ncjax.data.tables import builders as tfds_builders
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

  def subset(self, image_ids) -> "RecordImages":
    """These images only, renumbered 0.. in the given order (a held-out part: ncjax.data.holdout)."""
    return RecordImages(self.ds, np.asarray(self.positions)[np.asarray(image_ids)], self.kind, self.name)


def usable_cores() -> int:
  """CPUs this process may really use: the affinity mask and the cgroup (v2 or v1) CPU quota, at least 1."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count() or 1
  for path, period_path in (("/sys/fs/cgroup/cpu.max", None),
                            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
    try:
      with open(path) as f:
        fields = f.read().split()
      if period_path is None:
        limit, period = fields[0], fields[1]
      else:
        with open(period_path) as f:
          limit, period = fields[0], f.read().strip()
      if limit not in ("max", "-1") and int(limit) > 0:
        cores = min(cores, max(1, int(limit) // int(period)))
      break
    except (OSError, IndexError, ValueError):
      continue
  return max(1, cores)


def resolve_workers(workers: int) -> int:
  """`input.eval_workers`: -1 -> one worker per usable core; 0 or 1 -> serial."""
  return usable_cores() if int(workers) < 0 else int(workers)


DECODE_MODES = ("thread", "process")

_WORKER_VIEW = None   # a process worker's TransformedImages (set by its initializer)


def _init_process_worker(images, size, normalization, resize):
  global _WORKER_VIEW
  _WORKER_VIEW = TransformedImages(images, size, normalization, resize, workers=0)


def _load_in_worker(ids):
  return np.stack([_WORKER_VIEW.load(i) for i in ids])


class TransformedImages:
  """A view applying the evaluation transform when sliced (what evaluators batch over).

  `workers` > 1 decodes and transforms the images of one slice in parallel: 'thread' workers (PIL's decoders and
  resampling and numpy's arithmetic release the GIL) or 'process' workers (spawned; each holds its own copy of the
  image source, which must be picklable). The output is the same array as the serial loop's (`workers=0`)."""

  def __init__(self, images: RecordImages, size: int, normalization: str, resize: str = "shortest",
               workers: int = 0, decode: str = "thread"):
    if decode not in DECODE_MODES:
      raise ValueError(f"unknown decode mode {decode!r}; expected one of {DECODE_MODES}")
    self.images, self.size, self.normalization, self.resize = images, size, normalization, resize
    self.workers, self.decode = resolve_workers(workers), decode
    self._pool = None

  def __len__(self):
    return len(self.images)

  def load(self, image_id: int) -> np.ndarray:
    raw = self.images.raw(image_id)
    if self.images.kind == "features":
      return np.asarray(raw, np.float32)
    from PIL import Image
    with Image.open(io.BytesIO(raw)) as im:   # the decoded image straight to the transform (no array round trip)
      image = im.convert("RGB")
    return preprocess.eval_transform(image, self.size, self.normalization, self.resize)

  def _executor(self):
    if self._pool is None:
      import concurrent.futures as cf
      if self.decode == "thread":
        self._pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="ncjax-decode")
      else:
        import multiprocessing
        self._pool = cf.ProcessPoolExecutor(
            self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_process_worker,
            initargs=(self.images, self.size, self.normalization, self.resize))
    return self._pool

  def load_many(self, ids) -> np.ndarray:
    ids = [int(i) for i in ids]
    if self.workers <= 1 or len(ids) < 2 or self.images.kind == "features":
      return np.stack([self.load(i) for i in ids])
    pool = self._executor()
    if self.decode == "thread":
      return np.stack(list(pool.map(self.load, ids)))
    chunks = [ids[k::self.workers] for k in range(self.workers)]   # one task per worker, interleaved
    parts = list(pool.map(_load_in_worker, [c for c in chunks if c]))
    out = np.empty((len(ids),) + parts[0].shape[1:], parts[0].dtype)
    for k, part in enumerate(parts):
      out[k::self.workers] = part
    return out

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)
      self._pool = None

  def __del__(self):
    try:
      self.close()
    except Exception:   # interpreter shutdown
      pass

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_pool"] = None
    return state

  def __getitem__(self, key):
    if isinstance(key, slice):
      return self.load_many(range(*key.indices(len(self))))
    if isinstance(key, (np.ndarray, list)):
      return self.load_many(np.asarray(key).reshape(-1))
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
    from ncjax.data.embedded.digits import CLASS_NAMES
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
