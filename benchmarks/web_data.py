"""Web-scale data (ncjax.data.web.dataset, web_pipeline) on synthetic img2dataset output generated here (never stored in the
repository): per-process resident memory at start-up and after `steps` steps at two dataset sizes (the growth per
added pair, extrapolated to 400M), the index build's pairs/s per core with one and two processes, time to the first
batch, and host input throughput (JPEG decode + random resized crop + normalise at 224 from 256-px JPEGs) per core
beside a plain PIL loop and simplejpeg (libjpeg-turbo) as references.

Datasets. Writing 10M distinct pairs in Python takes most of an hour, so `templates` shards of 10,000 distinct pairs
(32-px JPEGs, captions of 8-16 words + a number, parquet with failed rows, _stats.json, .json members) are written
once and every other shard is a hard link of one of them (shard s -> template s mod templates). The readers see S
distinct files of the real layout; the page cache holds the templates once, so the build's and the stream's
figures are CPU costs (a cold disk or object store adds its own read time: ~3 KB per pair here, ~15-30 KB for
256-px web JPEGs). Memory: each run is a fresh process reading batches of `batch` pairs at 32 px (the model does
not run: the input pipeline is what grows with the data; per-sample method state lives on the devices).

  .venv/bin/python -m benchmarks.run --suites=web_data            (1M and 10M pairs; --quick: 100k and 1M)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from benchmarks import common

PER_SHARD = 10_000


def _status() -> dict:
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
        out[key] = int(value.split()[0]) * 1024
  return out


def make_dataset(root: str, pairs: int, templates: int = 4) -> str:
  """img2dataset layout of `pairs` pairs under root (kept between runs: a stamp file marks it complete)."""
  from ncjax.data.web import synthetic as web_synthetic
  stamp = os.path.join(root, f".complete_{pairs}")
  if os.path.isfile(stamp):
    return root
  shutil.rmtree(root, ignore_errors=True)
  t = min(templates, -(-pairs // PER_SHARD))
  web_synthetic.write_img2dataset(root, t * PER_SHARD, per_shard=PER_SHARD, image_size=32, pool=256)
  shards = -(-pairs // PER_SHARD)
  for s in range(t, shards):
    for suffix in (".tar", ".parquet", "_stats.json"):
      os.link(os.path.join(root, f"{s % t:05d}{suffix}"), os.path.join(root, f"{s:05d}{suffix}"))
  open(stamp, "w").close()
  return root


def child_memory(root: str, mode: str, steps: int, batch: int) -> dict:
  """In a fresh process: resident memory after imports, after building the input (start-up), after the first batch,
  after `steps` steps."""
  t0 = time.perf_counter()
  from ncjax import tokenizers
  from ncjax.data.web import dataset as web
  from ncjax.data.web import pipeline as web_pipeline
  base = _status()
  ds = web.open_dataset(root, use_index=mode == "index")
  tok = tokenizers.TOKENIZERS["clip_bpe"](context_length=77)
  data = web_pipeline.WebTrainData([ds], tok, batch, 0, None, mode=mode, image_size=32, num_threads=2,
                                   prefetch=2, process_index=0, process_count=1)
  start = _status()
  t_ready = time.perf_counter() - t0
  it = data.host_batches(0, steps)
  next(it)
  first = _status()
  t_first = time.perf_counter() - t0
  t1 = time.perf_counter()
  for _ in it:
    pass
  rate = (steps - 1) * batch / (time.perf_counter() - t1)
  end = _status()
  return dict(imports=base, start=start, first=first, end=end, ready_s=t_ready, first_batch_s=t_first,
              pairs_per_s=rate, num_examples=data.num_examples)


def _run_child(root, mode, steps, batch) -> dict:
  code = (f"import json; from benchmarks.web_data import child_memory; "
          f"print('RESULT' + json.dumps(child_memory({root!r}, {mode!r}, {steps}, {batch})))")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
  for line in out.stdout.splitlines():
    if line.startswith("RESULT"):
      return json.loads(line[len("RESULT"):])
  raise RuntimeError(f"memory child failed: {out.stderr[-3000:]}")


def build_speed(root: str, workers: int, index_dir: str) -> dict:
  from ncjax.data.web import index as web_index
  shutil.rmtree(index_dir, ignore_errors=True)
  t = time.perf_counter()
  manifest = web_index.build_index(root, index_dir=index_dir, workers=workers)
  dt = time.perf_counter() - t
  size = sum(os.path.getsize(os.path.join(index_dir, f)) for f in os.listdir(index_dir)
             if os.path.isfile(os.path.join(index_dir, f)))
  return dict(workers=workers, seconds=dt, pairs=manifest["num_examples"],
              pairs_per_s_per_core=manifest["num_examples"] / dt / workers, index_bytes=size)


def input_throughput(n: int = 1500) -> list[dict]:
  """Images/s on one core (one thread) from 256-px JPEGs to 224 x 224 normalised float32."""
  from PIL import Image
  import io
  from ncjax.data import preprocess, streams
  from ncjax.data.web import decode as web_decode
  from ncjax.data.web import synthetic as web_synthetic
  jpegs = web_synthetic.jpeg_pool(64, 256, seed=1, quality=90)
  rows = []

  def timed(name, fn):
    fn(0)
    t = time.perf_counter()
    for i in range(n):
      fn(i)
    rows.append(dict(loop=name, images_per_s=n / (time.perf_counter() - t)))

  timed("ncjax decode_train (PIL: decode, random resized crop, bicubic 224, normalise)",
        lambda i: web_decode.decode_train(jpegs[i % 64], 224, streams.crop_rng(0, 0, i), "openai", (0.9, 1.0)))

  def plain(i):
    with Image.open(io.BytesIO(jpegs[i % 64])) as im:
      return np.asarray(im.convert("RGB").resize((224, 224), Image.BILINEAR))
  timed("plain PIL: decode + resize 224 (no crop, no normalise)", plain)
  try:
    import simplejpeg
  except ImportError:
    simplejpeg = None
  if simplejpeg is not None:
    timed("ncjax decode_train, input.web.decoder=simplejpeg",
          lambda i: web_decode.decode_train(jpegs[i % 64], 224, streams.crop_rng(0, 0, i), "openai", (0.9, 1.0),
                                              "simplejpeg"))

    def sj(i):
      px = simplejpeg.decode_jpeg(jpegs[i % 64], colorspace="RGB")
      rng = streams.crop_rng(0, 0, i)
      left, top, w, h = preprocess.random_resized_crop_box(rng, px.shape[1], px.shape[0], (0.9, 1.0))
      img = Image.fromarray(px).resize((224, 224), Image.BICUBIC, box=(left, top, left + w, top + h))
      return preprocess.normalize(np.asarray(img), "openai")
    timed("simplejpeg decode + the same crop, bicubic 224, normalise", sj)
    timed("simplejpeg decode only", lambda i: simplejpeg.decode_jpeg(jpegs[i % 64], colorspace="RGB"))
  return rows


def run(quick: bool = False, sizes=None, steps: int = 1000, batch: int = 64) -> dict:
  sizes = sizes or ((100_000, 1_000_000) if quick else (1_000_000, 10_000_000))
  steps = 200 if quick else steps
  base = os.path.join(common.RESULTS_DIR, "web_data")
  payload: dict = dict(sizes=list(sizes), steps=steps, batch=batch, memory=[], build=[])
  roots = {}
  for n in sizes:
    t = time.perf_counter()
    roots[n] = make_dataset(os.path.join(base, f"pairs_{n}"), n)
    print(f"dataset of {n:,} pairs ready ({time.perf_counter() - t:.0f} s)", flush=True)
  small, large = sizes[0], sizes[-1]
  for workers in (1, 2):
    row = build_speed(roots[small], workers, os.path.join(roots[small], "_ncjax_index"))
    payload["build"].append(dict(row, dataset=small))
    print(row, flush=True)
  row = build_speed(roots[large], 2, os.path.join(roots[large], "_ncjax_index"))
  payload["build"].append(dict(row, dataset=large))
  print(row, flush=True)
  for mode in ("stream", "index"):
    for n in sizes:
      r = _run_child(roots[n], mode, steps, batch)
      payload["memory"].append(dict(r, mode=mode, pairs=n))
      print(mode, n, {k: r[k] for k in ("ready_s", "first_batch_s", "pairs_per_s")},
            {k: r["end"][k] for k in ("VmHWM", "RssAnon", "RssFile")}, flush=True)
  payload["input"] = input_throughput(400 if quick else 1500)
  rows = []
  for mode in ("stream", "index"):
    m = {r["pairs"]: r for r in payload["memory"] if r["mode"] == mode}
    a, b = m[small], m[large]
    for when in ("start", "end"):
      growth = (b[when]["VmHWM"] - a[when]["VmHWM"]) / (large - small)
      rows.append(dict(mode=mode, when="start-up" if when == "start" else f"after {steps} steps",
                       small=a[when]["VmHWM"] / 2**20, large=b[when]["VmHWM"] / 2**20,
                       file_large=b[when]["RssFile"] / 2**20, growth=growth,
                       at400m=(a[when]["VmHWM"] + growth * (400e6 - small)) / 2**30))
  payload["memory_table"] = rows
  common.write("web_data", payload)
  common.report(f"Web data: peak RSS per process (MiB), {small:,} vs {large:,} pairs, batch {batch}",
                rows, [("mode", "mode", "s"), ("when", "when", "s"), ("small", f"{small:,}", ".0f"),
                       ("large", f"{large:,}", ".0f"), ("file_large", "file-backed", ".0f"),
                       ("growth", "B/pair", ".2f"), ("at400m", "400M (GiB)", ".2f")])
  common.report("Web data: index build (page cache warm)", payload["build"],
                [("dataset", "pairs", ",d"), ("workers", "processes", "d"), ("seconds", "s", ".1f"),
                 ("pairs_per_s_per_core", "pairs/s/core", ",.0f"), ("index_bytes", "index bytes", ",d")])
  common.report("Web data: start-up", [dict(mode=r["mode"], pairs=r["pairs"], ready=r["ready_s"],
                                            first=r["first_batch_s"], rate=r["pairs_per_s"])
                                       for r in payload["memory"]],
                [("mode", "mode", "s"), ("pairs", "pairs", ",d"), ("ready", "input ready s", ".2f"),
                 ("first", "first batch s", ".2f"), ("rate", "pairs/s (32 px)", ",.0f")])
  common.report("Web data: host input per core, 256-px JPEG -> 224", payload["input"],
                [("loop", "loop", "s"), ("images_per_s", "images/s", ",.0f")])
  return payload


if __name__ == "__main__":
  run(quick="--quick" in sys.argv)
