"""The train step of a TPU pod, compiled here for its real chips, never executed: per-chip FLOPs, collective bytes,
HBM and the largest batch that fits — what a v5e-256 or v5p-128 run costs before one is rented.

`python -m benchmarks.pod_compile [--json=FILE] [--note=FILE] [--only=NAME,...] [--quick]`

With libtpu installed (`pip install 'ncjax[tpu]'`, or libtpu into a --target directory on PYTHONPATH; ~680 MB),
`jax.experimental.topologies.get_topology_desc` describes a TPU slice on a machine that has none, and
`jax.jit(step).lower(abstract inputs).compile()` runs the TPU compiler for it (MaxText's train_compile.py does the
same to find out-of-memory configurations). Without libtpu the same code compiles for 8 simulated CPU devices
(`--cpu`; the figures then describe XLA:CPU, not a TPU).

The step is ncjax's own: the trainer's StageProgram of the method (CLIP's InfoNCE step, NCU's unlearning stage,
GSC's step with its per-sample labels), built from the method's config with bf16 towers and float32 parameters,
over a mesh of the slice's chips, from `jax.ShapeDtypeStruct` inputs carrying their shardings. Reported per chip:
- FLOPs: the compiler's cost analysis of the per-chip program against `benchmarks.flops.train_step_flops` / chips;
- collective bytes: every all-gather / all-reduce / reduce-scatter / all-to-all / collective-permute of the
  compiled HLO, each as the bytes a chip receives over a ring of its replica group (all-reduce 2 (g-1)/g of its
  size, all-gather and reduce-scatter (g-1)/g of the full array, permute its size), against the data-parallel
  minimum: the float32 gradient all-reduce plus the global loss's gathers of the two embedding matrices (and their
  gradients' reduce-scatter); with FSDP, plus one bf16 all-gather of the parameters in the forward and one in the
  backward;
- memory: XLA's memory analysis (arguments + outputs − aliased + temporaries) against the chip's HBM;
- the largest per-chip batch that fits, with and without remat (memory is linear in the batch: two compiles fit
  the line, a third confirms it);
- a roofline step time: max(FLOPs / the chip's bf16 peak, HBM bytes accessed / its bandwidth) + collective bytes /
  its ICI bandwidth (no overlap assumed: an upper bound), and the MFU it implies.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time
import types

from benchmarks import hlo_traffic
from benchmarks.hlo_collectives import (collective_total, collectives, gradient_bytes,  # noqa: F401 (the API)
                                        minimum_collective_bytes)

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures (Google Cloud's "TPU v5e" and "TPU v5p" documentation pages, read 2026-11-26):
  peak bf16 FLOP/s, HBM capacity and bandwidth, and bidirectional inter-chip interconnect (ICI) bandwidth (v5e:
  400 GB/s; v5p: 4,800 Gbps). Collective time at the full ICI figure is a lower bound (a ring uses every port only
  when the collective spans the torus)."""
  name: str
  bf16_flops: float
  hbm_bytes: float
  hbm_bandwidth: float     # bytes/s
  ici_bandwidth: float     # bytes/s per chip


V5E = Chip("TPU v5e", 197e12, 16 * GIB, 819e9, 400e9)
V5P = Chip("TPU v5p", 459e12, 95 * GIB, 2765e9, 4800e9 / 8)

# The 8 simulated CPU devices of a machine without libtpu (`--quick`): XLA:CPU's program, no TPU figures. Its
# "peak" is nominal (no roofline is read from it).
CPU8 = Chip("XLA:CPU (8 simulated devices)", 1e12, 64 * GIB, 50e9, 50e9)

# slice name -> (topology name for get_topology_desc, chip, chips)
SLICES = {"v5e256": ("v5e:16x16", V5E, 256), "v5p128": ("v5p:4x4x8", V5P, 128), "v5e4": ("v5e:2x2", V5E, 4),
          "cpu8": ("", CPU8, 8)}


def has_libtpu() -> bool:
  import importlib.util
  return importlib.util.find_spec("libtpu") is not None

