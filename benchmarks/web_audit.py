"""The web audit's costs (issue 39): scoring every pair of img2dataset output, choosing a filter from the score
files, and training on the kept pairs.

1. Scoring throughput: `ncjax audit --checkpoint=RUN --dataset=web:ROOT` (model=small, 32-px JPEGs on local disk,
   8 CPU devices in all) on 1 process x 8 devices and on 2 processes x 4 devices: pairs/s of each process (its
   final progress line: its pairs after the first batch over the time since, compiling left out) and the wall
   time of the whole command (start-up, restoring, compiling and the report included); beside it the
   training step of the same model on the same data (`ncjax train`, batch 256: examples/s from metrics.jsonl).
2. Choosing a filter (`ncjax.data.web.subset.choose`, the exact top 70%): score files of 1M and 10M synthetic
   scores (10,000 pairs per shard), seconds per million pairs and the process's peak memory growth.
3. The filtered reader: `KeptSet.select` of a global batch of 32,768 ids at 400M pairs (a 50 MB bit file,
   memory-mapped) and opening it; `ncjax train` (model=micro, batch 64, pair reads, local disk) with and without a
   filter keeping 70%, in alternating rounds after a warm-up round.

  .venv/bin/python -m benchmarks.run --suites=web_audit        (--quick: 5,000 pairs, 1M scores)
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(extra=None) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.update(extra or {})
  return env


def _cli(args, processes: int = 1, devices: int = 8, timeout: float = 3600) -> tuple[list[str], float]:
  """Run `python -m ncjax.main ARGS` as `processes` local processes of one job; (each process's output, seconds)."""
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import multiprocess
  cmds = multiprocess.commands(args, processes, devices)
  t = time.perf_counter()
  procs = [subprocess.Popen(c, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for c in cmds]
  outs = [p.communicate(timeout=timeout)[0] for p in procs]
  seconds = time.perf_counter() - t
  if any(p.returncode for p in procs):
    raise RuntimeError("\n".join(o[-3000:] for o in outs))
  return outs, seconds


def _train_rate(workdir: str, root: str, model: str, batch: int, steps: int, *extra, save: bool = False) -> float:
  _cli(["train", f"--config=clip:data=web:{root},model={model},batch={batch}", f"--config.total_steps={steps}",
        "--config.log.every_steps=5", "--config.log.progress=False", f"--config.ckpt.save_at_end={save}",
        f"--workdir={workdir}", *extra])
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rates = [r["examples_per_sec"] for r in map(json.loads, f)
             if r.get("kind") == "train" and "examples_per_sec" in r and r["step"] > 5]
  return float(np.median(rates))


def scoring(tmp: str, pairs: int, model: str = "small", batch: int = 256) -> list[dict]:
  from ncjax.data.web import synthetic as web_synthetic
  root = os.path.join(tmp, "web")
  per_shard = max(500, pairs // 16)
  web_synthetic.write_img2dataset(root, pairs, per_shard=per_shard, image_size=32, pool=64)
  run = os.path.join(tmp, "run")
  train_rate = _train_rate(run, root, model, batch, 40, save=True)   # the run the audit then scores with
  rows = [dict(what=f"ncjax train (model={model}, batch {batch}, 1 x 8 devices)", processes=1,
               pairs_per_s_process=train_rate, pairs_per_s=train_rate)]
  print(rows[-1], flush=True)
  for processes in (1, 2):
    out = os.path.join(tmp, f"audit_{processes}")
    outs, seconds = _cli(["audit", f"--checkpoint={run}", f"--output={out}", "--progress_every=0", "--top=50",
                          "--sample=50", "--config=clip", f"--config.input.eval_batch_size={batch}"], processes,
                         8 // processes)
    rates = [float(m.group(1).replace(",", "")) for o in outs for m in re.finditer(r"([\d,]+) pairs/s", o)]
    rows.append(dict(what=f"ncjax audit, {processes} process(es) x {8 // processes} devices", processes=processes,
                     pairs_per_s_process=float(np.mean(rates)), pairs_per_s=float(np.sum(rates)),
                     command_s=seconds, pairs=pairs))
    print(rows[-1], flush=True)
  return rows


def _peak_kib() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def choosing(tmp: str, sizes) -> list[dict]:
  """subset.choose over synthetic score files (what an audit writes), the exact top 70%."""
  from ncjax import fileio
  from ncjax.data.web import score_files, subset
  rows = []
  per_shard = 10_000
  for n in sizes:
    out = os.path.join(tmp, f"scores_{n}")
    shards = -(-n // per_shard)
    counts = [min(per_shard, n - s * per_shard) for s in range(shards)]
    ident = dict(root="/bench", name="bench", shards=[f"{s:06d}.tar" for s in range(shards)], counts=counts,
                 sizes=[1] * shards, num_examples=n)
    manifest = score_files.make_manifest([ident], [0], dict(kind="similarity", init="bench"))
    fileio.write_text(os.path.join(score_files.scores_dir(out), "manifest.json"), json.dumps(manifest))
    rng = np.random.default_rng(0)
    first = 0
    for s, c in enumerate(counts):
      ids = np.arange(first, first + c)
      score_files.write_shard(score_files.shard_file(out, 0, ident["shards"][s]), dict(
          id=ids, key=[f"{i:012d}" for i in ids], score=rng.normal(size=c).astype(np.float32), bad=[""] * c,
          offset=np.full(c, -1), length=np.full(c, -1), clean=np.full(c, -1)), {})
      first += c
    before = _peak_kib()
    t = time.perf_counter()
    bits, decided = subset.choose(out, keep=0.7)
    seconds = time.perf_counter() - t
    rows.append(dict(pairs=n, seconds=seconds, s_per_million=seconds / (n / 1e6), kept=sum(decided["kept"]),
                     bits_mib=sum(len(b) for b in bits) / 2**20, peak_growth_mib=(_peak_kib() - before) / 1024))
    print(rows[-1], flush=True)
  return rows


def selecting(tmp: str) -> list[dict]:
  """select of a global batch of 32,768 ranks at 400M pairs, from a memory-mapped bit file."""
  from ncjax.data.web import subset
  n = 400_000_000
  path = os.path.join(tmp, "kept-400m.npy")
  rng = np.random.default_rng(0)
  bits = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8,   # 50 MB of random bits, 70% set, in pieces
                                   shape=(-(-n // subset.SUPERBLOCK) * subset.SUPERBLOCK_BYTES,))
  for a in range(0, len(bits), 1 << 22):
    chunk = rng.random(min(1 << 22, len(bits) - a) * 8) < 0.7
    bits[a:a + len(chunk) // 8] = np.packbits(chunk, bitorder="little")
  bits.flush()
  del bits
  before = _peak_kib()
  t = time.perf_counter()
  mapped = np.load(path, mmap_mode="r")
  kept = subset.KeptSet(mapped, len(mapped) * 8)
  opened = time.perf_counter() - t
  ranks = rng.integers(0, kept.kept, 32_768)
  median, _ = common.time_fn(kept.select, ranks, repeats=5)
  return [dict(pairs=kept.n, kept=kept.kept, open_s=opened, select_ms=1000 * median,
               bits_mib=os.path.getsize(path) / 2**20, rank_directory_mib=kept.before.nbytes / 2**20,
               peak_growth_mib=(_peak_kib() - before) / 1024)]


def filtered_training(tmp: str, pairs: int) -> list[dict]:
  from ncjax.data.web import index as web_index
  from ncjax.data.web import subset
  from ncjax.data.web import dataset as web
  from ncjax.data.web import synthetic as web_synthetic
  root = os.path.join(tmp, "web_train")
  web_synthetic.write_img2dataset(root, pairs, per_shard=max(500, pairs // 16), image_size=32, pool=64)
  web_index.build_index(root, workers=1)
  ds = web.open_dataset(root)
  flags = np.random.default_rng(1).random(ds.num_examples) < 0.7
  path = os.path.join(tmp, "filter70")
  subset.write_filter(path, [subset.dataset_identity(ds)], [subset.pack(flags)], dict(keep=0.7), dict(kind="bench"))
  rates: dict = {}
  for k in range(3):   # rounds, alternating (the first round warms the page cache and is left out)
    for label, extra in (("every pair", []), ("70% kept (input.web.filter)", [f"--config.input.web.filter={path}"])):
      rate = _train_rate(os.path.join(tmp, f"t_{k}_{len(rates.get(label, []))}_{label[:5]}"), root, "micro", 64, 80,
                         "--config.input.web.read=pair", *extra)
      if k:
        rates.setdefault(label, []).append(rate)
      print(label, rate, flush=True)
  rows = [dict(what=label, examples_per_s=float(np.median(r)), rounds=len(r)) for label, r in rates.items()]
  for r in rows:
    r["vs_all"] = r["examples_per_s"] / rows[0]["examples_per_s"]
  return rows


def run(quick: bool = False) -> dict:
  tmp = tempfile.mkdtemp(prefix="ncjax-bench-audit-")
  payload = dict(scoring=scoring(tmp, 5_000 if quick else 20_000),
                 choosing=choosing(tmp, (1_000_000,) if quick else (1_000_000, 10_000_000)),
                 selecting=selecting(tmp), filtered_training=filtered_training(tmp, 5_000 if quick else 20_000))
  common.write("web_audit", payload)
  common.report("Scoring web pairs (ncjax audit, 32-px JPEGs on local disk) beside the training step",
                payload["scoring"], [("what", "what", "s"), ("pairs_per_s_process", "pairs/s per process", ",.0f"),
                                     ("pairs_per_s", "pairs/s in all", ",.0f"), ("command_s", "command s", ".1f")])
  common.report("Choosing a filter from score files (the exact top 70%)", payload["choosing"],
                [("pairs", "pairs", ",d"), ("seconds", "s", ".1f"), ("s_per_million", "s per 1M pairs", ".2f"),
                 ("bits_mib", "bit file MiB", ".2f"), ("peak_growth_mib", "+peak MiB", ".0f")])
  common.report("A kept set of 400M pairs: open, select a global batch of 32,768", payload["selecting"],
                [("pairs", "pairs", ",d"), ("bits_mib", "bit file MiB", ".1f"),
                 ("rank_directory_mib", "rank directory MiB", ".2f"), ("open_s", "open s", ".2f"),
                 ("select_ms", "select ms", ".1f"), ("peak_growth_mib", "+peak MiB", ".0f")])
  common.report("ncjax train (model=micro, batch 64, pair reads) with and without a filter",
                payload["filtered_training"], [("what", "data", "s"), ("examples_per_s", "examples/s", ",.0f"),
                                               ("vs_all", "vs every pair", ".2f")])
  return payload


if __name__ == "__main__":
  run(quick="--quick" in sys.argv)
