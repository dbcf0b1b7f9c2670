"""img2dataset's output read as it is, at any size: WebDataset tar shards and their parquet metadata, local or gs://.

Layout (img2dataset `--output_format webdataset`; any directory depth):

  ROOT/00000.tar            <key>.jpg (or png/webp) + <key>.txt (caption) + <key>.json (url, caption, key, status, ...)
  ROOT/00000.parquet        one row per *attempted* URL: key, caption, status ('success' rows are the tar's samples,
                            in the tar's order), url, error_message, width, height, ...
  ROOT/00000_stats.json     {"count", "successes", ...}

Example ids. Shards are taken in sorted path order; sample j of shard s has the global id `starts[s] + j`, where
the shard's sample count comes from its metadata (`_stats.json`'s successes, else the parquet's 'success' rows,
else the tar itself). Ids are the same whether a dataset is streamed or indexed, and per-sample method state is
keyed by them. A shard whose tar holds fewer samples than its metadata says (truncated, corrupt) keeps the ids of
the missing samples: they read as bad records (skipped and counted, or raised); extra samples beyond the
metadata's count are ignored.

Two ways to read (ncjax.data.web_pipeline):
* streamed: nothing to build; shards are read front to back during training (see ncjax.data.mixture for the order).
* indexed: `python -m ncjax.data.build --dataset=web --manual_dir=ROOT` scans every shard once, in parallel over
  cores (and over hosts with --num_hosts/--host_index), and writes ROOT/_ncjax_index/: `offsets.npy` (the byte
  offset of every sample in its shard: 4 bytes per pair, 8 for shards over 4 GiB), `clean.npy` (1 byte per pair,
  only with a clean key) and `manifest.json` (shards, counts, region ends). Training memory-maps the offsets (the
  page cache shares them between the processes of a host) and reads each example with one ranged read of its tar,
  in an order from an on-demand global shuffle. The images stay where they are: no copy of the dataset.

Nothing here holds an N-sized Python object: counts and offsets are numpy arrays (S-long in memory, N-long
memory-mapped).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import glob as globlib
import hashlib
import io
import json
import logging
import os
import posixpath
import threading

import numpy as np

from ncjax import fileio
from ncjax.data import readers

log = logging.getLogger("ncjax")

INDEX_DIRNAME = "_ncjax_index"
INDEX_VERSION = 1
IMAGE_EXTENSIONS = readers.IMAGE_EXTENSIONS
BLOCK = 512
MISSING32 = np.iinfo(np.uint32).max
MISSING64 = np.iinfo(np.uint64).max


class CorruptShard(readers.DataFormatError):
  """A tar shard that cannot be read past some point (bad header checksum, truncated member: `member` names it)."""

  def __init__(self, message: str, member: str | None = None):
    super().__init__(message)
    self.member = member


# ---------------------------------------------------------------------------------------------------------------
# tar members (ustar / GNU / pax), parsed from any file object: a local file, a gs:// object, or bytes
# ---------------------------------------------------------------------------------------------------------------
def _octal(field: bytes) -> int:
  if field and field[0] & 0x80:   # GNU base-256 for large sizes
    return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
  text = field.split(b"\0", 1)[0].strip()
  return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict:
  out, pos = {}, 0
  while pos < len(data):
    space = data.find(b" ", pos)
    if space < 0:
      break
    length = int(data[pos:space])
    key, _, value = data[space + 1:pos + length - 1].partition(b"=")
    out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    pos += length
  return out


def iter_members(f, want=lambda name: True, start: int = 0):
  """(name, first header offset, end offset, data or None) of each regular file of a tar read from `f` (positioned at
  `start`). `want(name)` says whose data to read; the others are skipped (seek when `f` can, read otherwise).
  The first header offset includes any pax / GNU long-name header of the member. Raises CorruptShard."""
  pos = start
  pending_name, first = None, None
  seekable = getattr(f, "seekable", lambda: False)()
  while True:
    header = f.read(BLOCK)
    if len(header) < BLOCK:
      if header.strip(b"\0") or len(header):
        raise CorruptShard(f"truncated tar header at byte {pos}")
      return   # a tar without its end-of-archive blocks (a cut stream): what was complete is kept
    if header.count(0) == BLOCK:
      return   # end of archive
    stored = _octal(header[148:156])
    computed = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if stored != computed:
      raise CorruptShard(f"bad tar header checksum at byte {pos}")
    size, kind = _octal(header[124:136]), header[156:157]
    first = pos if first is None else first
    padded = (size + BLOCK - 1) // BLOCK * BLOCK
    if kind in (b"x", b"L", b"g"):
      data = f.read(padded)
      if len(data) < padded:
        raise CorruptShard(f"truncated extended header at byte {pos}")
      if kind == b"x":
        pending_name = _pax_records(data[:size]).get("path", pending_name)
      elif kind == b"L":
        pending_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "replace")
      else:
        first = None   # a global header belongs to no member
      pos += BLOCK + padded
      continue
    if pending_name is not None:
      name = pending_name
    else:
      name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
      prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") if header[257:262] == b"ustar" else ""
      name = f"{prefix}/{name}" if prefix else name
    data = None
    if kind in (b"0", b"\0", b"7") and want(name):
      data = f.read(padded)
      if len(data) < size:
        raise CorruptShard(f"member {name} truncated at byte {pos}", name)
      data = data[:size]
    elif padded:
      if seekable:
        f.seek(padded, 1)
      else:
        while padded:
          got = len(f.read(min(padded, 1 << 20)))
          if not got:
            raise CorruptShard(f"member {name} truncated at byte {pos}", name)
          padded -= got
    pos += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    if kind in (b"0", b"\0", b"7"):
      yield name, first, pos, data
    pending_name, first = None, None


def split_key(name: str) -> tuple[str, str]:
  """'dir/000010.jpg' -> ('dir/000010', 'jpg'): the key is the name up to the first dot of its base name."""
  directory, _, base = name.rpartition("/")
  key, _, ext = base.partition(".")
  return (f"{directory}/{key}" if directory else key), ext.lower()


def iter_samples(f, want_exts=None, start: int = 0):
  """(key, first header offset, end offset, {ext: bytes}) per sample (consecutive members sharing a key)."""
  want = (lambda name: True) if want_exts is None else (lambda name: split_key(name)[1] in want_exts)
  key, begin, end, parts = None, None, None, {}
  try:
    for name, first, member_end, data in iter_members(f, want, start):
      if name.rpartition("/")[2].startswith("."):
        continue
      k, ext = split_key(name)
      if key is not None and k != key:
        yield key, begin, end, parts
        parts, begin = {}, None
      key = k
      begin = first if begin is None else begin
      end = member_end
      if data is not None:
        parts[ext] = data
  except CorruptShard as e:
    # The sample before a cut member is whole when the cut member starts the next one (a cut inside a sample's own
    # members loses that sample): the same rule whether the images were read or skipped by seeking.
    if key is not None and e.member is not None and split_key(e.member)[0] != key:
      yield key, begin, end, parts
    raise
  if key is not None:
    yield key, begin, end, parts


@dataclasses.dataclass
class Sample:
  """One pair as read from a shard: its global id, key, image bytes, caption, .json metadata (raw bytes), or the
  reason it is unusable (`bad`: a missing or unreadable sample)."""
  id: int
  key: str = ""
  image: bytes | None = None
  caption: str | None = None
  meta: bytes | None = None
  bad: str = ""

  def json(self) -> dict:
    if not self.meta:
      return {}
    try:
      return json.loads(self.meta.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
      return {}


def make_sample(sample_id: int, key: str, parts: dict, caption_key: str = "caption") -> Sample:
  image = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
  meta = parts.get("json")
  if "txt" in parts:
    caption = parts["txt"].decode("utf-8", errors="replace")
  else:
    caption = Sample(sample_id, meta=meta).json().get(caption_key) if meta else None
  return Sample(sample_id, key, image, caption, meta)


# ---------------------------------------------------------------------------------------------------------------
# A dataset: its shards and their sample counts
# ---------------------------------------------------------------------------------------------------------------
def _stem(tar_path: str) -> str:
  return tar_path[:-len(".tar")] if tar_path.endswith(".tar") else tar_path


def list_shards(root: str) -> list[str]:
  """The tar shards under `root` (any depth), sorted; a missing or empty root raises with what is there."""
  if fileio.is_remote(root):
    import fsspec
    fs, inner = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    protocol = root.split("://", 1)[0]
    # a recursive listing (fsspec's glob takes '**' only as a whole path component, and '**/*.tar' would miss
    # tars directly under root in some versions); hidden names (.partial uploads) are not shards
    found = sorted(f"{protocol}://{p}" for p in fs.find(inner.rstrip("/"))
                   if p.endswith(".tar") and not posixpath.basename(p).startswith("."))
  else:
    found = sorted(globlib.glob(os.path.join(root, "**", "*.tar"), recursive=True))
  if not found:
    listing = readers._listing(root) if not fileio.is_remote(root) else f"{root} holds no .tar"
    raise readers.DataFormatError(f"no WebDataset shards (*.tar) under {root}: expected img2dataset's output "
                                  f"(00000.tar + 00000.parquet, ...); {listing}")
  return found


def metadata_count(tar_path: str) -> int | None:
  """A shard's sample count from img2dataset's metadata: `_stats.json`'s successes, else the parquet's rows with
  status 'success' (all rows when it has no status column); None when neither exists."""
  stem = _stem(tar_path)
  stats = stem + "_stats.json"
  if fileio.exists(stats):
    try:
      value = json.loads(fileio.read_text(stats)).get("successes")
      if value is not None:
        return int(value)
    except (ValueError, OSError):
      pass
  parquet = stem + ".parquet"
  if fileio.exists(parquet):
    import pyarrow.parquet as pq
    with fileio.open_file(parquet, "rb") as f:
      pf = pq.ParquetFile(f)
      if "status" not in pf.schema_arrow.names:
        return pf.metadata.num_rows
      status = pf.read(columns=["status"]).column("status").to_numpy(zero_copy_only=False)
    return int(np.sum(status == "success"))
  return None


def read_parquet_captions(tar_path: str, limit: int | None = None, caption_column: str = "caption") -> list[str]:
  """The captions of a shard's successful rows from its parquet (tar order); [] when there is no parquet."""
  parquet = _stem(tar_path) + ".parquet"
  if not fileio.exists(parquet):
    return []
  import pyarrow.parquet as pq
  with fileio.open_file(parquet, "rb") as f:
    pf = pq.ParquetFile(f)
    names = pf.schema_arrow.names
    if caption_column not in names:
      return []
    table = pf.read(columns=[c for c in (caption_column, "status") if c in names])
  caps = table.column(caption_column).to_pylist()
  if "status" in names:
    caps = [c for c, s in zip(caps, table.column("status").to_pylist()) if s == "success"]
  return [c or "" for c in caps[:limit]]