# model name -> (config file, model size, config arguments, method for the analytic count, stage)
MODELS = {
    "clip_vit_b16": ("clip", "ViT-B/16", "noise=0", "clip", "train"),
    "clip_vit_l14": ("clip", "ViT-L/14", "noise=0", "clip", "train"),
    "ncu_vit_b16": ("ncu", "ViT-B/16", "noise=0,setting=paper,init=random", "ncu", "unlearn"),
    "gsc_vit_b16": ("gsc", "ViT-B/16", "noise=0", "gsc", "train"),
    "clip_micro": ("clip", "micro", "noise=0", "clip", "train"),
}
# Collectives inside a while loop run once per iteration: NCU's two masked Sinkhorn solves iterate at most 100 times
# (they stop at their tolerance), each iteration all-reducing the plan's column sums (N + 1 numbers).
LOOP_TRIPS = {"ncu_vit_b16": 100}
GLOBAL_BATCH = 32768
STEPS_PER_EPOCH = 100      # the dataset: 100 global batches (GSC's per-sample labels are sized by it)


# Google Cloud's accelerator type of each slice (its names count TensorCores: a v5p chip has two, a v5e chip one).
ACCELERATOR_TYPES = {"v5e256": "v5litepod-256", "v5p128": "v5p-256", "v5e4": "v5litepod-4"}


def quiet_libtpu(slice_name: str) -> None:
  """The environment a compile-only libtpu wants on a machine that is no TPU VM, as ahead-of-time compiles set it
  (MaxText's train_compile, axlearn's aot_compilation): no metadata-server queries, the accelerator type and a
  single local worker named. Without them libtpu warns that it could not determine either and takes its own
  warning text for a worker's host name. Set before libtpu loads; a value the user set is kept."""
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", ACCELERATOR_TYPES.get(slice_name, "v5litepod-256"))
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_WORKER_ID", "0")


def topology_devices(slice_name: str):
  """The devices of a TPU slice described without TPUs (libtpu's topology), or the 8 simulated CPU devices."""
  import jax
  name, _, chips = SLICES[slice_name]
  if not name:
    devices = jax.devices("cpu")
    if len(devices) < chips:
      raise SystemExit(f"the cpu8 slice needs {chips} simulated CPU devices; this process has {len(devices)}")
    return devices[:chips]
  if not has_libtpu():
    raise SystemExit(f"compiling for {name} needs libtpu: pip install 'ncjax[tpu]' (~680 MB), or run --quick "
                     f"without it (8 simulated CPU devices)")
  quiet_libtpu(slice_name)
  from jax.experimental import topologies
  return topologies.get_topology_desc(platform="tpu", topology_name=name).devices


