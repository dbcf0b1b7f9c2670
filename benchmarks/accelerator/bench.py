"""The accelerator check's measurements: one table (and a JSON beside it) of what ncjax does on a GPU.

  python -m benchmarks.accelerator.bench --plan [--total_s S] [--smoke] [--calibrate FILE]
  python -m benchmarks.accelerator.bench --measure_s S --out DIR --logs DIR [--smoke] [--sections a,b,c,d,e]
  python -m benchmarks.accelerator.bench --finalize --out DIR --logs DIR [--smoke]

Sections, in priority order:
  a  CLIP ViT-B/16 train step (the trainer's own), bf16, per-GPU batch 256 and 512, each attention kind: pairs/s,
     step time, model FLOPs utilisation against the card's datasheet bf16 peak and against its measured matmul rate
  b  open_clip 3.3's ViT-B-16 on torch on the same card and batches (AMP bf16, SDPA, TF32, cudnn.benchmark, AdamW,
     ClipLoss), eager, with fused AdamW and under torch.compile, and ncjax's best pairs/s over open_clip's best
  c  NCU's stage-2 loss + gradient at N = 2,048 / 8,192 / 32,768 (D = 512): ncjax against the public code's loop
     restated in PyTorch (`ncu_public`), the speed-up, and the two losses' values compared at N = 2,048
  d  device memory: section a's peaks, and the largest per-GPU batch that fits with and without remat
  e  every method's step (benchmarks/steps.py's list) against CLIP's at per-GPU batch 256

How they run is the plan's (plan.py): every worker prepares at once in its own process (JAX takes most of the GPU's
memory when it starts, so torch never shares a process with it, and a worker that crashes the device runtime takes
no other with it); then the workers take turns on the GPU, the orchestrator telling each when (`go`) or that its
turn no longer fits (`skip`): the highest-priority worker that is ready goes next, so a slow preparation delays
no later worker's turn, and only lack of time drops a worker, the lowest priorities first. A measurement that does not happen for want of time reads
"not run (time)", never "failed". Every row goes to OUT/rows.jsonl as it is measured and the table (OUT/
accelerator.md) is rewritten after every turn, so a call cut short keeps what it measured; the workers' logs go to
the logs folder, archived into OUT/logs.tar.gz: OUT holds four files (the device tool returns at most 8).

--smoke runs the same plan at the `micro` size on one CPU device, the JAX workers in one process (torch parts
skipped where torch is missing): the check of the check, in tests/test_accelerator_check.py.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from importlib import metadata

from benchmarks.accelerator import plan as plan_lib
from benchmarks.accelerator import pytest_counts, record

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SECTION_TITLES = {
    "a": "CLIP train step per attention kind",
    "b": "open_clip on torch, same card",
    "c": "NCU stage-2 loss + gradient vs the public loop",
    "d": "device memory, largest batch",
    "e": "every method vs CLIP",
}
SPEEDUP_TARGET = 10.0   # ncjax over the public loop at N = 32,768 on an H100
VALUE_TOLERANCE = 1e-4  # relative difference of the two NCU losses at the check's N
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "numpy",
             "torch", "open_clip_torch", "ott-jax")
OUT_FILES = ("accelerator.md", "accelerator.json", record.ROWS_FILE, "logs.tar.gz")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="tiny sizes on one CPU device")
  p.add_argument("--out", default="", help="output folder (default: $OUT, else bench_results/accelerator)")
  p.add_argument("--logs", default="", help="the workers' logs (archived into OUT/logs.tar.gz)")
  p.add_argument("--plan", action="store_true", help="print the plan and run nothing")
  p.add_argument("--total_s", type=float, default=plan_lib.DEFAULT_TOTAL_S, help="the whole check's time (--plan)")
  p.add_argument("--calibrate", default="", help="plan with the phase times an earlier run recorded (its JSON)")
  p.add_argument("--measure_s", type=float, default=None, help="the measurements' time budget")
  p.add_argument("--finalize", action="store_true", help="write the table from the rows and the tests' counts")
  p.add_argument("--sections", default="a,b,c,d,e", help="comma-separated sections to run, of a,b,c,d,e")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  out = os.path.abspath(args.out or os.environ.get("OUT") or os.path.join("bench_results", "accelerator"))
  logs = os.path.abspath(args.logs or os.path.join(out + ".logs"))
  sections = [s.strip() for s in args.sections.split(",") if s.strip()]
  unknown = [s for s in sections if s not in SECTION_TITLES]
  if unknown:
    p.error(f"--sections: unknown {unknown}; sections are {list(SECTION_TITLES)}")
  if args.plan:
    seconds = plan_lib.calibrated_seconds(args.calibrate) if args.calibrate else None
    print(plan_lib.render(plan_lib.schedule(args.total_s, smoke=args.smoke, sections=sections, seconds=seconds)))
    return 0
  if args.worker:
    return _worker(args.worker.split(","), out, logs, args.deadline, args.smoke, sections)
  if args.finalize:
    return finalize(out, logs, args.smoke, sections)
  budget = args.measure_s if args.measure_s is not None else plan_lib.DEFAULT_TOTAL_S
  return measure(out, logs, sections, args.smoke, budget)


# --- the orchestrating process (imports neither JAX nor torch) ---------------------------------------------------

def _groups(chosen: list[plan_lib.Worker], smoke: bool) -> list[list[str]]:
  """Processes and the workers each runs: on a GPU one per worker; in the smoke run one per framework (the CPU has
  memory to share, and each process start costs seconds on two cores)."""
  if not smoke:
    return [[w.name] for w in chosen]
  return [g for g in ([w.name for w in chosen if w.framework == "jax"],
                      [w.name for w in chosen if w.framework == "torch"]) if g]


class _Process:
  """A worker process: its stdout pumped into the log and the event queue (its `@ready` / `@done` lines), its
  stdin the orchestrator's `go` / `skip`."""

  def __init__(self, names, out, logs, deadline, smoke, sections, events: queue.Queue):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if smoke:
      from ncjax import compat   # a leaf: no JAX import
      env["JAX_PLATFORMS"] = "cpu"
      env["CUDA_VISIBLE_DEVICES"] = ""
      env["XLA_FLAGS"] = compat.with_xla_flags(env.get("XLA_FLAGS", ""), compat.fast_compile_xla_flags())
      # torch's CPU ops on a small core quota: with OpenMP's second thread a 64 x 65 exp took 8 ms instead of 6 us
      # (the public NCU loop at N = 64 took 6.5 s instead of 0.05 s).
      env["OMP_NUM_THREADS"] = "1"
    else:
      # Several processes share the card: none may take 75% of it at start (JAX's default). The limit stays 92%
      # of the card, against which section d measures (the CUDA context and libraries keep their room).
      env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
      env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    self.names = list(names)
    cmd = [sys.executable, "-m", "benchmarks.accelerator.bench", "--worker", ",".join(names), "--out", out,
           "--logs", logs, "--deadline", repr(deadline), "--sections", ",".join(sections)] + \
        (["--smoke"] if smoke else [])
    self.log_path = os.path.join(logs, "+".join(names) + ".log")
    self.start = time.time()
    self.log = open(self.log_path, "w")
    self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
    self.tail: list[str] = []
    self.reader = threading.Thread(target=self._pump, args=(events,), daemon=True)
    self.reader.start()

  def _pump(self, events):
    for line in self.proc.stdout:
      self.log.write(line)
      self.log.flush()
      self.tail = (self.tail + [line.rstrip()])[-25:]
      if line.startswith("@"):
        kind, name = line[1:].split()[:2]
        events.put((kind, name, time.time()))
      elif line.startswith("["):   # the workers' row lines; the rest (XLA's and torch's chatter) stays in the log
        print(line, end="", flush=True)
    events.put(("exit", "+".join(self.names), time.time()))

  def tell(self, word: str, name: str) -> None:
    try:
      self.proc.stdin.write(f"{word} {name}\n")
      self.proc.stdin.flush()
    except (BrokenPipeError, OSError):
      pass

  def kill(self) -> None:
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, signal.SIGKILL)   # its own children too (torch.compile's compile workers)
    self.proc.wait()

  def close(self) -> None:
    self.reader.join(timeout=10)
    self.log.close()


