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

Two ways to read (ncjax.data.web.pipeline):
* streamed: nothing to build; shards are read front to back during training (see ncjax.data.web.mixture for the order).
* indexed: `python -m ncjax.data.build --dataset=web --manual_dir=ROOT` scans every shard once and writes the
  byte offset of every sample (ncjax.data.web.index); training reads runs of consecutive samples, or single ones,
  with ranged reads (ncjax.data.web.store), in an order from on-demand permutations. The images stay where they are: no
  copy of the dataset.

Faults: a fault of the store (unreachable, overloaded) is retried and then stops the run; a missing or changed
shard is one error naming it; only a record's own content (a cut member, an undecodable image, an empty or
non-UTF-8 caption) makes a bad record, skipped and counted (ncjax.data.web.store).

Nothing here holds an N-sized Python object: counts and offsets are numpy arrays (S-long in memory, N-long
memory-mapped).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import time

import numpy as np

from ncjax import fileio
from ncjax.data.tables import readers
from ncjax.data.web import pinned_stream
from ncjax.data.web import store
from ncjax.data.web import index as web_index

log = logging.getLogger("ncjax")
STREAM_BUFFER = 8 << 20   # bytes per request of a streamed shard on an object store

# The tar layer and the index, under the names this module always had (readers of a web dataset import them here)
from ncjax.data.web.index import (INDEX_DIRNAME, _stem, list_shards, metadata_count,  # noqa: E402,F401
                                  metadata_counts)
from ncjax.data.web.tar import (BLOCK, IMAGE_EXTENSIONS, CorruptShard, Sample, iter_members,  # noqa: E402,F401
                                iter_samples, make_sample, split_key, tar_end, tar_member, write_parquet)


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


