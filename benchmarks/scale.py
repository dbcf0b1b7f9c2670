"""Scale: the losses at a global batch of 32,768 on the simulated devices (peak memory of the whole process, each
configuration in its own process), and GSC's GMM label update on 10^7 scores sharded over the devices."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from benchmarks import common

CONFIGS = [("CLIP", "dense"), ("CLIP", "chunked"), ("SigLIP", "dense"), ("NCU stage 2", "chunked")]


def _child(loss: str, form: str, n: int, chunk: int) -> dict:
  """Runs in a fresh process: loss + gradient of 8-way batch-sharded (n, 512) embeddings."""
  import math
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  from ncjax.losses import chunked, contrastive, ncu
  mesh = jax.make_mesh((len(jax.devices()),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sh = NamedSharding(mesh, P("data"))

  def emb(k):
    x = jax.random.normal(k, (n, 512))
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

  v, t, tn = jax.jit(lambda k: tuple(emb(kk) for kk in jax.random.split(k, 3)), out_shardings=(sh, sh, sh))(
      jax.random.PRNGKey(0))
  s = math.log(1 / 0.07)
  if loss == "CLIP":
    fn = (lambda v, t, tn: chunked.infonce(v, t, s, chunk=chunk)[0]) if form == "chunked" else \
        (lambda v, t, tn: contrastive.infonce(v, t, s)[0])
  elif loss == "SigLIP":
    fn = lambda v, t, tn: contrastive.sigmoid(v, t, s, -10.0)[0]
  else:
    def fn(v, t, tn):
      forget, _ = ncu.select_forget(v, t, s, 0.1, chunk=chunk)
      return ncu.unlearning(v, t, tn, s, forget, ncu.UnlearningOptions(chunk_rows=chunk)).loss
  g = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))
  with jax.set_mesh(mesh):
    jax.block_until_ready(g(v, t, tn))
    t0 = time.perf_counter()
    value, grads = g(v, t, tn)
    jax.block_until_ready(grads)
  return dict(seconds=time.perf_counter() - t0, loss_value=float(value),
              peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)


def loss_memory(loss: str, form: str, n: int, chunk: int = 512) -> dict:
  code = ("import json, sys; from ncjax import runtime; runtime.configure_cpu_devices(8); "
          "from benchmarks.scale import _child; "
          f"print('RESULT ' + json.dumps(_child({loss!r}, {form!r}, {n}, {chunk})))")
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
  row = dict(loss=loss, form=form, n=n)
  line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
  if out.returncode or not line:
    row.update(seconds=None, peak_gb=None, status=f"failed ({out.returncode}): {out.stderr.strip()[-200:]}")
  else:
    row.update(json.loads(line[0][len("RESULT "):]), status="ok")
  return row


def gmm_at_scale(n: int) -> dict:
  import jax
  import numpy as np
  from ncjax.samplers import gmm
  rng = np.random.default_rng(0)
  x = np.where(rng.uniform(size=n) < 0.6, rng.normal(0.9, 0.03, n), rng.normal(0.6, 0.08, n)).astype(np.float32)
  x = (x - x.min()) / (x.max() - x.min())
  mesh = jax.make_mesh((len(jax.devices()),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
  fit = jax.jit(lambda v: gmm.posterior_of_larger_mean(gmm.fit(v), v))
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
  sec, _ = common.time_fn(fit, xs, repeats=2)
  return dict(n=n, seconds=sec, scores_gb=x.nbytes / 1e9,
              peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, peak_before_gb=before)


def run(quick: bool = False) -> dict:
  n = 4096 if quick else 32768
  rows = [loss_memory(loss, form, n) for loss, form in CONFIGS]
  gmm_row = gmm_at_scale(10 ** 6 if quick else 10 ** 7)
  payload = dict(loss=rows, gmm=gmm_row)
  common.write("scale", payload)
  common.report(f"Losses + gradient at global batch {n} on the simulated devices (peak RSS of the process)", rows,
                [("loss", "loss", "s"), ("form", "form", "s"), ("seconds", "s", ".1f"), ("peak_gb", "peak GB", ".2f"),
                 ("status", "status", "s")])
  common.report("GSC's GMM label update (10 EM iterations + posteriors), scores sharded over the devices", [gmm_row],
                [("n", "scores", ",d"), ("seconds", "s", ".2f"), ("peak_gb", "process peak GB", ".2f")])
  return payload