def measure(out: str, logs: str, sections: list[str], smoke: bool, budget_s: float) -> int:
  """Runs the plan's workers: every process prepares at once, then the turns, one at a time: the highest-priority
  worker that is ready and whose turn leaves the waiting higher priorities their time; a turn that can no longer
  fit before the deadline is cut. The table is rewritten after every turn."""
  os.makedirs(out, exist_ok=True)
  os.makedirs(logs, exist_ok=True)
  for name in (record.ROWS_FILE, "accelerator.md", "accelerator.json"):
    if os.path.exists(os.path.join(out, name)):
      os.remove(os.path.join(out, name))
  seconds = plan_lib.SMOKE_SECONDS if smoke else plan_lib.GPU_SECONDS
  chosen = [w for w in plan_lib.workers(smoke=smoke) if w.measures(sections)]
  start = time.time()
  deadline = start + budget_s
  events: queue.Queue = queue.Queue()
  processes = [_Process(g, out, logs, deadline, smoke, sections, events) for g in _groups(chosen, smoke)]
  process_of = {n: p for p in processes for n in p.names}
  ready, done, exited = {}, {}, set()
  outcome = {w.name: dict(planned_prepare_s=plan_lib.phase_seconds(w.prepare + w.after_wait, seconds),
                          planned_turn_s=plan_lib.phase_seconds(w.turn, seconds)) for w in chosen}

  def drain(timeout: float) -> None:
    try:
      kind, name, at = events.get(timeout=max(0.01, timeout))
    except queue.Empty:
      return
    if kind == "ready":
      ready[name] = at
      outcome[name]["prepare_s"] = at - start
    elif kind == "done":
      done[name] = at
    elif kind == "exit":
      exited.add(name)

  def gone(name: str) -> bool:
    return "+".join(process_of[name].names) in exited

  pending = list(chosen)
  stopped = set()   # processes stopped at the time limit
  decided: dict[str, str] = {}
  told = {id(p): 0 for p in processes}

  def decide(name: str, word: str) -> None:
    """`go` or `skip` for a worker; each process hears its workers' decisions in its own order."""
    decided[name] = word
    proc = process_of[name]
    while told[id(proc)] < len(proc.names) and proc.names[told[id(proc)]] in decided:
      nxt = proc.names[told[id(proc)]]
      proc.tell(decided[nxt], nxt)
      told[id(proc)] += 1

  def eligible(w) -> bool:
    """Ready, what its turn reads already measured, and every worker before it in its process done with."""
    names = {p.name for p in pending}
    before = process_of[w.name].names[:process_of[w.name].names.index(w.name)]
    return w.name in ready and not (set(w.turn_after) | set(before)) & names

  def leaves_room(w) -> bool:
    """Whether w's turn, taken now, still leaves time for the turns of the higher-priority workers waiting."""
    higher = [p for p in pending[:pending.index(w)]]
    return time.time() + sum(outcome[p.name]["planned_turn_s"] for p in higher + [w]) <= deadline

  while pending:
    for w in list(pending):   # a turn that can no longer fit, or whose process ended, is cut
      turn_s = outcome[w.name]["planned_turn_s"]
      if id(process_of[w.name]) in stopped:   # its process was stopped at the time limit in another's turn
        outcome[w.name]["status"] = record.NOT_RUN_TIME
        outcome[w.name]["note"] = "its process was stopped at the time limit"
      elif gone(w.name):
        outcome[w.name]["status"] = "failed: its process ended" + ("" if w.name in ready else " while preparing")
        outcome[w.name]["tail"] = process_of[w.name].tail
      elif time.time() > deadline - turn_s:
        outcome[w.name]["status"] = record.NOT_RUN_TIME
      else:
        continue
      pending.remove(w)
      decide(w.name, "skip")
      proc = process_of[w.name]
      if all(decided.get(n) == "skip" for n in proc.names) and proc.proc.poll() is None:
        # no turn is left for it: what it still prepares would take the cores (and the card) from the turns
        proc.kill()
        stopped.add(id(proc))
        for n in proc.names:
          outcome[n].setdefault("note", "its turn no longer fitted before the deadline; its process was stopped")
    # the GPU goes to the highest-priority worker that can take it: the plan's order where each is ready in time,
    # and no waiting on a slow preparation while a later worker's is done
    w = next((w for w in pending if eligible(w) and leaves_room(w)), None)
    if w is None:
      if pending:
        drain(1.0)
      continue
    pending.remove(w)
    proc = process_of[w.name]
    began = time.time()
    # other processes still compiling share the card with this turn (XLA:GPU autotunes on it): recorded, so a
    # timing taken beside compiles reads as such
    outcome[w.name]["others_preparing"] = sorted(n for n in process_of if n not in ready and not gone(n)
                                                 and process_of[n] is not proc)
    decide(w.name, "go")
    while w.name not in done and not gone(w.name) and time.time() < deadline + plan_lib.GRACE_S[smoke]:
      drain(deadline + plan_lib.GRACE_S[smoke] - time.time())
    outcome[w.name]["turn_s"] = time.time() - began
    if w.name in done:
      outcome[w.name]["status"] = "ok"
      if told[id(proc)] == len(proc.names):
        # its last turn: the next begins once the process has exited, since an allocator hands its pool back to
        # the card only then (on an H100 the 512/GPU step, 58 GiB, ran out of memory right after the 256/GPU
        # turn, whose process had held ~31 GiB; other processes' autotuning compiles were the other suspect)
        try:
          proc.proc.wait(timeout=max(0.1, min(plan_lib.GRACE_S[smoke], deadline - time.time())))
        except subprocess.TimeoutExpired:
          proc.kill()
    elif gone(w.name):
      outcome[w.name]["status"] = f"failed: exit status {proc.proc.poll()}"
      outcome[w.name]["tail"] = proc.tail
    else:   # past the deadline: stopped, and what it had not measured is a budget cut, not a failure
      proc.kill()
      stopped.add(id(proc))
      outcome[w.name]["status"] = record.NOT_RUN_TIME
      outcome[w.name]["note"] = f"stopped at the time limit after {time.time() - began:.0f} s of its turn"
    write_table(out, logs, smoke, sections, budget_s, start, outcome)
  for proc in processes:   # every worker had its turn or was skipped: the processes end on their own
    try:
      proc.proc.wait(timeout=max(1.0, deadline + plan_lib.GRACE_S[smoke] - time.time()))
    except subprocess.TimeoutExpired:
      proc.kill()
    proc.close()
  write_table(out, logs, smoke, sections, budget_s, start, outcome)
  return 0