def _parallel(fn, items, workers: int):
  if workers <= 1 or len(items) < 2:
    return [fn(x) for x in items]
  with cf.ThreadPoolExecutor(min(workers, len(items))) as pool:
    return list(pool.map(fn, items))


@dataclasses.dataclass
class WebDataset:
  """One img2dataset output: its shards, per-shard sample counts and (when built) the index. ids are
  `starts[s] + j` (see the module docstring)."""
  root: str
  shards: list[str]
  counts: np.ndarray                    # int64 (S,)
  name: str = ""
  index: "WebIndex | None" = None
  caption_key: str = "caption"
  clean_key: str = ""

  def __post_init__(self):
    self.counts = np.asarray(self.counts, np.int64)
    self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
    self.name = self.name or fileio.basename(self.root.rstrip("/"))

  @property
  def num_examples(self) -> int:
    return int(self.starts[-1])

  def locate(self, ids) -> tuple[np.ndarray, np.ndarray]:
    """(shard, position in shard) of global ids."""
    ids = np.asarray(ids, np.int64)
    shard = np.searchsorted(self.starts, ids, side="right") - 1
    return shard, ids - self.starts[shard]

  # -- streamed ---------------------------------------------------------------------------------------------------
  def iter_shard(self, s: int):
    """The samples of shard `s` in tar order, exactly counts[s] of them: missing ones (a short or corrupt tar, an
    unreadable object) come out as bad Samples with their ids, extra ones are dropped."""
    base, n = int(self.starts[s]), int(self.counts[s])
    j, error = 0, ""
    try:
      with fileio.open_sequential(self.shards[s]) as f:
        for key, _, _, parts in iter_samples(f):
          if j >= n:
            log.warning("%s holds more samples than its metadata's %d: the rest are not read", self.shards[s], n)
            break
          yield make_sample(base + j, key, parts, self.caption_key)
          j += 1
    except (CorruptShard, OSError) as e:
      error = f"{type(e).__name__}: {e}"
    if j < n:
      why = f"shard {self.shards[s]} ends after {j} of its {n} samples" + (f" ({error})" if error else "")
      log.warning("%s: %d samples skipped", why, n - j)
      for k in range(j, n):
        yield Sample(base + k, bad=why)

  # -- indexed ----------------------------------------------------------------------------------------------------
  def read(self, sample_id: int) -> Sample:
    """Random access by global id (needs the index)."""
    if self.index is None:
      raise readers.DataFormatError(f"{self.root} has no index: build it with python -m ncjax.data.build "
                                    f"--dataset=web --manual_dir={self.root}")
    return self.index.read(self, int(sample_id))

  def clean_flags(self, ids) -> np.ndarray | None:
    """The data's own clean flags of `ids` (a clean key in the .json, recorded by the index), None if unknown."""
    if self.index is None or self.index.clean is None:
      return None
    return np.asarray(self.index.clean[np.asarray(ids, np.int64)]) > 0

  def own_clean(self, sample: Sample) -> bool:
    """The clean flag a record carries in its .json (clean_key), True when the dataset has none."""
    if not self.clean_key:
      return True
    value = sample.json().get(self.clean_key)
    return True if value is None else bool(readers.clean_flag(value, f"{self.name}/{sample.key}"))


