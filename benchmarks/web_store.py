"""Web data read from object storage (issue 35): a real GCS JSON API server on 127.0.0.1 (tests/gcs_server.py) behind
a proxy that holds every request for 0, 10 or 30 ms (tests/latency_proxy.py: a real bucket's first-byte time).

1. Reader rate per process: pairs/s and requests per pair of `WebTrainData` reading img2dataset output (12 shards of
   unequal size, 32-px JPEGs, captions of web length) streamed, indexed read per pair, and indexed read in blocks —
   the reader alone (decode at 32 px on 2 threads: what a host spends per pair besides I/O is small here).
2. `ncjax train` (model=micro, batch 64, 8 CPU devices) at 25 ms per request: examples/s from metrics.jsonl, streamed
   vs indexed in blocks vs indexed per pair — the issue's headline ratio.
3. Opening a gs:// index of 10M pairs (40 MB of offsets) in two processes of one host at once: what each process's
   anonymous, file-backed and peak memory grew by from opening it and touching every offset, and the time to open
   (one process downloads into the host's cache while the other waits on its lock, then both map the same file).
4. 10,000 shards (10 pairs each) in the bucket at 30 ms per request: start-up of a streamed run (one listing, the
   shards' _stats.json read concurrently), the index build (2 processes) and opening the index (manifest, offsets,
   listing check).
5. Host input: 256-px JPEGs -> 224 normalised, through the thread decoder (1 and 2 threads) and the process decoder
   with 1 and 2 worker processes.
6. A CSV table of 40k and 320k pairs written as webdataset shards (`build --dataset=web --table=...`) and read as web
   data: the conversion's time and a training process's peak memory, per added pair.
7. Local reads with and without the per-read pin check (an fstat of the open descriptor), and filtered block reads
   at keep 10% with a fixed or a measured split gap (issue 53).

  .venv/bin/python -m benchmarks.run --suites=web_store        (--quick: fewer steps, 2,000 shards)
  .venv/bin/python -m benchmarks.web_store --train_only        (part 2 alone, with a row of injected noise 0.4)
  .venv/bin/python -m benchmarks.web_store --pin_check         (local reads with and without the per-read pin check)
  .venv/bin/python -m benchmarks.web_store --split_gap         (filtered block reads: the split gap, fixed or measured)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [1100, 900, 1300, 700, 1000, 1200, 800, 1400, 950, 1050, 600, 1500]   # 12,500 pairs


def _servers():
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  from gcs_server import GCSServer
  from latency_proxy import LatencyProxy
  return GCSServer, LatencyProxy


def _child(code: str, env: dict, timeout: float = 1800) -> dict:
  full = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **env)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout,
                       cwd=ROOT)
  for line in out.stdout.splitlines():
    if line.startswith("RESULT"):
      return json.loads(line[len("RESULT"):])
  raise RuntimeError(f"benchmark child failed: {out.stderr[-3000:]}")


def reader_rate(root: str, mode: str, read: str, steps: int, batch: int, cache: str, max_inflight: int = 64) -> dict:
  """(in a child process) pairs/s of this process's host batches after the first, and requests per pair."""
  from ncjax.data.web import dataset as web
  from ncjax.data.web import pipeline as web_pipeline
  from ncjax.data.web import synthetic as web_synthetic
  from ncjax.tokenizers import WordTokenizer
  tok = WordTokenizer.build(web_synthetic.captions(0, 500), context_length=32)
  t0 = time.perf_counter()
  ds = web.open_dataset(root, use_index=mode == "index", cache_dir=cache)
  data = web_pipeline.WebTrainData([ds], tok, batch, 0, None, mode=mode, read=read, image_size=32, num_threads=2,
                                   prefetch=4, max_inflight=max_inflight, process_index=0, process_count=1)
  it = data.host_batches(0, steps + 1)
  next(it)
  ready = time.perf_counter() - t0
  t = time.perf_counter()
  skipped = 0
  for b in it:
    skipped += int(b["_skipped"])
  dt = time.perf_counter() - t
  return dict(pairs_per_s=steps * batch / dt, requests_per_pair=data.last_reads["requests"] / ((steps + 1) * batch),
              first_batch_s=ready, skipped=skipped)


