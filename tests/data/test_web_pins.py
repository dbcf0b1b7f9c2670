"""Every read of a web shard checks what the run listed (ncjax.data.web.store): a local shard written in place under
an open descriptor, in every read mode; an object replaced while it is streamed (gs://) or read in ranges (a
versioned S3 bucket); a `file://` read cut short. Each is one error naming the shard, never another version's bytes.
The training-run and CLI forms: tests/train/test_web_changes.py."""

import os
import sys
import time

import numpy as np
import pytest
from fsspec.asyn import AsyncFileSystem

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gcs_server import GCSServer  # noqa: E402
from ncjax import fileio  # noqa: E402
from ncjax.data.web import dataset as web  # noqa: E402
from ncjax.data.web import index as web_index  # noqa: E402
from ncjax.data.web import pipeline as web_pipeline  # noqa: E402
from ncjax.data.web import pinned_stream
from ncjax.data.web import store  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402
from ncjax.tokenizers import WordTokenizer  # noqa: E402


def changed_captions(data: bytes) -> bytes:
  """The same tar with its captions changed and every byte where it was: the offsets an index holds still fit, so
  only a pin can tell (what `cp` of a re-downloaded shard of the same layout over the old one does)."""
  out = data.replace(b"skyline", b"SKYLINE")
  assert out != data and len(out) == len(data)
  return out


def write_in_place(path: str) -> None:
  with open(path, "r+b") as f:   # the same inode, written over, as `cp new old` does
    data = f.read()
    f.seek(0)
    f.write(changed_captions(data))


def _written_an_hour_ago(root: str) -> None:
  """Data written well before the run lists it (a write in place then moves the modification time on any clock)."""
  past = time.time() - 3600
  for name in os.listdir(root):
    os.utime(os.path.join(root, name), (past, past))


@pytest.fixture()
def local_data(tmp_path):
  root = str(tmp_path / "d")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[1300, 300, 200], image_size=32, pool=8)
  assert os.path.getsize(os.path.join(root, "00000.tar")) > 1 << 20   # more than a streamed read's buffer
  _written_an_hour_ago(root)
  web_index.build_index(root, workers=1)
  return root


def _train_data(ds, read):
  tokenizer = WordTokenizer.build(web_synthetic.captions(0, 200), context_length=12)
  return web_pipeline.WebTrainData([ds], tokenizer, 40, 3, None, read=read, block=16, shuffle_pairs=80,
                                   window_batches=2, image_size=8, num_threads=2, prefetch=1, process_index=0,
                                   process_count=1)


@pytest.mark.parametrize("read", ["pair", "block", "stream"])
def test_a_local_shard_written_in_place_under_its_open_descriptor_is_one_error_in_every_read_mode(local_data, read):
  # before issue 53 the pin was checked when a descriptor opened only: per-pair and block reads then trained on the
  # new captions of a shard overwritten by `cp` (230 of 346, 288 of 400 later pairs), a streamed read on 944 of 1,200
  shard = os.path.join(local_data, "00000.tar")
  if read == "stream":
    ds = web.open_dataset(local_data, use_index=False)
    samples = ds.iter_shard(0)
    seen = [next(samples).caption for _ in range(100)]
    write_in_place(shard)
    with pytest.raises(store.ShardChanged, match=r"00000.tar changed since this run listed it"):
      seen.extend(x.caption for x in samples)
    assert len(seen) < 1300 and not any("SKYLINE" in c for c in seen)
    return
  data = _train_data(web.open_dataset(local_data), read)
  batches = data.host_batches(0, data.steps_per_epoch)
  for _ in range(2):
    next(batches)
  write_in_place(shard)
  with pytest.raises(store.ShardChanged, match=r"00000.tar changed since this run listed it"):
    for _ in batches:
      pass


def test_a_streamed_object_replaced_mid_read_is_never_read_in_its_new_generation(tmp_path, monkeypatch):
  # a streamed read asked for the object by path (and a retry reopened it by path): on gs:// 952 of 3,000 samples
  # came from a new generation. Every request now names the generation listed.
  with GCSServer() as server:
    root = server.path("web")
    web_synthetic.write_img2dataset(root, 0, shard_sizes=[9000], image_size=32, pool=8)
    ds = web.open_dataset(root, use_index=False)
    shard = ds.shards[0]
    assert store.info(shard).size > 8 << 20                          # streamed in more than one request
    samples = ds.iter_shard(0)
    seen = [next(samples).caption for _ in range(50)]
    fileio.write_bytes(shard, changed_captions(fileio.read_bytes(shard)))   # a new generation
    with pytest.raises(store.ShardChanged, match=r"00000.tar: the version \d+ this run listed is gone"):
      seen.extend(x.caption for x in samples)
    assert not any("SKYLINE" in c for c in seen)


