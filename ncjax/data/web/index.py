"""The index of an img2dataset output: where every sample starts in its tar, built once, checked whenever it is used.

`python -m ncjax.data.build --dataset=web --manual_dir=ROOT` scans each shard once (headers parsed, images skipped
by seeking) and writes ROOT/_ncjax_index/:
* `offsets-<digest>.npy`: the first header byte of every sample in its shard (4 bytes per pair; 8 for shards over
  4 GiB), named by a digest of its content, so that two merges of the same parts write the same object;
* `clean-<digest>.npy`: 1 byte per pair, only with a clean key;
* `manifest.json` (written last: its presence says the index is whole): for every shard its path relative to ROOT,
  sample count, region end, **size and version** (an object store's generation, a local file's mtime), and the
  names of the files above.

An index that knows what it indexed. Part files are keyed by the shard's name (not its position in a listing) and
carry its size and version: a build that finds a part of another size or version scans that shard again, and a merge
refuses parts that do not match the listing, naming them. When a run opens the index, one recursive listing of ROOT
(pages of 1,000 objects) is compared with the manifest: a missing shard, or one of another size or version, is one
error naming it — before the first step, never offsets applied to the wrong tar. On an object store the reads are
also pinned to the indexed generation (ncjax.data.web.store.Range), so an object replaced during the run is an error on
its next read.

Builds on many hosts (`--num_hosts/--host_index`) write disjoint parts; `--merge` may run on several hosts at once:
each merge reads the same parts and writes the same bytes under the same names, the manifest last, and parts are
removed only after a manifest exists (a merge that finds them gone returns that manifest).

Opening a gs:// index: the offsets are downloaded once per host into a local cache (ncjax.data.web.host_cache: a
file lock makes one process download while the others of the host wait; the copy streams in 8 MiB pieces, never the
whole array in memory; least recently used files are evicted beyond a size bound) and memory-mapped: the page cache
holds one copy for every process of the host.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import io
import json
import logging
import os

import numpy as np

from ncjax import fileio
from ncjax.data.tables import readers
from ncjax.data.web import host_cache
from ncjax.data.web import pinned_stream
from ncjax.data.web import store
from ncjax.data.web import tar as web

log = logging.getLogger("ncjax")

INDEX_DIRNAME = "_ncjax_index"
INDEX_VERSION = 2
MISSING32 = np.iinfo(np.uint32).max
MISSING64 = np.iinfo(np.uint64).max


def index_dir_of(root: str, index_dir: str = "") -> str:
  return index_dir or fileio.join(root, INDEX_DIRNAME)


def relative(root: str, path: str) -> str:
  root = root.rstrip("/") + "/"
  return path[len(root):] if path.startswith(root) else os.path.relpath(path, root)


def part_path(index_dir: str, shard_name: str) -> str:
  """A shard's part file, keyed by the shard's name relative to the root (stable under any listing order)."""
  return fileio.join(index_dir, "parts", hashlib.sha1(shard_name.encode()).hexdigest()[:24] + ".npz")


# ---------------------------------------------------------------------------------------------------------------
# the shards and their metadata counts
# ---------------------------------------------------------------------------------------------------------------
def _stem(tar_path: str) -> str:
  return tar_path[:-len(".tar")] if tar_path.endswith(".tar") else tar_path


def list_shards(root: str, policy=None) -> list[str]:
  """The tar shards under `root` (any depth), sorted; a missing or empty root raises with what is there."""
  local = store.local_path(root)
  found = [o.path for o in store.list_files(root, ".tar", policy)] if local is None or os.path.isdir(local) else []
  if not found:
    listing = readers._listing(root) if not fileio.is_remote(root) else f"{root} holds no .tar"
    raise readers.DataFormatError(f"no WebDataset shards (*.tar) under {root}: expected img2dataset's output "
                                  f"(00000.tar + 00000.parquet, ...); {listing}")
  return found


def _count_from_stats(data: bytes | None) -> int | None:
  if data is None:
    return None
  try:
    value = json.loads(data.decode("utf-8")).get("successes")
  except (ValueError, UnicodeDecodeError, AttributeError):
    return None
  return None if value is None else int(value)


def _count_from_parquet(tar_path: str) -> int | None:
  parquet = _stem(tar_path) + ".parquet"
  import pyarrow.parquet as pq
  try:
    with fileio.open_file(parquet, "rb") as f:
      pf = pq.ParquetFile(f)
      if "status" not in pf.schema_arrow.names:
        return pf.metadata.num_rows
      status = pf.read(columns=["status"]).column("status").to_numpy(zero_copy_only=False)
  except FileNotFoundError:
    return None
  return int(np.sum(status == "success"))


def metadata_counts(tar_paths: list[str], policy=None, workers: int = 64) -> list[int | None]:
  """Each shard's sample count from img2dataset's metadata — `_stats.json`'s successes, else the parquet's rows with
  status 'success' (all rows without a status column), None when neither exists — read concurrently (one small
  request per shard, `workers` in flight), transient store faults retried."""
  policy = policy or store.RetryPolicy()
  counts = [_count_from_stats(d) for d in store.read_many([_stem(p) + "_stats.json" for p in tar_paths], policy,
                                                          workers)]
  rest = [k for k, c in enumerate(counts) if c is None]
  if rest:
    with cf.ThreadPoolExecutor(min(workers, len(rest))) as pool:
      found = pool.map(lambda k: policy.call(lambda: _count_from_parquet(tar_paths[k]), tar_paths[k]), rest)
      for k, c in zip(rest, found):
        counts[k] = c
  return counts


def metadata_count(tar_path: str) -> int | None:
  return metadata_counts([tar_path])[0]


# ---------------------------------------------------------------------------------------------------------------
# scanning one shard
# ---------------------------------------------------------------------------------------------------------------
WHOLE_OBJECT_BYTES = 64 << 20   # an object up to this size is scanned from one GET (a small shard: one round trip)
SCAN_THREADS = 8                 # shards scanned at once by each build process (round trips overlap)


def scan_shard(task) -> dict:
  """One shard's sample offsets (first header byte of each sample), its region end and, with a clean key, the
  clean flags: only headers and the small .json members are read from a local file (images are skipped by
  seeking); an object is read front to back once (one GET when it is small). Transient store faults are retried
  (ncjax.data.web.store). task: (path, expected count or None, clean key, deadline s[, size[, request timeout s]])
  — a build's worker processes bound their requests as the build does."""
  path, expected, clean_key, deadline_s = task[:4]
  size = task[4] if len(task) > 4 else None
  if len(task) > 5 and task[5] != fileio.request_timeout_s():
    fileio.bound_requests(task[5])
  pin = task[6] if len(task) > 6 else ""
  policy = store.RetryPolicy(deadline_s=deadline_s, request_timeout_s=fileio.request_timeout_s())
  return policy.call(lambda: _scan(path, expected, clean_key, size, pin), path)


