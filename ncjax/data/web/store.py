"""Reading a dataset's files where they lie — local disk or an object store (gs://) — for the web reader: many
ranged reads in flight at once, a listing that records what each shard *is* (size and, on an object store, its
generation), and a fault policy that never turns a fault of the store into a fault of the data.

Faults. A read can fail four ways, and each has one outcome:
* the store is unreachable or overloaded (timeouts, refused or reset connections, HTTP 408 / 429 / 5xx): *transient*
  — the read is retried with exponential backoff (1 s doubling to 30 s) until it succeeds or `deadline_s` seconds
  have passed since its first failure; then the run stops with one line (`StoreUnavailable`), its last checkpoint
  intact, and relaunching the same command resumes it exactly. Every request is bounded (fileio.bound_requests), so
  a read gives up at most `deadline_s` + one request's timeout after the store went away (gcsfs retries a request
  that failed fast itself for about 30 s first, pods.md §7);
* the store answers for good: its TLS certificate does not verify, or it refuses the credentials (HTTP 401 / 403,
  once more after a credential refresh) — `StoreRefused`, at once, in one line saying which;
* the object is gone (404, FileNotFoundError) or is not the one the run listed (another size, generation or, for a
  local file, modification time or inode — compared with every read, `ShardChanged`): one line naming the shard —
  never a bad record;
* anything else the store says (400, a local EIO): not retried, one line naming the path.
The data's own faults (a cut tar member, an undecodable image, an empty caption, invalid UTF-8) are decided above
this module, after the bytes arrived: those records are skipped and counted.

Concurrency. `RangeReader.submit(requests)` starts every (path, start, end) read of a batch of work at once and
returns a handle; the web reader submits the next steps' reads while the current ones decode, so a store that takes
30 ms per request is read at `max_inflight` / 30 ms requests per second. On an object store the reads are
coroutines on fsspec's event loop (gcsfs's aiohttp session: one connection per request in flight); on local disk,
`os.pread` on a thread pool over a cache of open descriptors that is safe to evict while other threads read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import errno
import logging
import os
import random
import re
import threading
import time

import numpy as np

from ncjax import fileio
from ncjax.data.tables.readers import DataFormatError

log = logging.getLogger("ncjax")
# gcsfs logs every request that ran out of its own retries with a traceback at ERROR; the fault is reported here,
# classified, in one line (and retried or not), so its log would only bury that line.
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)

DEFAULT_DEADLINE_S = 300.0
_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}
_TRANSIENT_ERRNO = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
                    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EAGAIN}


class StoreUnavailable(fileio.StorageError):
  """The store did not answer a read for the whole retry deadline: the run stops (its checkpoints are intact)."""


class StoreRefused(fileio.StorageError):
  """The store answered, and will answer the same however long one waits: its TLS certificate does not verify, or it
  refuses the credentials (HTTP 401 / 403 after one refresh). The run stops at once, in one line."""


class ShardMissing(DataFormatError):
  """A shard the dataset (or its index) names is not there."""


class ShardChanged(DataFormatError):
  """A shard is not the object the index was built from (another size or generation)."""


def _http_status(e: BaseException) -> int | None:
  for attr in ("code", "status"):
    value = getattr(e, attr, None)
    try:
      if value is not None:
        return int(value)
    except (TypeError, ValueError):
      continue
  return None


def _chain(e: BaseException):
  """e and the exceptions it was raised from (its cause or context), innermost last."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def _tls_verification_failed(e: BaseException) -> bool:
  import ssl
  for x in _chain(e):
    if isinstance(x, ssl.SSLCertVerificationError) or type(x).__name__ == "ClientConnectorCertificateError":
      return True
    if "CERTIFICATE_VERIFY_FAILED" in str(x):   # requests' and urllib3's wrappers keep only the text
      return True
  return False


def _refused_access(e: BaseException) -> bool:
  """HTTP 401 or 403: from aiohttp or gcsfs (its HttpError; a 403 it raises as OSError('Forbidden: ...')), or an
  s3fs PermissionError (botocore's AccessDenied)."""
  if isinstance(e, PermissionError):
    return True
  if isinstance(e, OSError) and str(e).startswith("Forbidden") and _raised_in(e, ("gcsfs",)):
    return True
  return _http_status(e) in (401, 403) and not isinstance(e, OSError)


