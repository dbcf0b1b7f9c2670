"""The JAX side of the accelerator check: ncjax's real train steps on the device (sections a, d, e) and its NCU
stage-2 loss (section c), in processes that import no torch. Each worker of the plan (benchmarks/accelerator/
plan.py) has a `prepare` (trainers, lowering, one wave of compiles on a thread pool: XLA compiles without the GIL)
and a `turn` (what runs on the GPU while no other worker does: timings, real steps).

A step is the trainer's own: a `Trainer` built from the method's config, the `StageProgram` of its first stage with
steps, its jitted step lowered and compiled ahead of time, then called on a device-resident batch of the training
pipeline, the state passed from call to call as the trainer does (donated); configurations that share a state
layout share one state.

The synthetic data is made small: the embedded `synthetic` set at 224 px would generate 4,096 images (2.4 GB) per
trainer. Sections a and e register a set with just the examples their batches need (random pixels: NCU's forget
selection and Sinkhorn see real variety), section d one whose images are a single broadcast image (its batches of
thousands of examples only need shapes).
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import statistics
import time
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.accelerator import record
from benchmarks.flops import train_step_flops

ATTENTION_KINDS = ("einsum", "xla", "cudnn")   # what section a compares ('auto' is the einsum path on a GPU)
# d: the predicted largest batch is aimed at this share of the device's memory limit (the allocator's
# fragmentation and the runtime's own buffers take some of the rest).
MEMORY_HEADROOM = 0.97
# d on the CPU (smoke run), which has no device memory limit: a nominal limit this many times the larger batch's
# footprint, so that the search runs the same way. Just above it, each line predicts the larger batch: the remat
# line's candidate is its point's program, the other line's compiles through the search's lowering.
SMOKE_NOMINAL_LIMIT = 1.25


# --- data and configs --------------------------------------------------------------------------------------------

_REGISTERED: dict[str, str] = {}


def _dataset(kind: str, num_examples: int) -> str:
  """The name of an in-memory dataset of `num_examples` synthetic pairs: kind 'random' (the embedded generator,
  random pixels) or 'broadcast' (one image repeated as a read-only broadcast view: no memory per example)."""
  from ncjax import data as data_lib
  from ncjax.data.embedded import synthetic
  name = f"accelerator_{kind}_{num_examples}"
  if name not in _REGISTERED:
    if kind == "random":
      loader = functools.lru_cache(maxsize=None)(functools.partial(synthetic.load, num_examples=num_examples))
    else:
      loader = functools.lru_cache(maxsize=None)(functools.partial(_broadcast_split, num_examples=num_examples))
    data_lib.DATASETS.add(name, lambda split, image_size=32, _load=loader: _load(split, image_size))
    _REGISTERED[name] = kind
  return name


def _broadcast_split(split: str, image_size: int, *, num_examples: int):
  from ncjax.data.embedded import synthetic
  from ncjax.data.types import PairSplit
  base = synthetic.load(split, image_size=image_size, num_examples=min(num_examples, 256))
  n = num_examples if split == "train" else len(base.captions)
  captions = [base.captions[i % len(base.captions)] for i in range(n)]
  images = np.broadcast_to(base.images[:1], (n,) + base.images.shape[1:])
  return PairSplit(images=images, captions=captions, caption_to_image=np.arange(n), name=f"broadcast/{split}")


def method_config(config_name: str, arg: str, *, model: str, global_batch: int, data: str, attention: str = "auto",
                  remat: bool = False):
  """A method's config at `model` in bfloat16 on `data`, for timing steps (as benchmarks/steps.py's, plus the
  compute dtype, the attention kind and rematerialisation)."""
  from ncjax import config_lib
  cfg = config_lib.load_config_file(config_name, f"model={model},data={data},batch={global_batch},epochs=2,{arg}")
  with cfg.unlocked():
    cfg.method.init_from = "random"   # the unlearning methods start from a checkpoint otherwise
    if config_name == "ncu":
      from ncjax.models import get_size
      depth = get_size(model)["text"]["depth"]
      # The public script freezes 5 of 12 text blocks; the smoke run's one-block towers freeze none.
      cfg.method.frozen_text_blocks = min(5, depth - 1)
    cfg.model.dtype = "bfloat16"
    cfg.model.attention = attention
    cfg.model.remat = remat
    cfg.input.augment = False   # host-side crops only slow the batch's assembly; the step is the same
    cfg.log.progress = False
    cfg.ckpt.save_at_end = False
    cfg.evals = {}
  return cfg


class Setup:
  """One configuration's trainer and the program of its first stage that has steps (NCU with epochs_prompt=0 lists
  its empty prompt stage first)."""

  def __init__(self, cfg, workdir: str):
    from ncjax import train
    self.cfg = cfg
    self.trainer = train.Trainer(cfg, workdir)
    self.span = next(s for s in self.trainer.spans if s.steps > 0)
    self.prog = self.trainer.program(self.span)
    self.mesh = self.trainer.exp.mesh
    self.spec = self.trainer.exp.model_spec
    self.global_batch = int(cfg.input.global_batch_size)
    self.batch = None

  def pipeline_batch(self):
    """One global batch from the training pipeline, on the devices with the step's batch sharding."""
    if self.batch is None:
      self.batch, _, _ = next(self.trainer.exp.train_data.batches(self.span.start, self.span.start + 1))
    return self.batch

  def lower(self, batch):
    with jax.set_mesh(self.mesh):
      return self.prog.step.lower(self.prog.abstract_state, batch)

  def init_state(self):
    with jax.set_mesh(self.mesh):
      return self.trainer.init_state(self.span)