def _reader_rates(server, proxy_cls, root, cache, latencies, steps, batch) -> list[dict]:
  rows = []
  for latency in latencies:
    with proxy_cls(server.port, latency) as proxy:
      env = dict(server.env, **proxy.env)
      for mode, read, inflight in (("stream", "auto", 64), ("index", "pair", 64), ("index", "block", 64),
                                   ("index", "pair", 8)):
        code = (f"import json; from benchmarks.web_store import reader_rate; print('RESULT' + json.dumps("
                f"reader_rate({root!r}, {mode!r}, {read!r}, {steps}, {batch}, {cache!r}, {inflight})))")
        r = _child(code, env)
        label = "streamed" if mode == "stream" else f"indexed, {read} reads" + (
            f" ({inflight} in flight)" if inflight != 64 else "")
        rows.append(dict(r, latency_ms=1000 * latency, reader=label))
        print(rows[-1], flush=True)
  return rows


def _train_rate(server, proxy_cls, root, cache, tmp, steps: int) -> list[dict]:
  rows = []
  with proxy_cls(server.port, 0.025) as proxy:
    env = dict(server.env, **proxy.env)
    for mode, read, noise in (("stream", "auto", 0), ("index", "block", 0), ("index", "pair", 0),
                              ("index", "block", 0.4)):
      workdir = os.path.join(tmp, f"train_{mode}_{read}_{noise}")
      cmd = [sys.executable, "-m", "ncjax.main", "train",
             f"--config=clip:data=web:{root},model=micro,batch=64" + (f",noise={noise}" if noise else ""),
             f"--config.total_steps={steps}", f"--config.input.web.mode={mode}", f"--config.input.web.read={read}",
             f"--config.input.web.cache_dir={cache}", "--config.log.every_steps=10", "--config.log.progress=False",
             "--config.ckpt.save_at_end=False", "--cpu_devices=8", f"--workdir={workdir}"]
      t = time.perf_counter()
      out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu", **env),
                           cwd=ROOT, timeout=3600)
      if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rates = [r["examples_per_sec"] for r in map(json.loads, f) if r.get("kind") == "train" and
                 "examples_per_sec" in r and r["step"] > 10]
      rows.append(dict(reader=("streamed" if mode == "stream" else f"indexed, {read} reads") +
                       (f", injected noise {noise}" if noise else ""),
                       examples_per_s=float(np.median(rates)), seconds=time.perf_counter() - t))
      print(rows[-1], flush=True)
  base = rows[0]["examples_per_s"]
  for r in rows:
    r["vs_streamed"] = r["examples_per_s"] / base
  return rows


def open_index(index_dir: str, cache: str, barrier: str) -> dict:
  """(in a child process) open a gs:// index, touch every offset; memory and time."""
  from benchmarks.web_data import _status
  from ncjax import fileio
  from ncjax.data.web import index as web_index
  fileio.filesystem(index_dir)   # the client made before the baseline: what is measured is the index
  before = _status()
  while not os.path.exists(barrier):   # both processes start opening at once
    time.sleep(0.005)
  t = time.perf_counter()
  index = web_index.WebIndex.open(index_dir, cache)
  opened = time.perf_counter() - t
  total = int(np.sum(index.offsets, dtype=np.uint64) % 7)   # every page of the offsets touched
  after = _status()
  return dict(open_s=opened, touched=total > -1, before=before, **after)