def dataset_cache_key(path: str) -> str:
  return hashlib.sha1(fileio.absolute(path).encode()).hexdigest()[:16]


def open_dataset(root: str, *, index_dir: str = "", use_index: bool = True, caption_key: str = "caption",
                 clean_key: str = "", cache_dir: str = "", workers: int = 16) -> WebDataset:
  """An img2dataset output at `root` (local or gs://): its built index when there is one (and use_index; without
  use_index its manifest still gives the shards and counts), else
  its shards and their metadata counts (read in parallel: one small file per shard)."""
  index_dir = index_dir or fileio.join(root, INDEX_DIRNAME)
  manifest_path = fileio.join(index_dir, "manifest.json")
  if fileio.isfile(manifest_path):
    index = WebIndex.open(index_dir, cache_dir) if use_index else None
    manifest = index.manifest if index is not None else json.loads(fileio.read_text(manifest_path))
    shards = [fileio.join(root, rel) for rel in manifest["shards"]]
    if manifest.get("clean_key") and not clean_key:
      clean_key = manifest["clean_key"]
    # streamed (use_index=False), a built index still gives the shard list and the counts
    return WebDataset(root, shards, manifest["counts"], index=index, caption_key=caption_key, clean_key=clean_key)
  shards = list_shards(root)
  counts = _parallel(metadata_count, shards, workers)
  missing = [s for s, c in zip(shards, counts) if c is None]
  if missing:
    raise readers.DataFormatError(
        f"{len(missing)} of {len(shards)} shards under {root} have neither a parquet nor a _stats.json (e.g. "
        f"{missing[0]}), so their sample counts are unknown without reading them: build the index once "
        f"(python -m ncjax.data.build --dataset=web --manual_dir={root}), which counts them")
  return WebDataset(root, shards, counts, caption_key=caption_key, clean_key=clean_key)