def tpu_attention(model: str) -> str:
  """What `model.attention='auto'` resolves to on a TPU for the model's heads in bf16 (the compile runs on a CPU
  host, where 'auto' would pick the CPU's kind)."""
  from ncjax.models import get_size
  from ncjax.models.layers import resolve_attention
  towers = get_size(MODELS[model][1])
  head_dim = min(towers[t]["width"] // towers[t]["heads"] for t in ("image", "text"))
  return resolve_attention("auto", dtype="bfloat16", head_dim=head_dim, platform="tpu")


def _config(model: str, global_batch: int, *, remat: bool, fsdp: int, attention: str = "", grad_reduce: str = ""):
  from ncjax.config_lib import load_config_file
  config_name, size, arg, _, _ = MODELS[model]
  cfg = load_config_file(config_name, f"model={size},data=synthetic,batch={global_batch},epochs=1,{arg}")
  with cfg.unlocked():
    cfg.model.dtype = "bfloat16"
    cfg.model.remat = remat
    cfg.model.attention = attention or tpu_attention(model)
    cfg.optim.grad_reduce = grad_reduce or cfg.optim.grad_reduce
    cfg.mesh.data, cfg.mesh.fsdp = -1, fsdp
  return cfg


def build_step(model: str, devices, global_batch: int, *, remat: bool = False, fsdp: int = 1, attention: str = "",
               grad_reduce: str = ""):
  """(jitted step, abstract state, abstract batch, mesh, method) of the model's training stage over `devices`."""
  import jax
  import jax.numpy as jnp
  from ncjax import experiment
  from ncjax import sharding as shard_lib
  from ncjax.data.noise import batch_transform
  from ncjax.train.program import StageProgram
  from ncjax.train.schedule import stage_spans
  cfg = _config(model, global_batch, remat=remat, fsdp=fsdp, attention=attention, grad_reduce=grad_reduce)
  resolved = experiment.resolve(cfg)
  mesh = shard_lib.make_mesh(resolved.config.mesh, devices)
  if global_batch % mesh.devices.size:
    raise ValueError(f"global batch {global_batch} is not divisible by the {mesh.devices.size} chips")
  tokenizer = resolved.tokenizer.build(["a photo of a cat", "a dog"])
  num_examples = global_batch * STEPS_PER_EPOCH
  method = resolved.method(tokenizer=tokenizer, num_examples=num_examples)
  data = types.SimpleNamespace(steps_per_epoch=STEPS_PER_EPOCH, num_examples=num_examples)
  exp = experiment.Experiment(resolved.config, resolved, mesh, tokenizer, data, method, None,
                              batch_transform(resolved.noise))
  abstract_params = method.abstract_params()
  param_sh = shard_lib.param_shardings(abstract_params, mesh)
  capacity = shard_lib.state_capacity(num_examples, mesh)
  import functools
  ms_abstract = jax.eval_shape(functools.partial(method.init_state, capacity))
  ms_sh = shard_lib.state_shardings(ms_abstract, mesh, capacity)
  stage = MODELS[model][4]
  span = next(s for s in stage_spans(method.stages(), STEPS_PER_EPOCH) if s.stage.name == stage)
  prog = StageProgram(exp, span, abstract_params, param_sh, ms_abstract, ms_sh)
  spec = resolved.model
  batch_sh = shard_lib.batch_sharding(mesh)
  size, length = spec.image_size, spec.context_length
  sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sh)
  batch = dict(image=sds((global_batch, size, size, 3), jnp.float32), tokens=sds((global_batch, length), jnp.int32),
               id=sds((global_batch,), jnp.int32), clean=sds((global_batch,), jnp.bool_))
  return prog, batch, mesh, method, abstract_params


def model_flops(model: str, global_batch: int) -> float:
  """The analytic model FLOPs of a configuration's step (no remat), from its config's model spec alone."""
  from ncjax import models
  from benchmarks import flops as flops_lib
  spec = models.ModelSpec.from_config(_config(model, global_batch, remat=False, fsdp=1).model)
  return flops_lib.train_step_flops(spec, global_batch, method=MODELS[model][3])


def compile_step(model: str, devices, global_batch: int, *, remat: bool = False, fsdp: int = 1):
  import jax
  prog, batch, mesh, method, abstract_params = build_step(model, devices, global_batch, remat=remat, fsdp=fsdp)
  from ncjax.models import fused_attention
  t = time.perf_counter()
  with jax.set_mesh(mesh), fused_attention.compiling_for(devices[0].platform):
    compiled = prog.step.lower(prog.abstract_state, batch).compile()
  return compiled, time.perf_counter() - t, abstract_params, mesh


# The collectives of a compiled program: benchmarks/hlo_collectives.py.