def _index_memory(server, root: str, tmp: str, pairs: int) -> list[dict]:
  from ncjax import fileio
  from ncjax.data.web import index as web_index
  import io
  offsets = (np.arange(pairs, dtype=np.uint64) * 1536 % (1 << 31)).astype(np.uint32)
  index_dir = fileio.join(root, "big_index")
  name, data = web_index._digest_name("offsets", offsets)
  fileio.write_bytes(fileio.join(index_dir, name), data)
  manifest = dict(version=web_index.INDEX_VERSION, shards=["x.tar"], counts=[pairs], ends=[1], sizes=[1],
                  versions=["1"], offsets_file=name, offsets_dtype="uint32", clean_file="", clean_key="",
                  num_examples=pairs, bad_shards={})
  fileio.write_text(fileio.join(index_dir, "manifest.json"), json.dumps(manifest))
  del io
  cache = os.path.join(tmp, "index_cache")
  barrier = os.path.join(tmp, "go")
  code = (f"import json; from benchmarks.web_store import open_index; print('RESULT' + json.dumps("
          f"open_index({index_dir!r}, {cache!r}, {barrier!r})))")
  full = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **server.env)
  procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full, cwd=ROOT) for _ in range(2)]
  time.sleep(2.0)
  open(barrier, "w").close()
  rows = []
  for k, p in enumerate(procs):
    out, err = p.communicate(timeout=600)
    line = [x for x in out.splitlines() if x.startswith("RESULT")]
    if not line:
      raise RuntimeError(err[-3000:])
    r = json.loads(line[0][len("RESULT"):])
    b = r["before"]
    rows.append(dict(process=k, open_s=r["open_s"], anon_mib=(r["RssAnon"] - b["RssAnon"]) / 2**20,
                     file_mib=(r["RssFile"] - b["RssFile"]) / 2**20, peak_mib=(r["VmHWM"] - b["VmHWM"]) / 2**20,
                     offsets_mib=offsets.nbytes / 2**20))
    print(rows[-1], flush=True)
  return rows


def _many_shards(server, proxy_cls, root: str, tmp: str, shards: int) -> list[dict]:
  from ncjax.data.web import synthetic as web_synthetic
  from concurrent.futures import ThreadPoolExecutor
  from ncjax import fileio
  t = time.perf_counter()
  one = os.path.join(tmp, "one_shard")
  web_synthetic.write_img2dataset(one, 10, per_shard=10, image_size=8, pool=4, parquet=False)
  tar, stats = open(os.path.join(one, "00000.tar"), "rb").read(), open(os.path.join(one, "00000_stats.json")).read()

  def put(s):
    fileio.write_bytes(fileio.join(root, f"{s:06d}.tar"), tar)
    fileio.write_text(fileio.join(root, f"{s:06d}_stats.json"), stats)

  with ThreadPoolExecutor(32) as pool:
    list(pool.map(put, range(shards)))
  print(f"{shards} shards uploaded ({time.perf_counter() - t:.0f} s)", flush=True)
  rows = []
  with proxy_cls(server.port, 0.03) as proxy:
    env = dict(server.env, **proxy.env)
    cache = os.path.join(tmp, "shards_cache")
    steps = [("stream start-up (listing + every _stats.json)",
              f"from ncjax.data.web import dataset as web; ds = web.open_dataset({root!r}, use_index=False); n = ds.num_examples"),
             ("index build, 2 processes (scan + parts + merge)",
              f"from ncjax.data.web import index as web_index; n = web_index.build_index({root!r}, workers=2)['num_examples']"),
             ("index open (manifest, offsets, listing check)",
              f"from ncjax.data.web import dataset as web; ds = web.open_dataset({root!r}, cache_dir={cache!r}); n = ds.num_examples")]
    for what, body in steps:
      code = (f"import json, time; t = time.perf_counter(); {body}; "
              f"print('RESULT' + json.dumps(dict(seconds=time.perf_counter() - t, pairs=n)))")
      r = _child(code, env, timeout=7200)
      rows.append(dict(step=what, shards=shards, latency_ms=30, **r))
      print(rows[-1], flush=True)
  return rows


