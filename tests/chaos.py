"""Fault injection: real training runs killed at random moments and resumed must end bitwise where an
uninterrupted run ends.

Each scenario is a real `python -m ncjax.main` run — one process on 8 simulated CPU devices, or 2 processes x 4
devices of one JAX job (the stand-in for a pod, tests/multiprocess.py) — with a checkpoint every step (orbax,
asynchronous saves). A trial starts the trainer processes themselves (no wrapper) and interrupts them `kills` times,
restarting in the same workdir each time, then lets the last start finish. The faults:
  random / mid_save / after_step   SIGKILL of every process at a random moment, while an orbax temporary checkpoint
                                   directory exists (mid-save), or just after a given step's metrics line appears;
  sigterm                          SIGTERM to one process (a preemption): every process must stop at the same
                                   step, save it and exit with status 75 (ncjax.train.PREEMPTED_EXIT_STATUS);
  sigterm_late                     (several processes) the same as the last steps run, when one process may be past
                                   its last check: the run must still end (75 or 0 with its final checkpoint),
                                   never hang (jax's preemption barrier deadlocked here);
  sigkill_one                      (several processes) SIGKILL of one process: the others must stop on their own
                                   within the heartbeat timeout (never hang), with jax's message that a task
                                   died (LOST_MESSAGES).
It then compares with the scenario's uninterrupted run (same process count):
  - the final train state (parameters, optimiser state, method state: GSC's per-sample labels and
    predictions, NCU's prompt), every leaf bitwise;
  - metrics.jsonl: the same steps, once each, with equal values (wall-clock fields aside);
  - no temporary checkpoint directory left behind, and the latest checkpoint restorable.

Scenarios: NCU's two stages (prompt learning, then unlearning; kills land on both sides of the boundary), GSC
(per-sample state, its end-of-epoch GMM hook, warm-up then GSC loss), and GSC on 2 processes.

  python -m tests.chaos --trials 20            # `make chaos`: 20 trials, alternating scenarios
  python -m tests.chaos --trials 1 --kills 2 --scenarios gsc_short   # ~ `make test`'s (test_chaos.py)
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import multiprocess  # noqa: E402  (tests/multiprocess.py)

PREEMPTED = 75   # ncjax.train.PREEMPTED_EXIT_STATUS
# What jax's coordination service prints in every survivor before it ends the process (SIGABRT), after the
# heartbeat timeout (a process that stopped) or at once (the coordinator, process 0, gone).
LOST_MESSAGES = ("stopped sending heartbeats", "JAX distributed service detected fatal errors")
HEARTBEAT_TIMEOUT = 15

_COMMON = ("--config.log.progress=False", "--config.log.every_steps=1",
           "--config.evals.zeroshot.enabled=False", "--config.evals.retrieval.enabled=False",
           "--config.evals.noise_detection.enabled=False")
# The runs that are interrupted save every step: a fault lands on either side of a save, or inside one.
_SAVE_EVERY_STEP = ("--config.ckpt.every_steps=1", "--config.ckpt.keep=2")

@dataclasses.dataclass(frozen=True)
class Scenario:
  args: tuple[str, ...]
  processes: int = 1

  @property
  def devices(self) -> int:
    return 8 // self.processes


_GSC = "--config=configs/gsc.py:model=micro,batch=256,epochs=3,warmup=1"
SCENARIOS = {
    # 5 steps per epoch on digits at batch 256: stage 1 (prompt) = steps 0-4, stage 2 (unlearning) = 5-9.
    "ncu": Scenario(("--config=configs/ncu.py:model=micro,batch=256,epochs=1,epochs_prompt=1,init=random",)),
    # warm-up epoch, then GSC with the GMM labels refreshed at every epoch's end (steps 5 and 10).
    "gsc": Scenario((_GSC,)),
    # the same on 2 processes x 4 devices: per-sample state split over both processes' devices
    "gsc_2proc": Scenario((_GSC,), processes=2),
    # `make test`'s trials (tests/train/test_chaos.py), shorter: NCU to step 7 (the prompt stage's 5 steps, then 2
    # unlearning steps: the boundary still inside the run), GSC over two epochs (its GSC epoch and two label updates)
    "ncu_short": Scenario(("--config=configs/ncu.py:model=micro,batch=256,epochs=1,epochs_prompt=1,init=random",
                           "--config.total_steps=7")),
    "gsc_short": Scenario(("--config=configs/gsc.py:model=micro,batch=256,epochs=2,warmup=1",)),
}
# What `make chaos` alternates over (the short scenarios are the test's).
CHAOS_SCENARIOS = ("ncu", "gsc", "gsc_2proc")
# The faults a trial of each kind of scenario draws from (every trial starts with the first).
FAULTS = {1: ("mid_save", "random", "after_step", "sigterm"),
          2: ("sigkill_one", "sigterm", "sigterm_late", "mid_save", "random", "after_step")}

# Metrics that legitimately differ between an interrupted and an uninterrupted run.
_WALL_CLOCK_KEYS = ("time", "examples_per_sec")
_TMP_MARKER = "orbax-checkpoint-tmp"


def _start(scenario: str, workdir: str, reference: bool = False) -> list[subprocess.Popen]:
  """The scenario's processes (stderr and stdout to files in the workdir: an unread pipe would block a trainer).
  `reference`: the uninterrupted run, which saves only its last step (the comparison reads nothing else, and an
  orbax save of even the micro state costs ~0.5 s)."""
  sc = SCENARIOS[scenario]
  os.makedirs(workdir, exist_ok=True)
  log_dir = os.path.join(workdir, f"logs_{int(time.time() * 1000)}")
  saves = ("--config.ckpt.every_steps=1000000", "--config.ckpt.keep=1") if reference else _SAVE_EVERY_STEP
  return multiprocess.start([*sc.args, f"--workdir={workdir}", *_COMMON, *saves], processes=sc.processes,
                            devices=sc.devices, log_dir=log_dir, heartbeat_timeout=HEARTBEAT_TIMEOUT)


def run_to_end(scenario: str, workdir: str, timeout: float = 900, reference: bool = False) -> float:
  """Run (or resume) to completion; returns its wall time."""
  t0 = time.perf_counter()
  procs = _start(scenario, workdir, reference)
  codes = multiprocess.wait(procs, timeout)
  if any(codes):
    raise RuntimeError(f"{scenario} run in {workdir} failed (exits {codes}):\n{_latest_logs(workdir)}")
  return time.perf_counter() - t0


def _latest_logs(workdir: str, tail: int | None = 3000) -> str:
  dirs = sorted(d for d in _listdir(workdir) if d.startswith("logs_"))
  return multiprocess.logs(os.path.join(workdir, dirs[-1]), tail) if dirs else ""


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
  how: str          # see FAULTS
  after_s: float    # when the fault came, seconds after the start
  step: int         # last step in metrics.jsonl then
  exits: list = dataclasses.field(default_factory=list)   # every process's exit status
  stop_s: float = 0.0   # sigterm / sigkill_one: seconds from the fault until the last process exited


def kill_once(scenario: str, workdir: str, how: str, rng: random.Random, budget_s: float,
              total_steps: int) -> Kill | None:
  """Start the trainer processes and interrupt them as `how` says; None if they finished first (too late)."""
  procs = _start(scenario, workdir)
  t0 = time.perf_counter()
  stale = frozenset(n for n in _listdir(os.path.join(workdir, "checkpoints")) if _TMP_MARKER in n)
  start_step = _last_step_logged(workdir)
  target_step = rng.randint(start_step + 1, total_steps - 1) if start_step + 1 < total_steps else total_steps
  if how == "sigterm_late":   # the notice as the last steps run: one process may already be past its last check
    target_step = max(start_step + 1, total_steps - 1)
  deadline = t0 + rng.uniform(0.2, 1.0) * budget_s
  moment = "random" if how in ("random",) else "mid_save" if how == "mid_save" else "after_step"
  while all(p.poll() is None for p in procs):
    now = time.perf_counter()
    if moment == "random" and now >= deadline:
      break
    if moment == "mid_save" and _saving(workdir, stale) and _last_step_logged(workdir) >= min(target_step,
                                                                                              total_steps - 1):
      break
    if moment == "after_step" and _last_step_logged(workdir) >= target_step:
      break
    if now - t0 > 3 * budget_s + 120:
      how = f"{how} (timed out)"  # the moment never came: interrupt anyway, and say so
      break
    time.sleep(0.002)
  if any(p.poll() is not None for p in procs):
    codes = multiprocess.wait(procs, 300)
    if any(codes):
      raise RuntimeError(f"{scenario} run in {workdir} failed on its own (exits {codes}):\n{_latest_logs(workdir)}")
    return None
  kill = Kill(how=how, after_s=round(time.perf_counter() - t0, 2), step=_last_step_logged(workdir))
  t_fault = time.perf_counter()
  victim = procs[rng.randrange(len(procs))]
  if how.startswith("sigterm"):
    os.kill(victim.pid, signal.SIGTERM)     # a preemption notice to one process
    limit = 300
  elif how.startswith("sigkill_one"):
    os.kill(victim.pid, signal.SIGKILL)     # one host lost
    limit = HEARTBEAT_TIMEOUT + 60
  else:
    for p in procs:                         # the processes themselves: no handler, no cleanup, no final save
      os.kill(p.pid, signal.SIGKILL)
    limit = 60
  try:
    kill.exits = multiprocess.wait(procs, limit)
  except subprocess.TimeoutExpired:
    raise RuntimeError(f"{scenario}: after {how} the processes did not stop within {limit}s (a hang):\n"
                       f"{_latest_logs(workdir)}") from None
  kill.stop_s = round(time.perf_counter() - t_fault, 2)
  if how.startswith("sigterm") and set(kill.exits) - {PREEMPTED, 0}:
    raise RuntimeError(f"{scenario}: a preempted run exited with {kill.exits}, not {PREEMPTED}:\n"
                       f"{_latest_logs(workdir)}")
  if how.startswith("sigterm") and PREEMPTED in kill.exits:
    logs = _latest_logs(workdir, tail=None)
    saved = _saved_steps(workdir)
    if not saved or max(saved) <= kill.step - 1:
      raise RuntimeError(f"{scenario}: preempted after step {kill.step} but the latest checkpoint is {saved}")
    if "preempted: saved the checkpoint of step" not in logs:
      raise RuntimeError(f"{scenario}: a preempted run did not say so:\n{logs}")
  if how.startswith("sigkill_one"):
    survivors = [c for p, c in zip(procs, kill.exits) if p is not victim]
    if 0 in survivors:
      raise RuntimeError(f"{scenario}: a process survived the loss of another and exited 0")
    if not any(m in _latest_logs(workdir, tail=None) for m in LOST_MESSAGES):
      raise RuntimeError(f"{scenario}: the survivors did not say a process was lost:\n{_latest_logs(workdir)}")
  return kill


def _saved_steps(workdir: str) -> list[int]:
  return sorted(int(n) for n in _listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


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


def run_trials(trials: int, kills: int, seed: int, root: str, scenarios=CHAOS_SCENARIOS,
               log=print, faults: dict | None = None) -> list[Trial]:
  """`faults`: {scenario: [fault, ...]} to run instead of drawing them (tests)."""
  rng = random.Random(seed)
  references, budgets, totals = {}, {}, {}
  results = []
  for i in range(trials):
    scenario = scenarios[i % len(scenarios)]
    if scenario not in references:
      references[scenario] = os.path.join(root, f"{scenario}_reference")
      budgets[scenario] = run_to_end(scenario, references[scenario], reference=True)
      totals[scenario] = max(r["step"] for r in _metric_rows(references[scenario]))
      log(f"[chaos] {scenario}: uninterrupted run {budgets[scenario]:.1f}s, {totals[scenario]} steps")
    workdir = os.path.join(root, f"{scenario}_trial{i}")
    t0 = time.perf_counter()
    # Every trial starts with its kind's first fault (single process: SIGKILL mid-save; several: one process
    # lost); the others are drawn from its kind's faults.
    drawn = FAULTS[SCENARIOS[scenario].processes]
    kinds = (list(faults[scenario]) if faults and scenario in faults else
             [drawn[0]] + [rng.choice(drawn) for _ in range(kills - 1)])
    done = []
    for how in kinds:
      k = kill_once(scenario, workdir, how, rng, budgets[scenario], totals[scenario])
      if k is not None:
        done.append(k)
    run_to_end(scenario, workdir)
    problems = compare(references[scenario], workdir)
    trial = Trial(scenario, done, problems, round(time.perf_counter() - t0, 1))
    results.append(trial)
    log(f"[chaos] trial {i} {scenario}: faults " +
        ", ".join(f"{k.how}@{k.after_s}s(step {k.step}; exits {k.exits}, stopped in {k.stop_s}s)" for k in done) +
        (" -> bitwise equal" if trial.ok else " -> DIFFERS:\n  " + "\n  ".join(problems)))
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--kills", type=int, default=3, help="faults per trial before the run may finish")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--scenarios", default=",".join(CHAOS_SCENARIOS))
  parser.add_argument("--workdir", default="", help="keep the runs here (default: a temporary directory)")
  parser.add_argument("--json", default="", help="write the trial records here")
  args = parser.parse_args(argv)
  root = args.workdir or tempfile.mkdtemp(prefix="ncjax_chaos_")
  try:
    results = run_trials(args.trials, args.kills, args.seed, root, tuple(args.scenarios.split(",")))
  finally:
    if not args.workdir:
      shutil.rmtree(root, ignore_errors=True)
  n_ok = sum(t.ok for t in results)
  counts = {}
  for t in results:
    for k in t.kills:
      key = (t.scenario, k.how.split(" ")[0])
      counts[key] = counts.get(key, 0) + 1
  print(f"[chaos] {n_ok}/{len(results)} trials bitwise equal to the uninterrupted run; faults per scenario: "
        + ", ".join(f"{s} {h} x{n}" for (s, h), n in sorted(counts.items())))
  if args.json:
    with open(args.json, "w") as f:
      json.dump([dataclasses.asdict(t) for t in results], f, indent=1)
  return 0 if n_ok == len(results) else 1


if __name__ == "__main__":
  sys.exit(main())
