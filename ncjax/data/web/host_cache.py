"""The host's cache of remote files the web reader memory-maps (an index's offsets and clean flags, a filter's bits):
each downloaded once per host — a file lock makes one process download while the other processes of the host wait,
the copy streams in 8 MiB pieces and is checked against the digest its name carries — and memory-mapped, so the
page cache holds one copy for every process of the host.

The cache is bounded: each use of a file marks it used (its modification time), and after a use the files of every
cached directory are evicted least recently used first until they hold at most `cache_bytes`
(`input.web.cache_bytes`) — never the files the use itself maps, nor those of a directory whose lock another
process holds (it may be about to map them). A file already mapped by a running process stays readable after it is
removed (the mapping holds it); the next run that needs it downloads it again.

Layout: CACHE_ROOT/<digest of the remote directory>/<file name> (+ `.lock`, and `.partial-<pid>` pieces of downloads
in progress), CACHE_ROOT being `input.web.cache_dir` or ~/.cache/ncjax/web.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import time

import numpy as np

from ncjax import fileio
from ncjax.data.tables import readers
from ncjax.data.web import store

DEFAULT_CACHE_BYTES = 32 << 30
DEFAULT_ROOT = "~/.cache/ncjax/web"


@contextlib.contextmanager
def _host_lock(path: str, stall_s: float | None = None):
  """An exclusive lock shared by the processes of one host (released when the holder exits, even by a kill). With
  `stall_s`, a waiter gives up (StoreUnavailable, one line) once nothing in the lock's directory has grown for that
  long: the holder's download is stalled, and its own reads end at their deadline anyway."""
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  with open(path, "a+") as f:
    if stall_s is None:
      fcntl.flock(f, fcntl.LOCK_EX)
    else:
      progress, since = None, time.monotonic()
      while True:
        try:
          fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
          break
        except BlockingIOError:
          now = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
          if now != progress:
            progress, since = now, time.monotonic()
          elif time.monotonic() - since > stall_s:
            raise store.StoreUnavailable(errno.EIO, f"waited {stall_s:.0f} s for another process of this host to "
                                         f"download the index into {directory} without any progress: the store "
                                         f"does not answer; the run stops (relaunch to resume)") from None
          time.sleep(0.2)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _download(src: str, dst: str, policy: store.RetryPolicy, chunk: int = 8 << 20) -> None:
  """Copy a (large) object to a local file in pieces: memory stays at one piece, the file appears whole or not —
  its content checked against the digest its name carries (`_digest_name`) and synced to disk before the rename,
  so a cut download or a full disk never leaves a file that later reads as the index."""
  tmp = f"{dst}.partial-{os.getpid()}"
  expected = re.search(r"-([0-9a-f]{16})\.npy$", os.path.basename(dst))

  def copy():
    digest = hashlib.sha256()
    with fileio.open_file(src, "rb") as f, open(tmp, "wb") as out:
      while True:
        data = f.read(chunk)
        if not data:
          break
        out.write(data)
        digest.update(data)
      out.flush()
      os.fsync(out.fileno())
    if expected and digest.hexdigest()[:16] != expected.group(1):
      raise readers.DataFormatError(f"{src}: its content's digest {digest.hexdigest()[:16]} is not the "
                                    f"{expected.group(1)} its name says: the index in the store is damaged; rebuild it")
    os.replace(tmp, dst)

  try:
    policy.call(copy, src)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)


def _remove_stale_partials(local: str) -> None:
  """Pieces of downloads whose process is gone (killed mid-download): removed, under the host's lock."""
  for entry in os.scandir(local):
    m = re.search(r"\.partial-(\d+)$", entry.name)
    if m and not _alive(int(m.group(1))):
      with contextlib.suppress(FileNotFoundError):
        os.remove(entry.path)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def cache_dir_of(remote_dir: str, cache_dir: str = "") -> str:
  """This host's cache directory of the files under `remote_dir`."""
  key = hashlib.sha1(fileio.absolute(remote_dir).encode()).hexdigest()[:16]
  return os.path.join(cache_dir or os.path.expanduser(DEFAULT_ROOT), key)


def mapped(remote_dir: str, names: list[str], cache_dir: str = "", policy: store.RetryPolicy | None = None,
           cache_bytes: int = DEFAULT_CACHE_BYTES) -> dict:
  """{name: the memory-mapped array of REMOTE_DIR/name} for content-addressed .npy files (a file present is whole),
  from this host's cache: downloaded where missing, marked used, mapped under the directory's lock (so no other
  process evicts them in between), then the cache trimmed to `cache_bytes`."""
  policy = policy or store.RetryPolicy()
  local = cache_dir_of(remote_dir, cache_dir)
  stall = policy.deadline_s + policy.request_timeout_s
  # one process per host downloads; the others wait (giving up on a stalled download), then map it
  with _host_lock(os.path.join(local, ".lock"), stall):
    _remove_stale_partials(local)
    out = {}
    for name in names:
      path = os.path.join(local, name)
      if not os.path.isfile(path):
        _download(fileio.join(remote_dir, name), path, policy)
      now = time.time_ns()   # used now: the last to be evicted (explicit ns: finer than the file system's clock)
      os.utime(path, ns=(now, now))
      out[name] = np.load(path, mmap_mode="r")
  evict(os.path.dirname(local), int(cache_bytes), keep={os.path.join(local, n) for n in names})
  return out


def evict(root: str, limit: int, keep=frozenset()) -> list[str]:
  """Remove the least recently used files of the cache under `root` until the files hold at most `limit` bytes,
  never one of `keep` nor a file of a directory whose lock another process holds. Returns the files removed."""
  files = []
  for directory in (e.path for e in os.scandir(root) if e.is_dir()) if os.path.isdir(root) else ():
    for entry in os.scandir(directory):
      if entry.is_file() and not entry.name.startswith(".") and ".partial-" not in entry.name:
        st = entry.stat()
        files.append((st.st_mtime_ns, st.st_size, entry.path))
  total = sum(size for _, size, _ in files)
  removed = []
  for _, size, path in sorted(files):
    if total <= limit:
      break
    if path in keep:
      continue
    with _try_lock(os.path.join(os.path.dirname(path), ".lock")) as held:
      if not held:
        continue   # another process is downloading or mapping in that directory: not now
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
        removed.append(path)
        total -= size
  return removed


@contextlib.contextmanager
def _try_lock(path: str):
  """The lock at `path` if no other process holds it (yields True), else yields False at once. This process's own
  lock of that directory (held by `mapped` for the current use) counts as held: its files are in `keep`."""
  try:
    f = open(path, "a+")
  except OSError:
    yield False
    return
  with f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      yield False
      return
    try:
      yield True
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