# ---------------------------------------------------------------------------------------------------------------
# The index: built once, in parallel, each shard read once
# ---------------------------------------------------------------------------------------------------------------
def _relative(root: str, path: str) -> str:
  root = root.rstrip("/") + "/"
  return path[len(root):] if path.startswith(root) else os.path.relpath(path, root)


def scan_shard(task) -> dict:
  """One shard's sample offsets (first header byte of each sample), its region end and, with a clean key, the
  clean flags; only headers and the small .json members are read from a local file (images are skipped by
  seeking), a gs:// object is read front to back once."""
  path, expected, clean_key = task
  offsets, ends, clean, error = [], [], [], ""
  want = {"json"} if clean_key else set()
  size = None
  try:
    with fileio.open_sequential(path) as f:
      size = f.seek(0, 2)
      f.seek(0)
      for key, begin, sample_end, parts in iter_samples(f, want):
        if expected is not None and len(offsets) >= expected:
          break
        offsets.append(begin)
        ends.append(sample_end)
        if clean_key:
          value = Sample(0, meta=parts.get("json")).json().get(clean_key)
          clean.append(1 if value is None else readers.clean_flag(value, f"{path}/{key}"))
  except (CorruptShard, OSError) as e:
    error = f"{type(e).__name__}: {e}"
  # Images are skipped by seeking, which does not notice a file cut short: keep the samples that end inside it.
  whole = int(np.searchsorted(np.asarray(ends, np.int64), size, side="right")) if size is not None else 0
  if whole < len(offsets):
    error = error or f"the tar is cut short at byte {size}"
  return dict(path=path, offsets=np.asarray(offsets[:whole], np.uint64), end=int(ends[whole - 1]) if whole else 0,
              clean=np.asarray(clean[:whole], np.uint8), expected=expected, error=error)


