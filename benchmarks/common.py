"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import json
import os
import platform
import time

import jax
import numpy as np

RESULTS_DIR = os.environ.get("NCJAX_BENCH_DIR", "bench_results")


def block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


def time_fn(fn, *args, warmup: int = 1, repeats: int = 3, min_time: float = 0.0):
  """Median wall time of fn(*args) over `repeats` runs after `warmup` runs (compile excluded)."""
  for _ in range(warmup):
    block(fn(*args))
  times = []
  t_start = time.perf_counter()
  while len(times) < repeats or (time.perf_counter() - t_start) < min_time:
    t = time.perf_counter()
    block(fn(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times)), times


def compiled_flops(jitted, *args, partitions: int = 1) -> float | None:
  """FLOPs of one call. XLA's cost analysis of an SPMD-partitioned program counts one partition, so pass the
  number of devices the program is split over (`partitions`) to get the whole step's count. `jitted` may also be
  an already compiled program (`jax.stages.Compiled`; no args then)."""
  try:
    compiled = jitted if isinstance(jitted, jax.stages.Compiled) else jitted.lower(*args).compile()
    cost = compiled.cost_analysis()
  except Exception:  # cost analysis is best-effort on some backends
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  flops = float(cost.get("flops", 0.0)) if cost else 0.0
  return flops * partitions if flops > 0 else None


def machine() -> dict:
  dev = jax.devices()
  return dict(platform=dev[0].platform, device_kind=dev[0].device_kind, n_devices=len(dev),
              cpu_count=os.cpu_count(), python=platform.python_version(), jax=jax.__version__)


def write(name: str, payload: dict) -> str:
  os.makedirs(RESULTS_DIR, exist_ok=True)
  path = os.path.join(RESULTS_DIR, f"{name}.json")
  with open(path, "w") as f:
    json.dump(dict(payload, machine=machine(), time=time.time()), f, indent=1)
  return path


REPORTS: list[tuple[str, list[dict], list[tuple[str, str, str]]]] = []


def report(title: str, rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
  """Print a table now and keep it for the markdown summary (bench_results/summary.md)."""
  print(f"\n{title}")
  print(table(rows, columns))
  REPORTS.append((title, rows, columns))


def markdown_summary(path: str | None = None) -> str:
  """Every reported table as markdown, with the machine's description."""
  m = machine()
  out = [f"# ncjax benchmarks\n\n{m['n_devices']} x {m['device_kind']} ({m['platform']}), {m['cpu_count']} CPUs, "
         f"jax {m['jax']}\n"]
  for title, rows, columns in REPORTS:
    out.append(f"\n## {title}\n")
    out.append("| " + " | ".join(h for _, h, _ in columns) + " |")
    out.append("|" + "---|" * len(columns))
    for r in rows:
      out.append("| " + " | ".join("-" if r.get(k) is None else format(r[k], f) for k, _, f in columns) + " |")
  text = "\n".join(out) + "\n"
  path = path or os.path.join(RESULTS_DIR, "summary.md")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)
  return path


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
  """columns: (key, header, format)."""
  heads = [h for _, h, _ in columns]
  cells = [[("-" if r.get(k) is None else format(r[k], fmt)) for k, _, fmt in columns] for r in rows]
  widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
  line = "  ".join(h.rjust(w) for h, w in zip(heads, widths))
  out = [line, "-" * len(line)]
  out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
  return "\n".join(out)


def train_step_seconds(cfg, steps: int = 2) -> float:
  """Median wall time of the trainer's jitted step of the first stage with steps (compile excluded) under `cfg`
  (NCU with epochs_prompt=0 lists its empty prompt stage first: its unlearning step is the one timed)."""
  import tempfile
  from ncjax import train
  with cfg.unlocked():
    cfg.log.progress = False
    cfg.ckpt.save_at_end = False
    cfg.evals = {}
  with tempfile.TemporaryDirectory() as workdir:
    trainer = train.Trainer(cfg, workdir)
    span = next(s for s in trainer.spans if s.steps > 0)
    state = trainer.init_state(span)
    prog = trainer.program(span)
    times = []
    batches = trainer.exp.train_data.batches(span.start, span.start + steps + 1)
    for s in range(steps + 1):
      b, _, _ = next(batches)
      t = time.perf_counter()
      with jax.set_mesh(trainer.exp.mesh):
        state, m = prog.step(state, b)
      block(m)
      if s:  # the first call compiles
        times.append(time.perf_counter() - t)
  return float(np.median(times))