def host_input(n: int = 600) -> list[dict]:
  """images/s through the decoders (256-px JPEG -> 224 x 224 normalised float32, batches of 64)."""
  from ncjax.data.web import decode as web_decode
  from ncjax.data.web import synthetic as web_synthetic
  from ncjax.tokenizers import WordTokenizer
  jpegs = web_synthetic.jpeg_pool(64, 256, seed=1, quality=90)
  tok = WordTokenizer.build(web_synthetic.captions(0, 500), context_length=32)
  settings = web_decode.DecodeSettings(224, "openai", True, (0.9, 1.0), "pil", tok.to_json())
  captions = web_synthetic.captions(0, 64)
  specs = [web_decode.ExampleSpec(k, captions[k % 64], jpegs[k % 64], (0, 1, k)) for k in range(64)]
  rows = []
  for label, make in (("threads, 1", lambda: web_decode.ThreadDecoder(settings, tok, 1)),
                      ("threads, 2", lambda: web_decode.ThreadDecoder(settings, tok, 2)),
                      ("worker processes, 1", lambda: web_decode.ProcessDecoder(settings, 1)),
                      ("worker processes, 2", lambda: web_decode.ProcessDecoder(settings, 2))):
    decoder = make()
    try:
      decoder.decode(specs, 32)   # workers started, buffers made
      t = time.perf_counter()
      done, pending = 0, []
      while done < n:              # two batches in flight, as the web reader's decode stage keeps them
        pending.append(decoder.submit(specs, 32))
        if len(pending) == 2:
          pending.pop(0).result()
        done += len(specs)
      for p in pending:
        p.result()
      rows.append(dict(decoder=label, images_per_s=done / (time.perf_counter() - t)))
    finally:
      decoder.close()
    print(rows[-1], flush=True)
  one = {r["decoder"].split(",")[0]: r["images_per_s"] for r in rows if r["decoder"].endswith(", 1")}
  for r in rows:
    r["vs_one"] = r["images_per_s"] / one[r["decoder"].split(",")[0]]
  return rows


def table_route(tmp: str, sizes=(40_000, 320_000), steps: int = 100, batch: int = 64) -> list[dict]:
  """A table of `size` rows over 64 image files -> shards + index (timed) -> a training process's memory."""
  from benchmarks.web_data import _run_child
  from ncjax.data import build
  from ncjax.data.web import synthetic as web_synthetic
  images = os.path.join(tmp, "table_images")
  os.makedirs(images, exist_ok=True)
  for k, data in enumerate(web_synthetic.jpeg_pool(64, 32, seed=5)):
    with open(os.path.join(images, f"{k}.jpg"), "wb") as f:
      f.write(data)
  rows = []
  for n in sizes:
    table = os.path.join(tmp, f"pairs_{n}.tsv")
    caps = web_synthetic.captions(0, n)
    with open(table, "w") as f:
      f.write("filepath\ttitle\n" + "".join(f"table_images/{k % 64}.jpg\t{caps[k]}\n" for k in range(n)))
    out = os.path.join(tmp, f"table_wds_{n}")
    t = time.perf_counter()
    assert build.main(["--dataset=web", f"--manual_dir={tmp}", f"--table={table}", f"--output_dir={out}",
                       "--workers=2"]) == 0
    seconds = time.perf_counter() - t
    r = _run_child(out, "index", steps, batch)
    rows.append(dict(pairs=n, convert_s=seconds, peak_mib=r["end"]["VmHWM"] / 2**20))
    print(rows[-1], flush=True)
  for r in rows:
    r["bytes_per_added_pair"] = (r["peak_mib"] - rows[0]["peak_mib"]) * 2**20 / max(1, r["pairs"] - rows[0]["pairs"])
  return rows


def pin_check_cost(quick: bool = False) -> list[dict]:
  """The cost of comparing a local shard's open descriptor with its pin after every read (issue 53): ranged reads
  of single pairs (`RangeReader`, 16 threads, the page cache warm) and per-pair host batches, with and without the
  fstat, in alternating repetitions (the median of each). `python -m benchmarks.web_store --pin_check`."""
  from ncjax.data.web import dataset as web
  from ncjax.data.web import index as web_index
  from ncjax.data.web import pipeline as web_pipeline
  from ncjax.data.web import store
  from ncjax.data.web import synthetic as web_synthetic
  from ncjax.tokenizers import WordTokenizer
  tmp = tempfile.mkdtemp(prefix="ncjax-bench-pins-")
  root = os.path.join(tmp, "web")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=32, pool=64)
  web_index.build_index(root, workers=1)
  ds = web.open_dataset(root)
  ids = np.random.default_rng(0).permutation(ds.num_examples)
  runs = ds.index.sample_ranges(ds, ids)
  ranges = [store.Range(ds.shards[s], a, b, ds.version_of(s)) for s, a, b in zip(*runs)]
  tok = WordTokenizer.build(web_synthetic.captions(0, 500), context_length=32)
  rates: dict = {}
  checked = store.check_descriptor
  for rep in range(3 if quick else 7):
    for check in (False, True):
      store.check_descriptor = checked if check else (lambda *args: None)   # without: the check removed
      try:
        reader = store.RangeReader()
        t = time.perf_counter()
        reader.read(ranges)
        rates.setdefault(("RangeReader, one pair per read", check), []).append(
            len(ranges) / (time.perf_counter() - t))
        reader.close()
        data = web_pipeline.WebTrainData([ds], tok, 64, rep, None, read="pair", image_size=32, num_threads=2,
                                         process_index=0, process_count=1)
        t = time.perf_counter()
        steps = sum(1 for _ in data.host_batches(0, 40 if quick else 100))
        rates.setdefault(("host batches, per-pair reads (decode 32 px)", check), []).append(
            steps * 64 / (time.perf_counter() - t))
      finally:
        store.check_descriptor = checked
  rows = []
  for what in dict.fromkeys(k for k, _ in rates):
    off, on = float(np.median(rates[what, False])), float(np.median(rates[what, True]))
    rows.append(dict(what=what, without=off, with_check=on, cost=1 - on / off))
    print(rows[-1], flush=True)
  common.write("web_pin_check", dict(rows=rows))
  common.report("Local reads with the pin compared by fstat after every read (pairs/s, median)", rows,
                [("what", "reads", "s"), ("without", "without", ",.0f"), ("with_check", "with the check", ",.0f"),
                 ("cost", "cost", ".1%")])
  return rows


