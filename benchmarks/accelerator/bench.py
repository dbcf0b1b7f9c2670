"""The accelerator check's measurements: one table (and a JSON beside it) of what ncjax does on a GPU.

  python -m benchmarks.accelerator.bench [--smoke] [--out DIR] [--budget_s S] [--sections a,b,c,d,e]

Sections, in priority order:
  a  CLIP ViT-B/16 train step (the trainer's own), bf16, per-GPU batch 256 and 512, each attention kind: pairs/s,
     step time, model FLOPs utilisation against the card's bf16 matmul rate measured in the same process
  b  open_clip 3.3's ViT-B-16 on torch on the same card and batches (AMP bf16, SDPA, AdamW, ClipLoss), eager and
     under torch.compile, and ncjax's best pairs/s over open_clip's best
  c  NCU's stage-2 loss + gradient at N = 2,048 / 8,192 / 32,768 (D = 512): ncjax against the public code's loop
     restated in PyTorch (`ncu_public`), the speed-up, and the two losses' values compared at N = 2,048
  d  device memory: section a's peaks, and the largest per-GPU batch that fits with and without remat
  e  every method's step (benchmarks/steps.py's list) against CLIP's at per-GPU batch 256

Each section runs in its own process (`--worker`, internal): JAX takes most of the GPU's memory when it starts, so
torch cannot share a process with it, and a section that crashes the device runtime takes no other with it. All
sections share one time budget: a section (or a measurement inside one) that would not end before the deadline is
recorded as "not run (time)", never dropped, and a worker still running at the deadline is stopped. Every row goes
to OUT/rows.jsonl as it is measured; at the end come OUT/accelerator.json (rows, versions, card, the test slice's
counts from run.sh) and OUT/accelerator.md.

--smoke runs the same code at the `micro` size on one CPU device (torch parts skipped where torch is missing): the
check of the check, in tests/test_accelerator_check.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata

from benchmarks.accelerator import pytest_counts, record

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SECTIONS = {   # section -> (title, its workers in the order they run)
    "a": ("CLIP train step per attention kind", ("a",)),
    "b": ("open_clip on torch, same card", ("b",)),
    "c": ("NCU stage-2 loss + gradient vs the public loop", ("c_jax", "c_torch")),
    "d": ("device memory, largest batch", ("d",)),
    "e": ("every method vs CLIP", ("e",)),
}
WORKER_SECTION = {w: s for s, (_, workers) in SECTIONS.items() for w in workers}
TORCH_WORKERS = ("b", "c_torch")
# Seconds a worker needs on the GPU to start and finish its first measurement; with less left it is not started.
MIN_START_S = {"a": 110, "b": 40, "c_jax": 30, "c_torch": 40, "d": 100, "e": 110}
# A worker checks the deadline between measurements; one that started just before it may overrun by a compile.
GRACE_S = {False: 20, True: 10}
DEFAULT_BUDGET_S = {False: 360, True: 120}
SPEEDUP_TARGET = 10.0   # ncjax over the public loop at N = 32,768 on an H100
VALUE_TOLERANCE = 1e-4  # relative difference of the two NCU losses at the check's N
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "numpy",
             "torch", "open_clip_torch", "ott-jax")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="tiny sizes on one CPU device")
  p.add_argument("--out", default="", help="output folder (default: $OUT, else bench_results/accelerator)")
  p.add_argument("--budget_s", type=float, default=None, help="time budget of all sections (default 360; smoke 120)")
  p.add_argument("--sections", default="a,b,c,d,e", help="comma-separated sections to run, of a,b,c,d,e")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  out = os.path.abspath(args.out or os.environ.get("OUT") or os.path.join("bench_results", "accelerator"))
  if args.worker:
    return _worker(args.worker.split(","), out, args.deadline, args.smoke)
  sections = [s.strip() for s in args.sections.split(",") if s.strip()]
  unknown = [s for s in sections if s not in SECTIONS]
  if unknown:
    p.error(f"--sections: unknown {unknown}; sections are {list(SECTIONS)}")
  return orchestrate(out, sections, args.smoke, args.budget_s or DEFAULT_BUDGET_S[args.smoke])


# --- the orchestrating process (imports neither JAX nor torch) ---------------------------------------------------

def orchestrate(out: str, sections: list[str], smoke: bool, budget_s: float) -> int:
  os.makedirs(os.path.join(out, "logs"), exist_ok=True)
  rows_path = os.path.join(out, record.ROWS_FILE)
  if os.path.exists(rows_path):
    os.remove(rows_path)
  start = time.time()
  deadline = start + budget_s
  workers = [w for s in sorted(sections) for w in SECTIONS[s][1]]
  if smoke:   # one process per framework: the CPU has memory to share, and each start costs seconds here
    groups = [g for g in ([w for w in workers if w not in TORCH_WORKERS], [w for w in workers if w in TORCH_WORKERS])
              if g]
  else:
    groups = [[w] for w in workers]
  outcomes = {}
  for group in groups:
    left = deadline - time.time()
    if not smoke and left < MIN_START_S[group[0]]:
      outcomes[tuple(group)] = dict(status=record.NOT_RUN_TIME, seconds=0.0)
      continue
    outcomes[tuple(group)] = _run_worker(group, out, deadline, smoke)
  rows = [r for r in record.read_rows(out) if r.get("kind") == "row"]
  machines = [r for r in record.read_rows(out) if r.get("kind") == "machine"]
  rows += _worker_rows(outcomes, rows)
  rows += _derived_rows(rows)
  rows += _test_rows(out)
  for s in sections:   # every requested section has its row, whatever happened
    if not any(r["section"] == s for r in rows):
      rows.append(_row(s, SECTIONS[s][0], status=record.NOT_RUN_TIME))
  order = {s: i for i, s in enumerate(["tests", *SECTIONS])}
  rows.sort(key=lambda r: order.get(r["section"], len(order)))   # stable: measurement order within a section
  summary = dict(smoke=smoke, budget_s=budget_s, seconds=time.time() - start, sections=sections,
                 versions=_versions(), card=_card(out, machines), machines=machines,
                 workers={"+".join(k): v for k, v in outcomes.items()}, rows=rows,
                 tests=_tests_summary(out))
  with open(os.path.join(out, "accelerator.json"), "w") as f:
    json.dump(summary, f, indent=1, default=str)
  text = table(rows)
  with open(os.path.join(out, "accelerator.md"), "w") as f:
    f.write(_markdown(summary, rows))
  print(f"\naccelerator check on {summary['card']} ({'smoke, ' if smoke else ''}{summary['seconds']:.0f} s of "
        f"{budget_s:.0f} s):\n{text}\n\n{os.path.join(out, 'accelerator.json')}")
  return 0


def _run_worker(names: list[str], out: str, deadline: float, smoke: bool) -> dict:
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
  elif names[0] not in TORCH_WORKERS:
    # Section d measures against the allocator's limit: give JAX most of the card (the default is 75%), leaving
    # the CUDA context and libraries their room.
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
  cmd = [sys.executable, "-m", "benchmarks.accelerator.bench", "--worker", ",".join(names), "--out", out,
         "--deadline", repr(deadline)] + (["--smoke"] if smoke else [])
  log_path = os.path.join(out, "logs", "+".join(names) + ".log")
  tail = collections.deque(maxlen=25)
  start = time.time()
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def pump():
      for line in proc.stdout:
        log.write(line)
        log.flush()
        tail.append(line.rstrip())
        if line.startswith("["):   # the workers' row lines; the rest (XLA's and torch's chatter) stays in the log
          print(line, end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
      rc = proc.wait(timeout=max(1.0, deadline - time.time() + GRACE_S[smoke]))
      status = "ok" if rc == 0 else f"failed: exit status {rc}"
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)   # its own children too (torch.compile's compile workers)
      proc.wait()
      status = f"failed: stopped at the time limit after {time.time() - start:.0f} s"
    reader.join(timeout=10)
  if status != "ok":
    print(f"[{'+'.join(names)}] {status}; the end of {log_path}:\n  " + "\n  ".join(tail), flush=True)
  return dict(status=status, seconds=time.time() - start, log=log_path, tail=list(tail) if status != "ok" else [])


def _row(section, config, value=None, unit="", *, vs=None, ref="", status="ok", note="", **extra) -> dict:
  return dict(kind="row", section=section, config=config, value=value, unit=unit, vs=vs, ref=ref, status=status,
              note=note, worker="bench", **extra)


def _worker_rows(outcomes: dict, rows: list[dict]) -> list[dict]:
  """A row for each worker that failed, was stopped, or was not started. In a process running several workers (the
  smoke run) the failure is the one's that was running — the last to write a row, or the first if none did — and
  the workers after it did not run."""
  extra = []
  for names, o in outcomes.items():
    if o["status"] == "ok":
      continue
    if o["status"] == record.NOT_RUN_TIME:
      extra += [_row(WORKER_SECTION[n], f"{SECTIONS[WORKER_SECTION[n]][0]} (worker {n})", status=o["status"])
                for n in names]
      continue
    wrote = [n for n in names if any(r["worker"] == n for r in rows)]
    culprit = wrote[-1] if wrote else names[0]
    last = next((line for line in reversed(o.get("tail", [])) if line.strip()), "")
    for n in names[names.index(culprit):]:
      status = o["status"] if n == culprit else f"failed: not run, worker {culprit} failed before it"
      extra.append(_row(WORKER_SECTION[n], f"{SECTIONS[WORKER_SECTION[n]][0]} (worker {n})", status=status,
                        note=last[:200] if n == culprit and o["status"].startswith("failed: exit") else ""))
  return extra


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


def _tests_summary(out: str) -> dict | None:
  meta_path = os.path.join(out, "tests_meta.json")
  if not os.path.exists(meta_path):
    return None
  with open(meta_path) as f:
    meta = json.load(f)
  return dict(meta, **pytest_counts.summarise(os.path.join(out, "tests.jsonl")))


def _test_rows(out: str) -> list[dict]:
  """The slice's counts. Stopped at its time limit without a failure is not a failure: the note says how far it
  got (the tests run in collection order, so the same prefix of the slice passed)."""
  t = _tests_summary(out)
  if t is None:
    return []
  bad = t["failed"] + t["errors"]
  if bad:
    status = f"failed: {t['failed']} failed, {t['errors']} errors (first: {t['failures'][0]})"
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


def _versions() -> dict:
  found = {"python": sys.version.split()[0]}
  for name in VERSIONED:
    try:
      found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return found


def _card(out: str, machines: list[dict]) -> str:
  """The card as nvidia-smi names it (run.sh's copy of its answer, else asked here), else JAX's device kind."""
  path = os.path.join(out, "nvidia_smi.csv")
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
  if key == "vs":
    return "-" if r["vs"] is None else f"{r['vs']:.3g}"
  if key == "note" and not ok:
    return "; ".join(x for x in (r["status"], r.get("note")) if x)
  return str(r.get(key) or "")


COLUMNS = (("section", "section"), ("config", "measurement"), ("value", "value"), ("unit", "unit"), ("vs", "vs"),
           ("ref", "vs what"), ("note", "note"))


def table(rows: list[dict]) -> str:
  cells = [[_cell(r, k) for k, _ in COLUMNS] for r in rows]
  heads = [h for _, h in COLUMNS]
  widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
  right = {2, 4}   # numbers
  line = lambda cs: "  ".join(c.rjust(w) if i in right else c.ljust(w)
                              for i, (c, w) in enumerate(zip(cs, widths))).rstrip()
  return "\n".join([line(heads), "-" * len(line(heads))] + [line(c) for c in cells])


def _markdown(summary: dict, rows: list[dict]) -> str:
  v = summary["versions"]
  head = (f"# ncjax accelerator check{' (smoke)' if summary['smoke'] else ''}\n\n{summary['card']}; python "
          f"{v.get('python')}, jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, flax {v.get('flax')}, optax "
          f"{v.get('optax')}, torch {v.get('torch', '-')}, open_clip {v.get('open_clip_torch', '-')}; "
          f"{summary['seconds']:.0f} s of a {summary['budget_s']:.0f} s budget\n\n")
  body = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  body += ["| " + " | ".join(_cell(r, k).replace("|", "/") for k, _ in COLUMNS) + " |" for r in rows]
  return head + "\n".join(body) + "\n"


# --- worker processes ----------------------------------------------------------------------------------------------

def _worker(names: list[str], out: str, deadline: float, smoke: bool) -> int:
  plan = record.SMOKE_PLAN if smoke else record.GPU_PLAN
  recorders = {n: record.Recorder(out, n, deadline, smoke) for n in names}
  if names[0] in TORCH_WORKERS:
    from benchmarks.accelerator import torch_work
    for name in names:
      if name == "b":
        torch_work.openclip_section(recorders[name], plan.batches, smoke)
      else:
        torch_work.ncu_section(recorders[name], plan.ncu_sizes, plan.ncu_check)
    return 0
  import absl.logging
  absl.logging.set_verbosity(absl.logging.WARNING)
  from benchmarks.accelerator import jax_work
  jax_work.run(recorders.__getitem__, names, plan, out)
  return 0


if __name__ == "__main__":
  from ncjax import runtime
  runtime.restart_with_huge_pages()   # XLA:CPU's temporaries (the smoke run); inherited by the workers
  sys.exit(main())