def _outcome_rows(outcome: dict, rows: list[dict]) -> list[dict]:
  """A row for each worker whose turn did not end normally: not run (time) where the budget cut it (skipped, or
  stopped at the time limit), failed where its process crashed — unless it wrote rows of its own for it."""
  extra = []
  by_name = {w.name: w for w in plan_lib.workers()}
  for name, o in outcome.items():
    status = o.get("status")
    if status in (None, "ok") or any(r.get("worker") == name for r in rows if r["status"] == record.NOT_RUN_TIME):
      continue
    w = by_name[name]
    last = next((line for line in reversed(o.get("tail", [])) if line.strip()), "")
    extra.append(_row(w.section, f"{w.title} (worker {name})", status=status,
                      note=o.get("note") or (last[:200] if status.startswith("failed") else "")))
  return extra


def _row(section, config, value=None, unit="", *, vs=None, ref="", status="ok", note="", **extra) -> dict:
  return dict(kind="row", section=section, config=config, value=value, unit=unit, vs=vs, ref=ref, status=status,
              note=note, worker="bench", **extra)


def _derived_rows(rows: list[dict]) -> list[dict]:
  """What compares numbers from two workers: ncjax over open_clip (b), the NCU speed-ups and value check (c)."""
  ok = [r for r in rows if r["status"] == "ok" and r["value"] is not None]
  out = []
  for batch in sorted({r["batch"] for r in ok if r["section"] == "b"}):
    ours = [r for r in ok if r["section"] == "a" and r.get("batch") == batch and r["unit"] == "pairs/s"]
    theirs = [r for r in ok if r["section"] == "b" and r.get("batch") == batch]
    if ours and theirs:
      a, b = max(ours, key=lambda r: r["value"]), max(theirs, key=lambda r: r["value"])
      out.append(_row("b", f"ncjax best / open_clip best, batch {batch}/GPU", a["value"] / b["value"], "x",
                      note=f"ncjax attention={a['attention']} {a['value']:.0f} pairs/s; open_clip {b['mode']} "
                           f"{b['value']:.0f} pairs/s", batch=batch))
  ncu = {(r["side"], r["n"]): r for r in ok if r["section"] == "c" and "side" in r}
  for n in sorted({n for _, n in ncu}):
    jax_r, torch_r = ncu.get(("jax", n)), ncu.get(("torch", n))
    if jax_r and torch_r:
      speedup = torch_r["value"] / jax_r["value"]
      out.append(_row("c", f"ncjax speed-up over the public loop, N = {n}", speedup, "x",
                      note=f"{jax_r['value']:.3g} s vs {torch_r['value']:.3g} s"
                           + (f"; target >= {SPEEDUP_TARGET:g}x at N = 32,768 on an H100" if n == 32768 else ""),
                      n=n))
    if jax_r and torch_r and jax_r.get("value_check") and torch_r.get("loss") is not None:
      rel = abs(jax_r["loss"] - torch_r["loss"]) / abs(torch_r["loss"])
      out.append(_row("c", f"loss value, ncjax vs the public loop, N = {n}", rel, "rel. diff",
                      status="ok" if rel < VALUE_TOLERANCE else f"failed: relative difference {rel:.2e} >= "
                                                                 f"{VALUE_TOLERANCE:g}",
                      note=f"ncjax {jax_r['loss']:.7f} (matmuls at float32), public {torch_r['loss']:.7f}",
                      n=n, check="value", rel_diff=rel, ncjax_loss=jax_r["loss"], public_loss=torch_r["loss"]))
  return out