def scan_shards(tasks: list) -> list[dict]:
  """scan_shard of each task, SCAN_THREADS at once (what one build process runs)."""
  if len(tasks) <= 1:
    return [scan_shard(t) for t in tasks]
  with cf.ThreadPoolExecutor(min(SCAN_THREADS, len(tasks))) as pool:
    return list(pool.map(scan_shard, tasks))


def _scan(path: str, expected, clean_key: str, known_size: int | None = None, pin: str = "") -> dict:
  """One shard's offsets, read as listed (`pin`: the part records the listing's version, so its bytes must be that
  version's: a shard changed while it is scanned is ShardChanged, scanned again by the next build)."""
  offsets, ends, clean, error = [], [], [], ""
  want = {"json"} if clean_key else set()
  size = None
  whole = fileio.is_remote(path) and known_size is not None and known_size <= WHOLE_OBJECT_BYTES
  try:
    with pinned_stream.open_stream(path, pin, buffer_size=max(1, known_size or 0) if whole else 8 << 20) as f:
      size = f.seek(0, 2)
      f.seek(0)
      for key, begin, sample_end, parts in web.iter_samples(f, want):
        if expected is not None and len(offsets) >= expected:
          break
        offsets.append(begin)
        ends.append(sample_end)
        if clean_key:
          value = web.Sample(0, meta=parts.get("json")).json().get(clean_key)
          clean.append(1 if value is None else readers.clean_flag(value, f"{path}/{key}"))
  except web.CorruptShard as e:
    error = f"{type(e).__name__}: {e}"
  # Images are skipped by seeking, which does not notice a file cut short: keep the samples that end inside it.
  whole = int(np.searchsorted(np.asarray(ends, np.int64), size, side="right")) if size is not None else 0
  if whole < len(offsets):
    error = error or f"the tar is cut short at byte {size}"
  return dict(path=path, offsets=np.asarray(offsets[:whole], np.uint64), end=int(ends[whole - 1]) if whole else 0,
              clean=np.asarray(clean[:whole], np.uint8), expected=expected, error=error)