def split_gap(quick: bool = False) -> list[dict]:
  """Filtered block reads at keep 10% on local disk (160-px JPEGs): bytes read per kept byte and requests, with the
  fixed 512 KiB gap of before issue 53, 64 KiB, and the gap measured on the run's own requests (-1, the default).
  `python -m benchmarks.web_store --split_gap`."""
  from ncjax.data.web import dataset as web
  from ncjax.data.web import index as web_index
  from ncjax.data.web import pipeline as web_pipeline
  from ncjax.data.web import subset as subset_lib
  from ncjax.data.web import synthetic as web_synthetic
  from ncjax.tokenizers import WordTokenizer
  tmp = tempfile.mkdtemp(prefix="ncjax-bench-gap-")
  root = os.path.join(tmp, "web")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=160, pool=64)
  web_index.build_index(root, workers=1)
  ds = web.open_dataset(root)
  flags = np.random.default_rng(0).random(ds.num_examples) < 0.1
  path = os.path.join(tmp, "filter")
  subset_lib.write_filter(path, [subset_lib.dataset_identity(ds)], [subset_lib.pack(flags)], dict(keep=0.1),
                          dict(kind="benchmark"))
  tok = WordTokenizer.build(web_synthetic.captions(0, 500), context_length=32)
  rows = []
  for gap in (512 << 10, 64 << 10, -1):
    data = web_pipeline.WebTrainData([ds], tok, 64, 0, None, read="block", image_size=32, num_threads=2,
                                     process_index=0, process_count=1, subset=subset_lib.open_subset(path, [ds]),
                                     split_gap_bytes=gap)
    t = time.perf_counter()
    kept = 0
    for b in data.host_batches(0, data.steps_per_window * (1 if quick else 3)):   # whole windows: all they read
      _, start, end = ds.index.sample_ranges(ds, np.asarray(b["id"]))
      kept += int(np.sum(end - start))
    dt = time.perf_counter() - t
    reads = data.last_reads
    rows.append(dict(gap=("measured: " + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in
                                                     reads["split_gap_bytes"].items() if k == "local"))
                     if gap < 0 else f"{gap >> 10} KiB", bytes_per_kept_byte=reads["bytes"] / max(1, kept),
                     requests=reads["requests"], seconds=dt))
    print(rows[-1], flush=True)
  common.write("web_split_gap", dict(rows=rows))
  common.report("Filtered block reads at keep 10%, local disk", rows,
                [("gap", "split gap", "s"), ("bytes_per_kept_byte", "bytes read / kept byte", ".2f"),
                 ("requests", "requests", "d"), ("seconds", "s", ".2f")])
  return rows