def _tests_summary(logs: str) -> dict | None:
  """The test slice's record (run.sh writes tests_meta.json and the per-test tests.jsonl into the logs folder)."""
  meta_path = os.path.join(logs, "tests_meta.json")
  if not os.path.exists(meta_path):
    return None
  with open(meta_path) as f:
    meta = json.load(f)
  return dict(meta, **pytest_counts.summarise(os.path.join(logs, "tests.jsonl")))


def _test_rows(logs: str) -> list[dict]:
  """The slice's counts. Stopped at its time limit without a failure is not a failure: the note says how far it
  got (the tests run in collection order, so the same prefix of the slice passed)."""
  t = _tests_summary(logs)
  if t is None:
    return []
  bad = t["failed"] + t["errors"]
  if bad:
    first = t["failures"][0]
    why = t.get("why", {}).get(first)
    status = f"failed: {t['failed']} failed, {t['errors']} errors (first: {first}" + (f": {why}" if why else "") + ")"
  elif t.get("timed_out"):
    status = "ok"
  elif t.get("rc") != 0:
    status = f"failed: pytest exit status {t.get('rc')} (tests.log)"
  else:
    status = "ok"
  note = (f"{t['skipped']} skipped, {t.get('seconds', 0):.0f} s"
          + (f"; stopped at its time limit of {t.get('limit_s')} s, the rest did not run" if t.get("timed_out")
             else ""))
  return [_row("tests", "GPU slice of the test suite (run.sh)", t["passed"], "passed", status=status, note=note,
               **{k: t[k] for k in ("failed", "errors", "skipped", "timed_out", "rc") if k in t})]