def classify(e: BaseException) -> str:
  """'transient' (retry it), 'missing' (the object is not there), 'access' (refused: retried once after a credential
  refresh), 'tls' (the store's certificate does not verify: never retried) or 'fatal' (stop with one line) for an
  exception raised by a read."""
  if isinstance(e, (FileNotFoundError, ShardMissing)):
    return "missing"
  if isinstance(e, (ShardChanged, DataFormatError, StoreRefused)):
    return "fatal"
  if _tls_verification_failed(e):
    return "tls"
  if _refused_access(e):
    return "access"
  import json
  if isinstance(e, (TimeoutError, asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError)):
    return "transient"
  if isinstance(e, json.JSONDecodeError) and _raised_in(e, ("gcsfs", "aiohttp", "fsspec")):
    return "transient"   # a listing page cut mid-body (a file of ours that does not parse is not the store's fault)
  import ssl
  if isinstance(e, ssl.SSLError):   # a TLS session cut mid-read (its errno is the TLS library's, not the OS's)
    return "transient"
  status = _http_status(e)
  if status is not None and not isinstance(e, OSError):
    if status == 404:
      return "missing"
    return "transient" if status in _TRANSIENT_HTTP else "fatal"
  module = type(e).__module__ or ""
  if module.startswith(("aiohttp", "requests", "urllib3", "google.auth")):
    return "transient"   # connection-level failures of the HTTP clients gcsfs uses
  if type(e).__name__ in ("HttpError", "ChecksumError"):   # gcsfs.retry's, without a status
    return "transient"
  if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNO:
    return "transient"
  return "fatal"


def _raised_in(e: BaseException, packages: tuple[str, ...]) -> bool:
  tb = e.__traceback__
  while tb is not None:
    module = tb.tb_frame.f_globals.get("__name__", "")
    if module.split(".")[0] in packages:
      return True
    tb = tb.tb_next
  return False


def _reason(e: BaseException) -> str:
  text = " ".join(str(e).split())[:200]
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  """How long a read keeps trying a store that does not answer (`input.web.io_deadline_s`), and its backoff."""
  deadline_s: float = DEFAULT_DEADLINE_S
  first_backoff_s: float = 1.0
  max_backoff_s: float = 30.0
  request_timeout_s: float = 60.0   # one request to the store (a ranged read, a listing page, a download piece)

  def backoff(self, attempt: int) -> float:
    return min(self.max_backoff_s, self.first_backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)

  def failed(self, what: str, e: BaseException, first_failure: float, attempt: int,
             tries: dict | None = None) -> float:
    """The seconds to wait before the next try of a failed read, or raise the error it ends in. `tries`: the read's
    own record across its tries (whether its credentials were refreshed)."""
    kind = classify(e)
    if kind == "tls":
      raise StoreRefused(errno.EACCES, f"reading {what}: the store's TLS certificate does not verify "
                         f"({_reason(e)}); not retried: check the store's address (an endpoint or "
                         f"STORAGE_EMULATOR_HOST setting), the CA certificates (SSL_CERT_FILE) or a proxy that "
                         f"intercepts TLS") from None
    if kind == "access":
      tries = {} if tries is None else tries
      if not tries.get("refreshed"):
        tries["refreshed"] = True
        fileio.refresh_credentials(re.search(r"\S+://\S+", what).group(0) if "://" in what else what)
        log.warning("reading %s: %s; the credentials were refreshed, trying once more", what, _reason(e))
        return 0.0
      raise StoreRefused(errno.EACCES, f"reading {what}: the store refused access ({_reason(e)}) again after the "
                         f"credentials were refreshed: check them (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth "
                         f"application-default login, AWS_PROFILE) and their permission to read this bucket") from None
    if kind == "missing":
      raise ShardMissing(f"{what}: the object is not there ({_reason(e)}): it was deleted or renamed after the "
                         f"dataset was listed or indexed; restore it, or rebuild the index") from None
    if kind == "fatal":
      if isinstance(e, (DataFormatError, StoreUnavailable, StoreRefused)):   # already decided (a nested call)
        raise e
      raise fileio.StorageError(errno.EIO, f"reading {what} failed: {_reason(e)} (not retried: check the path, "
                                           f"its permissions and the credentials)") from None
    waited = time.monotonic() - first_failure
    if waited >= self.deadline_s:
      raise StoreUnavailable(errno.EIO, f"reading {what}: the store did not answer for {waited:.0f} s (last error "
                             f"{_reason(e)}); the run stops here with its last checkpoint intact: relaunch the same "
                             f"command to resume (input.web.io_deadline_s={self.deadline_s:g} sets how long reads "
                             f"are retried)") from None
    if attempt == 0:
      log.warning("reading %s: %s; retrying for up to %.0f s", what, _reason(e), self.deadline_s)
    return self.backoff(attempt)

  def call(self, fn, what: str):
    """fn() with transient failures retried until the deadline."""
    first, attempt, tries = None, 0, {}
    while True:
      began = time.monotonic()
      try:
        return fn()
      except Exception as e:  # noqa: BLE001 — classified by `failed`
        first = began if first is None else first   # the deadline counts from the first failing try's start
        time.sleep(self.failed(what, e, first, attempt, tries))
        attempt += 1


