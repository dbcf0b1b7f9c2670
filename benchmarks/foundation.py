"""Foundation benchmarks: full train-step throughput and FLOP/s (tiny, small) at global batch 2048 on the
simulated devices, as a fraction of this machine's dense-matmul peak measured in the same run; and loss-only cost
(InfoNCE, SigLIP; forward + gradient w.r.t. the embeddings) at N = 2048, 8192, 32768."""

from __future__ import annotations

import collections
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from benchmarks import common


def matmul_peak(n: int = 2048) -> dict:
  """Dense f32 matmul FLOP/s: on one device, and batch-sharded over every device (the step's conditions)."""
  a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
  b = jnp.asarray(np.random.default_rng(1).normal(size=(n, n)), jnp.float32)
  single = jax.jit(lambda x, y: x @ y)
  t1, _ = common.time_fn(single, a, b, repeats=5)
  mesh = jax.make_mesh((len(jax.devices()),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  sa = jax.device_put(a, NamedSharding(mesh, P("d")))
  sb = jax.device_put(b, NamedSharding(mesh, P()))
  sharded = jax.jit(lambda x, y: x @ y, out_shardings=NamedSharding(mesh, P("d")))
  t8, _ = common.time_fn(sharded, sa, sb, repeats=5)
  flops = 2.0 * n ** 3
  return dict(n=n, single_device_flops=flops / t1, all_devices_flops=flops / t8,
              peak_flops=max(flops / t1, flops / t8))


_DTYPES = {"f32": np.float32, "bf16": jnp.bfloat16, "f16": np.float16}


def program_dots(hlo_text: str) -> list[dict]:
  """Every matrix product of a compiled program (its optimised HLO text): operand shapes, dimension numbers and
  how often the same product occurs."""
  shapes = {m.group(1): (m.group(2), tuple(int(x) for x in m.group(3).split(",") if x))
            for m in re.finditer(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]", hlo_text)}

  def dims(line, key):
    m = re.search(key + r"=\{([\d,]*)\}", line)
    return tuple(int(x) for x in m.group(1).split(",") if x) if m else ()

  counts = collections.Counter()
  for line in hlo_text.splitlines():
    m = re.search(r"= \w+\[[\d,]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)", line)
    if m and m.group(1) in shapes and m.group(2) in shapes:
      (dtype, lhs), (_, rhs) = shapes[m.group(1)], shapes[m.group(2)]
      counts[(dtype, lhs, rhs, dims(line, "lhs_contracting_dims"), dims(line, "rhs_contracting_dims"),
              dims(line, "lhs_batch_dims"), dims(line, "rhs_batch_dims"))] += 1
  return [dict(dtype=k[0], lhs=k[1], rhs=k[2], contracting=(k[3], k[4]), batch=(k[5], k[6]), count=c)
          for k, c in counts.items()]


def dot_ceiling(hlo_text: str, partitions: int) -> dict:
  """The ceiling a program's own matrix products put on its FLOP rate: each distinct product of the (per-device)
  program timed alone on one device at its shape, times how often it occurs and the number of partitions. Split
  into batched products (attention's per-example, per-head matmuls) and plain ones (the dense layers, the loss):
  if only the plain ones ran, at their own isolated speed, and everything else (attention, norms, softmax,
  copies, collectives) took no time at all, the step would reach `plain_flops / plain_seconds`."""
  totals = {"plain": [0.0, 0.0], "batched": [0.0, 0.0]}
  for d in program_dots(hlo_text):
    dtype = _DTYPES.get(d["dtype"])
    if dtype is None:
      continue
    (lc, rc), (lb, rb) = d["contracting"], d["batch"]
    lhs, rhs = jnp.ones(d["lhs"], dtype), jnp.ones(d["rhs"], dtype)
    product = jax.jit(lambda a, b, lc=lc, rc=rc, lb=lb, rb=rb: jax.lax.dot_general(a, b, ((lc, rc), (lb, rb))))
    out_size = int(np.prod(jax.eval_shape(product, lhs, rhs).shape))
    sec, _ = common.time_fn(product, lhs, rhs, repeats=3)
    flops = 2.0 * out_size * int(np.prod([d["lhs"][i] for i in lc]))
    kind = "batched" if lb else "plain"
    totals[kind][0] += flops * d["count"] * partitions
    totals[kind][1] += sec * d["count"] * partitions
  out = {}
  for kind, (flops, sec) in totals.items():
    out[f"{kind}_flops"], out[f"{kind}_seconds"] = flops, sec
    out[f"{kind}_flops_per_sec"] = flops / sec if sec else None
  return out


def train_step(size: str, batch: int, peak: float, steps: int = 2, ceiling: bool = False) -> dict:
  from ncjax import config_lib, train
  cfg = config_lib.base_config()
  cfg.method.name = "clip"
  cfg.model.size = size
  cfg.input.dataset = "synthetic"
  cfg.input.global_batch_size = batch
  cfg.log.progress = False
  cfg.ckpt.save_at_end = False
  cfg.ckpt.async_save = False
  cfg.num_epochs = 1
  with tempfile.TemporaryDirectory() as workdir:
    trainer = train.Trainer(cfg, workdir)
    span = trainer.spans[0]
    state = trainer.init_state(span)
    prog = trainer.program(span)
    batch_arrays, _ = trainer.exp.train_data.global_batch(0)
    partitions = trainer.exp.mesh.devices.size
    compiled = prog.step.lower(state, batch_arrays).compile()
    flops = common.compiled_flops(compiled, partitions=partitions)
    dots = dot_ceiling(compiled.as_text(), partitions) if ceiling else None
    # The executable compiled above runs the steps: calling prog.step would compile the same program a second time.
    state, m = compiled(state, batch_arrays)  # first step (warm-up)
    common.block(m)
    times = []
    import time
    for s in range(1, steps + 1):
      b, _ = trainer.exp.train_data.global_batch(s)
      t = time.perf_counter()
      state, m = compiled(state, b)
      common.block(m)
      times.append(time.perf_counter() - t)
  sec = float(np.median(times))
  out = dict(bench="train_step", size=size, global_batch=batch, devices=len(jax.devices()), step_seconds=sec,
             examples_per_sec=batch / sec, step_flops=flops)
  if flops:
    out["achieved_flops"] = flops / sec
    out["fraction_of_peak"] = flops / sec / peak
  if dots and dots["plain_seconds"]:
    out["dots"] = dots
    out["dense_share_of_flops"] = dots["plain_flops"] / flops if flops else None
    out["dense_ceiling_of_peak"] = dots["plain_flops_per_sec"] / peak
    out["attention_dots_of_peak"] = (dots["batched_flops_per_sec"] or 0.0) / peak
    out["matmul_seconds"] = dots["plain_seconds"] + dots["batched_seconds"]
    out["all_dots_of_peak"] = (dots["plain_flops"] + dots["batched_flops"]) / out["matmul_seconds"] / peak
  return out


def loss_cost(kind: str, n: int, dim: int = 512) -> dict:
  from ncjax.losses import contrastive
  rng = np.random.default_rng(0)
  v = rng.normal(size=(n, dim)).astype(np.float32)
  v /= np.linalg.norm(v, axis=1, keepdims=True)
  t = rng.normal(size=(n, dim)).astype(np.float32)
  t /= np.linalg.norm(t, axis=1, keepdims=True)
  v, t = jnp.asarray(v), jnp.asarray(t)
  if kind == "infonce":
    fn = lambda a, b: contrastive.infonce(a, b, 2.66)[0]
  else:
    fn = lambda a, b: contrastive.sigmoid(a, b, 2.3, -10.0)[0]
  f = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
  try:
    sec, _ = common.time_fn(f, v, t, repeats=2 if n > 10000 else 3)
  except Exception as e:  # out of memory at the largest N on small hosts: report, don't crash the suite
    return dict(bench="loss", loss=kind, n=n, dim=dim, error=type(e).__name__)
  return dict(bench="loss", loss=kind, n=n, dim=dim, seconds=sec, pairs_per_sec=n * n / sec)


def run(quick: bool = False) -> dict:
  peak = matmul_peak()
  steps = [train_step(size, 2048, peak["peak_flops"], ceiling=True) for size in ("tiny", "small")]
  ns = (2048, 8192) if quick else (2048, 8192, 32768)
  losses = [loss_cost(k, n) for n in ns for k in ("infonce", "sigmoid")]
  payload = dict(matmul_peak=peak, train_step=steps, loss=losses)
  common.write("foundation", payload)
  print(f"\nDense f32 matmul peak ({peak['n']}^3): {peak['single_device_flops'] / 1e9:.1f} GFLOP/s on one device, "
        f"{peak['all_devices_flops'] / 1e9:.1f} GFLOP/s sharded over {len(jax.devices())} devices")
  for r in steps:
    r["gflops"] = None if r.get("achieved_flops") is None else r["achieved_flops"] / 1e9
    r["step_tflop"] = None if not r.get("step_flops") else r["step_flops"] / 1e12
  common.report("Full CLIP train step (global batch 2048, simulated devices; peak = the dense f32 matmul above)",
                steps, [("size", "size", "s"), ("devices", "devices", "d"), ("step_seconds", "s/step", ".2f"),
                        ("examples_per_sec", "examples/s", ",.0f"), ("step_tflop", "TFLOP/step", ".3f"),
                        ("gflops", "GFLOP/s", ".1f"), ("fraction_of_peak", "of peak", ".1%")])
  common.report("What the step's own matrix products allow: each product of the compiled step timed alone at its "
                "shape on one device, as a fraction of the same peak. 'all matmuls alone' bounds the whole step: "
                "its rate if norms, softmax, activations, copies and collectives took no time at all", steps,
                [("size", "size", "s"), ("dense_share_of_flops", "dense share of FLOPs", ".1%"),
                 ("dense_ceiling_of_peak", "dense GEMMs alone", ".1%"),
                 ("attention_dots_of_peak", "attention matmuls alone", ".1%"),
                 ("all_dots_of_peak", "all matmuls alone", ".1%"), ("matmul_seconds", "matmul s", ".2f"),
                 ("step_seconds", "step s", ".2f"), ("fraction_of_peak", "whole step", ".1%")])
  print("\nLoss only (forward + gradient w.r.t. both embeddings, D=512, one device)")
  print(common.table(losses, [("loss", "loss", "s"), ("n", "N", "d"), ("seconds", "seconds", ".3f"),
                              ("pairs_per_sec", "pairs/s", ",.0f"), ("error", "error", "s")]))
  return payload
