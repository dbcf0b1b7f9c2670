"""The JAX side of the accelerator check: ncjax's real train steps on the device (sections a, d, e) and its NCU
stage-2 loss (section c), in a process that imports no torch.

A step is the trainer's own: a `Trainer` built from the method's config, the `StageProgram` of its first stage with
steps, its jitted step lowered and compiled ahead of time, then called on a device-resident batch of the training
pipeline, the state passed from call to call as the trainer does (donated). Compiles are what costs time on a GPU
(tens of seconds per ViT-B/16 step), so every section lowers its programs first and compiles them together on a
thread pool (XLA compiles without the GIL, each compile mostly on one core), initialising train states on the main
thread meanwhile; configurations that share a state layout share one state.

The synthetic data is made small: the embedded `synthetic` set at 224 px would generate 4,096 images (2.4 GB) per
trainer. Sections a and e register a set with just the examples their batches need (random pixels: NCU's forget
selection and Sinkhorn see real variety), section d one whose images are a single broadcast image (its batches of
thousands of examples only need shapes).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import math
import os
import statistics
import tempfile
import time
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.accelerator import record
from benchmarks.flops import train_step_flops

# 'auto' picks cuDNN on a GPU in bf16; the three concrete kinds are what section a compares.
ATTENTION_KINDS = ("einsum", "xla", "cudnn")
# d: the predicted largest batch is aimed at this share of the device's memory limit (the allocator's
# fragmentation and the runtime's own buffers take some of the rest).
MEMORY_HEADROOM = 0.97
# d on the CPU (smoke run), which has no device memory limit: a nominal limit this many times the larger batch's
# footprint, so that the search runs the same way.
SMOKE_NOMINAL_LIMIT = 4.0


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


def _compile(lowered):
  start = time.perf_counter()
  compiled = lowered.compile()
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


def time_steps(compiled, state, batch, plan: record.Plan, mesh):
  """(median seconds per step over the plan's rounds, the state after, the last metrics): back-to-back calls on the
  same device batch, blocked once per round, after warm-up calls."""
  with jax.set_mesh(mesh):
    for _ in range(plan.warmup):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    per_round = []
    for _ in range(plan.rounds):
      start = time.perf_counter()
      for _ in range(plan.steps):
        state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
      per_round.append((time.perf_counter() - start) / plan.steps)
  return statistics.median(per_round), state, metrics


def _failure(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"failed: {type(e).__name__}: {text[0][:200] if text else ''}"


@contextlib.contextmanager
def _compiler(plan: record.Plan):
  with concurrent.futures.ThreadPoolExecutor(max_workers=plan.compile_threads) as pool:
    yield pool


# --- section a: the CLIP step, each attention kind -----------------------------------------------------------------

def matmul_rate(rec: record.Recorder, plan: record.Plan) -> float:
  """FLOP/s of one jitted n^3 bf16 matmul on the default device, back-to-back calls: the card's rate that MFU is a
  fraction of, measured in this run instead of taken from a data sheet (clocks and power limits differ by host)."""
  n = plan.matmul
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
  rec.row("a", f"bf16 matmul {n} x {n} x {n}, jitted (the card's measured rate)", rate / 1e12, "TFLOP/s",
          note="the denominator of MFU below", matmul_n=n, seconds=min(times))
  return rate


def clip_section(rec: record.Recorder, plan: record.Plan, workdir: str) -> None:
  from ncjax.models.layers import cudnn_refusal
  n_dev = jax.device_count()
  rate = matmul_rate(rec, plan)
  kinds = []
  for kind in ATTENTION_KINDS:
    why = (cudnn_refusal(dtype=jnp.bfloat16, head_dim=_head_dim(plan.model), platform=jax.default_backend())
           if kind == "cudnn" else None)
    if why:
      rec.row("a", f"{plan.model} bf16, attention={kind}", status=f"skipped: {why}", attention=kind)
    else:
      kinds.append(kind)
  data = _dataset("random", max(plan.batches) * n_dev)
  configs = [(batch, kind) for batch in sorted(plan.batches) for kind in kinds]
  if not rec.fits("vit_compile_round"):
    for batch, kind in configs:
      rec.row("a", _a_config(plan, batch, kind), status=record.NOT_RUN_TIME, attention=kind, batch=batch)
    return
  setups, futures = [], []
  with _compiler(plan) as pool:
    for batch, kind in configs:
      s = Setup(method_config("clip", "noise=0", model=plan.model, global_batch=batch * n_dev, data=data,
                              attention=kind), os.path.join(workdir, f"a_{batch}_{kind}"))
      setups.append(s)
      futures.append(pool.submit(_compile, s.lower(s.pipeline_batch())))
    state, layout = setups[0].init_state(), _state_layout(setups[0])
    results = _gather(futures)   # nothing is timed while a compile may still be autotuning kernels on the device
  done_batch = None
  for (batch, kind), s, (compiled, compile_s) in zip(configs, setups, results):
    if done_batch is not None and batch != done_batch:
      _peak_row(rec, plan, done_batch)
    done_batch = batch
    config = _a_config(plan, batch, kind)
    if compiled is None:
      rec.row("a", config, status=compile_s, attention=kind, batch=batch)
      continue
    if not rec.fits("vit_timing"):
      rec.row("a", config, status=record.NOT_RUN_TIME, attention=kind, batch=batch, compile_s=compile_s)
      continue
    if _state_layout(s) != layout:
      state, layout = s.init_state(), _state_layout(s)
    try:
      seconds, state, metrics = time_steps(compiled, state, s.pipeline_batch(), plan, s.mesh)
    except Exception as e:
      rec.row("a", config, status=_failure(e), attention=kind, batch=batch, compile_s=compile_s)
      state, layout = s.init_state(), _state_layout(s)   # the failed call may have consumed the donated state
      continue
    flops = train_step_flops(s.spec, s.global_batch, method="clip")
    mfu = flops / seconds / (rate * n_dev)
    fp = footprint(compiled)
    loss = _loss_of(metrics)
    rec.row("a", config, s.global_batch / seconds, "pairs/s", vs=mfu, ref="MFU (model FLOPs / measured rate)",
            note=f"step {seconds * 1e3:.1f} ms, {flops / 1e12:.2f} TFLOP/step, compile {compile_s:.0f} s"
                 + (f", footprint {fp / 2**30:.2f} GiB" if fp else ""),
            attention=kind, batch=batch, global_batch=s.global_batch, step_s=seconds, model_flops=flops,
            xla_flops=common.compiled_flops(compiled, partitions=n_dev), footprint_bytes=fp, compile_s=compile_s,
            loss=loss, finite=math.isfinite(loss), n_devices=n_dev)
  if done_batch is not None:
    _peak_row(rec, plan, done_batch)


def _head_dim(model: str) -> int:
  """The smallest head size of the two towers (what decides whether cuDNN's kernel can run them)."""
  from ncjax.models import get_size
  towers = get_size(model)
  return min(towers[t]["width"] // towers[t]["heads"] for t in ("image", "text"))


def _auto_attention(model: str) -> str:
  """What model.attention='auto' resolves to here for `model` in bf16."""
  from ncjax.models.layers import resolve_attention
  return resolve_attention("auto", dtype=jnp.bfloat16, head_dim=_head_dim(model))


def _a_config(plan, batch, kind):
  return f"CLIP {plan.model} bf16, attention={kind}, batch {batch}/GPU"


def _peak_row(rec, plan, batch):
  """Section d's first rows: the process's peak device memory after section a's steps at `batch` (the allocator's
  peak cannot be reset, so batches run in increasing order and each peak covers that batch's attention kinds)."""
  peak = device_memory().get("peak_bytes_in_use")
  if peak is None:
    rec.row("d", f"peak device memory, CLIP {plan.model} batch {batch}/GPU (section a's steps)",
            status="skipped: this backend reports no memory statistics (section a's footprints are in its rows)",
            batch=batch)
    return
  rec.row("d", f"peak device memory, CLIP {plan.model} batch {batch}/GPU (section a's steps)", peak / 2**30,
          "GiB", note="process peak over the attention kinds", batch=batch, peak_bytes=peak)


# --- section d: the largest batch that fits -----------------------------------------------------------------------

def memory_section(rec: record.Recorder, plan: record.Plan, workdir: str, out: str) -> None:
  """The largest per-GPU ViT-B/16 CLIP batch that fits, with and without rematerialisation, from compiled programs'
  memory analyses: a program's footprint grows linearly with the batch, so two compiles give the line, the
  prediction at the limit is confirmed by compiling it (and corrected once, through the confirmed point, if it
  does not fit), and one real step then runs at that batch."""
  n_dev = jax.device_count()
  b1, b2 = sorted(plan.batches)[:2]
  from_a = _section_a_points(out)
  kind = from_a["kind"] if from_a else "auto"
  data = _dataset("broadcast", b2 * n_dev)
  small = {}   # (remat, batch) -> Setup, for the line's points

  def setup(remat, batch, data=data):
    cfg = method_config("clip", "noise=0", model=plan.model, global_batch=batch * n_dev, data=data,
                        attention=kind, remat=remat)
    return Setup(cfg, os.path.join(workdir, f"d_{remat}_{batch}_{time.monotonic_ns()}"))

  def abstract_batch(template: Setup, batch):
    return {k: jax.ShapeDtypeStruct((batch * n_dev,) + v.shape[1:], v.dtype, sharding=template.prog.batch_sh)
            for k, v in template.pipeline_batch().items()}

  points = {False: dict(from_a["points"]) if from_a else {}, True: {}}
  if not rec.fits("vit_compile_round", 2):
    rec.row("d", f"largest batch that fits, {plan.model}", status=record.NOT_RUN_TIME)
    return
  with _compiler(plan) as pool:
    jobs = {}
    for remat in (False, True):
      for batch in (b1, b2):
        if batch not in points[remat]:
          small[remat, batch] = s = setup(remat, batch)
          jobs[remat, batch] = pool.submit(_compile, s.lower(s.pipeline_batch()))
    for (remat, batch), fut in jobs.items():
      try:
        points[remat][batch] = footprint(fut.result()[0])
      except Exception as e:
        rec.row("d", f"footprint, remat={remat}, batch {batch}/GPU", status=_failure(e))
    memory = device_memory()
    limit = memory.get("bytes_limit")
    limit_note = "the device's bytes_limit"
    if not limit:
      known = [f for f in points[False].values() if f]
      limit = int(SMOKE_NOMINAL_LIMIT * max(known)) if known else None
      limit_note = f"nominal: {SMOKE_NOMINAL_LIMIT:g}x the batch-{b2} footprint (this backend reports no limit)"
    if limit is None or any(points[r].get(b) is None for r in (False, True) for b in (b1, b2)):
      rec.row("d", f"largest batch that fits, {plan.model}", status="failed: no memory analysis of the steps")
      return
    rec.row("d", "device memory limit", limit / 2**30, "GiB", note=limit_note, bytes_limit=limit)
    template = small.get((False, b1)) or setup(False, b1)
    found = {}
    for remat in (False, True):
      slope = (points[remat][b2] - points[remat][b1]) / (b2 - b1)
      intercept = points[remat][b1] - slope * b1
      found[remat] = dict(slope=slope, intercept=intercept, predicted=_batch_at(slope, intercept, limit, n_dev))
    pending = {r: found[r]["predicted"] for r in (False, True)}
    for attempt in (1, 2):   # the prediction, then at most one correction through the confirmed point
      if not pending or not rec.fits("vit_compile_round"):
        break
      jobs = {}
      for remat, batch in pending.items():
        s = setup(remat, batch, data=_dataset("broadcast", batch * n_dev))
        found[remat]["setup"] = s
        jobs[remat] = pool.submit(_compile, s.lower(abstract_batch(template, batch)))
      pending = {}
      for remat, fut in jobs.items():
        f = found[remat]
        try:
          compiled, compile_s = fut.result()
        except Exception as e:
          f["error"] = _failure(e)
          continue
        batch = f["setup"].global_batch // n_dev
        fb = footprint(compiled)
        f.update(batch=batch, footprint=fb, compiled=compiled, compile_s=compile_s, attempts=attempt,
                 prediction_error=fb / (f["intercept"] + f["slope"] * batch) - 1)
        if fb > limit and attempt == 1:
          slope = (fb - points[remat][b2]) / (batch - b2)
          pending[remat] = _batch_at(slope, fb - slope * batch, limit, n_dev)
          f["over_limit"] = batch
    for remat in (False, True):
      _fit_rows(rec, plan, found[remat], remat, limit, remat in pending)
  _real_steps(rec, plan, found, template, limit)


def _section_a_points(out: str):
  """{kind, points: {batch: footprint}} of section a's fastest attention kind at its largest batch, or None."""
  rows = [r for r in record.read_rows(out) if r.get("kind") == "row" and r.get("section") == "a"
          and r.get("status") == "ok" and r.get("footprint_bytes")]
  if not rows:
    return None
  top = max(r["batch"] for r in rows)
  best = max((r for r in rows if r["batch"] == top), key=lambda r: r["value"])
  points = {r["batch"]: r["footprint_bytes"] for r in rows if r["attention"] == best["attention"]}
  return dict(kind=best["attention"], points=points) if len(points) >= 2 else None


def _batch_at(slope: float, intercept: float, limit: int, n_dev: int) -> int:
  """The largest per-GPU batch, a multiple of 8, whose predicted footprint stays under the headroom of `limit`."""
  batch = int((MEMORY_HEADROOM * limit - intercept) / slope) if slope > 0 else 8
  return max(8, batch // 8 * 8)


def _fit_rows(rec, plan, found, remat, limit, correction_pending):
  label = f"largest CLIP {plan.model} bf16 batch/GPU that fits, remat={remat}"
  line = f"line {found['slope'] / 2**20:.2f} MiB/example + {found['intercept'] / 2**30:.2f} GiB"
  if "footprint" not in found:
    rec.row("d", label, status=found.get("error", record.NOT_RUN_TIME), note=f"predicted {found['predicted']}, {line}",
            remat=remat, predicted=found["predicted"])
    return
  fits = found["footprint"] <= limit
  if fits:
    status = "ok"
  elif correction_pending:   # over the limit, and no time left to compile the corrected batch
    status = record.NOT_RUN_TIME
  else:
    status = "failed: the corrected prediction does not fit either"
  rec.row("d", label, found["batch"] if fits else None, "examples", vs=found["footprint"] / limit,
          ref="footprint / limit", status=status,
          note=f"{line}; predicted {found['predicted']}, compiled {found['batch']}: footprint "
               f"{found['footprint'] / 2**30:.2f} GiB ({found['prediction_error']:+.1%} off the line)",
          remat=remat, batch=found["batch"], footprint_bytes=found["footprint"], predicted=found["predicted"],
          slope=found["slope"], intercept=found["intercept"], limit=limit, compile_s=found["compile_s"],
          over_limit=found.get("over_limit"), compiles=found["attempts"])


def _real_steps(rec, plan, found, template: Setup, limit):
  """One timed step (after one that may warm up) at each batch found, on a batch tiled from the template's pipeline
  batch; remat changes no parameter, so both share one train state."""
  base = template.pipeline_batch()
  state = layout = None
  for remat in (False, True):
    f = found[remat]
    label = f"real step at the largest batch, remat={remat}"
    if "compiled" not in f or f["footprint"] > limit:
      rec.row("d", label, status="skipped: no batch that fits was found", remat=remat)
      continue
    if not rec.fits("vit_init") or not rec.fits("vit_timing", 2 * f["batch"] / max(plan.batches)):
      rec.row("d", label, status=record.NOT_RUN_TIME, remat=remat, batch=f["batch"])
      continue
    s = f["setup"]
    n = f["batch"] * jax.device_count()
    try:
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
            note=f"step {seconds:.2f} s" + (f", process peak {peak / 2**30:.1f} GiB" if peak else ""),
            remat=remat, batch=f["batch"], step_s=seconds, peak_bytes=peak, loss=loss, finite=math.isfinite(loss))
    del batch


# --- section e: every method against CLIP --------------------------------------------------------------------------

def methods_section(rec: record.Recorder, plan: record.Plan, workdir: str, out: str) -> None:
  """Each method's step against CLIP's at the same size and batch. CLIP's step is section a's at the attention
  kind 'auto' resolves to, where section a ran it at this batch (the same program on the same card), else timed
  here."""
  from benchmarks.steps import METHODS
  n_dev = jax.device_count()
  batch = plan.methods_batch
  names = [n for n in METHODS if plan.methods is None or n in plan.methods]
  clip = _clip_from_a(out, batch, _auto_attention(plan.model))
  if clip:
    rec.row("e", _e_config(plan, "CLIP", batch), clip["step_s"] * 1e3, "ms/step", vs=1.0, ref="CLIP's step",
            note=f"section a's step (attention={clip['attention']})", method="CLIP", step_s=clip["step_s"],
            global_batch=clip["global_batch"])
    names.remove("CLIP")
  if not rec.fits("vit_compile_round"):
    for name in names:
      rec.row("e", _e_config(plan, name, batch), status=record.NOT_RUN_TIME, method=name)
    return
  # AC / HAC train on N retain + N forget pairs of the keyword 'cat' (about a third of the synthetic captions).
  data = _dataset("random", max(1024, 4 * batch * n_dev))
  setups, futures, states = {}, [], {}
  with _compiler(plan) as pool:
    for name in names:
      config_name, arg = METHODS[name]
      try:
        s = Setup(method_config(config_name, arg, model=plan.model, global_batch=batch * n_dev, data=data),
                  os.path.join(workdir, f"e_{config_name}"))
        futures.append(pool.submit(_compile, s.lower(s.pipeline_batch())))
        setups[name] = s
      except Exception as e:
        rec.row("e", _e_config(plan, name, batch), status=_failure(e), method=name)
    for name, s in setups.items():   # while the steps compile
      if rec.fits("vit_init", 2):
        states[name] = s.init_state()
    results = _gather(futures)
  clip_s = clip["step_s"] if clip else None
  for (name, s), (compiled, compile_s) in zip(setups.items(), results):
    config = _e_config(plan, name, batch)
    if compiled is None:
      rec.row("e", config, status=compile_s, method=name)
      continue
    if name not in states or not rec.fits("vit_timing"):
      rec.row("e", config, status=record.NOT_RUN_TIME, method=name, compile_s=compile_s)
      continue
    try:
      seconds, _, metrics = time_steps(compiled, states.pop(name), s.pipeline_batch(), plan, s.mesh)
    except Exception as e:
      rec.row("e", config, status=_failure(e), method=name, compile_s=compile_s)
      continue
    if name == "CLIP":
      clip_s = seconds
    loss = _loss_of(metrics)
    rec.row("e", config, seconds * 1e3, "ms/step", vs=seconds / clip_s if clip_s else None,
            ref="CLIP's step" if clip_s else "", note=f"compile {compile_s:.0f} s", method=name, step_s=seconds,
            global_batch=s.global_batch, loss=loss, finite=math.isfinite(loss), compile_s=compile_s)


def _clip_from_a(out: str, batch: int, kind: str):
  rows = [r for r in record.read_rows(out) if r.get("kind") == "row" and r.get("section") == "a"
          and r.get("status") == "ok" and r.get("batch") == batch and r.get("attention") == kind]
  return rows[0] if rows else None


def _e_config(plan, name, batch):
  return f"{name}, {plan.model} bf16, attention=auto, batch {batch}/GPU"


# --- section c: ncjax's NCU stage-2 loss ---------------------------------------------------------------------------

def ncu_section(rec: record.Recorder, plan: record.Plan) -> None:
  """ncjax's stage-2 loss and its gradient (forget selection included, as the public loop's timing includes it),
  jitted, at each N; at plan.ncu_check also its value at float32 ('highest') matmul precision, which the table
  compares with the public loop's (a GPU's default float32 matmul is TF32, ~1e-3 off)."""
  from ncjax.losses import ncu
  largest = max(plan.ncu_sizes)

  def loss(v, t, tn):
    forget, _ = ncu.select_forget(v, t, record.NCU_LOGIT_SCALE, record.NCU_FORGET_RATIO)
    out = ncu.unlearning(v, t, tn, record.NCU_LOGIT_SCALE, forget, ncu.UnlearningOptions())
    return out.loss, out.scalars

  for n in plan.ncu_sizes:
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
      if n == plan.ncu_check:
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


def run(rec_for, names, plan: record.Plan, out: str) -> None:
  """Runs the JAX workers `names` (a, c_jax, d, e) in this process, in that order; `rec_for(name)` gives each its
  Recorder."""
  with tempfile.TemporaryDirectory(prefix="ncjax_accelerator_") as workdir:
    machine(rec_for(names[0]))
    for name in names:
      rec = rec_for(name)
      if name == "a":
        clip_section(rec, plan, workdir)
      elif name == "c_jax":
        ncu_section(rec, plan)
      elif name == "d":
        memory_section(rec, plan, workdir, out)
      elif name == "e":
        methods_section(rec, plan, workdir, out)