def _state_layout(setup: Setup):
  return jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding), setup.prog.abstract_state)


# The memory search compiles its candidates for their memory analysis only: without autotuning, which would run
# trial kernels on the card, holding operand-sized buffers there (up to ~4,400 pairs/GPU) while another worker's turn
# timed its steps. Its real steps at the largest batch run these untuned programs (their rows say so).
MEMORY_SEARCH_OPTIONS = {"xla_gpu_autotune_level": 0}


def _compile(lowered, options=None):   # GPU options: off a GPU, the smoke cache's program of section a is reused
  start, gpu = time.perf_counter(), options and jax.default_backend() == "gpu"
  compiled = lowered.compile(compiler_options=options) if gpu else lowered.compile()
  return compiled, time.perf_counter() - start


def _gather(futures) -> list:
  """(compiled, seconds) of each compile, or (None, failure status) where it raised."""
  out = []
  for fut in futures:
    try:
      out.append(fut.result())
    except Exception as e:
      out.append((None, _failure(e)))
  return out


def footprint(compiled) -> int | None:
  """Device bytes a compiled program needs: arguments + outputs - donated aliases + temporaries (XLA's analysis)."""
  try:
    m = compiled.memory_analysis()
  except Exception:   # not every backend reports it
    return None
  if isinstance(m, (list, tuple)):
    m = m[0] if m else None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def device_memory() -> dict:
  stats = jax.local_devices()[0].memory_stats()
  return dict(stats) if stats else {}


def _loss_of(metrics) -> float:
  keys = sorted(k for k in metrics if k == "loss" or k.endswith("/loss"))
  return float(metrics[keys[0]]) if keys else float("nan")


def time_steps(compiled, state, batch, sizes: record.Sizes, mesh):
  """(median seconds per step over the plan's rounds, the state after, the last metrics): back-to-back calls on the
  same device batch, blocked once per round, after warm-up calls."""
  with jax.set_mesh(mesh):
    for _ in range(sizes.warmup):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    per_round = []
    for _ in range(sizes.rounds):
      start = time.perf_counter()
      for _ in range(sizes.steps):
        state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
      per_round.append((time.perf_counter() - start) / sizes.steps)
  return statistics.median(per_round), state, metrics