def _all_rows(out: str, logs: str, smoke: bool, sections: list[str], outcome: dict | None) -> tuple[list, list]:
  read = record.read_rows(out)
  rows = [r for r in read if r.get("kind") == "row"]
  machines = [r for r in read if r.get("kind") == "machine"]
  rows += _outcome_rows(outcome or {}, rows)
  rows += _derived_rows(rows)
  rows += _test_rows(logs)
  for s in sections:   # every requested section has its row, whatever happened
    if not any(r["section"] == s for r in rows):
      rows.append(_row(s, SECTION_TITLES[s], status=record.NOT_RUN_TIME))
  order = {s: i for i, s in enumerate(["tests", *SECTION_TITLES])}
  rows.sort(key=lambda r: order.get(r["section"], len(order)))   # stable: measurement order within a section
  return rows, machines


def write_table(out: str, logs: str, smoke: bool, sections: list[str], budget_s: float, start: float,
                outcome: dict | None, *, final: bool = False) -> dict:
  """OUT/accelerator.json and OUT/accelerator.md from the rows so far, and the logs archived into OUT."""
  rows, machines = _all_rows(out, logs, smoke, sections, outcome)
  summary_path = os.path.join(out, "accelerator.json")
  earlier = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      earlier = json.load(f)
  summary = dict(smoke=smoke, budget_s=budget_s or earlier.get("budget_s"),
                 seconds=(time.time() - start) if start else earlier.get("seconds"), sections=sections,
                 versions=_versions(), card=_card(logs, machines), machines=machines,
                 workers=outcome if outcome is not None else earlier.get("workers", {}), rows=rows,
                 tests=_tests_summary(logs), final=final)
  tmp = summary_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(summary, f, indent=1, default=str)
  os.replace(tmp, summary_path)
  tmp = os.path.join(out, "accelerator.md.tmp")
  with open(tmp, "w") as f:
    f.write(_markdown(summary, rows))
  os.replace(tmp, os.path.join(out, "accelerator.md"))
  archive_logs(out, logs)
  return summary