def _part_path(index_dir: str, s: int) -> str:
  return fileio.join(index_dir, "parts", f"{s:07d}.npz")


def build_index(root: str, *, index_dir: str = "", workers: int = 0, num_hosts: int = 1, host_index: int = 0,
                clean_key: str = "", merge: bool | None = None, progress=None) -> dict | None:
  """Index the shards of `root`: host `host_index` of `num_hosts` scans shards host_index::num_hosts with
  `workers` processes (0: one per usable core), writing one part per shard (a part already written is kept, so
  an interrupted build continues); `merge` (default: on a single host) joins the parts into offsets.npy,
  clean.npy and manifest.json. Returns the manifest when merged."""
  from ncjax.data.sources import usable_cores
  index_dir = index_dir or fileio.join(root, INDEX_DIRNAME)
  shards = list_shards(root)
  counts = _parallel(metadata_count, shards, 16)
  mine = [s for s in range(len(shards)) if s % num_hosts == host_index
          and not fileio.exists(_part_path(index_dir, s))]
  workers = workers or usable_cores()
  tasks = [(shards[s], counts[s], clean_key) for s in mine]
  done = 0

  def save(s, result):
    fileio.save_npz(_part_path(index_dir, s), offsets=result["offsets"], end=np.int64(result["end"]),
                    clean=result["clean"], expected=np.int64(-1 if result["expected"] is None else result["expected"]),
                    error=np.asarray(result["error"]))

  if workers > 1 and len(tasks) > 1:
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
      for s, result in zip(mine, pool.imap(scan_shard, tasks, chunksize=1)):
        save(s, result)
        done += 1
        if progress:
          progress(done, len(tasks))
  else:
    for s, task in zip(mine, tasks):
      save(s, scan_shard(task))
      done += 1
      if progress:
        progress(done, len(tasks))
  if merge is None:
    merge = num_hosts == 1
  return merge_index(root, index_dir, shards, clean_key) if merge else None


