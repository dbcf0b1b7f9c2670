"""The smaller parts of reading web data: the host's cache of remote index files evicts its least recently used files
beyond a size bound (ncjax.data.web.host_cache); a filtered block read cuts its spans where the unread bytes cost
more than a request, the request's cost measured (store.RequestCost), not a constant; what a web run opened for
reading is closed with it."""

import os
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gcs_server import GCSServer  # noqa: E402
from ncjax import fileio  # noqa: E402
from ncjax.data.web import dataset as web  # noqa: E402
from ncjax.data.web import store  # noqa: E402
from ncjax.data.web import index as web_index  # noqa: E402
from ncjax.data.web import pipeline as web_pipeline  # noqa: E402
from ncjax.data.web import subset as subset_lib  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402
from ncjax.tokenizers import WordTokenizer  # noqa: E402


def _cached(cache: str) -> set[str]:
  return {name for d in os.listdir(cache) for name in os.listdir(os.path.join(cache, d)) if name.endswith(".npy")}


def test_the_hosts_index_cache_evicts_its_least_recently_used_files_beyond_its_bound(tmp_path):
  # the cache of gs:// index files was never evicted: every index a host ever opened stayed on its disk
  cache = str(tmp_path / "cache")
  with GCSServer() as server:
    roots = [server.path(name) for name in ("a", "b", "c")]
    for k, root in enumerate(roots):
      web_synthetic.write_img2dataset(root, 0, shard_sizes=[300 + 100 * k], image_size=8, pool=2, seed=k)
      web_index.build_index(root, workers=1)
    names = [web_index.read_manifest(web_index.index_dir_of(r))["offsets_file"] for r in roots]
    sizes = [len(fileio.read_bytes(fileio.join(web_index.index_dir_of(r), n))) for r, n in zip(roots, names)]
    bound = sizes[0] + sizes[1] + sizes[2] // 2                      # room for two of the three
    opened = [web.open_dataset(roots[k], cache_dir=cache, cache_bytes=bound) for k in (0, 1)]
    assert _cached(cache) == {names[0], names[1]}
    b_offsets = np.asarray(opened[1].index.offsets).copy()
    web.open_dataset(roots[0], cache_dir=cache, cache_bytes=bound)   # a is used again, after b
    web.open_dataset(roots[2], cache_dir=cache, cache_bytes=bound)
    assert _cached(cache) == {names[0], names[2]}                    # b, the least recently used, went
    np.testing.assert_array_equal(opened[1].index.offsets, b_offsets)   # ... still read where it was mapped
    tiny = web.open_dataset(roots[1], cache_dir=cache, cache_bytes=1)   # a bound below one index: it keeps its own
    assert _cached(cache) == {names[1]} and not tiny.read(3).bad


def test_request_cost_is_measured_as_latency_times_bandwidth():
  rng = np.random.default_rng(0)
  for latency, bandwidth, sizes in ((0.025, 40e6, (50_000, 4_000_000)), (20e-6, 3e9, (1_000, 400_000))):
    cost = store.RequestCost(initial=123)
    assert cost.gap_bytes() == 123                                   # nothing measured yet
    for b in rng.integers(*sizes, 400):
      cost.add(int(b), (latency + b / bandwidth) * rng.uniform(0.97, 1.03))
    assert cost.gap_bytes() == pytest.approx(latency * bandwidth, rel=0.15)
  alike = store.RequestCost(initial=99)
  for _ in range(100):
    alike.add(65_536, 0.001)                                         # one size: latency and bandwidth untold
  assert alike.gap_bytes() == 99


@pytest.fixture(scope="module")
def filtered(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("filtered") / "d")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[400, 600, 500], image_size=24, pool=8)
  web_index.build_index(root, workers=1)
  ds = web.open_dataset(root)
  flags = np.random.default_rng(0).random(ds.num_examples) < 0.1     # keep 10%
  path = str(tmp_path_factory.mktemp("filter") / "f")
  subset_lib.write_filter(path, [subset_lib.dataset_identity(ds)], [subset_lib.pack(flags)], dict(keep=0.1),
                          dict(kind="test"))
  return ds, path, flags


def _filtered_reads(ds, path, **kw):
  tokenizer = WordTokenizer.build(web_synthetic.captions(0, 100), context_length=12)
  data = web_pipeline.WebTrainData([ds], tokenizer, 20, 3, None, read="block", block=16, shuffle_pairs=40,
                                   window_batches=1, image_size=8, num_threads=2, process_index=0, process_count=1,
                                   subset=subset_lib.open_subset(path, [ds]), **kw)
  batches = list(data.host_batches(0, 6))
  return batches, data.last_reads


def test_a_filtered_block_read_cuts_its_spans_where_the_measured_request_cost_says(filtered, monkeypatch):
  # the gap was a constant (512 KiB): 6.3 bytes read per kept byte at keep 10% where the measured cost says 1.35
  ds, path, flags = filtered
  runs = {}
  for measured in (1 << 30, 1):                                      # a request costs as much as 1 GiB, or 1 byte
    monkeypatch.setattr(store.RequestCost, "gap_bytes", lambda self, measured=measured: measured)
    runs[measured] = _filtered_reads(ds, path)                       # split_gap_bytes: -1, the default: measured
  (never, never_reads), (always, always_reads) = runs[1 << 30], runs[1]
  for a, b in zip(never, always):
    np.testing.assert_array_equal(a["id"], b["id"])
    np.testing.assert_array_equal(a["image"], b["image"])
  assert all(flags[np.asarray(b["id"])].all() for b in always)
  assert always_reads["bytes"] < never_reads["bytes"] / 3, (never_reads, always_reads)
  assert always_reads["requests"] > never_reads["requests"]


def test_what_a_web_run_opened_for_reading_is_closed_with_it(filtered):
  ds, path, _ = filtered
  data = web_pipeline.WebTrainData([ds], None, 20, 3, None, read="block", block=16, process_index=0, process_count=1)
  assert not ds.read(3).bad and ds._reader is not None               # noqa: SLF001 — random access opened a reader
  data.close()
  assert ds._reader is None                                          # noqa: SLF001
  assert not [t for t in threading.enumerate() if t.name.startswith("ncjax-pread")]