def archive_logs(out: str, logs: str) -> None:
  """The logs folder as OUT/logs.tar.gz (rewritten whole: a call cut short keeps the last one)."""
  if not os.path.isdir(logs):
    return
  tmp = os.path.join(out, "logs.tar.gz.tmp")
  with tarfile.open(tmp, "w:gz") as tar:
    for name in sorted(os.listdir(logs)):
      path = os.path.join(logs, name)
      if os.path.isfile(path):
        tar.add(path, arcname=os.path.join("logs", name))
  os.replace(tmp, os.path.join(out, "logs.tar.gz"))


def finalize(out: str, logs: str, smoke: bool, sections: list[str]) -> int:
  """After the test slice: the table with its counts, printed at the end of the output as well."""
  summary = write_table(out, logs, smoke, sections, 0.0, 0.0, None, final=True)
  print(f"\naccelerator check on {summary['card']} ({'smoke, ' if smoke else ''}measurements "
        f"{summary['seconds'] or 0:.0f} s of {summary['budget_s'] or 0:.0f} s):\n{table(summary['rows'])}\n\n"
        f"{os.path.join(out, 'accelerator.md')}")
  return 0


def _versions() -> dict:
  found = {"python": sys.version.split()[0]}
  for name in VERSIONED:
    try:
      found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return found


def _card(logs: str, machines: list[dict]) -> str:
  """The card as nvidia-smi names it (run.sh's copy of its answer, else asked here), else JAX's device kind."""
  path = os.path.join(logs, "nvidia_smi.csv")
  lines = []
  if os.path.exists(path):
    with open(path) as f:
      lines = [line.strip() for line in f if line.strip()]
  elif shutil.which("nvidia-smi"):
    try:
      lines = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
      lines = []
  if len(lines) > 1:
    return "; ".join(lines[1:])
  kinds = sorted({f"{m['n_devices']} x {m['device_kind']}" for m in machines if "device_kind" in m})
  return ", ".join(kinds) or "unknown"