@dataclasses.dataclass
class WebDataset:
  """One img2dataset output: its shards, per-shard sample counts and (when built) the index. ids are
  `starts[s] + j` (see the module docstring). `versions`: each shard's version as listed (an object's generation),
  pinned by the reads when the index recorded it."""
  root: str
  shards: list[str]
  counts: np.ndarray                    # int64 (S,)
  name: str = ""
  index: "object | None" = None         # ncjax.data.web.index.WebIndex
  caption_key: str = "caption"
  clean_key: str = ""
  versions: list = dataclasses.field(default_factory=list)
  policy: "object | None" = None        # ncjax.data.web.store.RetryPolicy
  pins: list = dataclasses.field(default_factory=list)   # each shard as listed when opened (store.ObjectInfo.pin)

  def __post_init__(self):
    self.counts = np.asarray(self.counts, np.int64)
    self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
    self.name = self.name or fileio.basename(self.root.rstrip("/"))
    self.policy = self.policy or store.RetryPolicy()
    self._reader = None

  @property
  def num_examples(self) -> int:
    return int(self.starts[-1])

  def locate(self, ids) -> tuple[np.ndarray, np.ndarray]:
    """(shard, position in shard) of global ids."""
    ids = np.asarray(ids, np.int64)
    shard = np.searchsorted(self.starts, ids, side="right") - 1
    return shard, ids - self.starts[shard]

  def pins_record(self) -> dict:
    """The shards as this run listed them, for a checkpoint: a digest, and the list itself compressed (a resume
    names the shard that changed)."""
    import base64
    import hashlib
    import json
    import zlib
    rows = [[web_index.relative(self.root, p), _portable(p, pin)] for p, pin in zip(self.shards, self.pins)]
    text = json.dumps(rows, separators=(",", ":"))
    return dict(digest=hashlib.sha256(text.encode()).hexdigest(),
                pins=base64.b64encode(zlib.compress(text.encode(), 6)).decode())

  def changed_since(self, record: dict) -> str:
    """'' when the shards are those of `record` (pins_record), else the first difference, in words."""
    import base64
    import json
    import zlib
    now = self.pins_record()
    if not record or not record.get("digest") or record["digest"] == now["digest"]:
      return ""
    then = dict(json.loads(zlib.decompress(base64.b64decode(record["pins"]))))
    current = {web_index.relative(self.root, p): _portable(p, pin) for p, pin in zip(self.shards, self.pins)}
    for name in sorted(set(then) | set(current)):
      if then.get(name) != current.get(name):
        if name not in current:
          return f"{fileio.join(self.root, name)} is gone"
        if name not in then:
          return f"{fileio.join(self.root, name)} was added"
        return f"{fileio.join(self.root, name)} changed (size:version then {then[name]}, now {current[name]})"
    return f"the shards under {self.root} differ"

  def version_of(self, s: int) -> str:
    """What a ranged read of shard s pins: an object's generation, a local file's pin (size, mtime, inode)."""
    if store.local_path(self.shards[s]) is None:
      return str(self.versions[s]) if self.versions else ""
    return self.pins[s] if self.pins else ""

  # -- streamed ---------------------------------------------------------------------------------------------------
  def iter_shard(self, s: int, first: int = 0, last: int | None = None):
    """Samples [first, last) of shard `s` in tar order (all of them by default), exactly that many: missing ones (a
    short or corrupt tar) come out as bad Samples with their ids, extra ones are dropped. A transient fault of the
    store re-opens the object where the last whole sample ended (retried until the policy's deadline: then
    StoreUnavailable); a missing object raises ShardMissing — store faults are never bad records."""
    base, n = int(self.starts[s]), int(self.counts[s])
    last = n if last is None else min(int(last), n)
    path, j, resume_at, error = self.shards[s], 0, 0, ""
    first_failure, attempt, failed_at, tries = None, 0, 0, {}
    pin = self.pins[s] if self.pins else ""
    while True:
      began = time.monotonic()
      try:
        with pinned_stream.open_stream(path, pin, STREAM_BUFFER) as f:   # never another file behind the same ids
          if resume_at:
            f.seek(resume_at)
          for key, begin, end, parts in iter_samples(f, start=resume_at):
            if j >= n:
              log.warning("%s holds more samples than its metadata's %d: the rest are not read", path, n)
              break
            resume_at = end
            if j >= last:
              break
            if j >= first:
              sample = make_sample(base + j, key, parts, self.caption_key)
              sample.span = (begin, end)   # where to read it again with one ranged read (an audit's report)
              yield sample
            j += 1
        break
      except CorruptShard as e:
        error = f"{type(e).__name__}: {e}"
        break
      except FileNotFoundError:
        raise store.ShardMissing(f"{path} is not there (deleted or renamed after the dataset was listed)") from None
      except Exception as e:  # noqa: BLE001 — a fault of the store: retried from the last whole sample
        progressed, failed_at = resume_at > failed_at, resume_at
        if first_failure is None or progressed:   # reads recovered since the last fault: a whole deadline again,
          first_failure, attempt = (time.monotonic() if progressed else began), 0   # counted from this fault
        time.sleep(self.policy.failed(path, e, first_failure, attempt, tries))
        attempt += 1
    if j < last:
      store.check_pin(path, pin, self.policy)   # a file cut or replaced while it was read is not the data's fault
      why = f"shard {path} ends after {j} of its {n} samples" + (f" ({error})" if error else "")
      log.warning("%s: %d samples skipped", why, last - max(j, first))
      for k in range(max(j, first), last):
        yield Sample(base + k, bad=why)

  # -- indexed ----------------------------------------------------------------------------------------------------
  def read(self, sample_id: int) -> Sample:
    """Random access by global id (needs the index): one ranged read."""
    return self.read_run(int(sample_id), int(sample_id) + 1)[0]

  def read_run(self, first: int, last: int, reader=None) -> list[Sample]:
    """Samples [first, last) by id (needs the index): one ranged read per shard the run touches."""
    if self.index is None:
      raise readers.DataFormatError(f"{self.root} has no index: build it with python -m ncjax.data.build "
                                    f"--dataset=web --manual_dir={self.root}")
    if reader is None:
      self._reader = self._reader or store.RangeReader(self.policy)
      reader = self._reader
    runs = self.index.run_ranges(self, first, last)
    data = reader.read([store.Range(self.shards[s], a, b, self.version_of(s)) for s, a, b, _, _ in runs])
    out: dict[int, Sample] = {}
    for (s, a, _, lo, n), raw in zip(runs, data):
      out.update(parse_run(self, s, a, lo, n, raw))
    return [out.get(i) or Sample(i, bad=self._missing_reason(i)) for i in range(first, last)]

  def close(self) -> None:
    """Close the range reader random access opened (its threads and descriptors)."""
    if self._reader is not None:
      self._reader.close()
      self._reader = None

  def _missing_reason(self, sample_id: int) -> str:
    s, k = self.locate(sample_id)
    return f"sample {int(k)} of {self.shards[int(s)]} is missing from its tar (cut or corrupt)"

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