def _failure(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"failed: {type(e).__name__}: {text[0][:200] if text else ''}"


def compile_wave(lowered: list, options=None) -> list:
  """(compiled, seconds) of each lowered program, compiled concurrently; (None, failure status) where one raised."""
  if not lowered:
    return []
  with concurrent.futures.ThreadPoolExecutor(max_workers=len(lowered)) as pool:
    return _gather([pool.submit(_compile, low, options) for low in lowered])


# --- section a: the CLIP step, each attention kind -----------------------------------------------------------------

def matmul_rate(rec: record.Recorder, sizes: record.Sizes) -> float:
  """FLOP/s of one jitted n^3 bf16 matmul on the default device, back-to-back calls: the rate this card reaches
  in this run (clocks and power limits differ by host), beside the datasheet's peak."""
  n = sizes.matmul
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(k1, (n, n), jnp.bfloat16)
  b = jax.random.normal(k2, (n, n), jnp.bfloat16)
  f = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(f(a, b))
  calls = 20 if jax.default_backend() != "cpu" else 3
  times = []
  for _ in range(5):
    start = time.perf_counter()
    out = [f(a, b) for _ in range(calls)]
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / calls)
  rate = 2.0 * n ** 3 / min(times)
  peak = record.datasheet_peak(jax.devices()[0].device_kind)
  rec.row("a", f"bf16 matmul {n} x {n} x {n}, jitted (the card's measured rate)", rate / 1e12, "TFLOP/s",
          vs=rate / peak[0] if peak else None, ref="of the datasheet peak" if peak else "",
          note="the denominator of the measured-rate MFU", matmul_n=n, seconds=min(times))
  return rate


class CLIPWorker:
  """Section a at one per-GPU batch: the CLIP ViT-B/16 step for each attention kind that can run here. Prepared:
  each kind's program compiled (its memory footprint recorded at once: section d's line reads it) and one train
  state (the kinds share its layout). Turn: the matmul rate (the first batch's worker), each program timed, the
  process's peak memory."""

  def __init__(self, rec: record.Recorder, sizes: record.Sizes, batch: int, workdir: str, *, matmul: bool):
    from ncjax.models.layers import cudnn_refusal
    self.rec, self.sizes, self.batch, self.matmul = rec, sizes, batch, matmul
    n_dev = jax.device_count()
    self.configs = []
    for kind in ATTENTION_KINDS:
      why = (cudnn_refusal(dtype=jnp.bfloat16, head_dim=_head_dim(sizes.model), platform=jax.default_backend())
             if kind == "cudnn" else None)
      if why:
        rec.row("a", _a_config(sizes, batch, kind), status=f"skipped: {why}", attention=kind, batch=batch)
      else:
        self.configs.append(kind)
    data = _dataset("random", max(sizes.batches) * n_dev)
    self.setups = [Setup(method_config("clip", "noise=0", model=sizes.model, global_batch=batch * n_dev, data=data,
                                       attention=kind), os.path.join(workdir, f"a_{batch}_{kind}"))
                   for kind in self.configs]
    # each kind lowered on its own: a kind that cannot be traced here (cuDNN refusing a shape) is its row's
    # failure, not the worker's
    lowered = [_lower_or_failure(s) for s in self.setups]
    waves = compile_wave([low for low in lowered if not isinstance(low, str)])
    self.compiled = [(None, low) if isinstance(low, str) else waves.pop(0) for low in lowered]
    for kind, (compiled, compile_s) in zip(self.configs, self.compiled):
      if compiled is not None:
        rec.write(dict(kind="compiled", section="a", attention=kind, batch=batch, compile_s=compile_s,
                       footprint_bytes=footprint(compiled)))
    self.state = self.setups[0].init_state() if self.setups else None

  def turn(self) -> None:
    rec, sizes, batch = self.rec, self.sizes, self.batch
    n_dev = jax.device_count()
    rate = matmul_rate(rec, sizes) if self.matmul else _matmul_from_rows(rec.out)
    peak = record.datasheet_peak(jax.devices()[0].device_kind)
    state, layout = self.state, _state_layout(self.setups[0]) if self.setups else None
    for kind, s, (compiled, compile_s) in zip(self.configs, self.setups, self.compiled):
      config = _a_config(sizes, batch, kind)
      if compiled is None:
        rec.row("a", config, status=compile_s, attention=kind, batch=batch)
        continue
      if not rec.fits("timing"):
        rec.row("a", config, status=record.NOT_RUN_TIME, attention=kind, batch=batch, compile_s=compile_s)
        continue
      if _state_layout(s) != layout:
        state, layout = s.init_state(), _state_layout(s)
      try:
        seconds, state, metrics = time_steps(compiled, state, s.pipeline_batch(), sizes, s.mesh)
      except Exception as e:
        rec.row("a", config, status=_failure(e), attention=kind, batch=batch, compile_s=compile_s)
        state, layout = s.init_state(), _state_layout(s)   # the failed call may have consumed the donated state
        continue
      flops = train_step_flops(s.spec, s.global_batch, method="clip")
      mfu_peak = flops / seconds / (peak[0] * n_dev) if peak else None
      mfu_measured = flops / seconds / (rate * n_dev) if rate else None
      fp = footprint(compiled)
      loss = _loss_of(metrics)
      rec.row("a", config, s.global_batch / seconds, "pairs/s", vs=mfu_peak,
              ref=f"MFU of the datasheet peak ({peak[1]})" if peak else "",
              note=f"step {seconds * 1e3:.1f} ms, {flops / 1e12:.2f} TFLOP/step, compile {compile_s:.0f} s"
                   + (f", footprint {fp / 2**30:.2f} GiB" if fp else ""),
              attention=kind, batch=batch, global_batch=s.global_batch, step_s=seconds, model_flops=flops,
              mfu_peak=mfu_peak, mfu_measured=mfu_measured, peak_flops=peak[0] if peak else None,
              peak_source=peak[1] if peak else None,
              xla_flops=common.compiled_flops(compiled, partitions=n_dev), footprint_bytes=fp, compile_s=compile_s,
              loss=loss, finite=math.isfinite(loss), n_devices=n_dev)
    _peak_row(rec, sizes, batch)


