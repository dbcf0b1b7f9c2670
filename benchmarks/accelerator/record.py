"""What the accelerator check's processes share, importing neither JAX nor torch: the sizes, the rows file, the
deadline (with the plan's estimates, whether a measurement still fits before it), and the NCU loss's inputs.

Every worker process appends its rows to one JSON-lines file as each measurement finishes, so a worker stopped at
the time limit (or crashing on the device) keeps what it measured; `bench.py` reads the file back and makes the
table. A worker must not import the other framework: JAX takes most of the GPU's memory when it starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

from benchmarks.accelerator import plan as plan_lib

ROWS_FILE = "rows.jsonl"
NOT_RUN_TIME = "not run (time)"


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The sizes of one run. Batches are per GPU (the global batch is that times the devices)."""
  model: str                    # ncjax size name of sections a, d, e
  batches: tuple[int, ...]      # sections a and b (and the two points of d's memory line)
  methods_batch: int            # section e
  ncu_sizes: tuple[int, ...]    # section c's N
  ncu_check: int                # the N where ncjax's loss value is checked against the public loop's
  matmul: int                   # the side of the bf16 matmul that measures the card's rate
  steps: int                    # timed steps per round, rounds, warm-up steps
  rounds: int
  warmup: int
  methods: tuple[str, ...] | None = None   # section e's methods (benchmarks/steps.py's names); None: all
  candidates: tuple[float, ...] = (1.0, 0.9)   # section d: fractions of each line's predicted batch compiled


GPU_SIZES = Sizes(model="ViT-B/16", batches=(256, 512), methods_batch=256, ncu_sizes=(2048, 8192, 32768),
                  ncu_check=2048, matmul=8192, steps=5, rounds=3, warmup=2)
# The smoke run's section e keeps the methods whose steps differ most from CLIP's (two stages with an empty first,
# Lorentz geometry with N + N forget / retain batches): every compile costs seconds on two cores.
SMOKE_SIZES = Sizes(model="micro", batches=(8, 16), methods_batch=16, ncu_sizes=(64, 128), ncu_check=64,
                    matmul=256, steps=1, rounds=1, warmup=1, methods=("CLIP", "NCU (stage 2)", "HAC-reg"),
                    candidates=(1.0,))


class Recorder:
  """Appends rows for one worker to `out/rows.jsonl` and knows its deadline (seconds since the epoch)."""

  def __init__(self, out: str, worker: str, deadline: float, smoke: bool):
    self.out, self.path = out, os.path.join(out, ROWS_FILE)
    self.worker, self.deadline, self.smoke = worker, deadline, smoke
    self.start = time.time()
    os.makedirs(out, exist_ok=True)

  def write(self, record: dict) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps(dict(record, worker=self.worker), default=_plain) + "\n")

  def row(self, section: str, config: str, value=None, unit: str = "", *, vs=None, ref: str = "",
          status: str = "ok", note: str = "", **extra) -> dict:
    """One measurement: `value` in `unit`, optionally `vs` a reference named by `ref` (a ratio or a fraction)."""
    row = dict(kind="row", section=section, config=config, value=_finite_or_none(value), unit=unit,
               vs=_finite_or_none(vs), ref=ref, status=status, note=note, at_s=round(time.time() - self.start, 1),
               **extra)
    self.write(row)
    shown = f"{value:.4g} {unit}" if status == "ok" and isinstance(value, (int, float)) else status
    print(f"[{self.worker} {row['at_s']:.0f}s] {section} | {config} | {shown} | {note}", flush=True)
    return row

  def estimate(self, name: str, times: float = 1.0) -> float:
    """Seconds the plan gives `times` phases of the kind `name` (plan.GPU_SECONDS; the smoke run's figures)."""
    return plan_lib.phase_seconds([(name, times)], plan_lib.SMOKE_SECONDS if self.smoke else plan_lib.GPU_SECONDS)

  def left(self) -> float:
    return self.deadline - time.time()

  def fits(self, name: str, times: float = 1.0) -> bool:
    """Whether a measurement of the kind `name` (times `times`) is expected to end before the deadline."""
    return self.left() >= self.estimate(name, times)


def read_rows(out: str) -> list[dict]:
  path = os.path.join(out, ROWS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _finite_or_none(x):
  if x is None:
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def _plain(x):
  """JSON for numpy scalars and arrays in extras (numpy is imported by then: only its values come here)."""
  if hasattr(x, "tolist"):
    return x.tolist()
  return str(x)


# --- NCU stage-2 inputs ------------------------------------------------------------------------------------------

NCU_LOGIT_SCALE = math.log(1 / 0.07)   # CLIP's initial temperature, as a log (ncjax's losses take the log)
NCU_FORGET_RATIO = 0.1                 # P of the public script: the floor(P N) least confident pairs are forgotten
NCU_DIM = 512


def ncu_inputs(n: int, dim: int = NCU_DIM, seed: int = 0):
  """Unit-norm image, text and negative-text embeddings (float32, n x dim), the same on both sides of the
  comparison. The texts lean towards their images (0.6 / 0.4) so that pairs have a real diagonal: the forget set
  is then a choice and the plan non-trivial, as in benchmarks/ncu.py."""
  import numpy as np   # here, not at the top: the plan and the orchestrator import this module without numpy
  rng = np.random.default_rng(seed)
  v, t, tn = rng.standard_normal((3, n, dim), dtype=np.float32)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  v = unit(v)
  t = unit(0.6 * v + 0.4 * unit(t))
  return v, t, unit(tn)


def crosscheck_inputs():
  """methods.md §1.7's N = 8, D = 4 inputs (float64): the unit check of the public loop's restatement against the
  notes' values (ncjax.testing holds them for the tests too)."""
  from ncjax.testing import ncu_crosscheck_inputs
  return ncu_crosscheck_inputs("float64")


def crosscheck_values() -> dict:
  """methods.md §1.7's expected values."""
  from ncjax.testing import NCU_CROSSCHECK
  return NCU_CROSSCHECK


# Dense bf16 peaks of the cards' datasheets (without sparsity), FLOP/s, and where each figure is printed: MFU is
# quoted against these, as published MFUs are. Matched against the device's name (nvidia-smi's, JAX's device kind).
DATASHEET_BF16 = (
    ("H100 PCIe", 756e12, "NVIDIA H100 datasheet (PCIe: 1,513 TFLOP/s with sparsity)"),
    ("H100 NVL", 835e12, "NVIDIA H100 datasheet (NVL: 1,671 TFLOP/s with sparsity)"),
    ("H200 NVL", 835e12, "NVIDIA H200 datasheet (NVL: 1,671 TFLOP/s with sparsity)"),
    ("H100", 989e12, "NVIDIA H100 datasheet (SXM: 1,979 TFLOP/s with sparsity)"),
    ("H200", 989e12, "NVIDIA H200 datasheet (SXM: 1,979 TFLOP/s with sparsity)"),
    ("GH200", 989e12, "NVIDIA GH200 datasheet (1,979 TFLOP/s with sparsity)"),
    ("A100", 312e12, "NVIDIA A100 datasheet (624 TFLOP/s with sparsity)"),
    ("L40S", 362e12, "NVIDIA L40S datasheet (733 TFLOP/s with sparsity)"),
)


def datasheet_peak(device_name: str) -> tuple[float, str] | None:
  """(dense bf16 FLOP/s, its source) of the card named `device_name`, None for a card not listed (or a CPU)."""
  for key, flops, source in DATASHEET_BF16:
    if key.lower() in device_name.lower():
      return flops, source
  return None