def _cell(r: dict, key: str) -> str:
  """A row's cell: a measurement that did not happen shows its status's first word in the value column and the
  whole status in the note."""
  ok = r["status"] == "ok"
  if key == "value":
    if not ok:
      return r["status"].split(":")[0].replace("not run (time)", "not run")
    v = r["value"]
    return "-" if v is None else (f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:,.4g}" if v < 1e4 else f"{v:,.0f}")
  if key in ("vs", "mfu_peak", "mfu_measured"):
    v = r.get(key)
    if key != "vs" and v is not None and ok:
      return f"{v:.1%}"
    return "-" if v is None else f"{v:.3g}"
  if key == "note" and not ok:
    return "; ".join(x for x in (r["status"], r.get("note")) if x)
  return str(r.get(key) or "")


COLUMNS = (("section", "section"), ("config", "measurement"), ("value", "value"), ("unit", "unit"), ("vs", "vs"),
           ("ref", "vs what"), ("mfu_peak", "MFU (datasheet peak)"), ("mfu_measured", "MFU (measured matmul)"),
           ("note", "note"))


def table(rows: list[dict]) -> str:
  cells = [[_cell(r, k) for k, _ in COLUMNS] for r in rows]
  heads = [h for _, h in COLUMNS]
  widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
  right = {2, 4, 6, 7}   # numbers
  line = lambda cs: "  ".join(c.rjust(w) if i in right else c.ljust(w)
                              for i, (c, w) in enumerate(zip(cs, widths))).rstrip()
  return "\n".join([line(heads), "-" * len(line(heads))] + [line(c) for c in cells])


def _markdown(summary: dict, rows: list[dict]) -> str:
  v = summary["versions"]
  sources = sorted({r["peak_source"] for r in rows if r.get("peak_source")})
  head = (f"# ncjax accelerator check{' (smoke)' if summary['smoke'] else ''}\n\n{summary['card']}; python "
          f"{v.get('python')}, jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, flax {v.get('flax')}, optax "
          f"{v.get('optax')}, torch {v.get('torch', '-')}, open_clip {v.get('open_clip_torch', '-')}; measurements "
          f"{summary['seconds'] or 0:.0f} s of a {summary['budget_s'] or 0:.0f} s budget"
          f"{'' if summary.get('final') else ' (in progress: the table so far)'}\n\n"
          f"MFU: the model FLOPs of a step (benchmarks/flops.py) per second, over the card's dense bf16 peak "
          f"({'; '.join(sources) if sources else 'no datasheet figure for this device'}) and over the bf16 matmul "
          f"rate measured in the same run (section a's first row).\n\n")
  body = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  body += ["| " + " | ".join(_cell(r, k).replace("|", "/") for k, _ in COLUMNS) + " |" for r in rows]
  workers = summary.get("workers") or {}
  if workers:   # what each phase took (`run.sh --plan --calibrate accelerator.json` plans with it)
    body += ["", "| worker | prepared at (s) | planned (s) | turn (s) | planned (s) | still compiling beside its turn "
                 "| status |", "|---|---|---|---|---|---|---|"]
    fmt = lambda x: f"{x:.0f}" if isinstance(x, (int, float)) else "-"
    body += [f"| {n} | {fmt(o.get('prepare_s'))} | {fmt(o.get('planned_prepare_s'))} | {fmt(o.get('turn_s'))} | "
             f"{fmt(o.get('planned_turn_s'))} | {', '.join(o.get('others_preparing', [])) or '-'} | "
             f"{o.get('status', '-')} |" for n, o in workers.items()]
  return head + "\n".join(body) + "\n"


# --- worker processes ----------------------------------------------------------------------------------------------

def _prepare(name: str, rec: record.Recorder, sizes: record.Sizes, smoke: bool, sections: list[str],
             deadline: float, workdir: str):
  """The plan's worker `name`, prepared (an object with a `turn()`)."""
  if name == "torch":
    from benchmarks.accelerator import torch_work
    return _TorchTurn(rec, sizes, smoke, sections, torch_work)
  from benchmarks.accelerator import jax_work
  if name == "cd" and "d" not in sections:
    return _Call(lambda: jax_work.ncu_section(rec, sizes))
  names = [m for m in (sizes.methods or _all_methods()) if m != "CLIP" or "a" not in sections]
  half = (len([m for m in names if m != "CLIP"]) + 1) // 2
  e_methods = names[:half + ("CLIP" in names)] if name == "e1" else names[half + ("CLIP" in names):]
  w = next(w for w in plan_lib.workers() if w.name == "cd")
  seconds = plan_lib.SMOKE_SECONDS if smoke else plan_lib.GPU_SECONDS
  wait_s = deadline - time.time() - plan_lib.phase_seconds(w.after_wait + w.turn, seconds)
  prepared = jax_work.prepare(name, rec, sizes, workdir, e_methods=e_methods, wait_for_a_s=max(0.0, wait_s))
  if name == "cd" and "c" not in sections:
    return _Call(prepared.turn_memory)
  if name == "e1":
    return _Call(lambda: (jax_work.clip_reference_row(rec, sizes), prepared.turn()))
  return prepared


