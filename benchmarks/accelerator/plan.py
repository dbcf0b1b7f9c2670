"""The accelerator check's plan: which processes prepare what, in what order they take the GPU, what each phase is
expected to cost, and what of the call's time is left for the test slice. Imports neither JAX nor torch:
`run.sh --plan` prints it on any machine, and `bench.py` runs by it (the same code at smoke sizes on the CPU).

A GPU host is lent for one short call, so the check runs in two phases. **Prepare**, all workers at once, each in
its own process: imports, trainers, the lowering and compiling of every program a worker will time (within a
process on a thread pool: XLA compiles without the GIL), torch.compile's first call. **Turns**, one worker at a time
in priority order (a, b, c, d, e): only timings and the real steps run on the GPU, so no compile or autotuning
disturbs a measurement; a worker exits after its turn, giving its memory back. What is left of the call after the
turns goes to the GPU slice of the test suite.

Estimates are seconds on the GPU host (one H100-class card, 16 cores). Where a figure could be measured without a
GPU it was (imports, trainers, lowering: CPU work, on this repository's 2-core machine, 2026-11-27); the rest are
planning figures, marked as such, until a GPU run records what each phase took: accelerator.json keeps every
worker's `prepare_s` and `turn_s`, and `--plan --calibrate accelerator.json` plans with them.
"""

from __future__ import annotations

import dataclasses
import json
import math

# The device call's command may run 600 s; the machine's start and the copies are outside that limit (on the H100
# host: 351 s of command in a call held 382 s). 30 s are kept for the slice's stop and the table's writing.
DEFAULT_TOTAL_S = 570

# What one phase costs, in seconds on the GPU host. (g): measured on the H100 host (2026-11-27, jax 0.11.2, torch 2.11;
# docs/notes/accelerator_h100.md); (m): measured on the CPU here (the same work on the host's CPU); (p): a planning
# figure, to be replaced by a GPU run's own record.
GPU_SECONDS = {
    "install": 3,           # (g) pip install of the carried wheels (with the versions' listing: 4-5 s on the H100)
    "versions": 2,          # (g) nvidia-smi and the versions' listing
    "jax_start": 12,        # (m+p) import jax + ncjax 1.5 s; the CUDA client, cuBLAS and cuDNN handles (p) 10 s
    "torch_start": 15,      # (p) import torch and open_clip, the CUDA context
    "setup": 5,             # (m) one ViT-B/16 trainer: config, model spec, data, shardings (3.4-9.8 s here)
    "lower": 10,            # (m) lowering one ViT-B/16 train step to StableHLO (8.6-11.5 s here)
    "compile": 90,          # (g) XLA:GPU compile of one ViT-B/16 train step, autotuning included: three at once
                            # took 112-140 s on the H100 host while five processes compiled
    "init": 10,             # (p) one train state on the device, its init programs compiled
    "matmul": 5,            # (p) the bf16 matmul rate: one compile, 100 products
    "timing": 6,            # (p) warm-up and 3 x 5 timed steps of one configuration (a step is <= 0.3 s)
    "openclip_build": 5,    # (p) open_clip's ViT-B-16 built and moved to the GPU, its optimiser
    "eager": 8,             # (p) open_clip eager at one batch: warm-up and timed steps
    "torch_compile": 70,    # (g) torch.compile (Inductor) of the open_clip step at 512: its first call, 66 s
    "ncu_jax": 20,          # (p) ncjax's NCU loss + gradient at N = 2,048 / 8,192 / 32,768: compiles and timings
    "ncu_torch": 40,        # (g) the public NCU loop at the same N: 0.11 s, 0.92 s and 14.1 s a call on the H100
    "steps_large": 8,       # (p) two steps at the largest batch found (a few seconds each at up to ~2k pairs)
    "finalize": 10,         # (m) the table, the JSON, the logs' archive
}
# A worker's programs compile on a thread pool; the card autotunes one kernel at a time, so each further concurrent
# compile adds this fraction of one (p).
CONCURRENT_COMPILE = 0.25
# The minimum test slice (losses, ot, samplers, the sharded step, at `highest` precision): (g) on the H100 the whole
# slice (143 tests) took 176 s on 4 pytest workers, these four parts two thirds of its test-seconds.
TESTS_MIN_S = 120
GRACE_S = {False: 20, True: 5}   # a worker still running this long after the deadline is stopped (GPU, smoke)

SMOKE_SECONDS = {k: 1.0 for k in GPU_SECONDS} | {"jax_start": 4, "torch_start": 4, "torch_compile": 6,
                                                  "finalize": 2, "compile": 3, "lower": 2}
SMOKE_TESTS_MIN_S = 0