# ---------------------------------------------------------------------------------------------------------------
# what a shard is: name, size and version
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ObjectInfo:
  """A file as a listing sees it: its path, size and version (an object store's generation, a local file's
  modification time in ns) — what the index records and a run checks — and, where the listing gives them for free,
  a local file's inode and an object's checksum (crc32c, else md5)."""
  path: str
  size: int
  version: str = ""
  inode: int = 0
  checksum: str = ""

  @property
  def pin(self) -> str:
    """What this file is, as one string: a run pins every shard it reads to the pin it listed first."""
    return ":".join([str(self.size), self.version] + ([str(self.inode)] if self.inode else []) +
                    ([self.checksum] if self.checksum else []))


def _remote_info(path: str, entry: dict) -> ObjectInfo:
  version = entry.get("generation") or entry.get("VersionId") or entry.get("etag") or entry.get("ETag") or \
      entry.get("mtime") or ""
  checksum = entry.get("crc32c") or entry.get("md5Hash") or ""
  return ObjectInfo(path, int(entry.get("size") or 0), str(version), checksum=str(checksum))


def _stat_info(path: str, st: os.stat_result) -> ObjectInfo:
  return ObjectInfo(path, int(st.st_size), str(st.st_mtime_ns), inode=int(st.st_ino))


def _local_info(path: str) -> ObjectInfo:
  return _stat_info(path, os.stat(local_path(path)))


def local_pin(pin: str) -> tuple:
  """A local file's pin as (size, mtime_ns, inode) — what fstat of an open descriptor is compared with."""
  parts = pin.split(":")
  return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0


def check_descriptor(path: str, fd: int, pin: tuple) -> None:
  """Raise ShardChanged when the open file `fd` is no longer the file `pin` (local_pin) describes: written in place,
  truncated or replaced (`cp` over it keeps the inode, not the modification time). One fstat: ~30 µs a read with
  its Python on a 2-core VM (docs/notes/web_store_cpu.md)."""
  st = os.fstat(fd)
  if (st.st_size, st.st_mtime_ns, st.st_ino if pin[2] else 0) != pin:
    raise _pin_changed(path, ":".join(map(str, pin if pin[2] else pin[:2])), _stat_info(path, st).pin)


def pin_kwargs(path: str, version: str) -> dict:
  """What a read of `path` passes to its filesystem to get exactly `version` of the object, never a newer one: gcsfs's
  `generation`, s3fs's `version_id` (a VersionId: an S3 listing's ETag names no version a GET can ask for)."""
  if not version:
    return {}
  protocol = path.split("://", 1)[0]
  if protocol in ("gs", "gcs"):
    return {"generation": version}
  if protocol in ("s3", "s3a") and not version.startswith('"'):
    return {"version_id": version}
  return {}


def local_path(path: str) -> str | None:
  """The file system path of a local path or a `file://` URL (read as a local file: pinned, checked), else None."""
  path = str(path)
  if path.startswith("file://"):
    return path[len("file://"):]
  return None if fileio.is_remote(path) else path


def version_gone(path: str, version: str) -> "ShardChanged":
  return ShardChanged(f"{path}: the version {version} this run listed is gone: the object was replaced or deleted "
                      f"since (a read never takes a newer version); restore it, or start a new run (and rebuild the "
                      f"index: python -m ncjax.data.build --dataset=web)")


def _pin_changed(path: str, pin: str, now: str) -> "ShardChanged":
  return ShardChanged(f"{path} changed since this run listed it (size:version then {pin}, now {now}): its pairs "
                      f"would not be the ones the run's ids name; restore it, or start a new run (and rebuild the "
                      f"index)")