def train_only(quick: bool = False) -> dict:
  """Part 2 alone (the ratio README's web-data section states): `python -m benchmarks.web_store --train_only`."""
  GCSServer, LatencyProxy = _servers()
  from ncjax.data.web import index as web_index
  from ncjax.data.web import synthetic as web_synthetic
  tmp = tempfile.mkdtemp(prefix="ncjax-bench-store-")
  with GCSServer() as server:
    root = server.path("web")
    web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=32, pool=64)
    web_index.build_index(root, workers=1)
    rows = _train_rate(server, LatencyProxy, root, os.path.join(tmp, "cache"), tmp, 60 if quick else 150)
  common.write("web_store_train", dict(train=rows))
  common.report("ncjax train (model=micro, batch 64, 8 CPU devices), data on gs:// at 25 ms per request", rows,
                [("reader", "reader", "s"), ("examples_per_s", "examples/s", ",.0f"),
                 ("vs_streamed", "vs streamed", ".2f")])
  return dict(train=rows)


def run(quick: bool = False) -> dict:
  GCSServer, LatencyProxy = _servers()
  from ncjax.data.web import index as web_index
  from ncjax.data.web import synthetic as web_synthetic
  tmp = tempfile.mkdtemp(prefix="ncjax-bench-store-")
  payload: dict = {}
  with GCSServer() as server:
    root = server.path("web")
    web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=32, pool=64)
    web_index.build_index(root, workers=1)
    cache = os.path.join(tmp, "cache")
    payload["reader"] = _reader_rates(server, LatencyProxy, root, cache, (0.0, 0.01, 0.03), 40 if quick else 120, 64)
    payload["train"] = _train_rate(server, LatencyProxy, root, cache, tmp, 60 if quick else 150)
    payload["index_memory"] = _index_memory(server, server.path("mem"), tmp, 10_000_000)
    payload["many_shards"] = _many_shards(server, LatencyProxy, server.path("many"), tmp, 2000 if quick else 10_000)
  payload["host_input"] = host_input(200 if quick else 600)
  payload["pin_check"] = pin_check_cost(quick)
  payload["split_gap"] = split_gap(quick)
  payload["table_route"] = table_route(tmp, (20_000, 80_000) if quick else (40_000, 320_000))
  common.write("web_store", payload)
  common.report("Web data on gs:// behind a latency proxy: the reader of one process (batch 64, 32 px)",
                payload["reader"], [("latency_ms", "ms/request", ".0f"), ("reader", "reader", "s"),
                                    ("pairs_per_s", "pairs/s", ",.0f"), ("requests_per_pair", "requests/pair", ".3f"),
                                    ("first_batch_s", "first batch s", ".2f"), ("skipped", "skipped", "d")])
  common.report("ncjax train (model=micro, batch 64, 8 CPU devices), data on gs:// at 25 ms per request",
                payload["train"], [("reader", "reader", "s"), ("examples_per_s", "examples/s", ",.0f"),
                                   ("vs_streamed", "vs streamed", ".2f")])
  common.report("Opening a gs:// index of 10M pairs in two processes of one host at once", payload["index_memory"],
                [("process", "process", "d"), ("open_s", "open s", ".2f"), ("anon_mib", "+anon MiB", ".1f"),
                 ("file_mib", "+file-backed MiB", ".1f"), ("peak_mib", "+peak MiB", ".1f"),
                 ("offsets_mib", "offsets MiB", ".0f")])
  common.report("Many shards on gs:// at 30 ms per request", payload["many_shards"],
                [("step", "step", "s"), ("shards", "shards", ",d"), ("seconds", "s", ".1f")])
  common.report("Host input: 256-px JPEG -> 224, batches of 64", payload["host_input"],
                [("decoder", "decoder", "s"), ("images_per_s", "images/s", ",.0f"), ("vs_one", "vs 1", ".2f")])
  common.report("A CSV table written as webdataset shards and trained as web data (index, pair reads)",
                payload["table_route"], [("pairs", "pairs", ",d"), ("convert_s", "convert + index s", ".1f"),
                                         ("peak_mib", "peak MiB (training reader)", ".0f"),
                                         ("bytes_per_added_pair", "B/added pair", ".2f")])
  return payload


if __name__ == "__main__":
  part = {"--train_only": train_only, "--pin_check": pin_check_cost, "--split_gap": split_gap}
  next((f for flag, f in part.items() if flag in sys.argv), run)(quick="--quick" in sys.argv)
