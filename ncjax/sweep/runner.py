"""Running a sweep's runs: each under WORKDIR/runs/<name>/ with its resolved config beside it, trained (resuming a
killed run from its checkpoint) and evaluated, then marked finished by its record, written atomically and last. A
finished run is never trained again.

On several processes (a pod) every process takes the same run at the same time, so each run trains on all the
chips; which runs are finished is process 0's view, broadcast, so that no process skips a run the others train.
Files are written by process 0.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import numpy as np

from ncjax import config_lib, fileio
from ncjax.sweep.grid import Run

RECORD = "result.json"          # a finished run's record: its swept values, seed, final metrics, steps, seconds
CONFIG_FILE = "config.json"     # the run's resolved config, written before it trains
DEFINITION = "sweep.json"       # the sweep's definition (ncjax.sweep.grid.definition), written once per workdir


def run_dir(workdir: str, name: str) -> str:
  return fileio.join(workdir, "runs", name)


def agree(value: bool) -> bool:
  """Process 0's `value` on every process (a single process: `value`)."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    value = bool(multihost_utils.broadcast_one_to_all(np.asarray(value)))
  return bool(value)


def is_finished(workdir: str, name: str, record: str = RECORD) -> bool:
  """Whether the run's record exists (process 0's view, on every process)."""
  import jax
  return agree(fileio.isfile(fileio.join(run_dir(workdir, name), record)) if jax.process_index() == 0 else False)


def read_record(workdir: str, name: str, record: str = RECORD) -> dict | None:
  path = fileio.join(run_dir(workdir, name), record)
  return json.loads(fileio.read_text(path)) if fileio.isfile(path) else None


def flat_metrics(results: dict) -> dict:
  """{'evaluator/metric': number} of a run's final evaluation."""
  return {f"{ev}/{k}": v for ev, metrics in results.items() for k, v in metrics.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)}


def default_record(run: Run, result, results: dict, seconds: float) -> dict:
  import jax
  return dict(name=run.name, index=run.index, point={k: v for k, v in run.point}, seed=run.seed,
              steps=int(jax.device_get(result.state["step"])), seconds=round(seconds, 1),
              noise_sha256=result.experiment.train_data.noise_sha256, metrics=flat_metrics(results))


def train_run(run: Run, config, workdir: str, record: str = RECORD,
              make_record: Callable = default_record) -> dict:
  """Train and evaluate one run (a killed one resumes from its latest checkpoint) and write its record last."""
  import jax
  from ncjax import evaluation, train
  from ncjax.evals import finite_or_none
  out = run_dir(workdir, run.name)
  if jax.process_index() == 0:
    fileio.write_text(fileio.join(out, CONFIG_FILE), json.dumps(config_lib.to_json_dict(config), indent=1,
                                                               default=str))
  t0 = time.perf_counter()
  result = train.train(config, out)
  results = evaluation.final(config, result, out)
  rec = make_record(run, result, results, time.perf_counter() - t0)
  if jax.process_index() == 0:
    fileio.write_text(fileio.join(out, record), json.dumps(finite_or_none(rec), indent=1, allow_nan=False))
  return rec


def execute(runs: list[Run], workdir: str, configure: Callable[[Run], object], *, record: str = RECORD,
            make_record: Callable = default_record, tag: str = "sweep", log=print) -> list[dict]:
  """Every run in turn (finished ones read back): their records, in order. One progress line per run: its place,
  its time (or 'done before') and the ETA of the runs left."""
  fileio.makedirs(workdir)
  finished_before = {r.name: is_finished(workdir, r.name, record) for r in runs}
  records, t_start, trained = [], time.perf_counter(), 0
  for k, run in enumerate(runs):
    finished = finished_before[run.name]
    t0 = time.perf_counter()
    if finished:
      records.append(json.loads(fileio.read_text(fileio.join(run_dir(workdir, run.name), record))))
    else:
      records.append(train_run(run, configure(run), workdir, record, make_record))
      trained += 1
    per_run = (time.perf_counter() - t_start) / max(trained, 1)
    remaining = sum(1 for r in runs[k + 1:] if not finished_before[r.name])
    eta = per_run * remaining
    took = "done before" if finished else f"{time.perf_counter() - t0:.0f}s"
    # no run trained yet in this invocation: nothing to estimate from
    eta_text = f"{int(eta // 60)}:{int(eta % 60):02d}" if trained or not remaining else "?"
    log(f"[{tag}] {k + 1}/{len(runs)} {run.name}: {took} | ETA {eta_text}")
  return records