def _matmul_from_rows(out: str) -> float | None:
  rows = [r for r in record.read_rows(out) if r.get("kind") == "row" and r.get("unit") == "TFLOP/s"
          and r.get("status") == "ok"]
  return rows[-1]["value"] * 1e12 if rows else None


def _head_dim(model: str) -> int:
  """The smallest head size of the two towers (what decides whether cuDNN's kernel can run them)."""
  from ncjax.models import get_size
  towers = get_size(model)
  return min(towers[t]["width"] // towers[t]["heads"] for t in ("image", "text"))


def _lower_or_failure(setup: "Setup"):
  try:
    return setup.lower(setup.pipeline_batch())
  except Exception as e:
    return _failure(e)


def _auto_attention(model: str) -> str:
  """What model.attention='auto' resolves to here for `model` in bf16."""
  from ncjax.models.layers import resolve_attention
  return resolve_attention("auto", dtype=jnp.bfloat16, head_dim=_head_dim(model))


def _a_config(sizes, batch, kind):
  return f"CLIP {sizes.model} bf16, attention={kind}, batch {batch}/GPU"


def _peak_row(rec, sizes, batch):
  """Section d's first rows: this process's peak device memory after section a's steps at `batch` (its attention
  kinds; each batch's worker is a process of its own)."""
  peak = device_memory().get("peak_bytes_in_use")
  label = f"peak device memory, CLIP {sizes.model} batch {batch}/GPU (section a's steps)"
  if peak is None:
    rec.row("d", label, status="skipped: this backend reports no memory statistics (section a's footprints are in "
                               "its rows)", batch=batch)
    return
  rec.row("d", label, peak / 2**30, "GiB", note="process peak over the attention kinds", batch=batch,
          peak_bytes=peak)


# --- section d: the largest batch that fits -----------------------------------------------------------------------

class MemoryWorker:
  """Section c's ncjax side and section d. Prepared: the largest per-GPU ViT-B/16 CLIP batch that fits, with and
  without rematerialisation, from compiled programs' memory analyses. A program's footprint grows linearly with the
  batch, so two compiles give a line (remat off: section a's two batches at the kind 'auto' picks, read from its
  workers' records; remat on: compiled here); each line's prediction at the device's limit and 90% of it are then
  compiled together (the smoke run: the prediction only), and the larger that fits is the answer: at most six
  compiles in three waves. Turn: the NCU
  loss timings, one real step at each batch found."""

  def __init__(self, rec: record.Recorder, sizes: record.Sizes, workdir: str, *, wait_for_a_s: float):
    self.rec, self.sizes, self.workdir = rec, sizes, workdir
    n_dev = self.n_dev = jax.device_count()
    self.kind = _auto_attention(sizes.model)
    self.b1, self.b2 = sorted(sizes.batches)[:2]
    self.data = _dataset("broadcast", self.b2 * n_dev)
    self.found = {}
    self.programs = {}   # (remat, batch): (compiled, setup, compile seconds) of the programs compiled here
    points = {True: self._own_points(True)}
    memory = device_memory()
    points[False] = self._a_points(wait_for_a_s) or self._own_points(False)
    limit = memory.get("bytes_limit")
    limit_note = "the device's bytes_limit"
    if not limit:
      known = [f for f in points[False].values() if f]
      limit = int(SMOKE_NOMINAL_LIMIT * max(known)) if known else None
      limit_note = f"nominal: {SMOKE_NOMINAL_LIMIT:g}x the batch-{self.b2} footprint (this backend reports no limit)"
    self.limit = limit
    if limit is None or any(points[r].get(b) is None for r in (False, True) for b in (self.b1, self.b2)):
      rec.row("d", f"largest batch that fits, {sizes.model}", status="failed: no memory analysis of the steps")
      return
    rec.row("d", "device memory limit", limit / 2**30, "GiB", note=limit_note, bytes_limit=limit)
    for remat in (True, False):   # remat's line is known first; each wave compiles one line's two candidates
      self.found[remat] = self._candidates(remat, points[remat])
      _fit_rows(rec, sizes, self.found[remat], remat, limit)
    self.programs = {}   # what the search did not choose is not kept

  def _setup(self, remat: bool, batch: int) -> Setup:
    cfg = method_config("clip", "noise=0", model=self.sizes.model, global_batch=batch * self.n_dev,
                        data=_dataset("broadcast", batch * self.n_dev), attention=self.kind, remat=remat)
    return Setup(cfg, os.path.join(self.workdir, f"d_{remat}_{batch}_{time.monotonic_ns()}"))

  def _abstract_batch(self, template: Setup, batch: int):
    return {k: jax.ShapeDtypeStruct((batch * self.n_dev,) + v.shape[1:], v.dtype, sharding=template.prog.batch_sh)
            for k, v in template.pipeline_batch().items()}

  def _own_points(self, remat: bool) -> dict:
    setups = {b: self._setup(remat, b) for b in (self.b1, self.b2)}
    if not hasattr(self, "template"):
      self.template = setups[self.b1]
    results = compile_wave([s.lower(s.pipeline_batch()) for s in setups.values()], MEMORY_SEARCH_OPTIONS)
    self.programs.update({(remat, b): (compiled, s, compile_s)
                          for (b, s), (compiled, compile_s) in zip(setups.items(), results) if compiled is not None})
    return {b: footprint(compiled) if compiled is not None else None for b, (compiled, _) in zip(setups, results)}

  def _a_points(self, wait_s: float) -> dict | None:
    """{batch: footprint} of section a's programs at the kind 'auto' picks, waiting up to `wait_s` for its workers
    to compile them; None if they do not."""
    until = time.time() + wait_s
    while True:
      rows = [r for r in record.read_rows(self.rec.out) if r.get("kind") == "compiled" and r.get("section") == "a"
              and r.get("attention") == self.kind and r.get("footprint_bytes")]
      points = {r["batch"]: r["footprint_bytes"] for r in rows}
      if self.b1 in points and self.b2 in points:
        return {b: points[b] for b in (self.b1, self.b2)}
      if time.time() >= until:
        return None
      time.sleep(2)

  def _candidates(self, remat: bool, points: dict) -> dict:
    slope = (points[self.b2] - points[self.b1]) / (self.b2 - self.b1)
    intercept = points[self.b1] - slope * self.b1
    predicted = _batch_at(slope, intercept, self.limit, self.n_dev)
    batches = sorted({max(8, int(f * predicted) // 8 * 8) for f in self.sizes.candidates})
    found = dict(slope=slope, intercept=intercept, predicted=predicted, tried={})
    if not self.rec.fits("compile"):
      found["error"] = record.NOT_RUN_TIME
      return found
    # a candidate compiled already as a point of its line is that program (the same batch and options)
    new = [b for b in batches if (remat, b) not in self.programs]
    setups = {b: self._setup(remat, b) for b in new}
    results = compile_wave([setups[b].lower(self._abstract_batch(self.template, b)) for b in new],
                           MEMORY_SEARCH_OPTIONS)
    programs = {b: self.programs[(remat, b)] for b in batches if b not in setups}
    programs.update({b: (compiled, setups[b], compile_s) for b, (compiled, compile_s) in zip(new, results)})
    for b in batches:
      compiled, s, compile_s = programs[b]
      if compiled is None:
        found.setdefault("error", compile_s)
        continue
      fb = footprint(compiled)
      found["tried"][b] = fb
      if fb <= self.limit and b > found.get("batch", 0):
        found.update(batch=b, footprint=fb, compiled=compiled, setup=s, compile_s=compile_s,
                     prediction_error=fb / (intercept + slope * b) - 1)
    return found

  def turn(self) -> None:
    ncu_section(self.rec, self.sizes)
    self.turn_memory()

  def turn_memory(self) -> None:
    """Section d's part of the turn alone (`--sections` without c)."""
    _real_steps(self.rec, self.sizes, self.found, getattr(self, "template", None))


def _batch_at(slope: float, intercept: float, limit: int, n_dev: int) -> int:
  """The largest per-GPU batch, a multiple of 8, whose predicted footprint stays under the headroom of `limit`."""
  batch = int((MEMORY_HEADROOM * limit - intercept) / slope) if slope > 0 else 8
  return max(8, batch // 8 * 8)


def _fit_rows(rec, sizes, found, remat, limit):
  label = f"largest CLIP {sizes.model} bf16 batch/GPU that fits, remat={remat}"
  line = f"line {found['slope'] / 2**20:.2f} MiB/example + {found['intercept'] / 2**30:.2f} GiB"
  tried = ", ".join(f"{b}: {f / 2**30:.2f} GiB" for b, f in sorted(found["tried"].items()))
  if "batch" not in found:
    status = found.get("error") or f"failed: neither candidate fits ({tried})"
    rec.row("d", label, status=status, note=f"predicted {found['predicted']}, {line}", remat=remat,
            predicted=found["predicted"])
    return
  rec.row("d", label, found["batch"], "examples", vs=found["footprint"] / limit, ref="footprint / limit",
          note=f"{line}; predicted {found['predicted']}; compiled {tried} ({found['prediction_error']:+.1%} off the "
               f"line at {found['batch']})",
          remat=remat, batch=found["batch"], footprint_bytes=found["footprint"], predicted=found["predicted"],
          slope=found["slope"], intercept=found["intercept"], limit=limit, compile_s=found["compile_s"],
          tried=found["tried"])


def _real_steps(rec, sizes, found, template):
  """Two steps at each batch found (the first may warm up; the second is timed), on a batch tiled from the
  template's pipeline batch; remat changes no parameter, so both share one train state."""
  state = layout = None
  for remat in (True, False):
    f = found.get(remat, {})
    label = f"real step at the largest batch, remat={remat}"
    if "compiled" not in f:
      rec.row("d", label, status="skipped: no batch that fits was found", remat=remat)
      continue
    if not rec.fits("steps_large", 0.5):
      rec.row("d", label, status=record.NOT_RUN_TIME, remat=remat, batch=f["batch"])
      continue
    s = f["setup"]
    n = f["batch"] * jax.device_count()
    try:
      base = template.pipeline_batch()
      batch = jax.device_put({k: np.resize(np.asarray(v), (n,) + v.shape[1:]) for k, v in base.items()},
                             s.prog.batch_sh)
      if layout != _state_layout(s):
        state, layout = s.init_state(), _state_layout(s)
      with jax.set_mesh(s.mesh):
        state, metrics = f["compiled"](state, batch)
        jax.block_until_ready(metrics)
        start = time.perf_counter()
        state, metrics = f["compiled"](state, batch)
        jax.block_until_ready((state, metrics))
      seconds = time.perf_counter() - start
    except Exception as e:
      rec.row("d", label, status=_failure(e), remat=remat, batch=f["batch"])
      state = layout = None
      continue
    peak = device_memory().get("peak_bytes_in_use")
    loss = _loss_of(metrics)
    rec.row("d", label + f" ({f['batch']}/GPU)", n / seconds, "pairs/s",
            note=f"step {seconds:.2f} s, untuned kernels" + (f", process peak {peak / 2**30:.1f} GiB" if peak else ""),
            remat=remat, batch=f["batch"], step_s=seconds, peak_bytes=peak, loss=loss, finite=math.isfinite(loss))
    del batch


# --- section e: every method against CLIP --------------------------------------------------------------------------

class MethodsWorker:
  """Section e for some of the methods: prepared, their steps compiled (no state: each method's is made in the
  turn and dropped after its timing, so nothing is held while section d runs at the largest batch); turn, each
  timed against CLIP's step — section a's at the kind 'auto' picks (the same program on the same card), else timed
  here when CLIP is among `names`."""

  def __init__(self, rec: record.Recorder, sizes: record.Sizes, names: list[str], workdir: str):
    from benchmarks.steps import METHODS
    self.rec, self.sizes, self.names = rec, sizes, list(names)
    n_dev = jax.device_count()
    batch = sizes.methods_batch
    # AC / HAC train on N retain + N forget pairs of the keyword 'cat' (about a third of the synthetic captions).
    data = _dataset("random", max(1024, 4 * batch * n_dev))
    self.setups = {}
    for name in self.names:
      config_name, arg = METHODS[name]
      try:
        self.setups[name] = Setup(method_config(config_name, arg, model=sizes.model, global_batch=batch * n_dev,
                                                data=data, attention=_auto_attention(sizes.model)),
                                  os.path.join(workdir, f"e_{config_name}"))
      except Exception as e:
        rec.row("e", _e_config(sizes, name, batch), status=_failure(e), method=name)
    lowered = {name: _lower_or_failure(s) for name, s in self.setups.items()}
    for name in [n for n, low in lowered.items() if isinstance(low, str)]:
      rec.row("e", _e_config(sizes, name, batch), status=lowered.pop(name), method=name)
      del self.setups[name]
    self.compiled = dict(zip(lowered, compile_wave(list(lowered.values()))))

  def turn(self) -> None:
    rec, sizes, batch = self.rec, self.sizes, self.sizes.methods_batch
    clip = _clip_from_a(rec.out, batch, _auto_attention(sizes.model))
    clip_s = clip["step_s"] if clip else None
    for name, s in self.setups.items():
      compiled, compile_s = self.compiled[name]
      config = _e_config(sizes, name, batch)
      if compiled is None:
        rec.row("e", config, status=compile_s, method=name)
        continue
      if not rec.fits("init") or not rec.fits("timing"):
        rec.row("e", config, status=record.NOT_RUN_TIME, method=name, compile_s=compile_s)
        continue
      try:
        seconds, _, metrics = time_steps(compiled, s.init_state(), s.pipeline_batch(), sizes, s.mesh)
      except Exception as e:
        rec.row("e", config, status=_failure(e), method=name, compile_s=compile_s)
        continue
      if name == "CLIP":
        clip_s = seconds
      loss = _loss_of(metrics)
      rec.row("e", config, seconds * 1e3, "ms/step", vs=seconds / clip_s if clip_s else None,
              ref="CLIP's step" if clip_s else "", note=f"compile {compile_s:.0f} s", method=name, step_s=seconds,
              global_batch=s.global_batch, loss=loss, finite=math.isfinite(loss), compile_s=compile_s)


def clip_reference_row(rec: record.Recorder, sizes: record.Sizes) -> None:
  """Section e's CLIP row: section a's step at the batch and kind section e uses (written once, by the first
  section-e worker's turn)."""
  batch = sizes.methods_batch
  clip = _clip_from_a(rec.out, batch, _auto_attention(sizes.model))
  if clip:
    rec.row("e", _e_config(sizes, "CLIP", batch), clip["step_s"] * 1e3, "ms/step", vs=1.0, ref="CLIP's step",
            note=f"section a's step (attention={clip['attention']})", method="CLIP", step_s=clip["step_s"],
            global_batch=clip["global_batch"])


def _clip_from_a(out: str, batch: int, kind: str):
  rows = [r for r in record.read_rows(out) if r.get("kind") == "row" and r.get("section") == "a"
          and r.get("status") == "ok" and r.get("batch") == batch and r.get("attention") == kind]
  return rows[0] if rows else None


def _e_config(sizes, name, batch):
  return f"{name}, {sizes.model} bf16, attention={_auto_attention(sizes.model)}, batch {batch}/GPU"


# --- section c: ncjax's NCU stage-2 loss ---------------------------------------------------------------------------

def ncu_section(rec: record.Recorder, sizes: record.Sizes) -> None:
  """ncjax's stage-2 loss and its gradient (forget selection included, as the public loop's timing includes it),
  jitted, at each N; at sizes.ncu_check also its value at float32 ('highest') matmul precision, which the table
  compares with the public loop's (a GPU's default float32 matmul is TF32, ~1e-3 off)."""
  from ncjax.losses import ncu

  def loss(v, t, tn):
    forget, _ = ncu.select_forget(v, t, record.NCU_LOGIT_SCALE, record.NCU_FORGET_RATIO)
    out = ncu.unlearning(v, t, tn, record.NCU_LOGIT_SCALE, forget, ncu.UnlearningOptions())
    return out.loss, out.scalars

  largest = max(sizes.ncu_sizes)
  for n in sizes.ncu_sizes:
    config = f"ncjax.losses.ncu.unlearning (kernel Sinkhorn), loss + gradient, N = {n}, D = {record.NCU_DIM}"
    if not rec.fits("ncu_jax", max(0.3, (n / largest) ** 2)):
      rec.row("c", config, status=record.NOT_RUN_TIME, n=n, side="jax")
      continue
    v, t, tn = (jnp.asarray(x) for x in record.ncu_inputs(n))
    try:
      f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
      seconds, _ = common.time_fn(f, v, t, tn, warmup=1, repeats=3)
      (_, scalars), _ = f(v, t, tn)
      value = None
      if n == sizes.ncu_check:
        with jax.default_matmul_precision("highest"):
          value = float(jax.jit(lambda v, t, tn: loss(v, t, tn)[0])(v, t, tn))
    except Exception as e:
      rec.row("c", config, status=_failure(e), n=n, side="jax")
      continue
    iterations = (int(scalars["sinkhorn_iterations_img"]), int(scalars["sinkhorn_iterations_txt"]))
    rec.row("c", config, seconds, "s", note=f"Sinkhorn iterations {iterations}", n=n, side="jax", loss=value,
            iterations=iterations, value_check=value is not None)
    del v, t, tn


def machine(rec: record.Recorder) -> None:
  dev = jax.devices()[0]
  rec.write(dict(kind="machine", platform=dev.platform, device_kind=dev.device_kind, n_devices=jax.device_count(),
                 jax=jax.__version__, jaxlib=metadata.version("jaxlib")))


def prepare(name: str, rec: record.Recorder, sizes: record.Sizes, workdir: str, *, e_methods: list[str],
            wait_for_a_s: float):
  """The worker `name` of the plan, prepared: an object whose `turn()` runs its measurements."""
  if name in ("a256", "a512"):
    batch = sorted(sizes.batches)[0 if name == "a256" else 1]
    return CLIPWorker(rec, sizes, batch, workdir, matmul=name == "a256")
  if name == "cd":
    return MemoryWorker(rec, sizes, workdir, wait_for_a_s=wait_for_a_s)
  if name in ("e1", "e2"):
    return MethodsWorker(rec, sizes, e_methods, workdir)
  raise ValueError(f"no JAX worker {name!r}")
