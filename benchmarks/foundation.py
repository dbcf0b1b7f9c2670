"""Foundation benchmarks: full train-step throughput and FLOP/s (tiny, small) at global batch 2048 on the
simulated devices, as a fraction of this machine's dense-matmul peak measured in the same run; and loss-only cost
(InfoNCE, SigLIP; forward + gradient w.r.t. the embeddings) at N = 2048, 8192, 32768."""

from __future__ import annotations

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


def train_step(size: str, batch: int, peak: float, steps: int = 2) -> dict:
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
    flops = common.compiled_flops(prog.step, state, batch_arrays, partitions=trainer.exp.mesh.devices.size)
    state, m = prog.step(state, batch_arrays)  # compile + first step
    common.block(m)
    times = []
    import time
    for s in range(1, steps + 1):
      b, _ = trainer.exp.train_data.global_batch(s)
      t = time.perf_counter()
      state, m = prog.step(state, b)
      common.block(m)
      times.append(time.perf_counter() - t)
  sec = float(np.median(times))
  out = dict(bench="train_step", size=size, global_batch=batch, devices=len(jax.devices()), step_seconds=sec,
             examples_per_sec=batch / sec, step_flops=flops)
  if flops:
    out["achieved_flops"] = flops / sec
    out["fraction_of_peak"] = flops / sec / peak
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
  steps = [train_step("tiny", 2048, peak["peak_flops"]), train_step("small", 2048, peak["peak_flops"])]
  ns = (2048, 8192) if quick else (2048, 8192, 32768)
  losses = [loss_cost(k, n) for n in ns for k in ("infonce", "sigmoid")]
  payload = dict(matmul_peak=peak, train_step=steps, loss=losses)
  common.write("foundation", payload)
  print(f"\nDense f32 matmul peak ({peak['n']}^3): {peak['single_device_flops'] / 1e9:.1f} GFLOP/s on one device, "
        f"{peak['all_devices_flops'] / 1e9:.1f} GFLOP/s sharded over {len(jax.devices())} devices")
  print("\nFull CLIP train step (global batch 2048, simulated devices)")
  for r in steps:
    r["gflops"] = None if r.get("achieved_flops") is None else r["achieved_flops"] / 1e9
    r["step_tflop"] = None if not r.get("step_flops") else r["step_flops"] / 1e12
  print(common.table(steps, [("size", "size", "s"), ("devices", "devices", "d"), ("step_seconds", "s/step", ".2f"),
                             ("examples_per_sec", "examples/s", ",.0f"), ("step_tflop", "TFLOP/step", ".3f"),
                             ("gflops", "GFLOP/s", ".1f"), ("fraction_of_peak", "of peak", ".1%")]))
  print("\nLoss only (forward + gradient w.r.t. both embeddings, D=512, one device)")
  print(common.table(losses, [("loss", "loss", "s"), ("n", "N", "d"), ("seconds", "seconds", ".3f"),
                              ("pairs_per_sec", "pairs/s", ",.0f"), ("error", "error", "s")]))
  return payload
