"""NCU benchmarks: the stage-2 loss + gradient with each Sinkhorn solver against plain InfoNCE on the same embeddings
(ratios measured in one run) and against the public loop's loss value; the stage-1 prompt loss; the kernel solver's
time and iterations against N."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common

SCALE = math.log(1 / 0.07)


def _embeddings(n, dim=512, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(3, n, dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  # Give pairs a real diagonal so the forget selection and the plan are non-trivial.
  x[1] = 0.6 * x[0] + 0.4 * x[1]
  x[1] /= np.linalg.norm(x[1], axis=-1, keepdims=True)
  return [jnp.asarray(a) for a in x]


def _solvers():
  from ncjax.losses import ncu
  from ncjax.ot import KernelSinkhorn, OttSinkhorn, ReferenceSinkhorn
  return {
      "kernel (default)": ncu.UnlearningOptions(),
      "kernel, one solve": ncu.UnlearningOptions(share_plan=True),
      "kernel, bf16 kernel": ncu.UnlearningOptions(solver=KernelSinkhorn(kernel_dtype="bfloat16")),
      "ott-jax": ncu.UnlearningOptions(solver=OttSinkhorn()),
      "reference loop": ncu.UnlearningOptions(solver=ReferenceSinkhorn()),
  }


def loss_table(n: int, with_slow: bool = True) -> list[dict]:
  from ncjax.losses import contrastive, ncu
  v, t, tn = _embeddings(n)
  forget, _ = ncu.select_forget(v, t, SCALE, 0.1)
  clip = jax.jit(jax.value_and_grad(lambda v, t: contrastive.infonce(v, t, SCALE)[0], argnums=(0, 1)))
  t_clip, _ = common.time_fn(clip, v, t, repeats=3)
  rows, values = [], {}
  for name, opts in _solvers().items():
    if not with_slow and name in ("ott-jax", "reference loop"):
      continue
    f = jax.jit(jax.value_and_grad(lambda v, t, tn, o=opts: ncu.unlearning(v, t, tn, SCALE, forget, o).loss,
                                   argnums=(0, 1, 2)))
    sec, _ = common.time_fn(f, v, t, tn, repeats=1 if name == "reference loop" else 2)
    values[name] = float(f(v, t, tn)[0])
    rows.append(dict(loss="NCU stage 2", solver=name, n=n, seconds=sec, vs_infonce=sec / t_clip))
  ref = values.get("reference loop")
  if ref is None:   # the loop's value without timing it
    ref = float(ncu.unlearning(v, t, tn, SCALE, forget, _solvers()["reference loop"]).loss)
  for r in rows:
    r["rel_diff"] = abs(values[r["solver"]] - ref) / abs(ref)
  p = jax.jit(jax.value_and_grad(lambda v, t, tn: ncu.prompt(v, t, tn, SCALE, forget).loss, argnums=(0, 1, 2)))
  t_prompt, _ = common.time_fn(p, v, t, tn, repeats=3)
  rows.append(dict(loss="NCU stage 1 (prompt)", solver="-", n=n, seconds=t_prompt, vs_infonce=t_prompt / t_clip,
                   rel_diff=None))
  rows.append(dict(loss="InfoNCE", solver="-", n=n, seconds=t_clip, vs_infonce=1.0, rel_diff=None))
  return rows


def sinkhorn_scaling(n: int) -> dict:
  from ncjax.losses import ncu
  from ncjax.ot import KernelSinkhorn
  v, t, tn = _embeddings(n)
  forget, _ = ncu.select_forget(v, t, SCALE, 0.1)
  cost = 1.0 - ncu.extended_similarity(v, t, tn)
  cost = cost / cost.max()
  mask = ncu.transport_mask(forget)
  solver = KernelSinkhorn()
  a, b = jnp.full((n,), 1.0 / n), jnp.full((n + 1,), 1.0 / (n + 1))
  fn = jax.jit(lambda c, m: solver(c, m, a, b))
  sec, _ = common.time_fn(fn, cost, mask, repeats=2 if n > 4096 else 3)
  out = fn(cost, mask)
  return dict(n=n, seconds=sec, iterations=int(out.iterations),
              row_error=float(jnp.abs(out.plan.sum(1) - a).sum()))


def run(quick: bool = False) -> dict:
  ns = (512, 2048) if quick else (2048, 8192)
  rows = [r for i, n in enumerate(ns) for r in loss_table(n, with_slow=i == 0 or not quick)]
  sinkhorn = [sinkhorn_scaling(n) for n in ((256, 1024) if quick else (256, 1024, 2048, 4096, 8192))]
  payload = dict(loss=rows, sinkhorn=sinkhorn)
  common.write("ncu", payload)
  cols = [("loss", "loss", "s"), ("solver", "Sinkhorn", "s"), ("n", "N", "d"), ("seconds", "s", ".3f"),
          ("vs_infonce", "x InfoNCE", ".1f"), ("rel_diff", "loss vs public loop", ".1e")]
  common.report("NCU losses + gradient vs InfoNCE on the same embeddings (D=512, one device)", rows, cols)
  common.report("Kernel Sinkhorn (one side, eps 0.03 on the max-normalised cost, <= 100 iterations)", sinkhorn,
                [("n", "N", "d"), ("seconds", "seconds", ".3f"), ("iterations", "iterations", "d"),
                 ("row_error", "L1 row error", ".1e")])
  return payload
