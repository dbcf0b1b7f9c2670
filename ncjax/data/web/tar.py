"""WebDataset tar shards, parsed from any file object — a local file, an object read front to back, the bytes of a
ranged read: members (ustar / GNU / pax), samples (consecutive members sharing a key), and the `Sample` a pair is
read as. Also the writer of the layout (tests and benchmarks). A leaf of the web reader: nothing of ncjax.data's web
modules is imported here."""

from __future__ import annotations

import dataclasses
import functools
import io
import json

from ncjax import fileio
from ncjax.data.tables import readers

IMAGE_EXTENSIONS = readers.IMAGE_EXTENSIONS
BLOCK = 512


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
  span: tuple | None = None     # (first byte, end byte) of the sample in its tar, where the reader knows them

  def json(self) -> dict:
    if not self.meta:
      return {}
    try:
      return json.loads(self.meta.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
      return {}


def make_sample(sample_id: int, key: str, parts: dict, caption_key: str = "caption") -> Sample:
  """A Sample from a tar sample's members; a caption that is not valid UTF-8 makes it a bad record (its text would be
  a guess: the record is skipped and counted, never trained on with replacement characters)."""
  image = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
  meta = parts.get("json")
  if "txt" in parts:
    try:
      caption = parts["txt"].decode("utf-8")
    except UnicodeDecodeError:
      return Sample(sample_id, key, image, None, meta, bad="the caption (.txt) is not valid UTF-8")
  else:
    caption = Sample(sample_id, meta=meta).json().get(caption_key) if meta else None
  return Sample(sample_id, key, image, caption, meta)


# ---------------------------------------------------------------------------------------------------------------
# A dataset: its shards and their sample counts

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