def merge_index(root: str, index_dir: str, shards: list[str] | None = None, clean_key: str = "") -> dict:
  """Join the per-shard parts (every host's) into the index files; raises naming the shards not yet scanned."""
  shards = shards or list_shards(root)
  missing = [s for s in range(len(shards)) if not fileio.exists(_part_path(index_dir, s))]
  if missing:
    raise readers.DataFormatError(f"{len(missing)} shards of {root} are not indexed yet (e.g. {shards[missing[0]]}):"
                                  f" run the build on every host (--num_hosts/--host_index) before --merge")
  parts = [fileio.load_npz(_part_path(index_dir, s)) for s in range(len(shards))]
  counts, ends, errors, offsets, cleans = [], [], {}, [], []
  for s, part in enumerate(parts):
    got = part["offsets"]
    expected = int(part["expected"])
    n = expected if expected >= 0 else len(got)
    counts.append(n)
    ends.append(int(part["end"]))
    err = str(part["error"])
    if err or len(got) < n:
      errors[_relative(root, shards[s])] = err or f"{len(got)} of {n} samples in the tar"
    offsets.append(got[:n])
    if clean_key:
      flags = np.ones(n, np.uint8)
      flags[:len(part["clean"])] = part["clean"][:n]
      cleans.append(flags)
  wide = max(ends, default=0) >= MISSING32
  dtype, missing_value = (np.uint64, MISSING64) if wide else (np.uint32, MISSING32)
  total = int(sum(counts))
  flat = np.full(total, missing_value, dtype)
  pos = 0
  for n, got in zip(counts, offsets):
    flat[pos:pos + len(got)] = got
    pos += n
  fileio.makedirs(index_dir)
  _save_npy(fileio.join(index_dir, "offsets.npy"), flat)
  if clean_key:
    _save_npy(fileio.join(index_dir, "clean.npy"), np.concatenate(cleans) if cleans else np.zeros(0, np.uint8))
  manifest = dict(version=INDEX_VERSION, shards=[_relative(root, p) for p in shards], counts=counts, ends=ends,
                  offsets_dtype=np.dtype(dtype).name, clean_key=clean_key, num_examples=total, bad_shards=errors)
  fileio.write_text(fileio.join(index_dir, "manifest.json"), json.dumps(manifest))
  for s in range(len(shards)):
    fileio.remove(_part_path(index_dir, s))
  return manifest


def _save_npy(path: str, array: np.ndarray) -> None:
  if fileio.is_remote(path):
    buf = io.BytesIO()
    np.save(buf, array)
    fileio.write_bytes(path, buf.getvalue())
  else:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
      np.save(f, array)
    os.replace(tmp, path)


class ShardFiles:
  """Open shards for ranged reads, at most `limit` at once (least recently used closed first): os.pread on a
  local file (thread-safe, no seek), an fsspec ranged read on gs://."""

  def __init__(self, limit: int = 256):
    self.limit, self.lock, self.open = limit, threading.Lock(), {}

  def read(self, path: str, start: int, end: int) -> bytes:
    if fileio.is_remote(path):
      import fsspec
      fs, inner = fsspec.core.url_to_fs(path)
      return fs.cat_file(inner, start=start, end=end)
    with self.lock:
      fd = self.open.pop(path, None)
      if fd is None:
        fd = os.open(path, os.O_RDONLY)
        while len(self.open) >= self.limit:
          os.close(self.open.pop(next(iter(self.open))))
      self.open[path] = fd   # most recently used last
    return os.pread(fd, end - start, start)