# ---------------------------------------------------------------------------------------------------------------
# build and merge
# ---------------------------------------------------------------------------------------------------------------
def _listing(root: str, policy: store.RetryPolicy) -> list[store.ObjectInfo]:
  shards = store.list_files(root, ".tar", policy)
  if not shards:
    list_shards(root)   # raises with what is there
  return shards


def _existing_parts(index_dir: str, policy: store.RetryPolicy) -> set[str]:
  parts_dir = fileio.join(index_dir, "parts")
  return {o.path for o in store.list_files(parts_dir, ".npz", policy)} if fileio.exists(parts_dir) else set()


def _part_matches(part: dict, name: str, info: store.ObjectInfo) -> bool:
  return str(part.get("name")) == name and int(part.get("size", -1)) == info.size and \
      str(part.get("version")) == info.version


def build_index(root: str, *, index_dir: str = "", workers: int = 0, num_hosts: int = 1, host_index: int = 0,
                clean_key: str = "", merge: bool | None = None, progress=None,
                deadline_s: float = store.DEFAULT_DEADLINE_S, request_timeout_s: float | None = None) -> dict | None:
  """Index the shards of `root`: host `host_index` of `num_hosts` scans shards host_index::num_hosts with
  `workers` processes (0: one per usable core), writing one part per shard (a part already written for the same
  shard name, size and version is kept, so an interrupted build continues); `merge` (default: on a single host)
  joins the parts into the index files. Returns the manifest when merged. One listing and concurrent reads of the
  shards' metadata: no per-shard round trips before the scan. A store that stops answering ends the build within
  `deadline_s` plus one request (`request_timeout_s`, default fileio's bound) with StoreUnavailable."""
  from ncjax.data.tables.sources import usable_cores
  if request_timeout_s is not None:
    fileio.bound_requests(request_timeout_s)
  policy = store.RetryPolicy(deadline_s=deadline_s, request_timeout_s=fileio.request_timeout_s())
  index_dir = index_dir_of(root, index_dir)
  shards = _listing(root, policy)
  names = [relative(root, o.path) for o in shards]
  have = _existing_parts(index_dir, policy)
  mine = [s for s in range(len(shards)) if s % num_hosts == host_index]
  if have:   # a part of the same shard name but another size or version is stale: scan again
    kept = [s for s in mine if part_path(index_dir, names[s]) in have]
    stale = {s for s, part in zip(kept, _read_parts(index_dir, [names[s] for s in kept], policy))
             if part is None or not _part_matches(part, names[s], shards[s])}
    mine = [s for s in mine if part_path(index_dir, names[s]) not in have or s in stale]
  counts = metadata_counts([shards[s].path for s in mine], policy=policy)
  workers = workers or usable_cores()
  tasks = [(shards[s].path, counts[k], clean_key, deadline_s, shards[s].size, policy.request_timeout_s, shards[s].pin)
           for k, s in enumerate(mine)]
  chunk = max(1, min(SCAN_THREADS * 2, len(tasks) // max(1, workers * 4)))
  chunks = [(mine[i:i + chunk], tasks[i:i + chunk]) for i in range(0, len(tasks), chunk)]
  done = 0

  def save(s, result):
    policy.call(lambda: fileio.save_npz(
        part_path(index_dir, names[s]), offsets=result["offsets"], end=np.int64(result["end"]),
        clean=result["clean"], expected=np.int64(-1 if result["expected"] is None else result["expected"]),
        error=np.asarray(result["error"]), name=np.asarray(names[s]), size=np.int64(shards[s].size),
        version=np.asarray(shards[s].version)), part_path(index_dir, names[s]))

  with cf.ThreadPoolExecutor(16) as writers:   # one object per part: their round trips overlap too
    if workers > 1 and len(chunks) > 1:
      import multiprocessing
      pool = multiprocessing.get_context("spawn").Pool(min(workers, len(chunks)))
      results = pool.imap(scan_shards, [t for _, t in chunks])
    else:
      pool, results = None, map(scan_shards, [t for _, t in chunks])
    try:
      for (ids, _), scanned in zip(chunks, results):
        list(writers.map(save, ids, scanned))
        done += len(ids)
        if progress:
          progress(done, len(tasks))
    finally:
      if pool is not None:
        pool.close()
        pool.join()
  if merge is None:
    merge = num_hosts == 1
  return merge_index(root, index_dir, clean_key, listing=shards, deadline_s=deadline_s, policy=policy) if merge \
      else None


def _read_parts(index_dir: str, names: list[str], policy: store.RetryPolicy) -> list[dict | None]:
  raw = store.read_many([part_path(index_dir, n) for n in names], policy)
  out = []
  for data in raw:
    if data is None:
      out.append(None)
      continue
    with np.load(io.BytesIO(data)) as z:
      out.append({k: z[k] for k in z.files})
  return out


def _digest_name(prefix: str, array: np.ndarray) -> tuple[str, bytes]:
  buf = io.BytesIO()
  np.save(buf, array)
  data = buf.getvalue()
  return f"{prefix}-{hashlib.sha256(data).hexdigest()[:16]}.npy", data


def merge_index(root: str, index_dir: str = "", clean_key: str = "", *, listing=None,
                deadline_s: float = store.DEFAULT_DEADLINE_S, policy: store.RetryPolicy | None = None) -> dict:
  """Join the per-shard parts (every host's) into the index files; raises naming the shards not yet scanned or
  scanned from another version of the shard."""
  policy = policy or store.RetryPolicy(deadline_s=deadline_s, request_timeout_s=fileio.request_timeout_s())
  index_dir = index_dir_of(root, index_dir)
  shards = listing if listing is not None else _listing(root, policy)
  names = [relative(root, o.path) for o in shards]
  parts = _read_parts(index_dir, names, policy)
  missing = [n for n, p in zip(names, parts) if p is None]
  if missing:
    done = read_manifest(index_dir)   # another host's merge may have finished (and removed the parts) just now
    if done is not None and _manifest_matches(done, names, shards):
      return done
    raise readers.DataFormatError(f"{len(missing)} shards of {root} are not indexed yet (e.g. {missing[0]}): run "
                                  f"the build on every host (--num_hosts/--host_index) before --merge")
  stale = [n for n, p, o in zip(names, parts, shards) if not _part_matches(p, n, o)]
  if stale:
    raise readers.DataFormatError(f"{len(stale)} shards of {root} changed since they were scanned (e.g. {stale[0]}: "
                                  f"another size or version): run the build again (it rescans only those)")
  counts, ends, errors, offsets, cleans = [], [], {}, [], []
  for name, part in zip(names, parts):
    got = part["offsets"]
    expected = int(part["expected"])
    n = expected if expected >= 0 else len(got)
    counts.append(n)
    ends.append(int(part["end"]))
    err = str(part["error"])
    if err or len(got) < n:
      errors[name] = err or f"{len(got)} of {n} samples in the tar"
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
  offsets_name, data = _digest_name("offsets", flat)
  fileio.write_bytes(fileio.join(index_dir, offsets_name), data)
  clean_name = ""
  if clean_key:
    clean_name, data = _digest_name("clean", np.concatenate(cleans) if cleans else np.zeros(0, np.uint8))
    fileio.write_bytes(fileio.join(index_dir, clean_name), data)
  manifest = dict(version=INDEX_VERSION, shards=names, counts=counts, ends=ends, sizes=[o.size for o in shards],
                  versions=[o.version for o in shards], offsets_file=offsets_name, offsets_dtype=np.dtype(dtype).name,
                  clean_file=clean_name, clean_key=clean_key, num_examples=total, bad_shards=errors)
  fileio.write_text(fileio.join(index_dir, "manifest.json"), json.dumps(manifest))
  def remove(name):
    with contextlib.suppress(FileNotFoundError, OSError):
      fileio.remove(part_path(index_dir, name))

  with cf.ThreadPoolExecutor(32) as pool:   # one request per part: overlapped (40k parts at 30 ms: 40 s, not 20 min)
    list(pool.map(remove, names))
  if not fileio.is_remote(index_dir):   # an object store has no empty directories to leave behind
    with contextlib.suppress(OSError):
      os.rmdir(os.path.join(index_dir, "parts"))
  return manifest


def read_manifest(index_dir: str) -> dict | None:
  path = fileio.join(index_dir, "manifest.json")
  try:
    return json.loads(fileio.read_text(path))
  except FileNotFoundError:
    return None


def _manifest_matches(manifest: dict, names, shards) -> bool:
  return manifest.get("version") == INDEX_VERSION and manifest.get("shards") == list(names) and \
      manifest.get("sizes") == [o.size for o in shards] and manifest.get("versions") == [o.version for o in shards]


def check_shards(root: str, manifest: dict, policy: store.RetryPolicy | None = None) -> list[store.ObjectInfo]:
  """The manifest's shards as they are now (one listing), or one error naming a shard that is missing or is not the
  one indexed. Local files are compared by size and modification time; objects by size and generation."""
  found = {o.path: o for o in store.list_files(root, ".tar", policy or store.RetryPolicy())}
  known = {fileio.join(root, name) for name in manifest["shards"]}
  added = sorted(relative(root, p) for p in found if p not in known)
  out, missing, changed = [], [], []
  for name, size, version in zip(manifest["shards"], manifest["sizes"], manifest["versions"]):
    path = fileio.join(root, name)
    o = found.get(path)
    if o is None:
      missing.append(name)
    elif o.size != size or o.version != version:
      changed.append(f"{name} (indexed {size} bytes, version {version}; now {o.size} bytes, version {o.version})")
    out.append(o)
  if missing:
    raise store.ShardMissing(f"{len(missing)} shards indexed under {root} are not there (e.g. {missing[0]}): they "
                             f"were deleted or moved after the build; restore them or rebuild the index "
                             f"(python -m ncjax.data.build --dataset=web --manual_dir={root})")
  if added:
    raise store.ShardChanged(f"{len(added)} shards under {root} are not in its index (e.g. {added[0]}): added after "
                             f"the build, they would be left out without a word; rebuild the index (python -m "
                             f"ncjax.data.build --dataset=web --manual_dir={root}; indexed shards are not rescanned) "
                             f"or move them out of {root}")
  if changed:
    raise store.ShardChanged(f"{len(changed)} shards under {root} changed after the index was built (e.g. "
                             f"{changed[0]}): the offsets would read the wrong bytes; rebuild the index (python -m "
                             f"ncjax.data.build --dataset=web --manual_dir={root}; unchanged shards are not rescanned)")
  return out


# ---------------------------------------------------------------------------------------------------------------
# a built index, opened for reading
# ---------------------------------------------------------------------------------------------------------------
class WebIndex:
  """A built index: the manifest, the offsets and clean flags memory-mapped (a gs:// index from a per-host cache)."""

  def __init__(self, index_dir: str, manifest: dict, local_dir: str, maps: dict | None = None):
    self.index_dir, self.manifest = index_dir, manifest
    load = (lambda name: maps[name]) if maps is not None else \
        (lambda name: np.load(os.path.join(local_dir, name), mmap_mode="r"))
    self.offsets = load(manifest["offsets_file"])
    self.clean = load(manifest["clean_file"]) if manifest.get("clean_file") else None
    if len(self.offsets) != manifest["num_examples"]:
      raise readers.DataFormatError(f"{index_dir}: {manifest['offsets_file']} holds {len(self.offsets)} offsets for "
                                    f"{manifest['num_examples']} pairs: rebuild the index")
    self.ends = np.asarray(manifest["ends"], np.int64)
    self.missing = np.iinfo(self.offsets.dtype).max

  @classmethod
  def open(cls, index_dir: str, cache_dir: str = "", policy: store.RetryPolicy | None = None,
           cache_bytes: int = host_cache.DEFAULT_CACHE_BYTES) -> "WebIndex":
    """The index at `index_dir`; a remote one's files from the host's cache (ncjax.data.web.host_cache: downloaded
    once per host, least recently used files evicted beyond `cache_bytes`)."""
    policy = policy or store.RetryPolicy()
    manifest = policy.call(lambda: read_manifest(index_dir), fileio.join(index_dir, "manifest.json"))
    if manifest is None:
      raise readers.DataFormatError(f"{index_dir} holds no manifest.json: the index is not built (or its merge did "
                                    f"not finish)")
    if manifest.get("version") != INDEX_VERSION:
      raise readers.DataFormatError(f"{index_dir}: index version {manifest.get('version')}, this ncjax reads "
                                    f"{INDEX_VERSION} (which records each shard's size and version): rebuild it "
                                    f"with python -m ncjax.data.build --dataset=web")
    if not fileio.is_remote(index_dir):
      return cls(index_dir, manifest, index_dir)
    names = [n for n in (manifest["offsets_file"], manifest.get("clean_file")) if n]
    maps = host_cache.mapped(index_dir, names, cache_dir, policy, cache_bytes)
    return cls(index_dir, manifest, "", maps)

  def sample_range(self, ds, sample_id: int) -> tuple[int, int, int] | None:
    """(shard, start, end) of the bytes of sample `sample_id`, None when the tar lacks it."""
    s = int(np.searchsorted(ds.starts, sample_id, side="right") - 1)
    start = int(self.offsets[sample_id])
    if start == self.missing:
      return None
    last = sample_id + 1 >= ds.starts[s + 1]
    end = int(self.ends[s]) if last else int(self.offsets[sample_id + 1])
    if end == self.missing:
      end = int(self.ends[s])
    return s, start, end

  def sample_ranges(self, ds, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, start, end) of many samples at once; start -1 where the tar lacks the sample."""
    ids = np.asarray(ids, np.int64)
    shard = np.searchsorted(ds.starts, ids, side="right") - 1
    start = np.asarray(self.offsets[ids]).astype(np.int64)
    last = ids + 1 >= ds.starts[shard + 1]
    nxt = np.asarray(self.offsets[np.minimum(ids + 1, len(self.offsets) - 1)]).astype(np.int64)
    end = np.where(last | (nxt == int(self.missing)), self.ends[shard], nxt)
    start = np.where(start == int(self.missing), -1, start)
    return shard, start, end

  def run_ranges(self, ds, first: int, last: int) -> list[tuple[int, int, int, int, int]]:
    """The reads that cover ids [first, last): (shard, start byte, end byte, first id, id count) per shard touched,
    leaving out samples the tar lacks (those are always a shard's trailing ones)."""
    out = []
    s = int(np.searchsorted(ds.starts, first, side="right") - 1)
    while first < last:
      shard_end_id = int(ds.starts[s + 1])
      hi = min(last, shard_end_id)
      present = first
      block = np.asarray(self.offsets[first:hi])
      present = first + int(np.count_nonzero(block != self.missing))
      if present > first:
        start = int(block[0])
        end = int(self.offsets[present]) if present < shard_end_id and self.offsets[present] != self.missing \
            else int(self.ends[s])
        out.append((s, start, end, first, present - first))
      first, s = hi, s + 1
    return out