def check_pin(path: str, pin: str, policy: "RetryPolicy | None" = None) -> None:
  """Raise ShardChanged (one line naming the shard) when `path` is no longer the file `pin` describes."""
  if not pin:
    return
  now = info(path, policy).pin
  if now != pin:
    raise _pin_changed(path, pin, now)


def list_files(root: str, suffix: str, policy: RetryPolicy | None = None) -> list[ObjectInfo]:
  """Every file under `root` (any depth) whose name ends with `suffix`, sorted, hidden names left out: one recursive
  listing (an object store answers it in pages of 1,000 objects, sizes and generations included)."""
  policy = policy or RetryPolicy()
  if local_path(root) is None:
    protocol = root.split("://", 1)[0]

    def listing():
      fs, inner = fileio.filesystem(root)
      fs.invalidate_cache()
      return fs.find(inner.rstrip("/"), detail=True)

    found = policy.call(listing, f"the listing of {root}")
    return sorted((_remote_info(f"{protocol}://{p}", e) for p, e in found.items()
                   if p.endswith(suffix) and not os.path.basename(p).startswith(".")), key=lambda o: o.path)
  out, base = [], local_path(root)
  prefix = root[:len(root) - len(base)]   # 'file://' kept in the paths listed under a file:// root
  for directory, dirs, files in os.walk(base):
    dirs.sort()
    out.extend(_local_info(prefix + os.path.join(directory, f)) for f in files
               if f.endswith(suffix) and not f.startswith("."))
  return sorted(out, key=lambda o: o.path)


def info(path: str, policy: RetryPolicy | None = None) -> ObjectInfo:
  if local_path(path) is None:
    def get():
      fs, inner = fileio.filesystem(path)
      fs.invalidate_cache(inner)
      return fs.info(inner)

    return _remote_info(path, (policy or RetryPolicy()).call(get, path))
  try:
    return _local_info(path)
  except FileNotFoundError:
    raise ShardMissing(f"{path} is not there") from None


def read_many(paths: list[str], policy: RetryPolicy | None = None, workers: int = 32) -> list[bytes | None]:
  """Whole small files read concurrently (metadata: one _stats.json per shard); None where a file is missing."""
  policy = policy or RetryPolicy()

  def one(p):
    try:
      return policy.call(lambda: fileio.read_bytes(p), p)
    except ShardMissing:
      return None

  if not paths:
    return []
  with cf.ThreadPoolExecutor(min(workers, len(paths))) as pool:
    return list(pool.map(one, paths))


# ---------------------------------------------------------------------------------------------------------------
# ranged reads, many in flight
# ---------------------------------------------------------------------------------------------------------------
class _LocalFiles:
  """Open descriptors, at most `limit` at once, least recently used closed first — but never while another thread
  is reading through it (a closed descriptor's number is reused by the next open: reading then returns another
  file's bytes)."""

  def __init__(self, limit: int = 256):
    self.limit, self.lock = max(1, int(limit)), threading.Lock()
    self.fds: dict[str, list] = {}   # path -> [fd, readers in flight, pin]; insertion order = recency

  def pread(self, path: str, start: int, end: int, pin: str = "") -> bytes:
    """Bytes [start, end) of `path`; with a pin, the descriptor's fstat is compared with it after the read (a file
    written in place while it is open is one error, never its new bytes)."""
    with self.lock:
      entry = self.fds.pop(path, None)
      if entry is None:
        fd = os.open(path, os.O_RDONLY)
        expected = local_pin(pin) if pin else None
        if expected is not None:   # the file opened must be the one listed (same size, modification time and inode)
          try:
            check_descriptor(path, fd, expected)
          except ShardChanged:
            os.close(fd)
            raise
        entry = [fd, 0, expected]
      elif pin and entry[2] is None:   # opened by an unpinned read: pinned from now on
        entry[2] = local_pin(pin)
      entry[1] += 1
      self.fds[path] = entry
      self._evict()
    try:
      out = os.pread(entry[0], end - start, start)
      if entry[2] is not None:
        check_descriptor(path, entry[0], entry[2])   # after the read: a change that began before it ended is seen
    finally:
      with self.lock:
        entry[1] -= 1
        if path not in self.fds and entry[1] == 0:
          os.close(entry[0])   # evicted while this read was in flight: its last reader closes it
        self._evict()
    if len(out) < end - start:
      raise ShardChanged(f"{path}: {len(out)} of the {end - start} bytes at {start} could be read: the file is "
                         f"shorter than when it was indexed (replaced or truncated); rebuild the index")
    return out

  def _evict(self):
    for path in list(self.fds):
      if len(self.fds) <= self.limit:
        return
      fd, readers, _ = self.fds[path]
      del self.fds[path]
      if readers == 0:
        os.close(fd)

  def close(self):
    with self.lock:
      for fd, readers, _ in self.fds.values():
        if readers == 0:
          os.close(fd)
      self.fds.clear()