def _oom(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text.lower()


# A configuration's variant: '' (the defaults: `model.attention='auto'` as a TPU resolves it, gradients summed in
# bf16), or one setting changed, for the comparisons of the note.
# 'no_attention_core' is no model: the attention core (softmax(q k^T) v, forward and backward) replaced by an
# elementwise stand-in that reads q, k and v and writes an output of their shape, to measure what the rest of the
# step costs: the floor no attention implementation can go below.
VARIANTS = {"": {}, "einsum": dict(attention="einsum"), "recompute": dict(attention="recompute"),
            "gradf32": dict(grad_reduce="float32"), "no_attention_core": dict(attention="recompute")}


def _stand_in_core(q, k, v, mask, scale):
  return v + q * k * scale


@contextlib.contextmanager
def _variant_patch(variant: str):
  """The variant's change to the model while its program is traced ('no_attention_core' only)."""
  if variant != "no_attention_core":
    yield
    return
  from ncjax.models import layers
  real = layers.attend_recomputing
  layers.attend_recomputing = _stand_in_core
  try:
    yield
  finally:
    layers.attend_recomputing = real


def measure(model: str, slice_name: str, mesh_kind: str, batch_per_chip: int, *, remat: bool = False,
            devices=None, hlo_dir: str = "", variant: str = "") -> dict:
  """Compile one configuration and read its program: the record `--json` keeps per configuration."""
  import jax
  from benchmarks import flops as flops_lib
  _, chip, chips = SLICES[slice_name]
  devices = topology_devices(slice_name) if devices is None else devices
  fsdp = FSDP[slice_name] if mesh_kind == "fsdp" else 1
  global_batch = batch_per_chip * chips
  settings = VARIANTS[variant]
  attention = settings.get("attention") or tpu_attention(model)
  record = dict(model=model, slice=slice_name, mesh=mesh_kind, chips=chips, fsdp=fsdp, batch_per_chip=batch_per_chip,
                global_batch=global_batch, remat=remat, chip=chip.name, hbm_capacity=chip.hbm_bytes,
                variant=variant, attention=attention, grad_reduce=settings.get("grad_reduce", "bf16"))
  prog, batch, mesh, method, abstract_params = build_step(model, devices, global_batch, remat=remat, fsdp=fsdp,
                                                          **settings)
  record["params"] = int(sum(leaf.size for leaf in jax.tree.leaves(abstract_params)))
  spec = method.setup.model
  t = time.perf_counter()
  from ncjax.models import fused_attention
  try:
    with jax.set_mesh(mesh), _variant_patch(variant), fused_attention.compiling_for(devices[0].platform):
      compiled = prog.step.lower(prog.abstract_state, batch).compile()
  except Exception as e:    # the TPU compiler refuses a program that does not fit its HBM
    if not _oom(e):
      raise
    record.update(fits=False, compile_seconds=time.perf_counter() - t, error=str(e).splitlines()[0][:300])
    return record
  record["compile_seconds"] = time.perf_counter() - t
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  mem = compiled.memory_analysis()
  peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes
          + mem.generated_code_size_in_bytes)
  method_name = MODELS[model][3]
  analytic = flops_lib.train_step_flops(spec, global_batch, method=method_name, remat=remat) / chips
  record["flops_model"] = flops_lib.train_step_flops(spec, global_batch, method=method_name) / chips
  hlo = compiled.as_text()
  if hlo_dir:
    import gzip
    os.makedirs(hlo_dir, exist_ok=True)
    with gzip.open(os.path.join(hlo_dir, config_name(model, slice_name, mesh_kind, batch_per_chip, remat) + ".hlo.gz"),
                   "wt") as f:
      f.write(hlo)
  cols = collectives(hlo, chips)
  traffic = hlo_traffic.hbm_traffic(hlo, LOOP_TRIPS.get(model, 1))
  record.update(hbm_resident_bytes=traffic["hbm_bytes"], operand_bytes=traffic["all_bytes"],
                hbm_parts=traffic["parts"])
  minimum = minimum_collective_bytes(abstract_params, chips=chips, fsdp=fsdp, global_batch=global_batch,
                                     embed_dim=int(spec.towers["embed_dim"]),
                                     grad_bytes=4 if record["grad_reduce"] == "float32" else 2)
  record.update(
      fits=True, flops_compiled=float(cost.get("flops", 0.0)), flops_analytic=analytic,
      transcendentals=float(cost.get("transcendentals", 0.0)), hbm_bytes=float(cost.get("bytes accessed", 0.0)),
      peak_bytes=int(peak), argument_bytes=int(mem.argument_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      output_bytes=int(mem.output_size_in_bytes), alias_bytes=int(mem.alias_size_in_bytes),
      code_bytes=int(mem.generated_code_size_in_bytes),
      collective_bytes=collective_total(cols, LOOP_TRIPS.get(model, 1)), collective_bytes_min=minimum["total"],
      loop_trips=LOOP_TRIPS.get(model, 1),
      collective_min_parts=minimum, collectives=[{k: c[k] for k in ("kind", "type", "group", "bytes", "moved",
                                                                      "pieces", "in_loop", "op_name")}
                                                 for c in sorted(cols, key=lambda c: -c["moved"])],
      while_loops=len(re.findall(r"\bwhile\(", hlo)))
  record.update(roofline(record, chip))
  return record


def roofline(record: dict, chip: Chip) -> dict:
  """A step time from the chip's published rates: compute at the bf16 peak for the compiled FLOPs, HBM traffic at
  its bandwidth for XLA's bytes-accessed estimate (which counts every fusion's operands and results), collectives
  at the ICI bandwidth. `step_seconds`: max(compute, HBM) + collectives (no overlap of communication: an upper
  bound where the estimate is right); `mfu`: the analytic model FLOPs over that time at the peak."""
  compute = record["flops_compiled"] / chip.bf16_flops
  hbm = record["hbm_bytes"] / chip.hbm_bandwidth
  ici = record["collective_bytes"] / chip.ici_bandwidth
  step = max(compute, hbm) + ici
  model_flops = record.get("flops_model", record["flops_analytic"])   # without remat's recomputed forward
  out = dict(seconds_compute=compute, seconds_hbm=hbm, seconds_ici=ici, step_seconds=step,
             mfu=model_flops / chip.bf16_flops / step,
             mfu_compute_bound=model_flops / chip.bf16_flops / (compute + ici))
  if record.get("hbm_resident_bytes"):   # the traffic of the arrays that live in HBM (hlo_traffic)
    resident = record["hbm_resident_bytes"] / chip.hbm_bandwidth
    out.update(seconds_hbm_resident=resident,
               mfu_hbm_resident=model_flops / chip.bf16_flops / (max(compute, resident) + ici))
  return out


FSDP = {"v5e256": 16, "v5p128": 8, "v5e4": 2, "cpu8": 2}


def config_name(model: str, slice_name: str, mesh_kind: str, batch_per_chip: int | None = None,
                remat: bool = False, variant: str = "") -> str:
  name = f"{model}_{slice_name}_{mesh_kind}"
  if batch_per_chip is not None:
    name += f"_b{batch_per_chip}"
  return name + ("_remat" if remat else "") + (f"_{variant}" if variant else "")


_TEMPS_REFUSED = re.compile(r"required for HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")


def memory_point(r: dict) -> tuple[float, float] | None:
  """(temporaries needed, HBM available for them) in bytes for one compile: from the memory analysis where the
  compiler accepted the program (available = capacity − arguments − outputs + aliases − code), from its refusal
  otherwise ("required for HLO temporaries (X G) exceeds available HBM (Y G)": a refused compile fails in ~1
  minute where an accepted one takes several, so refusals are the cheap points)."""
  if r.get("fits"):
    rest = r["peak_bytes"] - r["temp_bytes"]
    return float(r["temp_bytes"]), float(r["hbm_capacity"] - rest)
  m = _TEMPS_REFUSED.search(r.get("error", ""))
  return (float(m.group(1)) * GIB, float(m.group(2)) * GIB) if m else None


AS_WRITTEN_FLOPS = 1.05   # compiled / analytic FLOPs below which a step without remat recomputes nothing of note


def largest_batch(model: str, slice_name: str, *, remat: bool, run, anchors=(128, 512, 1024), rounds: int = 12) -> dict:
  """The largest per-chip batch (a multiple of 8) whose step the compiler accepts as written, data-parallel.

  Past some batch the TPU compiler still accepts the program by rematerialising on its own: ViT-B/16 on a v5e chip
  compiles at 128 pairs with 1.006x the analytic FLOPs and at 216-248 with 1.15x (the compiler recomputes part of
  the forward to fit). "As written" means accepted with no more FLOPs per pair than at the smallest accepted
  anchor (+2%); the largest batch accepted at all is reported beside it. The search compiles the anchors (a
  refused compile costs ~1 minute and names the temporaries it needed; an accepted one several), halves below
  them until one is accepted, then bisects between the largest batch as written and the smallest that is not,
  starting at the batch where the temporaries' fitted curve a + s b + q b^2 meets the available HBM, in at most
  `rounds` bisection steps (`run` may answer from records: a search stopped there goes on with more rounds)."""
  import numpy as np
  records: dict[int, dict] = {}

  def attempt(b):
    records[b] = run(model, slice_name, "data", b, remat)

  def ratio(r):
    return r["flops_compiled"] / r["flops_analytic"]

  for b in anchors:
    attempt(b)
  b = min(anchors)
  # Below the anchors until one is accepted — and, without remat, until one is accepted with no recomputation of
  # the compiler's own (ViT-L/14 on a v5e chip compiles at 128 pairs with 1.2x the FLOPs): "as written" is measured
  # from a batch that is.
  while b > 8 and not any(r.get("fits") and (remat or ratio(r) <= AS_WRITTEN_FLOPS) for r in records.values()):
    b //= 2
    attempt(b)
  accepted = sorted(b for b, r in records.items() if r.get("fits"))
  if not accepted:
    return dict(max_batch=None, note="no batch compiles")
  base = ratio(records[accepted[0]])
  as_written = lambda b: records[b].get("fits") and ratio(records[b]) <= base + 0.02
  points = {b: p for b, p in ((b, memory_point(r)) for b, r in records.items()) if p is not None}
  predicted = None
  if len(points) >= 2:
    bs = np.array(sorted(points), float)
    temps = np.array([points[int(b)][0] for b in bs])
    avail = float(np.median([points[int(b)][1] for b in bs]))
    coef = np.polyfit(bs, temps, 2 if len(bs) >= 3 else 1)
    q, sl, a = coef if len(coef) == 3 else (0.0, *coef)
    disc = sl * sl - 4 * q * (a - avail)
    predicted = ((-sl + math.sqrt(disc)) / (2 * q)) if q > 0 and disc >= 0 else (avail - a) / sl
  guess = predicted
  for _ in range(rounds):
    lo = max((b for b in records if as_written(b)), default=0)
    hi = min((b for b in records if b > lo and not as_written(b)), default=None)
    if hi is not None and hi - lo <= 8:
      break
    mid = 2 * lo if hi is None else (lo + hi) // 2
    g = int(guess) // 8 * 8 if guess is not None and lo < guess < (hi or math.inf) else mid // 8 * 8
    guess = None   # the prediction once, then halving
    if g <= lo or g in records or (hi is not None and g >= hi):
      g = max(lo + 8, mid // 8 * 8)
      if g in records or (hi is not None and g >= hi):
        break
    attempt(g)
  lo = max((b for b in records if as_written(b)), default=None)
  hi = min((b for b in records if lo is not None and b > lo and not as_written(b)), default=None)
  accepted = sorted(b for b, r in records.items() if r.get("fits"))
  return dict(max_batch=lo, first_not_as_written=hi, largest_accepted=accepted[-1] if accepted else None,
              flops_ratio_at_largest_accepted=ratio(records[accepted[-1]]) if accepted else None,
              base_flops_ratio=base, predicted=predicted,
              tried=sorted((b, bool(r.get("fits")), round(ratio(r), 3) if r.get("fits") else None)
                           for b, r in records.items()))


# (model, slice, mesh, remat): ViT-L/14 at 128 pairs per chip needs 27.6 GiB of temporaries without remat, more
# than a v5e chip has, so its v5e rows are remat's too.
MAIN = [("clip_vit_b16", "v5e256", "data", False), ("clip_vit_b16", "v5p128", "data", False),
        ("clip_vit_l14", "v5e256", "data", False), ("clip_vit_l14", "v5e256", "data", True),
        ("clip_vit_l14", "v5p128", "data", False),
        ("ncu_vit_b16", "v5e256", "data", False), ("ncu_vit_b16", "v5p128", "data", False),
        ("gsc_vit_b16", "v5e256", "data", False), ("gsc_vit_b16", "v5p128", "data", False),
        ("clip_vit_b16", "v5e256", "fsdp", False), ("clip_vit_b16", "v5p128", "fsdp", False),
        ("clip_vit_l14", "v5e256", "fsdp", True), ("clip_vit_l14", "v5p128", "fsdp", False)]
SEARCH = [("clip_vit_b16", "v5e256"), ("clip_vit_b16", "v5p128"), ("clip_vit_l14", "v5e256"),
          ("clip_vit_l14", "v5p128")]
# The note's comparisons, at the first row's configuration: the recomputing einsums (the TPU's attention until
# 2026-11-28), the einsum attention (every row's until 2026-11-27) and gradients summed in float32.
COMPARE = [("clip_vit_b16", "v5e256", "data", False, "recompute"),
           ("clip_vit_b16", "v5e256", "data", False, "einsum"), ("clip_vit_b16", "v5e256", "data", False, "gradf32"),
           ("clip_vit_b16", "v5e256", "data", False, "no_attention_core"),
           ("clip_vit_b16", "v5p128", "data", False, "gradf32")]
LATE = [("ncu_vit_b16", "v5e256", "fsdp", False), ("ncu_vit_b16", "v5p128", "fsdp", False),
        ("gsc_vit_b16", "v5e256", "fsdp", False), ("gsc_vit_b16", "v5p128", "fsdp", False)]


def not_compiled(results: dict) -> list[str]:
  """The note's planned rows and searches (MAIN, COMPARE, SEARCH) that `results` has no record of."""
  names = [config_name(m, s, mesh, remat=remat) for m, s, mesh, remat in MAIN]
  names += [config_name(m, s, mesh, remat=remat, variant=v) for m, s, mesh, remat, v in COMPARE]
  names += [f"{m}_{s}_data_max_batch" for m, s in SEARCH]
  return [n for n in names if n not in results]


def upgrade(results: dict) -> dict:
  """Records written by an earlier version of this file, brought up to this one's readings without compiling:
  loop bodies counted per iteration, the model FLOPs beside the analytic count."""
  for r in results.values():
    if isinstance(r, dict) and "model" in r:
      r.setdefault("variant", "")
    parts = r.get("collective_min_parts") if isinstance(r, dict) else None
    if parts and r.get("grad_reduce") == "float32" and r.get("fsdp") == 1 and not r.get("min_grad_bytes"):
      # minimums recorded before they counted float32 gradient sums: every gradient is a float32 one
      n = r["chips"]
      parts["gradients"] = 2 * (n - 1) / n * 4 * r["params"]
      parts["total"] = parts["gradients"] + parts["loss"] + parts["parameters"]
      r["collective_bytes_min"] = parts["total"]
    if parts and isinstance(r, dict):
      r["min_grad_bytes"] = 4 if r.get("grad_reduce") == "float32" else 2
    if isinstance(r, dict) and "collectives" in r and ("loop_trips" not in r or "flops_model" not in r):
      r["loop_trips"] = LOOP_TRIPS.get(r["model"], 1)
      r["collective_bytes"] = collective_total(r["collectives"], r["loop_trips"])
      r["flops_model"] = model_flops(r["model"], r["global_batch"]) / r["chips"]
      r.update(roofline(r, SLICES[r["slice"]][1]))
  for key, r in results.items():   # each configuration's record carries its largest batches (data-parallel search)
    if isinstance(r, dict) and r.get("name") == key:
      found = results.get(config_name(r["model"], r["slice"], "data") + "_max_batch")
      r["max_batch_per_chip"] = (None if found is None or r["mesh"] != "data" else
                                 {"remat": (found.get("True") or {}).get("max_batch"),
                                  "no_remat": (found.get("False") or {}).get("max_batch")})
  return results


def run_all(json_path: str, *, only: set | None = None, search: bool = True, quick: bool = False,
            cpu: bool = False) -> dict:
  """Every configuration (skipping those already in `json_path`, so an interrupted run continues), written after
  each compile."""
  results = {}
  if os.path.exists(json_path):
    with open(json_path) as f:
      results = json.load(f)
    upgrade(results)
  devices = {}

  def save():
    tmp = json_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(results, f, indent=1)
    os.replace(tmp, json_path)

  def run(model, slice_name, mesh_kind, batch_per_chip, remat, variant=""):
    key = config_name(model, slice_name, mesh_kind, batch_per_chip, remat, variant)
    if key not in results:
      if slice_name not in devices:
        devices[slice_name] = topology_devices(slice_name)
      print(f"[pod_compile] {key} ...", flush=True)
      results[key] = measure(model, slice_name, mesh_kind, batch_per_chip, remat=remat, devices=devices[slice_name],
                             hlo_dir=os.path.splitext(json_path)[0] + "_hlo", variant=variant)
      r = results[key]
      print(f"[pod_compile] {key}: {r.get('compile_seconds', 0):.0f} s, fits={r.get('fits')}, "
            f"peak {r.get('peak_bytes', 0) / GIB:.2f} GiB", flush=True)
      save()
    return results[key]

  wanted = lambda name: only is None or name in only

  def main_rows(configs):
    for model, slice_name, mesh_kind, remat, *variant in configs:
      variant = variant[0] if variant else ""
      name = config_name(model, slice_name, mesh_kind, remat=remat, variant=variant)
      if not wanted(name):
        continue
      per_chip = GLOBAL_BATCH // SLICES[slice_name][2] if not quick else 8
      r = run(model, slice_name, mesh_kind, per_chip, remat, variant)
      results[name] = dict(r, name=name)
      save()

  if quick:
    main_rows([("clip_micro", "v5e4" if has_libtpu() and not cpu else "cpu8", "data", False)])
    upgrade(results)
    save()
    return results
  main_rows(MAIN[:1] + COMPARE + MAIN[1:])
  if search:
    for model, slice_name in SEARCH:
      name = config_name(model, slice_name, "data")
      if not wanted(name) or f"{name}_max_batch" in results:
        continue
      results[f"{name}_max_batch"] = {str(remat): largest_batch(model, slice_name, remat=remat, run=run)
                                      for remat in (False, True)}
      save()
  main_rows(LATE)
  upgrade(results)
  save()
  return results


def _versions() -> str:
  from importlib import metadata
  found = []
  for name in ("jax", "jaxlib", "libtpu"):
    try:
      found.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
      pass
  return "; " + ", ".join(found) if found else ""


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--json", default="bench_results/pod_compile.json")
  parser.add_argument("--note", default="", help="write the markdown report here (docs/notes/pod_compile_tpu.md)")
  parser.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
  parser.add_argument("--no_search", action="store_true", help="skip the largest-batch search")
  parser.add_argument("--quick", action="store_true", help="a micro model on v5e:2x2 (the test's path)")
  parser.add_argument("--cpu", action="store_true", help="--quick on the 8 simulated CPU devices even with libtpu")
  parser.add_argument("--report_only", action="store_true", help="write --note from --json without compiling")
  args = parser.parse_args(argv)
  if args.report_only:
    from benchmarks import pod_report
    with open(args.json) as f:
      results = upgrade(json.load(f))
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
      json.dump(results, f, indent=1)
    os.replace(tmp, args.json)
    with open(args.note, "w") as f:
      f.write(pod_report.markdown(results, versions=_versions(), missing=not_compiled(results)))
    return 0
  from ncjax import runtime
  runtime.configure_cpu_devices(8)    # the cpu8 slice (--quick without libtpu); TPU topologies need no devices
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  only = set(filter(None, args.only.split(","))) or None
  results = run_all(args.json, only=only, search=not args.no_search, quick=args.quick, cpu=args.cpu)
  if args.note:
    from benchmarks import pod_report
    with open(args.note, "w") as f:
      f.write(pod_report.markdown(results, versions=_versions(), missing=not_compiled(results)))
  print(f"[pod_compile] {len(results)} records in {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