def _all_methods() -> list[str]:
  from benchmarks.steps import METHODS
  return list(METHODS)


class _Call:
  def __init__(self, fn):
    self.turn = fn


class _TorchTurn:
  """The torch worker: section b prepared (open_clip, its torch.compile), its turn section b then c's public loop."""

  def __init__(self, rec, sizes, smoke, sections, torch_work):
    self.rec, self.sizes, self.sections, self.torch_work, self.smoke = rec, sizes, sections, torch_work, smoke
    self.openclip = torch_work.OpenClipWorker(rec, sizes.batches, smoke) if "b" in sections else None

  def turn(self):
    if self.openclip is not None:
      self.openclip.turn()
    if "c" in self.sections:
      self.torch_work.ncu_section(self.rec, self.sizes.ncu_sizes, self.sizes.ncu_check, smoke=self.smoke)


def _failure(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"failed: {type(e).__name__}: {text[0][:200] if text else ''}"


def _worker(names: list[str], out: str, logs: str, deadline: float, smoke: bool, sections: list[str]) -> int:
  """One process of the plan: prepares its workers in order (`@ready NAME` after each), then runs each one's turn
  when the orchestrator says `go NAME` on stdin (`skip NAME`: its turn no longer fits), `@done NAME` after it."""
  import tempfile
  sizes = record.SMOKE_SIZES if smoke else record.GPU_SIZES
  by_name = {w.name: w for w in plan_lib.workers()}
  recorders = {n: record.Recorder(out, n, deadline, smoke) for n in names}
  if any(by_name[n].framework == "jax" for n in names):
    import absl.logging
    absl.logging.set_verbosity(absl.logging.WARNING)
    from benchmarks.accelerator import jax_work
    jax_work.machine(recorders[names[0]])
  prepared = {}
  with tempfile.TemporaryDirectory(prefix="ncjax_accelerator_") as workdir:
    if smoke and any(by_name[n].framework == "jax" for n in names):
      # The smoke run's JAX workers share one process: a program it compiles again (every CLIP trainer's
      # initialisation, section d's candidate at section a's batch) comes from a compilation cache of this run's own.
      import jax
      jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "jax_cache"))
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    for name in names:
      try:
        prepared[name] = _prepare(name, recorders[name], sizes, smoke, sections, deadline, workdir)
      except Exception as e:   # its rows say so; the other workers go on
        w = by_name[name]
        recorders[name].row(w.section, f"{w.title} (worker {name}, preparing)", status=_failure(e))
        prepared[name] = None
      print(f"@ready {name}", flush=True)
    for name in names:
      line = sys.stdin.readline().split()
      word = line[0] if line and line[1:] == [name] else "skip"
      w = by_name[name]
      if word == "go" and prepared[name] is not None:
        try:
          prepared[name].turn()
        except Exception as e:
          recorders[name].row(w.section, f"{w.title} (worker {name})", status=_failure(e))
      elif word != "go":
        recorders[name].row(w.section, f"{w.title} (worker {name})", status=record.NOT_RUN_TIME,
                            note="its turn no longer fitted before the deadline")
      prepared[name] = None   # its memory back before the next worker's turn
      print(f"@done {name}", flush=True)
  return 0


if __name__ == "__main__":
  from ncjax import runtime
  runtime.restart_with_huge_pages()   # XLA:CPU's temporaries (the smoke run); inherited by the workers
  sys.exit(main())