class WebIndex:
  """A built index, memory-mapped (`offsets`, `clean`); a gs:// index is copied once into a local cache."""

  def __init__(self, index_dir: str, local_dir: str):
    self.index_dir = index_dir
    with open(os.path.join(local_dir, "manifest.json"), encoding="utf-8") as f:
      self.manifest = json.load(f)
    if self.manifest.get("version") != INDEX_VERSION:
      raise readers.DataFormatError(f"{index_dir}: index version {self.manifest.get('version')}, this ncjax reads "
                                    f"{INDEX_VERSION}: rebuild it")
    self.offsets = np.load(os.path.join(local_dir, "offsets.npy"), mmap_mode="r")
    clean = os.path.join(local_dir, "clean.npy")
    self.clean = np.load(clean, mmap_mode="r") if os.path.isfile(clean) else None
    self.ends = np.asarray(self.manifest["ends"], np.int64)
    self.missing = np.iinfo(self.offsets.dtype).max
    self.files = ShardFiles()

  @classmethod
  def open(cls, index_dir: str, cache_dir: str = "") -> "WebIndex":
    if not fileio.is_remote(index_dir):
      return cls(index_dir, index_dir)
    local = os.path.join(cache_dir or os.path.expanduser("~/.cache/ncjax/web"), dataset_cache_key(index_dir))
    names = ["manifest.json", "offsets.npy", "clean.npy"]
    if not os.path.isfile(os.path.join(local, "manifest.json")) or \
        fileio.read_bytes(fileio.join(index_dir, "manifest.json")) != open(
            os.path.join(local, "manifest.json"), "rb").read():
      os.makedirs(local, exist_ok=True)
      for name in names[1:] + names[:1]:   # the manifest last: its presence says the copy is whole
        src = fileio.join(index_dir, name)
        if fileio.exists(src):
          fileio.copy_file(src, os.path.join(local, name))
    return cls(index_dir, local)

  def read(self, ds: WebDataset, sample_id: int) -> Sample:
    s = int(np.searchsorted(ds.starts, sample_id, side="right") - 1)
    start = int(self.offsets[sample_id])
    if start == self.missing:
      return Sample(sample_id, bad=f"sample {sample_id - ds.starts[s]} of {ds.shards[s]} is missing from its tar")
    last = sample_id + 1 >= ds.starts[s + 1]
    end = int(self.ends[s]) if last else int(self.offsets[sample_id + 1])
    if end == self.missing:
      end = int(self.ends[s])
    try:
      data = self.files.read(ds.shards[s], start, end)
      got = list(iter_samples(io.BytesIO(data)))
    except (CorruptShard, OSError) as e:
      return Sample(sample_id, bad=f"{ds.shards[s]} at byte {start}: {type(e).__name__}: {e}")
    if len(got) != 1:
      return Sample(sample_id, bad=f"{ds.shards[s]} at byte {start}: {len(got)} samples where the index has one")
    key, _, _, parts = got[0]
    return make_sample(sample_id, key, parts, ds.caption_key)


# ---------------------------------------------------------------------------------------------------------------
# Writing the layout (tests and benchmarks: synthetic img2dataset output)
# ---------------------------------------------------------------------------------------------------------------
def tar_member(name: str, data: bytes, mtime: int = 0) -> bytes:
  """One ustar member (header + data padded to 512 bytes), as Python's tarfile writes a short-named file."""
  raw = name.encode("utf-8")
  if len(raw) > 100:
    raise ValueError(f"member name {name!r} is longer than 100 bytes")
  header = bytearray(BLOCK)
  header[0:len(raw)] = raw
  header[100:108] = b"0000644\0"
  header[108:116] = b"0000000\0"
  header[116:124] = b"0000000\0"
  header[124:136] = b"%011o\0" % len(data)
  header[136:148] = b"%011o\0" % mtime
  header[148:156] = b" " * 8
  header[156:157] = b"0"
  header[257:265] = b"ustar\x0000"
  header[148:156] = b"%06o\0 " % sum(header)
  pad = (BLOCK - len(data) % BLOCK) % BLOCK
  return bytes(header) + data + b"\0" * pad


def tar_end() -> bytes:
  return b"\0" * (2 * BLOCK)


@functools.lru_cache(maxsize=None)
def _pyarrow():
  import pyarrow
  import pyarrow.parquet
  return pyarrow


def write_parquet(path: str, rows: dict) -> None:
  """img2dataset's per-shard parquet (columns as given: key, caption, status, url, ...)."""
  pa = _pyarrow()
  buf = io.BytesIO()
  pa.parquet.write_table(pa.table(rows), buf)
  fileio.write_bytes(path, buf.getvalue())
