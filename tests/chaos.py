"""Fault injection: real training runs SIGKILLed at random moments and resumed must end bitwise where an
uninterrupted run ends.

Each scenario is a real `python -m ncjax.main` run on 8 simulated CPU devices with a checkpoint every step
(orbax, asynchronous saves). A trial starts the trainer process itself (no wrapper), kills it with SIGKILL
`kills` times — at a random moment, while an orbax temporary checkpoint directory exists (mid-save), or just
after a given step's metrics line appears — restarts it each time in the same workdir, and lets the last start
finish. It then compares with the scenario's uninterrupted run:
  - the final train state (parameters, optimiser state, method state: GSC's per-sample labels and
    predictions, NCU's prompt), every leaf bitwise;
  - metrics.jsonl: the same steps, once each, with equal values (wall-clock fields aside);
  - no temporary checkpoint directory left behind, and the latest checkpoint restorable.

Scenarios: NCU's two stages (prompt learning, then unlearning; kills land on both sides of the boundary) and
GSC (per-sample state, its end-of-epoch GMM hook, warm-up then GSC loss).

  python -m tests.chaos --trials 20            # `make chaos`: 20 trials, alternating scenarios
  python -m tests.chaos --trials 2 --kills 2   # what `make test` runs (tests/train/test_chaos.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_COMMON = ("--cpu_devices=8", "--config.log.progress=False", "--config.log.every_steps=1",
           "--config.ckpt.every_steps=1", "--config.ckpt.keep=2",
           "--config.evals.zeroshot.enabled=False", "--config.evals.retrieval.enabled=False",
           "--config.evals.noise_detection.enabled=False")

SCENARIOS = {
    # 5 steps per epoch on digits at batch 256: stage 1 (prompt) = steps 0-4, stage 2 (unlearning) = 5-9.
    "ncu": ("--config=configs/ncu.py:model=micro,batch=256,epochs=1,epochs_prompt=1",),
    # warm-up epoch, then GSC with the GMM labels refreshed at every epoch's end (steps 5 and 10).
    "gsc": ("--config=configs/gsc.py:model=micro,batch=256,epochs=3,warmup=1",),
}

# Metrics that legitimately differ between an interrupted and an uninterrupted run.
_WALL_CLOCK_KEYS = ("time", "examples_per_sec")
_TMP_MARKER = "orbax-checkpoint-tmp"


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # see tests/conftest.py: cached collective programs can hang
  return env


def command(scenario: str, workdir: str) -> list[str]:
  return [sys.executable, "-m", "ncjax.main", *SCENARIOS[scenario], f"--workdir={workdir}", *_COMMON]


def run_to_end(scenario: str, workdir: str, timeout: float = 900) -> float:
  """Run (or resume) to completion; returns its wall time."""
  t0 = time.perf_counter()
  out = subprocess.run(command(scenario, workdir), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=timeout)
  if out.returncode != 0:
    raise RuntimeError(f"{scenario} run in {workdir} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
  return time.perf_counter() - t0


def _metric_rows(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      if line.strip():
        rows.append(json.loads(line))
  return rows


def _last_step_logged(workdir: str) -> int:
  try:
    return max((r["step"] for r in _metric_rows(workdir)), default=0)
  except ValueError:  # a line being written right now
    return 0


def _saving(workdir: str, stale=frozenset()) -> bool:
  """A save in progress: a temporary checkpoint directory other than those a killed run left behind."""
  return any(_TMP_MARKER in name and name not in stale for name in _listdir(os.path.join(workdir, "checkpoints")))


def _listdir(path):
  try:
    return os.listdir(path)
  except OSError:
    return []


@dataclasses.dataclass
class Kill:
  how: str          # 'random' | 'mid_save' | 'after_step'
  after_s: float    # when the process was killed, seconds after its start
  step: int         # last step in metrics.jsonl when killed


def kill_once(scenario: str, workdir: str, how: str, rng: random.Random, budget_s: float,
              total_steps: int) -> Kill | None:
  """Start the trainer, SIGKILL it as `how` says; None if it finished first (the kill came too late)."""
  # stderr to a file, never an unread pipe: orbax logs every save, and a full pipe would block the trainer.
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, f"stderr_{int(time.time() * 1000)}.log")
  stderr = open(log_path, "w")
  proc = subprocess.Popen(command(scenario, workdir), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=stderr, text=True)
  t0 = time.perf_counter()
  stale = frozenset(n for n in _listdir(os.path.join(workdir, "checkpoints")) if _TMP_MARKER in n)
  start_step = _last_step_logged(workdir)
  target_step = rng.randint(start_step + 1, total_steps - 1) if start_step + 1 < total_steps else total_steps
  deadline = t0 + rng.uniform(0.2, 1.0) * budget_s
  while proc.poll() is None:
    now = time.perf_counter()
    if how == "random" and now >= deadline:
      break
    if how == "mid_save" and _saving(workdir, stale) and _last_step_logged(workdir) >= min(target_step, total_steps - 1):
      break
    if how == "after_step" and _last_step_logged(workdir) >= target_step:
      break
    if now - t0 > 3 * budget_s + 120:
      how = f"{how} (timed out)"  # the moment never came: kill anyway, and say so
      break
    time.sleep(0.002)
  if proc.poll() is not None:
    stderr.close()
    if proc.returncode != 0:
      with open(log_path) as f:
        raise RuntimeError(f"{scenario} run in {workdir} failed on its own (exit {proc.returncode}):\n"
                           f"{f.read()[-4000:]}")
    return None
  os.kill(proc.pid, signal.SIGKILL)  # the trainer itself: no handler, no cleanup, no final save
  proc.wait()
  stderr.close()
  return Kill(how=how, after_s=round(time.perf_counter() - t0, 2), step=_last_step_logged(workdir))


def _comparable(rows: list[dict]) -> dict:
  out = {}
  for r in rows:
    key = (r["kind"], r["step"])
    if key in out:
      raise AssertionError(f"metrics.jsonl has step {r['step']} ({r['kind']}) more than once")
    out[key] = {k: v for k, v in r.items() if k not in _WALL_CLOCK_KEYS}
  return out


def compare(reference: str, resumed: str) -> list[str]:
  """Differences between two finished workdirs (empty: bitwise the same)."""
  import numpy as np
  import jax
  from ncjax import checkpoint as ckpt_lib
  problems = []
  ref_state, _, ref_step = ckpt_lib.restore_state_on_host(reference)
  got_state, _, got_step = ckpt_lib.restore_state_on_host(resumed)
  if ref_step != got_step:
    problems.append(f"latest checkpoint step {got_step} != {ref_step}")
  ref_leaves = jax.tree_util.tree_flatten_with_path(ref_state)[0]
  got_leaves = dict((jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_flatten_with_path(got_state)[0])
  for path, ref in ref_leaves:
    name = jax.tree_util.keystr(path)
    got = got_leaves.get(name)
    if got is None:
      problems.append(f"state leaf {name} missing")
    elif got.dtype != ref.dtype or got.shape != ref.shape or not np.array_equal(got, ref, equal_nan=True):
      diff = np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))) if got.shape == ref.shape else "shape"
      problems.append(f"state leaf {name} differs (max |diff| {diff})")
  ref_rows, got_rows = _comparable(_metric_rows(reference)), _comparable(_metric_rows(resumed))
  if sorted(ref_rows) != sorted(got_rows):
    problems.append(f"metrics steps differ: missing {sorted(set(ref_rows) - set(got_rows))}, "
                    f"extra {sorted(set(got_rows) - set(ref_rows))}")
  for key in sorted(set(ref_rows) & set(got_rows)):
    if ref_rows[key] != got_rows[key]:
      keys = sorted(k for k in ref_rows[key] if ref_rows[key].get(k) != got_rows[key].get(k))
      problems.append(f"metrics at {key} differ in {keys}")
  leftovers = [p for p in glob.glob(os.path.join(resumed, "checkpoints", "*")) if _TMP_MARKER in p]
  if leftovers:
    problems.append(f"temporary checkpoint directories left behind: {leftovers}")
  return problems


@dataclasses.dataclass
class Trial:
  scenario: str
  kills: list
  problems: list
  seconds: float

  @property
  def ok(self) -> bool:
    return not self.problems


def run_trials(trials: int, kills: int, seed: int, root: str, scenarios=tuple(SCENARIOS),
               log=print) -> list[Trial]:
  rng = random.Random(seed)
  references, budgets, totals = {}, {}, {}
  results = []
  for i in range(trials):
    scenario = scenarios[i % len(scenarios)]
    if scenario not in references:
      references[scenario] = os.path.join(root, f"{scenario}_reference")
      budgets[scenario] = run_to_end(scenario, references[scenario])
      totals[scenario] = max(r["step"] for r in _metric_rows(references[scenario]))
      log(f"[chaos] {scenario}: uninterrupted run {budgets[scenario]:.1f}s, {totals[scenario]} steps")
    workdir = os.path.join(root, f"{scenario}_trial{i}")
    t0 = time.perf_counter()
    # Every trial kills mid-save at least once; the others are random moments or just after a random step.
    kinds = ["mid_save"] + [rng.choice(["random", "after_step", "mid_save"]) for _ in range(kills - 1)]
    done = []
    for how in kinds:
      k = kill_once(scenario, workdir, how, rng, budgets[scenario], totals[scenario])
      if k is not None:
        done.append(k)
    run_to_end(scenario, workdir)
    problems = compare(references[scenario], workdir)
    trial = Trial(scenario, done, problems, round(time.perf_counter() - t0, 1))
    results.append(trial)
    log(f"[chaos] trial {i} {scenario}: kills " +
        ", ".join(f"{k.how}@{k.after_s}s(step {k.step})" for k in done) +
        (" -> bitwise equal" if trial.ok else " -> DIFFERS:\n  " + "\n  ".join(problems)))
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--kills", type=int, default=3, help="SIGKILLs per trial before the run may finish")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--scenarios", default=",".join(SCENARIOS))
  parser.add_argument("--workdir", default="", help="keep the runs here (default: a temporary directory)")
  parser.add_argument("--json", default="", help="write the trial records here")
  args = parser.parse_args(argv)
  root = args.workdir or tempfile.mkdtemp(prefix="ncjax_chaos_")
  try:
    results = run_trials(args.trials, args.kills, args.seed, root, tuple(args.scenarios.split(",")))
  finally:
    if not args.workdir:
      shutil.rmtree(root, ignore_errors=True)
  n_kills = sum(len(t.kills) for t in results)
  n_ok = sum(t.ok for t in results)
  print(f"[chaos] {n_ok}/{len(results)} trials bitwise equal to the uninterrupted run "
        f"({n_kills} SIGKILLs, {sum(k.how == 'mid_save' for t in results for k in t.kills)} mid-save)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump([dataclasses.asdict(t) for t in results], f, indent=1)
  return 0 if n_ok == len(results) else 1


if __name__ == "__main__":
  sys.exit(main())