@dataclasses.dataclass(frozen=True)
class Worker:
  """One unit of the plan: what it prepares and what its turn on the GPU does, as (phase, count) pairs. A
  ("compile", n) phase is one wave of n programs compiled concurrently. `after`: the workers whose compiled
  programs it needs (section d fits its memory line through section a's); `after_wait`: what it prepares once they
  are compiled."""
  name: str
  section: str
  framework: str                                # 'jax' or 'torch'
  title: str
  prepare: tuple[tuple[str, float], ...]
  turn: tuple[tuple[str, float], ...]
  after: tuple[str, ...] = ()
  after_wait: tuple[tuple[str, float], ...] = ()
  covers: tuple[str, ...] = ()                  # the sections it measures, if more than its own
  turn_after: tuple[str, ...] = ()              # workers whose turns' rows its turn reads

  def measures(self, sections) -> bool:
    return any(s in sections for s in (self.section,) + self.covers)


def _programs(n: int, *, init: bool = True) -> tuple[tuple[str, float], ...]:
  """n ViT-B/16 steps prepared: trainers, lowering (one after another: tracing holds the GIL), one compile wave,
  and a train state where the worker keeps one through its preparation."""
  return (("setup", n), ("lower", n), ("compile", n)) + ((("init", 1),) if init else ())


def workers(*, smoke: bool = False, kinds: int = 3, methods: int = 8) -> list[Worker]:
  """Every worker of the check, in priority order (the order of their turns). `kinds`: the attention kinds section
  a times; `methods`: section e's methods (CLIP's step there is section a's). Section e's workers initialise each
  method's state in their turn, not before: a state held through the preparation would take memory from section
  d's steps at the largest batch."""
  rest = methods - 1
  half = math.ceil(rest / 2)
  return [
      Worker("a256", "a", "jax", "CLIP ViT-B/16 bf16 at 256/GPU, each attention kind",
             prepare=_programs(kinds) + (("matmul", 1),), turn=(("timing", kinds),)),
      Worker("a512", "a", "jax", "CLIP ViT-B/16 bf16 at 512/GPU, each attention kind",
             prepare=_programs(kinds), turn=(("timing", kinds),)),
      Worker("torch", "b", "torch", "open_clip eager, fused AdamW, torch.compile; public NCU loop",
             prepare=(("openclip_build", 1), ("torch_compile", 1)),
             turn=(("eager", 3), ("timing", 1), ("ncu_torch", 1)), covers=("c",)),
      # d: the remat line's two points, then its predicted largest batch and 90% of it; the line without remat
      # comes from section a's programs, then its two candidates
      Worker("cd", "d", "jax", "NCU loss vs the public loop; largest batch, remat off / on",
             prepare=_programs(2, init=False) + _programs(2, init=False), after=("a256", "a512"),
             after_wait=_programs(2, init=False), turn=(("ncu_jax", 1), ("init", 1), ("steps_large", 1)),
             covers=("c",)),
      # e's reference is CLIP's step as section a timed it
      Worker("e1", "e", "jax", "every method's step vs CLIP's (first half)", prepare=_programs(half, init=False),
             turn=(("init", half), ("timing", half)), turn_after=("a256", "a512")),
      Worker("e2", "e", "jax", "every method's step vs CLIP's (second half)", prepare=_programs(rest - half, init=False),
             turn=(("init", rest - half), ("timing", rest - half)), turn_after=("a256", "a512")),
  ]


def phase_seconds(phases, seconds: dict) -> float:
  total = 0.0
  for name, count in phases:
    if name == "compile":
      total += seconds["compile"] * (1 + CONCURRENT_COMPILE * (count - 1)) if count else 0.0
    else:
      total += seconds[name] * count
  return total


@dataclasses.dataclass
class Step:
  worker: Worker
  ready: float           # seconds from the start of the measurements
  start: float
  end: float
  left_out: bool = False


