"""NCU benchmarks: stage-2 loss + gradient vs InfoNCE on the same embeddings (overhead ratio), masked Sinkhorn time
and iterations vs N, and the full NCU step vs the CLIP step (small config, global batch 2048, simulated devices)."""

from __future__ import annotations

import math
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common


def _embeddings(n, dim=512, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(3, n, dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  # Give pairs a real diagonal so the forget selection and the plan are non-trivial.
  x[1] = 0.6 * x[0] + 0.4 * x[1]
  x[1] /= np.linalg.norm(x[1], axis=-1, keepdims=True)
  return [jnp.asarray(a) for a in x]


def loss_overhead(n: int) -> dict:
  from ncjax.losses import contrastive, ncu
  v, t, tn = _embeddings(n)
  scale = math.log(1 / 0.07)
  forget, _ = ncu.select_forget(v, t, scale, 0.1)

  def ncu_fn(v, t, tn):
    return ncu.unlearning_loss(v, t, tn, scale, forget)[0]

  ncu_grad = jax.jit(jax.value_and_grad(ncu_fn, argnums=(0, 1, 2)))
  clip_grad = jax.jit(jax.value_and_grad(lambda v, t: contrastive.infonce(v, t, scale)[0], argnums=(0, 1)))
  t_ncu, _ = common.time_fn(ncu_grad, v, t, tn, repeats=2 if n > 4096 else 3)
  t_clip, _ = common.time_fn(clip_grad, v, t, repeats=3)
  return dict(bench="ncu_loss", n=n, ncu_seconds=t_ncu, infonce_seconds=t_clip, overhead=t_ncu / t_clip)


def sinkhorn_scaling(n: int) -> dict:
  from ncjax.losses import ncu
  from ncjax.ot import masked_sinkhorn_with_info
  v, t, tn = _embeddings(n)
  forget, _ = ncu.select_forget(v, t, math.log(1 / 0.07), 0.1)
  cost = 1.0 - ncu.extended_similarity(v, t, tn)
  cost = cost / cost.max()
  mask = ncu.transport_mask(forget)
  a = jnp.full((n,), 1.0 / n)
  b = jnp.full((n + 1,), 1.0 / (n + 1))
  fn = jax.jit(lambda c, m: masked_sinkhorn_with_info(c, m, a, b, epsilon=0.03, max_iterations=100,
                                                      threshold=1e-4 / (0.03 * n)))
  sec, _ = common.time_fn(fn, cost, mask, repeats=2 if n > 4096 else 3)
  _, info = fn(cost, mask)
  return dict(bench="sinkhorn", n=n, seconds=sec, iterations=int(info["iterations"]),
              converged=bool(info["converged"]), row_error=float(info["row_error"]))


def step_ratio(batch: int = 2048, size: str = "small") -> dict:
  from ncjax import config_lib, train
  results = {}
  for name in ("clip", "ncu"):
    cfg = config_lib.base_config()
    cfg.method.name = name
    cfg.model.size = size
    cfg.input.dataset = "synthetic"
    cfg.input.global_batch_size = batch
    cfg.log.progress = False
    cfg.ckpt.save_at_end = False
    cfg.num_epochs = 2
    if name == "ncu":
      src = config_lib.load_config_file("ncu", "setting=digits")
      for key in ("method", "loss"):
        with cfg.unlocked():
          cfg[key] = src[key].copy_and_resolve_references()
      with cfg.unlocked():
        cfg.method.init_from = ""
        cfg.method.epochs_prompt = 1
        cfg.method.forget_ratio = 0.1
    with tempfile.TemporaryDirectory() as workdir:
      trainer = train.Trainer(cfg, workdir)
      span = trainer.spans[-1]          # NCU: the unlearning stage
      state = trainer.init_state(span)
      prog = trainer.program(span)
      b0, _ = trainer.exp.train_data.global_batch(0)
      state, m = prog.step(state, b0)
      common.block(m)
      times = []
      for s in (1, 2):
        b, _ = trainer.exp.train_data.global_batch(s)
        t = time.perf_counter()
        state, m = prog.step(state, b)
        common.block(m)
        times.append(time.perf_counter() - t)
    results[name] = float(np.median(times))
  return dict(bench="ncu_step", size=size, global_batch=batch, devices=len(jax.devices()),
              clip_step_seconds=results["clip"], ncu_step_seconds=results["ncu"],
              ratio=results["ncu"] / results["clip"])


def run(quick: bool = False) -> dict:
  ns = (512, 2048) if quick else (2048, 8192)
  losses = [loss_overhead(n) for n in ns]
  sinkhorn = [sinkhorn_scaling(n) for n in ((256, 1024) if quick else (256, 1024, 2048, 4096, 8192))]
  step = step_ratio(512 if quick else 2048)
  payload = dict(loss=losses, sinkhorn=sinkhorn, step=step)
  common.write("ncu", payload)
  print("\nNCU stage-2 loss + gradient vs InfoNCE on the same embeddings (D=512, one device, Sinkhorn both sides)")
  print(common.table(losses, [("n", "N", "d"), ("ncu_seconds", "NCU s", ".3f"), ("infonce_seconds", "InfoNCE s", ".3f"),
                              ("overhead", "NCU / InfoNCE", ".1f")]))
  print("\nMasked Sinkhorn (ott-jax, eps 0.03 on the max-normalised cost, <= 100 iterations, one side)")
  print(common.table(sinkhorn, [("n", "N", "d"), ("seconds", "seconds", ".3f"), ("iterations", "iterations", "d"),
                                ("converged", "converged", "")]))
  print(f"\nFull train step, {step['size']} config, global batch {step['global_batch']}, {step['devices']} devices: "
        f"CLIP {step['clip_step_seconds']:.2f} s, NCU (unlearning stage) {step['ncu_step_seconds']:.2f} s -> "
        f"NCU/CLIP = {step['ratio']:.2f}")
  return payload