class _VersionedBucket(AsyncFileSystem):
  """An S3 bucket with versioning, as s3fs reads it: `_cat_file(path, version_id=None, start=None, end=None)`, each
  object's versions kept, a listing that names each object's current VersionId."""
  protocol = ("s3", "s3a")
  cachable = False
  versions: dict = {}     # path -> [bytes of version 0, 1, ...]

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)

  def put(self, path: str, data: bytes) -> None:
    self.versions.setdefault(self._strip_protocol(path), []).append(data)

  def _entry(self, path):
    versions = self.versions[path]
    return dict(name=path, size=len(versions[-1]), type="file", VersionId=f"v{len(versions) - 1}")

  async def _info(self, path, **kwargs):
    path = self._strip_protocol(path)
    if path not in self.versions:
      raise FileNotFoundError(path)
    return self._entry(path)

  async def _find(self, path, detail=False, **kwargs):
    path = self._strip_protocol(path).rstrip("/")
    out = {p: self._entry(p) for p in sorted(self.versions) if p.startswith(path + "/")}
    return out if detail else list(out)

  async def _cat_file(self, path, version_id=None, start=None, end=None, **kwargs):
    assert not kwargs, kwargs
    versions = self.versions[self._strip_protocol(path)]
    data = versions[int(version_id[1:])] if version_id else versions[-1]
    return data[start:end]


def test_s3_reads_ranged_and_streamed_ask_for_the_version_listed(tmp_path, monkeypatch):
  # only gs:// ranged reads named a version before issue 53: an S3 object overwritten in a versioned bucket was read
  # in its new version
  monkeypatch.setattr(_VersionedBucket, "versions", {})
  for protocol in _VersionedBucket.protocol:
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, protocol, _VersionedBucket)   # noqa: SLF001
  fs = _VersionedBucket()
  first, second = b"A" * 1000, b"B" * 1000
  fs.put("s3://bucket/web/00000.tar", first)
  (listed,) = store.list_files("s3://bucket/web", ".tar")
  assert listed.version == "v0"
  fs.put("s3://bucket/web/00000.tar", second)                       # overwritten after the run listed it
  reader = store.RangeReader()
  try:
    assert reader.read([store.Range(listed.path, 100, 200, listed.version)]) == [first[100:200]]
  finally:
    reader.close()
  with pinned_stream.open_stream(listed.path, listed.pin, buffer_size=256) as f:
    assert f.read() == first


def test_a_file_url_read_is_a_local_read_pinned_and_a_short_read_is_an_error(local_data):
  # a file:// range went through fsspec's local filesystem: pinned to nothing, and a short read returned no error
  tar = "file://" + os.path.join(local_data, "00000.tar")
  size = os.path.getsize(local_data + "/00000.tar")
  reader = store.RangeReader()
  try:
    with pytest.raises(store.ShardChanged, match="00000.tar: .* bytes at"):
      reader.read([store.Range(tar, size - 100, size + 100)])         # past its end: a short read
  finally:
    reader.close()
  ds = web.open_dataset("file://" + local_data)                       # local disk: its index read in place
  assert ds.shards[0] == tar[len("file://"):] and ds.read(5).caption == web_synthetic.captions(0, 1300)[5]
  write_in_place(os.path.join(local_data, "00000.tar"))
  try:
    with pytest.raises(store.ShardChanged, match="00000.tar changed since this run listed it"):
      ds.read(6)
  finally:
    ds.close()


def test_a_filters_kept_pairs_are_written_only_from_the_shards_that_were_scored(local_data, tmp_path):
  # `ncjax filter --write_shards` streamed each source shard by path: one written over since it was scored gave its
  # new pairs under the kept ids
  from ncjax.data.web import subset as subset_lib
  ds = web.open_dataset(local_data)
  path = str(tmp_path / "filter")
  subset_lib.write_filter(path, [subset_lib.dataset_identity(ds)], [subset_lib.pack(np.arange(ds.num_examples) % 3
                                                                                    == 0)], dict(keep=0.33),
                          dict(kind="test"))
  assert subset_lib.write_shards(path, str(tmp_path / "kept")) == 600
  write_in_place(os.path.join(local_data, "00001.tar"))
  with pytest.raises(store.ShardChanged, match="00001.tar changed since this run listed it"):
    subset_lib.write_shards(path, str(tmp_path / "kept_again"))


def test_a_local_stream_refused_at_open_never_closes_a_descriptor_again(tmp_path):
  """A shard that changed before its stream opened is refused, and the refused stream's finalizer closes nothing:
  its descriptor number, given to the next file opened, stays that file's (a second close of the number made an
  index build's read fail with EBADF)."""
  import gc
  path = tmp_path / "shard.tar"
  path.write_bytes(b"x" * 100)
  st = os.stat(path)
  stale_pin = f"{st.st_size + 1}:{st.st_mtime_ns}:{st.st_ino}"
  refused = None
  try:
    pinned_stream._LocalStream(str(path), stale_pin)
    raise AssertionError("a changed shard was opened")
  except store.ShardChanged as e:
    refused = e   # its traceback holds the half-made stream alive until the next file is open
  other = os.open(path, os.O_RDONLY)   # the lowest free number: the one the refused stream held
  try:
    del refused
    gc.collect()   # the half-made stream finalized
    assert os.fstat(other).st_size == 100
  finally:
    os.close(other)