def schedule(total_s: float, *, smoke: bool = False, sections=("a", "b", "c", "d", "e"), seconds=None,
             tests_min_s=None) -> dict:
  """The plan's timeline: {setup_s, steps: [Step], tests_s, tests_min_s, finalize_s, left_out: [names]}. Turns
  run in priority order, each when the one before it ended and its own preparation is ready; a turn that would
  leave the tests less than their minimum is left out, from the lowest priority up."""
  seconds = dict(SMOKE_SECONDS if smoke else GPU_SECONDS) | dict(seconds or {})
  tests_min_s = (SMOKE_TESTS_MIN_S if smoke else TESTS_MIN_S) if tests_min_s is None else tests_min_s
  setup_s = 0.0 if smoke else seconds["install"] + seconds["versions"]
  chosen = [w for w in workers(smoke=smoke) if w.measures(sections)]
  ready, compiled = {}, {}
  for w in chosen:
    start = seconds["torch_start" if w.framework == "torch" else "jax_start"]
    ready[w.name] = start + phase_seconds(w.prepare, seconds)
    # what a later worker waits for: this one's programs, before its state's initialisation
    compiled[w.name] = ready[w.name] - phase_seconds([p for p in w.prepare if p[0] in ("init", "matmul")], seconds)
    if w.after_wait:
      waits = max((compiled.get(a, start) for a in w.after), default=start)
      ready[w.name] = max(ready[w.name], waits + phase_seconds(w.after_wait, seconds))
  budget = total_s - setup_s - seconds["finalize"] - tests_min_s
  steps, clock, pending, finished = [], 0.0, list(chosen), {}
  while pending:   # as bench.py runs them: the highest-priority worker that is ready (and whose inputs are) goes
    def room(w, at):   # its turn at `at` leaves the higher-priority waiting workers their turns
      higher = pending[:pending.index(w)]
      return at + sum(phase_seconds(p.turn, seconds) for p in higher + [w]) <= budget
    fits = [w for w in pending if all(a in finished or a not in ready for a in w.turn_after)]
    fits = [w for w in fits if room(w, max(clock, ready[w.name])) or w is pending[0]]
    w = min(fits, key=lambda w: (max(clock, ready[w.name]), chosen.index(w)))
    begin = max(clock, ready[w.name])
    end = begin + phase_seconds(w.turn, seconds)
    steps.append(Step(w, ready[w.name], begin, end))
    clock = finished[w.name] = end
    pending.remove(w)
  steps.sort(key=lambda s: chosen.index(s.worker))
  budget += tests_min_s
  left_out = []
  while steps and [s for s in steps if not s.left_out] and \
      max(s.end for s in steps if not s.left_out) > budget - tests_min_s:
    last = [s for s in steps if not s.left_out][-1]
    last.left_out = True
    left_out.append(last.worker.name)
  measured = max((s.end for s in steps if not s.left_out), default=0.0)
  return dict(total_s=total_s, setup_s=setup_s, steps=steps, measurements_s=measured,
              tests_s=max(0.0, budget - measured), tests_min_s=tests_min_s, finalize_s=seconds["finalize"],
              left_out=left_out, seconds=seconds)


def calibrated_seconds(summary_path: str) -> dict:
  """Phase figures corrected by a GPU run's record (accelerator.json): each worker's measured prepare and turn
  seconds over its planned ones scale that worker's planning figures (the median over workers, per phase kind)."""
  with open(summary_path) as f:
    summary = json.load(f)
  ratios = [w["prepare_s"] / w["planned_prepare_s"] for w in summary.get("workers", {}).values()
            if w.get("prepare_s") and w.get("planned_prepare_s")]
  if not ratios:
    return {}
  ratios.sort()
  scale = ratios[len(ratios) // 2]
  return {k: v * scale for k, v in GPU_SECONDS.items() if k in ("compile", "torch_compile", "init", "jax_start",
                                                               "torch_start")}


def render(plan: dict) -> str:
  """The plan as text: each worker's preparation (in parallel) and turn (one at a time), the tests' share, and
  what is left out."""
  lines = [f"accelerator check plan: {plan['total_s']:.0f} s in all (inside the device call's 600 s command limit)",
           f"  {'setup: wheels, card, versions':<70} {plan['setup_s']:>5.0f} s"]
  lines.append("  prepare, every worker at once in its own process (ready at, from the measurements' start):")
  for s in plan["steps"]:
    lines.append(f"    {s.worker.name:<5} {s.worker.section}  {s.worker.title:<60} ready at {s.ready:>4.0f} s")
  lines.append("  turns on the GPU, one at a time, the highest-priority ready worker first (start -> end):")
  for s in plan["steps"]:
    mark = "LEFT OUT" if s.left_out else f"{s.start:>4.0f} -> {s.end:>4.0f} s"
    lines.append(f"    {s.worker.name:<5} {s.worker.section}  {s.worker.title:<60} {mark}")
  tests = f"GPU slice of the test suite: what is left (its minimum {plan['tests_min_s']:.0f} s)"
  lines.append(f"  {tests:<70} {plan['tests_s']:>5.0f} s")
  lines.append(f"  {'the table, the JSON and the logs archive':<70} {plan['finalize_s']:>5.0f} s")
  lines.append("left out: " + (", ".join(plan["left_out"]) if plan["left_out"] else "nothing"))
  return "\n".join(lines)
