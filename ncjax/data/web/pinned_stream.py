"""A shard read front to back (streamed reading, an index build's scan) that never returns bytes of another version
than the one the run listed: a local file's open descriptor is compared with its pin (size, modification time,
inode) after every read — one fstat per buffer refill — and on an object store every ranged request, the first and
any after a retry reopened the stream, asks for the listed version (ncjax.data.web.store.pin_kwargs). A change is
ShardChanged, one line naming the shard."""

from __future__ import annotations

import io
import os

from ncjax import fileio
from ncjax.data.web import store


class _LocalStream(io.RawIOBase):
  """A local file read front to back, its descriptor's fstat compared with the pin after every read (one fstat per
  buffer refill): a file written in place while it is streamed is one error, never its new bytes."""

  def __init__(self, path: str, pin: str):
    self.path, self.pin = path, store.local_pin(pin)
    self.fd = os.open(store.local_path(path), os.O_RDONLY)
    try:
      store.check_descriptor(path, self.fd, self.pin)
    except store.ShardChanged:
      # closed here and forgotten: the half-made object's finalizer calls close() too, and closing the number again
      # would close whatever file has since been given it (an index build's read then failed with EBADF)
      fd, self.fd = self.fd, -1
      os.close(fd)
      raise

  def readable(self):
    return True

  def seekable(self):
    return True

  def readinto(self, b) -> int:
    n = os.readv(self.fd, [b])
    store.check_descriptor(self.path, self.fd, self.pin)
    return n

  def seek(self, offset: int, whence: int = 0) -> int:
    return os.lseek(self.fd, offset, whence)

  def tell(self) -> int:
    return os.lseek(self.fd, 0, os.SEEK_CUR)

  def close(self):
    if not self.closed and self.fd >= 0:
      fd, self.fd = self.fd, -1
      os.close(fd)
    super().close()


class _RemoteStream(io.RawIOBase):
  """An object read front to back in ranged requests that each ask for the pinned version (`pin_kwargs`): a new
  piece, or a retry that reopens the stream, never reads another version; a piece shorter than the pinned size
  promises is ShardChanged. Each request is bounded (fileio.bound_requests)."""

  def __init__(self, path: str, size: int, version: str):
    self.path, self.size, self.version, self.pos = path, int(size), version, 0
    self.fs, self.inner = fileio.filesystem(path)
    self.kwargs = store.pin_kwargs(path, version)

  def readable(self):
    return True

  def seekable(self):
    return True

  def readinto(self, b) -> int:
    end = min(self.size, self.pos + len(b))
    if end <= self.pos:
      return 0
    try:
      data = self.fs.cat_file(self.inner, start=self.pos, end=end, **self.kwargs)
    except FileNotFoundError:
      if self.kwargs:
        raise store.version_gone(self.path, self.version) from None
      raise
    if len(data) != end - self.pos:
      raise store.ShardChanged(f"{self.path}: {len(data)} of the {end - self.pos} bytes at {self.pos} were returned: "
                               f"the object is not the one listed (replaced or truncated)")
    b[:len(data)] = data
    self.pos = end
    return len(data)

  def seek(self, offset: int, whence: int = 0) -> int:
    self.pos = {0: 0, 1: self.pos, 2: self.size}[whence] + int(offset)
    return self.pos

  def tell(self) -> int:
    return self.pos


def open_stream(path: str, pin: str = "", buffer_size: int = 8 << 20):
  """A binary file object of `path` for reading front to back (a tar parsed header by header) that never returns
  bytes of another version than `pin` (ObjectInfo.pin): local, the open descriptor checked after every read; on an
  object store, every request asks for the pinned version. Without a pin, fileio.open_sequential."""
  if not pin:
    return fileio.open_sequential(path, buffer_size)
  if store.local_path(path) is not None:
    return io.BufferedReader(_LocalStream(path, pin), buffer_size=min(buffer_size, 1 << 20))
  size, version = pin.split(":")[:2]
  return io.BufferedReader(_RemoteStream(path, int(size), version), buffer_size=buffer_size)
