"""How web data is read (ncjax.data.web.store, web_index, mixture, web_pipeline, web_decode), on local disk: the block
order and its noise, block reads (every pair once per epoch, disjoint process shares, resume mid-window, requests per
pair), streamed epochs that partition the pairs over 2-4 processes when shard sizes differ, resumes refused when the
order would change, an index that knows what it indexed (a replaced, deleted or added shard; two merges at once),
the fault policy (store faults retried then stopped, never bad records), descriptors evicted while read, and the
thread and process decoders agreeing bitwise. Object-store faults against a real server: tests/train/
test_web_faults.py."""

import concurrent.futures as cf
import errno
import os
import shutil
import threading
import time

import numpy as np
import pytest

from ncjax import fileio
from ncjax.data import streams
from ncjax.data.web import assembly, mixture, noise_deal
from ncjax.data.web import pinned_stream
from ncjax.data.web import store
from ncjax.data.web import dataset as web
from ncjax.data.web import decode as web_decode
from ncjax.data.web import host_cache
from ncjax.data.web import index as web_index
from ncjax.data.web import pipeline as web_pipeline
from ncjax.data.web import stream as web_stream
from ncjax.data.web import synthetic as web_synthetic
from ncjax.data.noise import BlockNoise, PermutedNoise
from ncjax.tokenizers import WordTokenizer

SIZES = [230, 410, 95, 305, 170, 260, 340, 190]          # unequal shards, as img2dataset writes them (2,000 pairs)
N = sum(SIZES)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("uneven") / "data")
  info = web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=8, pool=16, corrupt_images=(7,),
                                         invalid_utf8=(400,))
  manifest = web_index.build_index(root, workers=1)
  return dict(root=root, info=info, manifest=manifest)


def _tokenizer():
  return WordTokenizer.build(web_synthetic.captions(0, 200), context_length=12)


def _data(root_or_ds, mode="index", batch=40, **kw):
  ds = web.open_dataset(root_or_ds, use_index=mode == "index") if isinstance(root_or_ds, str) else root_or_ds
  kw.setdefault("image_size", 8)
  kw.setdefault("num_threads", 2)
  kw.setdefault("process_index", 0)
  kw.setdefault("process_count", 1)
  kw.setdefault("window_batches", 1)
  return web_pipeline.WebTrainData([ds], _tokenizer(), batch, 3, None, mode=mode, **kw)


# --- the block order and its noise ------------------------------------------------------------------------------
@pytest.mark.parametrize("n,block", [(1, 4), (64, 64), (1003, 64), (1000, 7)])
def test_the_block_order_lists_every_pair_once_per_epoch_in_runs_of_whole_blocks(n, block):
  order = mixture.BlockOrder(n, block, seed=5, dataset=1)
  epochs = [order(np.arange(e * n, (e + 1) * n)) for e in range(3)]
  for ids in epochs:
    assert sorted(ids.tolist()) == list(range(n))
    starts = np.flatnonzero(np.diff(ids, prepend=-2) != 1)          # where a run of consecutive ids begins
    assert all(ids[s] % block == 0 for s in starts)                 # every run starts a block ...
    runs = np.diff(np.append(starts, n))
    assert all(r % block == 0 or ids[s] + r == n for s, r in zip(starts, runs))   # ... and ends one
  if n // block >= 8:
    assert not np.array_equal(epochs[0], epochs[1])                 # a new block order every epoch
  np.testing.assert_array_equal(order(np.arange(n, 2 * n)[::-1]), epochs[1][::-1])   # any query order