def _portable(path: str, pin: str) -> str:
  """A pin as a checkpoint records it: a local file's without its inode (the hosts of a pod, or a restarted host,
  hold their own copies: same size and modification time when copied with rsync -a / cp -p, not the same inode)."""
  return pin if store.local_path(path) is None else ":".join(pin.split(":")[:2])


def parse_run(ds: WebDataset, s: int, start: int, first_id: int, n: int, data: bytes) -> dict[int, Sample]:
  """The `n` samples starting at id `first_id` from the bytes of shard `s` read from byte `start`: each must begin
  where the index says (else the shard is not the one indexed: ShardChanged); a member cut or corrupt makes the
  rest of the run bad records (the data's own fault)."""
  out: dict[int, Sample] = {}
  offsets = ds.index.offsets
  k = 0
  try:
    for key, begin, _, parts in iter_samples(io.BytesIO(data)):
      if k >= n:
        break
      sid = first_id + k
      if start + begin != int(offsets[sid]):
        raise store.ShardChanged(f"{ds.shards[s]}: sample {sid - int(ds.starts[s])} begins at byte {start + begin}, "
                                 f"the index says {int(offsets[sid])}: the shard is not the one indexed; rebuild the "
                                 f"index")
      out[sid] = make_sample(sid, key, parts, ds.caption_key)
      k += 1
  except CorruptShard as e:
    for sid in range(first_id + k, first_id + n):
      out[sid] = Sample(sid, bad=f"{ds.shards[s]} at byte {start}: {type(e).__name__}: {e}")
  for sid in range(first_id + k, first_id + n):
    out.setdefault(sid, Sample(sid, bad=f"{ds.shards[s]} at byte {start}: fewer samples than the index has"))
  return out


def open_dataset(root: str, *, index_dir: str = "", use_index: bool = True, caption_key: str = "caption",
                 clean_key: str = "", cache_dir: str = "", workers: int = 64, policy=None,
                 check: bool = True, cache_bytes: int = 32 << 30) -> WebDataset:
  """An img2dataset output at `root` (local or gs://). With a built index (and use_index), the index (its shards
  checked against one listing: a missing or changed shard is one error naming it); without use_index its manifest
  still gives the shards and counts (one read). Else one listing and the shards' metadata counts, read
  concurrently. A remote index is mapped from the host's cache (`cache_dir`, bounded by `cache_bytes`)."""
  policy = policy or store.RetryPolicy()
  root = store.local_path(root) if root.startswith("file://") else root   # a file:// root is local disk
  index_dir = web_index.index_dir_of(root, index_dir)
  manifest = policy.call(lambda: web_index.read_manifest(index_dir), index_dir)
  if manifest is not None and manifest.get("version") != web_index.INDEX_VERSION and not use_index:
    manifest = None   # an old index: streaming lists the shards itself
  if manifest is not None:
    index = web_index.WebIndex.open(index_dir, cache_dir, policy, cache_bytes) if use_index else None
    shards = [fileio.join(root, rel) for rel in manifest["shards"]]
    versions = list(manifest.get("versions", []))
    pins = []
    if check:   # streamed from the manifest's counts too: those count the indexed shards, no others
      pins = [o.pin for o in web_index.check_shards(root, manifest, policy)]
    if manifest.get("clean_key") and not clean_key:
      clean_key = manifest["clean_key"]
    return WebDataset(root, shards, manifest["counts"], index=index, caption_key=caption_key, clean_key=clean_key,
                      versions=versions, policy=policy, pins=pins)
  local = store.local_path(root)
  infos = store.list_files(root, ".tar", policy) if local is None or os.path.isdir(local) else []
  if not infos:
    list_shards(root)   # raises with what is there
  shards = [o.path for o in infos]
  counts = metadata_counts(shards, policy, workers)
  missing = [s for s, c in zip(shards, counts) if c is None]
  if missing:
    raise readers.DataFormatError(
        f"{len(missing)} of {len(shards)} shards under {root} have neither a parquet nor a _stats.json (e.g. "
        f"{missing[0]}), so their sample counts are unknown without reading them: build the index once "
        f"(python -m ncjax.data.build --dataset=web --manual_dir={root}), which counts them")
  return WebDataset(root, shards, counts, caption_key=caption_key, clean_key=clean_key,
                    versions=[o.version for o in infos], policy=policy, pins=[o.pin for o in infos])