class RequestCost:
  """What a request to a store costs, measured on the requests made: a least-squares line seconds = fixed + bytes /
  bandwidth over the last `window` of them — on an object store the wall time a request holds one of the
  `max_inflight` slots (its latency, then its transfer), on local disk the CPU time of the thread that reads (the
  host's cores are what a pool of readers runs out of). `gap_bytes()` is fixed x bandwidth, the bytes the fixed cost
  of one request would read: unread bytes between two wanted ranges cost less read than skipped below it, and more
  above (input.web.split_gap_bytes=-1). Until the line can be fitted (fewer than `window` / 8 requests, sizes too
  alike to tell the two costs apart, a slope that is not positive) the last fitted value, at first `initial`."""

  def __init__(self, initial: int, window: int = 512, smallest: int = 4 << 10, largest: int = 16 << 20):
    self.initial, self.window, self.smallest, self.largest = int(initial), int(window), int(smallest), int(largest)
    self.samples: list[tuple[int, float]] = []
    self.lock = threading.Lock()
    self.fitted: int | None = None

  def add(self, nbytes: int, seconds: float) -> None:
    with self.lock:
      self.samples.append((int(nbytes), float(seconds)))
      if len(self.samples) > self.window:
        del self.samples[:len(self.samples) - self.window]

  def gap_bytes(self) -> int:
    with self.lock:
      samples = list(self.samples)
    if len(samples) >= max(8, self.window // 8):
      b = np.asarray([x for x, _ in samples], np.float64)
      t = np.asarray([y for _, y in samples], np.float64)
      if b.std() > 0.05 * max(b.mean(), 1.0):
        slope = float(np.cov(b, t, bias=True)[0, 1] / b.var())
        latency = float(t.mean() - slope * b.mean())
        if slope > 0 and latency > 0:
          self.fitted = int(min(self.largest, max(self.smallest, latency / slope)))
    return self.fitted if self.fitted is not None else self.initial


@dataclasses.dataclass(frozen=True)
class Range:
  """Bytes [start, end) of `path`; `version` pins an object's version (gcsfs's generation, s3fs's VersionId: every
  request, first try and retry, asks for it, so a replaced object reads as gone instead of returning another
  object's bytes), or a local file's pin (ObjectInfo.pin: compared with the open descriptor's fstat after every
  read)."""
  path: str
  start: int
  end: int
  version: str = ""


class Handle:
  """The reads of one submit: `result()` waits for all of them (raising the first error that ends a read)."""

  def __init__(self, futures):
    self.futures = futures

  def done(self) -> bool:
    return all(f.done() for f in self.futures)

  def result(self) -> list[bytes]:
    return [f.result() for f in self.futures]

  def cancel(self):
    for f in self.futures:
      f.cancel()


class RangeReader:
  """Concurrent ranged reads of local files and object-store objects, with the retry policy above."""

  def __init__(self, policy: RetryPolicy | None = None, max_inflight: int = 64, local_threads: int = 16,
               open_files: int = 256):
    self.policy = policy or RetryPolicy()
    self.max_inflight = max(1, int(max_inflight))
    self.local = _LocalFiles(open_files)
    self._local_pool = cf.ThreadPoolExecutor(max(1, int(local_threads)), thread_name_prefix="ncjax-pread")
    self._fs: dict[str, object] = {}
    self._fs_epoch: dict[str, int] = {}
    self._semaphores: dict[int, asyncio.Semaphore] = {}
    self.requests = 0
    self.bytes = 0
    self._count_lock = threading.Lock()
    # what a request costs, local and remote apart (a first guess until measured: a local read ~20 µs of CPU at
    # ~3 GB/s, an object store's ranged GET ~25 ms at ~40 MB/s per connection)
    self.cost = {"local": RequestCost(64 << 10), "remote": RequestCost(1 << 20)}

  # --- local -------------------------------------------------------------------------------------------------
  def _read_local(self, r: Range) -> bytes:
    path = local_path(r.path)
    began = time.thread_time()   # the CPU a read takes: what a pool of threads on a host's cores runs out of
    try:
      out = self.policy.call(lambda: self.local.pread(path, r.start, r.end, r.version), r.path)
    except FileNotFoundError:
      raise ShardMissing(f"{r.path} is not there (deleted or renamed after it was indexed)") from None
    self.cost["local"].add(len(out), time.thread_time() - began)
    self._count(len(out))
    return out

  def _count(self, n: int):
    with self._count_lock:
      self.requests += 1
      self.bytes += n

  # --- remote ------------------------------------------------------------------------------------------------
  def _filesystem(self, path: str):
    """The path's filesystem (fileio's, made again after a credential refresh)."""
    protocol = path.split("://", 1)[0]
    fs = self._fs.get(protocol)
    if fs is None or fileio.credentials_epoch() != self._fs_epoch.get(protocol):
      fs = self._fs[protocol] = fileio.filesystem(path)[0]
      self._fs_epoch[protocol] = fileio.credentials_epoch()
    return fs

  async def _read_remote(self, fs, r: Range) -> bytes:
    key = id(asyncio.get_running_loop())
    sem = self._semaphores.get(key)
    if sem is None:
      sem = self._semaphores[key] = asyncio.Semaphore(self.max_inflight)
    inner = r.path.split("://", 1)[1]
    kwargs = pin_kwargs(r.path, r.version)
    first, attempt, tries = None, 0, {}
    while True:
      began = time.monotonic()
      try:
        if attempt:
          fs = self._filesystem(r.path)   # a new client after a credential refresh
        async with sem:
          sent = time.perf_counter()
          out = await asyncio.wait_for(fs._cat_file(inner, start=r.start, end=r.end, **kwargs),
                                       self.policy.request_timeout_s)
          self.cost["remote"].add(len(out), time.perf_counter() - sent)
        if len(out) != r.end - r.start:
          raise ShardChanged(f"{r.path}: {len(out)} of the {r.end - r.start} bytes at {r.start} were returned: the "
                             f"object is not the one indexed (replaced or truncated); rebuild the index")
        self._count(len(out))
        return out
      except (ShardChanged, asyncio.CancelledError):
        raise
      except Exception as e:  # noqa: BLE001 — classified by the policy
        if kwargs and classify(e) == "missing":
          raise version_gone(r.path, r.version) from None
        first = began if first is None else first
        await asyncio.sleep(self.policy.failed(r.path, e, first, attempt, tries))
        attempt += 1

  def _read_sync(self, fs, r: Range) -> bytes:
    """A filesystem without fsspec's event loop: the same pin and length checks, on a thread."""
    out = self.policy.call(lambda: fs.cat_file(r.path, start=r.start, end=r.end, **pin_kwargs(r.path, r.version)),
                           r.path)
    if len(out) != r.end - r.start:
      raise ShardChanged(f"{r.path}: {len(out)} of the {r.end - r.start} bytes at {r.start} were returned: the "
                         f"object is not the one indexed (replaced or truncated); rebuild the index")
    self._count(len(out))
    return out

  # --- both ----------------------------------------------------------------------------------------------------
  def submit(self, ranges: list[Range]) -> Handle:
    futures = []
    for r in ranges:
      if local_path(r.path) is None:
        fs = self._filesystem(r.path)
        if getattr(fs, "async_impl", False):
          futures.append(asyncio.run_coroutine_threadsafe(self._read_remote(fs, r), fs.loop))
          continue
        futures.append(self._local_pool.submit(self._read_sync, fs, r))
      else:
        futures.append(self._local_pool.submit(self._read_local, r))
    return Handle(futures)

  def gap_bytes(self, path: str) -> int:
    """RequestCost.gap_bytes of the store `path` lies in."""
    return self.cost["local" if local_path(path) is not None else "remote"].gap_bytes()

  def read(self, ranges: list[Range]) -> list[bytes]:
    return self.submit(ranges).result()

  def close(self):
    """Stop the reads not started, wait for the ones in flight (a thread left reading a closed descriptor could
    read another file's bytes), close the descriptors."""
    self._local_pool.shutdown(wait=True, cancel_futures=True)
    self.local.close()