@pytest.mark.parametrize("n,block", [(1000, 64), (2000, 16), (100_003, 64), (5000, 64), (200, 64), (3, 1)])
def test_block_noise_shows_exactly_floor_ratio_n_captions_an_image_of_the_paired_block(n, block):
  ratio = {5000: 0.01, 3: 0.7}.get(n, 0.4)
  noise = BlockNoise(n, ratio, seed=2, block=block)
  ids = np.arange(n)
  image, holder = noise.image_of(ids), noise.holder_of(ids)
  assert sorted(image.tolist()) == list(range(n))                    # every image shown once
  np.testing.assert_array_equal(image[holder], ids)                  # holder_of is image_of's inverse
  noisy = image != ids
  assert noisy.sum() == noise.num_noisy == int(np.floor(ratio * n))  # a derangement: no fixed point among them
  assert BlockNoise(3, 0.4, 2, 1).num_noisy == 0 == (BlockNoise(3, 0.4, 2, 1).image_of([0, 1, 2]) != [0, 1, 2]).sum()
  np.testing.assert_array_equal(noise.group_of(image), noise.group_of(ids))   # the partner is of the caption's group
  same_block = (image // block == ids // block) & noisy
  if n != 200:                                                       # (200: a 64 + 8 last group, see the docstring)
    assert same_block.sum() <= 1 + (n % block > 0) * block
  if n >= 1000:
    assert np.median(np.abs(image - ids)[noisy]) > n / 10           # not a shard neighbour (NCR's: ~n / 3)
  units = [noise.ids_of_units(np.full(noise.unit, g), np.arange(noise.unit)) for g in range(noise.num_units - 1)]
  for g, u in enumerate(units[:20]):                                 # a group's ids are two whole blocks
    assert sorted(set((u // block).tolist())) == sorted(set((u // block).tolist())) and len(set(u // block)) == 2
    assert (noise.group_of(u) == g).all()
  np.testing.assert_array_equal(noise.image_of(ids[::-1]), image[::-1])
  assert noise.sha256 != BlockNoise(n, ratio, 2, block, dataset=1).sha256


@pytest.mark.parametrize("n,block", [(1000, 64), (1003, 16), (130, 64)])
def test_the_block_order_with_noise_lists_the_blocks_of_a_group_together(n, block):
  noise = BlockNoise(n, 0.4, seed=4, block=block)
  order = mixture.BlockOrder(n, block, seed=5, dataset=0, groups=noise)
  for e in range(2):
    ids = order(np.arange(e * n, (e + 1) * n))
    assert sorted(ids.tolist()) == list(range(n))
    groups = noise.group_of(ids)
    runs = np.flatnonzero(np.diff(groups, prepend=-1) != 0)
    assert len(runs) == noise.num_units                             # each group is one run of the epoch's list
  with pytest.raises(ValueError, match="block noise of"):
    mixture.BlockOrder(n + 1, block, 5, 0, groups=noise)


# --- block reads ----------------------------------------------------------------------------------------------
def test_block_reads_visit_every_pair_once_per_epoch_and_split_windows_between_processes(uneven):
  root = uneven["root"]
  one = _data(root, batch=40, read="block", block=16, shuffle_pairs=160)
  assert one.read == "block" and one.steps_per_window == 4
  # the position stream lists every pair once per epoch; a window's steps deal out exactly the window's positions
  assert sorted(one.order.ids_at(np.arange(N)).tolist()) == sorted(one.order.ids_at(np.arange(N, 2 * N)).tolist()) == \
      list(range(N))
  ids = np.concatenate([one.indices(s) for s in range(48)])          # 12 whole windows, all in epoch 0
  assert sorted(ids.tolist()) == sorted(one.order.ids_at(np.arange(48 * 40)).tolist())
  assert len(np.unique(ids)) == len(ids)
  window = np.concatenate([one.indices(s) for s in range(4, 8)])
  # two processes: each reads its own contiguous share of every window; together, the window's pairs
  parts = [_data(root, batch=40, read="block", block=16, shuffle_pairs=80, process_index=p, process_count=2)
           for p in range(2)]
  assert parts[0].steps_per_window == 4
  halves = [np.concatenate([parts[p].order.local_ids(s, p) for s in range(4, 8)]) for p in range(2)]
  assert not set(halves[0].tolist()) & set(halves[1].tolist())
  assert sorted(np.concatenate(halves).tolist()) == sorted(window.tolist())
  # a batch mixes many blocks: at most a few pairs of any one block
  counts = np.bincount(one.indices(5) // 16)
  assert counts.max() <= 12 and (counts > 0).sum() >= 5


def test_block_reads_resume_bitwise_mid_window_with_one_request_per_block(uneven):
  make = lambda: _data(uneven["root"], batch=40, read="block", block=16, shuffle_pairs=160)
  data = make()
  full = list(data.host_batches(0, 12))
  requests = data.last_reads["requests"]
  # 12 steps x 40 pairs from blocks of 16: ~30 blocks, a few read twice (at window edges) or in two pieces (across a
  # shard's end) — not one request per pair
  assert 30 <= requests <= 12 * 40 / 16 + 3 * 6, requests
  resumed = list(make().host_batches(6, 12))                        # inside the second window of 4 steps
  for a, b in zip(full[6:], resumed):
    for k in ("image", "tokens", "id", "clean", "_skipped"):
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert data.iterator_state(12)["steps_per_window"] == 4


def test_block_noise_shows_each_noisy_caption_with_its_partners_image(uneven):
  root = uneven["root"]
  data = _data(root, batch=40, read="block", block=16, shuffle_pairs=80, augment=True,
               noise=PermutedNoise(N, 0.4, seed=1))
  assert isinstance(data.noise, BlockNoise) and data.noise.block == 16
  ds = data.datasets[0]
  seen_noisy = 0
  for step, batch in enumerate(data.host_batches(0, 3)):
    partners = data.noise.image_of(batch["id"])
    for k, (gid, partner) in enumerate(zip(batch["id"], partners)):
      own, shown = ds.read(int(gid)), ds.read(int(partner))
      if own.bad or shown.bad:
        continue
      # the image is the partner's, cropped by this position's draw; the caption is the pair's own
      expected = web_decode.decode_train(shown.image, 8, streams.crop_rng(3, step, k), "openai", (0.9, 1.0))
      np.testing.assert_array_equal(batch["image"][k], expected)
      np.testing.assert_array_equal(batch["tokens"][k], data.tokenizer.encode([own.caption])[0])
      assert bool(batch["clean"][k]) == (partner == gid)
      seen_noisy += partner != gid
  assert seen_noisy >= 30


# --- streamed epochs with unequal shards -------------------------------------------------------------------------
@pytest.mark.parametrize("processes", [2, 3, 4])
def test_streamed_epochs_partition_the_pairs_over_processes_when_shard_sizes_differ(uneven, processes):
  ds = web.open_dataset(uneven["root"], use_index=False)
  epochs = {0: [], 1: []}
  for p in range(processes):
    schedule = mixture.ShardSchedule(ds.counts, 3, 0, p, processes, window=2)
    assert schedule.epoch_size in (N // processes, N // processes + 1)
    reader = web_stream.StreamReader(ds, schedule, buffer=64)
    for e in epochs:
      epochs[e].extend(reader.take(q).id for q in range(e * schedule.epoch_size, (e + 1) * schedule.epoch_size))
  for e, ids in epochs.items():
    assert sorted(ids) == list(range(N)), e                          # every pair exactly once per epoch
  # the old scheme (every P-th whole shard) left processes with unequal epochs: 1,990 pairs over 4 processes
  shares = [ds.counts[np.arange(p, len(SIZES), 4)].sum() for p in range(4)]
  assert max(shares) - min(shares) > 100


def test_a_resume_is_refused_when_the_order_of_the_remaining_steps_would_differ(uneven):
  root = uneven["root"]
  streamed = _data(root, "stream", window=2, buffer=64, process_count=2)
  saved = streamed.iterator_state(7)
  streamed.check_resume(saved)                                       # the same settings: fine
  for changed in (dict(window=3), dict(buffer=32), dict(process_count=4)):
    other = _data(root, "stream", **{**dict(window=2, buffer=64, process_count=2), **changed})
    with pytest.raises(ValueError, match="cannot resume: the web data's order"):
      other.check_resume(saved)
  indexed = _data(root, read="pair").iterator_state(7)
  _data(root, read="pair", process_count=2).check_resume(indexed)    # one global order for any process count
  with pytest.raises(ValueError, match="input.web.read: checkpoint 'pair', now 'block'"):
    _data(root, read="block").check_resume(indexed)
  blocks = _data(root, read="block", block=16).iterator_state(7)
  with pytest.raises(ValueError, match="the process count"):
    _data(root, read="block", block=16, process_count=2).check_resume(blocks)
  with pytest.raises(ValueError, match="input.web.mode"):
    _data(root, "stream", window=2, buffer=64).check_resume(blocks)
  ds = web.open_dataset(root)
  with pytest.raises(ValueError, match="input.shuffle_seed: checkpoint 3, now 4"):   # another seed, another order
    web_pipeline.WebTrainData([ds], _tokenizer(), 40, 4, None, read="pair", image_size=8, process_index=0,
                              process_count=1).check_resume(indexed)


# --- bad records: only the record's own content ------------------------------------------------------------------
def test_a_caption_that_is_not_utf8_is_a_bad_record(uneven):
  ds = web.open_dataset(uneven["root"])
  sample = ds.read(400)
  assert sample.bad and "UTF-8" in sample.bad and sample.caption is None
  assert [x.bad for x in ds.iter_shard(1) if x.id == 400][0] == sample.bad
  data = _data(ds, batch=N // 5 * 5 // 5, read="pair")
  skipped = sum(int(b["_skipped"]) for b in data.host_batches(0, data.steps_per_epoch))
  ids = set(np.concatenate([data.indices(s) for s in range(data.steps_per_epoch)]).tolist())
  assert skipped == len({7, 400} & ids)                              # the corrupt JPEG and the bad caption, once each


# --- an index that knows what it indexed --------------------------------------------------------------------------
def test_a_shard_replaced_deleted_or_added_after_the_build_is_one_clear_error(tmp_path):
  root = str(tmp_path / "d")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[30, 40, 20], image_size=8, pool=4)
  web_index.build_index(root, workers=1)
  assert web.open_dataset(root).num_examples == 90
  tar = os.path.join(root, "00001.tar")
  original = open(tar, "rb").read()
  # another tar of the same name (a re-download): the size differs
  with open(tar, "wb") as f:
    f.write(original[:len(original) // 2])
  with pytest.raises(store.ShardChanged, match=r"1 shards under .* changed after the index was built \(e.g. "
                                                r"00001.tar"):
    web.open_dataset(root)
  # the same size, rewritten later: its modification time differs
  with open(tar, "wb") as f:
    f.write(original)
  with pytest.raises(store.ShardChanged, match="00001.tar"):
    web.open_dataset(root)
  os.remove(tar)
  with pytest.raises(store.ShardMissing, match="00001.tar"):
    web.open_dataset(root)
  # rebuilt: only the changed shard is scanned again (parts are keyed by shard name, size and version)
  with open(tar, "wb") as f:
    f.write(original)
  web_synthetic.write_img2dataset(str(tmp_path / "extra"), 0, shard_sizes=[0, 0, 0, 10], image_size=8, pool=2)
  shutil.copy(os.path.join(tmp_path / "extra", "00003.tar"), os.path.join(root, "00000a.tar"))   # a new name,
  shutil.copy(os.path.join(tmp_path / "extra", "00003_stats.json"), os.path.join(root, "00000a_stats.json"))
  with pytest.raises(store.ShardChanged, match=r"1 shards under .* are not in its index \(e.g. 00000a.tar\)"):
    web.open_dataset(root, use_index=False)                          # streamed from the manifest's counts, too
  index_dir = web_index.index_dir_of(root)
  for name in ("00000.tar", "00002.tar"):   # keep the parts of the unchanged shards, as an interrupted build does
    fileio.save_npz(web_index.part_path(index_dir, name), **_part_of(root, name))
  scanned = []
  manifest = web_index.build_index(root, workers=1, progress=lambda done, total: scanned.append(total))
  assert scanned[-1] == 2                                            # 00000a.tar and the replaced 00001.tar
  assert manifest["shards"] == ["00000.tar", "00000a.tar", "00001.tar", "00002.tar"]
  assert manifest["counts"] == [30, 10, 40, 20]
  ds = web.open_dataset(root)
  assert ds.read(35).caption == web_synthetic.captions(0, 10)[5]    # the added shard sits second in the listing


def _part_of(root, name):
  info = store.info(os.path.join(root, name))
  result = web_index.scan_shard((info.path, None, "", 10.0))
  return dict(offsets=result["offsets"], end=np.int64(result["end"]), clean=result["clean"], expected=np.int64(-1),
              error=np.asarray(result["error"]), name=np.asarray(name), size=np.int64(info.size),
              version=np.asarray(info.version))


def test_two_merges_at_once_write_the_same_index(tmp_path):
  root = str(tmp_path / "d")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[30, 40, 20, 25], image_size=8, pool=4)
  index_dir = str(tmp_path / "idx")
  for h in range(2):
    assert web_index.build_index(root, index_dir=index_dir, workers=1, num_hosts=2, host_index=h) is None
  with cf.ThreadPoolExecutor(2) as pool:
    manifests = list(pool.map(lambda _: web_index.merge_index(root, index_dir), range(2)))
  assert manifests[0] == manifests[1] == web_index.read_manifest(index_dir)
  assert sorted(os.listdir(index_dir)) == ["manifest.json", manifests[0]["offsets_file"]]
  assert web.open_dataset(root, index_dir=index_dir).read(95).caption == web_synthetic.captions(90, 25)[5]


# --- the fault policy ------------------------------------------------------------------------------------------
class _Flaky:
  """Fails with `error` for the first `failures` calls, then returns b'ok'."""

  def __init__(self, error, failures):
    self.error, self.failures, self.calls = error, failures, 0

  def __call__(self):
    self.calls += 1
    if self.calls <= self.failures:
      raise self.error
    return b"ok"


def test_store_faults_are_retried_until_the_deadline_and_never_become_bad_records():
  import aiohttp
  policy = store.RetryPolicy(deadline_s=2.0, first_backoff_s=0.01, max_backoff_s=0.05)
  transient = [ConnectionRefusedError(errno.ECONNREFUSED, "refused"), TimeoutError("slow"),
               aiohttp.ClientConnectionError("reset"), _http_error(503), _http_error(429),
               OSError(errno.ECONNRESET, "reset by peer"),
               __import__("ssl").SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]"),
               __import__("asyncio").IncompleteReadError(b"", 100), _listing_page_cut()]
  for e in transient:
    assert store.classify(e) == "transient", e
    flaky = _Flaky(e, 3)
    assert policy.call(flaky, "gs://b/x.tar") == b"ok" and flaky.calls == 4
  t = time.monotonic()
  with pytest.raises(store.StoreUnavailable, match=r"gs://b/x.tar: the store did not answer for 2 s .* relaunch "
                                                    r"the same command to resume"):
    policy.call(_Flaky(TimeoutError("slow"), 10 ** 6), "gs://b/x.tar")
  assert time.monotonic() - t < 3.0                                  # stops at the deadline
  for e, kind, raised in ((FileNotFoundError("gone"), "missing", store.ShardMissing),
                          (_http_error(404), "missing", store.ShardMissing),
                          (_http_error(400), "fatal", fileio.StorageError),
                          (OSError(errno.EIO, "disk"), "fatal", fileio.StorageError),
                          (_json_error_of_ours(), "fatal", fileio.StorageError)):   # a file of ours, not the store
    assert store.classify(e) == kind, e
    flaky = _Flaky(e, 1)
    with pytest.raises(raised):
      policy.call(flaky, "gs://b/x.tar")
    assert flaky.calls == 1                                          # not retried


def _json_error_of_ours():
  try:
    __import__("json").loads("{")
  except ValueError as e:
    return e


def _listing_page_cut():
  """A JSON error raised in gcsfs's code, as its parse of a listing page cut mid-body raises it."""
  try:
    exec(compile("import json; json.loads(text)", "<gcsfs>", "exec"), {"__name__": "gcsfs.core",
                                                                       "text": '{"items": [{"na'})
  except ValueError as e:
    return e
  raise AssertionError("parsed")


def _http_error(code):
  from gcsfs.retry import HttpError
  return HttpError({"code": code, "message": f"HTTP {code}"})


def test_a_local_descriptor_evicted_while_another_thread_reads_it_is_never_reused(tmp_path):
  # 6 files, a cache of one descriptor, 8 threads: every read must return its own file's bytes. (Closing a descriptor
  # that another thread is about to pread lets the next open reuse its number: that read then returns another
  # file's bytes — what the previous ShardFiles did.)
  paths = []
  for k in range(6):
    paths.append(str(tmp_path / f"{k}.bin"))
    with open(paths[-1], "wb") as f:
      f.write(bytes([k]) * 4096)
  files = store._LocalFiles(limit=1)

  def work(seed):
    rng = np.random.default_rng(seed)
    for _ in range(2000):
      k = int(rng.integers(6))
      a = int(rng.integers(0, 4000))
      assert files.pread(paths[k], a, a + 64) == bytes([k]) * 64
    return True

  with cf.ThreadPoolExecutor(8) as pool:
    assert all(pool.map(work, range(8)))
  assert len(files.fds) <= 1


# --- decoders -------------------------------------------------------------------------------------------------
def test_thread_and_process_decoders_make_the_same_examples_bitwise():
  jpegs = web_synthetic.jpeg_pool(6, 40, seed=2)
  tok = _tokenizer()
  specs = [web_decode.ExampleSpec(k, f"a photo of a dog number {k}", jpegs[k % 6], (0, 3, k)) for k in range(12)]
  specs[4] = web_decode.ExampleSpec(4, "a caption", b"\xff\xd8 not a jpeg", (0, 3, 4))
  specs[9] = web_decode.ExampleSpec(9, "  ", jpegs[0], (0, 3, 9))
  settings = web_decode.DecodeSettings(16, "openai", True, (0.5, 1.0), "pil", tok.to_json())
  threads = web_decode.ThreadDecoder(settings, tok, 2)
  processes = web_decode.ProcessDecoder(settings, 2)
  try:
    a, b = threads.decode(specs, 12), processes.decode(specs, 12)
    b2 = processes.decode(specs[:5], 12)                             # a second batch through a reused buffer
  finally:
    threads.close()
    processes.close()
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert a[2] == b[2] and [k for k, e in enumerate(a[2]) if e] == [4, 9]
  assert "does not decode" in a[2][4] and a[2][9] == "empty caption"
  np.testing.assert_array_equal(b2[0], a[0][:5])
  expected = web_decode.decode_train(jpegs[1], 16, streams.crop_rng(0, 3, 1), "openai", (0.5, 1.0))
  np.testing.assert_array_equal(a[0][1], expected)


def test_process_workers_train_data_equals_threads(uneven):
  make = lambda workers: _data(uneven["root"], batch=40, read="pair", workers=workers)
  a = list(make(0).host_batches(0, 3))
  b = list(make(2).host_batches(0, 3))
  for x, y in zip(a, b):
    for k in ("image", "tokens", "id", "clean", "_skipped"):
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_the_latency_proxy_holds_every_request(tmp_path):
  import http.server
  import sys
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from latency_proxy import LatencyProxy, measure_first_byte
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    direct = measure_first_byte(url)
    with LatencyProxy(server.server_address[1], 0.05) as proxy:
      held = measure_first_byte(proxy.url + "/")
    assert held >= 0.05 and direct < held, (direct, held)   # (a lower bound: the machine's load only adds to it)
  finally:
    server.shutdown()


# --- a table as large as a web dataset -----------------------------------------------------------------------------
def test_a_table_is_written_as_webdataset_shards_and_trained_as_web_data(tmp_path):
  from ncjax.data import build
  jpegs = web_synthetic.jpeg_pool(5, 16, seed=4)
  os.makedirs(tmp_path / "img")
  for k, data in enumerate(jpegs):
    (tmp_path / "img" / f"{k}.jpg").write_bytes(data)
  rows = [(f"img/{k % 5}.jpg" if k != 17 else "img/missing.jpg", f"a caption, number {k}", int(k % 4 != 0))
          for k in range(230)]
  with open(tmp_path / "pairs.csv", "w") as f:
    f.write("path,text,ok\n" + "".join(f"{p},\"{c}\",{o}\n" for p, c, o in rows))
  out = str(tmp_path / "wds")
  assert build.main(["--dataset=web", f"--manual_dir={tmp_path}", "--table=pairs.csv", "--separator=,",
                     "--image_column=path", "--caption_column=text", "--clean_column=ok", f"--output_dir={out}",
                     "--per_shard=100", "--workers=1"]) == 0
  kept = [r for k, r in enumerate(rows) if k != 17]                  # the row whose image is missing is not a pair
  ds = web.open_dataset(out)
  assert ds.num_examples == 229 and list(ds.counts) == [100, 100, 29]
  for i in (0, 16, 17, 150, 228):                                    # id = rank among the rows with an image
    sample = ds.read(i)
    assert sample.caption == kept[i][1] and sample.image == jpegs[int(kept[i][0][4])]
  np.testing.assert_array_equal(ds.clean_flags(np.arange(229)), [bool(r[2]) for r in kept])
  import pyarrow.parquet as pq
  statuses = pq.read_table(os.path.join(out, "00000.parquet")).column("status").to_pylist()
  assert statuses.count("failed_to_download") == 1 and len(statuses) == 101
  data = _data(out, batch=40, read="pair")
  batch = data.host_batch(0)
  expected = [bool(kept[i][2]) for i in batch["id"]]
  assert batch["clean"].tolist() == expected and int(batch["_skipped"]) == 0


# --- injected noise read in blocks, at any mixture and batch size --------------------------------------------------
def test_a_mixture_with_injected_noise_read_in_blocks_skips_nothing(tmp_path):
  # two clean datasets; windows far smaller than the data, as at scale: every partner image must be read, so not one
  # pair of an epoch is a bad record (before 2026-11-26 the partner's block of the second dataset was often unread)
  roots = [str(tmp_path / "a"), str(tmp_path / "b")]
  web_synthetic.write_img2dataset(roots[0], 0, shard_sizes=[230, 410, 95, 305], image_size=8, pool=8)
  web_synthetic.write_img2dataset(roots[1], 1, shard_sizes=[170, 260, 119], image_size=8, pool=8)
  for root in roots:
    web_index.build_index(root, workers=1)
  dsets = [web.open_dataset(r) for r in roots]
  n = sum(d.num_examples for d in dsets)
  data = web_pipeline.WebTrainData(dsets, _tokenizer(), 40, 3, None, read="block", block=16, shuffle_pairs=80,
                                   window_batches=4, noise=PermutedNoise(n, 0.4, seed=1), image_size=8,
                                   num_threads=2, process_index=0, process_count=1, on_bad_record="raise")
  noise = data.noise
  assert [p.n for p in noise.parts] == [1040, 549] and noise.num_noisy == 416 + 219
  ids = np.arange(n)
  image = noise.image_of(ids)
  assert ((image < 1040) == (ids < 1040)).all()                     # a partner of the caption's own dataset
  seen, noisy = 0, 0
  for step, batch in enumerate(data.host_batches(0, data.steps_per_epoch)):   # raises on any bad record
    seen += len(batch["id"])
    noisy += int((~batch["clean"]).sum())
    assert int(batch["_skipped"]) == 0
    holders = set(noise.holder_of(batch["id"][~batch["clean"]]).tolist())
    assert not holders & set(batch["id"].tolist())                  # no noisy caption meets its own image
  assert seen == data.steps_per_epoch * 40 and 0.3 < noisy / seen < 0.5
  assert data.iterator_state(1)["noise"]["protocol"] == "per dataset"


def _fake_datasets(sizes):
  """Datasets of these sizes that are never read (the order and the noise need only their counts)."""
  return [web.WebDataset(f"/nowhere/{d}", [f"/nowhere/{d}/0.tar"], [n], index=object()) for d, n in enumerate(sizes)]


@pytest.mark.parametrize("per_process", [256, 4096])
def test_batches_of_block_reads_keep_ncrs_statistics_at_pod_batch_sizes(per_process):
  sizes, processes, ratio = [700_000, 300_000], 2, 0.4
  n = sum(sizes)
  parts = [web_pipeline.WebTrainData(_fake_datasets(sizes), None, per_process * processes, 0, None, read="block",
                                     noise=PermutedNoise(n, ratio, seed=3), process_index=p,
                                     process_count=processes) for p in range(processes)]
  data = parts[0]
  assert data.steps_per_window == 16                                 # the default window: 16 per-process batches
  noise = data.noise
  stats = noise_deal.block_noise_statistics(data, steps=range(16, 32))
  assert stats["shown_another_image"] == pytest.approx(ratio, abs=5e-3)
  assert stats["own_image_in_batch"] == 0.0
  assert stats["median_partner_distance"] > 50_000
  assert noise.num_noisy == sum(int(np.floor(ratio * s)) for s in sizes)


def test_a_run_with_more_bad_records_than_max_skipped_fraction_stops_with_one_line():
  guard = assembly.SkipGuard(0.01)
  guard.add(900, 50)                                                 # not judged before 1,000 pairs were read
  with pytest.raises(assembly.BadRecordError, match=r"51 of the 1000 web pairs .*max_skipped_fraction=0.01"):
    guard.add(100, 1)
  quiet = assembly.SkipGuard(0.01)
  quiet.add(100_000, 1000)                                           # exactly 1%: allowed
  strict = assembly.SkipGuard(0.0)
  with pytest.raises(assembly.BadRecordError):
    strict.add(40, 1)
  assembly.SkipGuard(1.0).add(10, 10)                            # 1 turns the guard off


def test_a_shard_rewritten_under_a_streamed_reader_is_one_error_naming_it(tmp_path):
  root = str(tmp_path / "d")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[30, 40], image_size=8, pool=4)
  ds = web.open_dataset(root, use_index=False)                       # no index: the listing pins each shard
  assert len(list(ds.iter_shard(1))) == 40
  tar = os.path.join(root, "00001.tar")
  data = open(tar, "rb").read()
  os.remove(tar)
  with open(tar, "wb") as f:                                         # the same bytes, another file (a re-upload)
    f.write(data)
  with pytest.raises(store.ShardChanged, match=r"00001.tar changed since this run listed it"):
    next(ds.iter_shard(1))
  record = ds.pins_record()
  again = web.open_dataset(root, use_index=False)
  assert again.changed_since(record).endswith(")") and "00001.tar changed" in again.changed_since(record)
  assert again.changed_since(again.pins_record()) == ""
  # indexed, on local disk: the ranged reads pin the file too (before 2026-11-26 only gs:// objects were pinned)
  web_index.build_index(root, workers=1)
  indexed = web.open_dataset(root)
  assert not indexed.read(45).bad
  os.remove(tar)
  with open(tar, "wb") as f:
    f.write(data)
  with pytest.raises(store.ShardChanged, match=r"00001.tar changed since this run listed it"):
    indexed.read_run(31, 33, reader=store.RangeReader())


def test_a_machine_fault_while_decoding_is_raised_never_counted_as_a_bad_record(monkeypatch):
  settings = web_decode.DecodeSettings(8, "openai", False, (0.9, 1.0), "pil", "")
  spec = web_decode.ExampleSpec(0, "a caption", web_synthetic.jpeg_pool(1, 8)[0], (0, 0, 0), True, "")
  for fault in (MemoryError(), OSError(errno.ENOMEM, "Cannot allocate memory")):
    def broken(*args, fault=fault, **kwargs):
      raise fault
    monkeypatch.setattr(web_decode, "decode_eval", broken)
    with pytest.raises(type(fault)):
      web_decode.make_example(spec, settings, _tokenizer())
  monkeypatch.setattr(web_decode, "decode_eval", lambda *a, **k: (_ for _ in ()).throw(OSError("cannot identify")))
  with pytest.raises(web_decode.BadExample, match="does not decode"):   # PIL's own OSError (no errno): the record's
    web_decode.make_example(spec, settings, _tokenizer())


def test_a_streamed_read_gets_a_whole_deadline_for_each_fault_after_reads_recovered(tmp_path, monkeypatch):
  root = str(tmp_path / "d")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[60], image_size=8, pool=4)
  ds = web.open_dataset(root, use_index=False)
  ds.policy = store.RetryPolicy(deadline_s=0.6, first_backoff_s=0.01, max_backoff_s=0.02)
  real = pinned_stream.open_stream
  state = {"opens": 0}

  class Blip:
    """A file that fails once after 10 samples were read; the second blip comes long after the first."""
    def __init__(self, f, fail_after):
      self.f, self.fail_after, self.read_bytes = f, fail_after, 0
    def read(self, n=-1):
      if self.fail_after is not None and self.read_bytes >= self.fail_after:
        raise ConnectionResetError(errno.ECONNRESET, "reset")
      if state["opens"] == 2 and not self.read_bytes:
        time.sleep(0.7)                                              # the 2nd blip comes > deadline after the 1st
      out = self.f.read(n)
      self.read_bytes += len(out)
      return out
    def seek(self, *a):
      return self.f.seek(*a)
    def __enter__(self):
      return self
    def __exit__(self, *exc):
      self.f.close()

  def flaky_open(path, *a, **k):
    state["opens"] += 1
    size = os.path.getsize(path)
    fail_after = {1: size // 4, 2: size // 2}.get(state["opens"])   # two blips, reads recover in between
    return Blip(real(path, *a, **k), fail_after)

  monkeypatch.setattr(pinned_stream, "open_stream", flaky_open)
  samples = list(ds.iter_shard(0))
  assert len(samples) == 60 and not any(x.bad for x in samples) and state["opens"] == 3


def test_the_hosts_copy_of_an_index_is_checked_against_its_digest_and_stale_pieces_are_removed(tmp_path):
  name, data = web_index._digest_name("offsets", np.arange(10, dtype=np.uint32))   # noqa: SLF001
  src = tmp_path / "store"
  src.mkdir()
  (src / name).write_bytes(data[:-4] + b"\0\0\0\1")                  # damaged in the store
  local = tmp_path / "cache"
  local.mkdir()
  policy = store.RetryPolicy(deadline_s=1.0)
  with pytest.raises(web_index.readers.DataFormatError, match="digest .* is not the"):
    host_cache._download(str(src / name), str(local / name), policy)   # noqa: SLF001
  assert os.listdir(local) == []                                     # neither the file nor a piece of it
  (src / name).write_bytes(data)
  host_cache._download(str(src / name), str(local / name), policy)     # noqa: SLF001
  assert (local / name).read_bytes() == data
  (local / f"{name}.partial-{2 ** 22 + 7}").write_bytes(b"cut")      # a download killed with its process
  (local / f"{name}.partial-{os.getpid()}").write_bytes(b"ours")     # one in progress
  host_cache._remove_stale_partials(str(local))                       # noqa: SLF001
  assert sorted(os.listdir(local)) == sorted([name, f"{name}.partial-{os.getpid()}"])


def test_filtered_block_reads_cut_a_span_where_the_gap_is_worth_a_request(uneven, tmp_path):
  from ncjax.data.web import subset as subset_lib
  ds = web.open_dataset(uneven["root"])
  flags = np.random.default_rng(0).random(N) < 0.1                  # keep 10%: spans of ~10 pairs per kept pair
  path = str(tmp_path / "filter")
  subset_lib.write_filter(path, [subset_lib.dataset_identity(ds)], [subset_lib.pack(flags)], dict(keep=0.1),
                          dict(kind="test"))
  runs = {}
  for gap in (0, 1):                                                 # 0: one request per block of kept pairs
    data = _data(ds, batch=20, read="block", block=16, shuffle_pairs=40, split_gap_bytes=gap,
                 subset=subset_lib.open_subset(path, [ds]))
    runs[gap] = (list(data.host_batches(0, 8)), dict(data.last_reads))
  for a, b in zip(runs[0][0], runs[1][0]):                           # the same batches ...
    for k in ("image", "tokens", "id", "clean"):
      np.testing.assert_array_equal(a[k], b[k])
  trained = sum(int(np.sum(flags[np.asarray(b["id"])])) for b in runs[1][0])
  assert trained == 8 * 20
  # ... from about the bytes of the kept pairs instead of ~1 / keep times them
  assert runs[1][1]["bytes"] < runs[0][1]["bytes"] / 4, (runs[0][1], runs[1][1])
  assert runs[1][1]["requests"] > runs[0][1]["requests"]
