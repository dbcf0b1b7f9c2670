"""GSC and Bayesian-CL benchmarks: their train steps vs the CLIP step (small config, global batch 2048, simulated
devices), and the GMM fit of GSC's label update on 10^6 scores vs scikit-learn (same machine, same run)."""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks import common


def _config(name: str, size: str, batch: int):
  from ncjax.config_lib import load_config_file
  cfg = load_config_file(name, f"model={size},data=synthetic,batch={batch},noise=0")
  with cfg.unlocked():
    cfg.log.progress = False
    cfg.ckpt.save_at_end = False
    cfg.evals = {}
    cfg.num_epochs = 2
  return cfg


def step_seconds(name: str, size: str, batch: int, steps: int = 2) -> float:
  return common.train_step_seconds(_config(name, size, batch), steps)


def gmm_vs_sklearn(n: int = 1_000_000) -> dict:
  from sklearn.mixture import GaussianMixture
  from ncjax.samplers import gmm
  rng = np.random.default_rng(0)
  clean = rng.uniform(size=n) < 0.6
  x = np.where(clean, rng.normal(0.9, 0.03, n), rng.normal(0.6, 0.08, n)).astype(np.float32)
  x = (x - x.min()) / (x.max() - x.min())
  mesh = jax.make_mesh((len(jax.devices()),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))

  def ours(v):
    p = gmm.fit(v)
    return gmm.posterior_of_larger_mean(p, v)

  t_ours, _ = common.time_fn(ours, xs, repeats=3)
  t0 = time.perf_counter()
  ref = GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=0).fit(x[:, None])
  prob = ref.predict_proba(x[:, None])[:, ref.means_.argmax()]
  t_ref = time.perf_counter() - t0
  diff = float(np.abs(np.asarray(ours(xs)) - prob).max())
  return dict(bench="gmm", n=n, jax_seconds=t_ours, sklearn_seconds=t_ref, speedup=t_ref / t_ours,
              max_posterior_diff=diff, devices=len(jax.devices()))


def run(quick: bool = False) -> dict:
  batch = 512 if quick else 2048
  clip = step_seconds("clip", "small", batch)
  rows = [dict(method="CLIP", seconds=clip, ratio=1.0)]
  for label, name in (("GSC", "gsc"), ("Bayesian CL", "bayes")):
    sec = step_seconds(name, "small", batch)
    rows.append(dict(method=label, seconds=sec, ratio=sec / clip))
  g = gmm_vs_sklearn(100_000 if quick else 1_000_000)
  payload = dict(steps=rows, global_batch=batch, gmm=g)
  common.write("gsc_bayes", payload)
  print(f"\nTrain step, small config, global batch {batch}, {len(jax.devices())} devices")
  print(common.table(rows, [("method", "method", "s"), ("seconds", "s/step", ".2f"), ("ratio", "vs CLIP", ".2f")]))
  print(f"\nGMM (2 components, 10 EM iterations, k-means init) on {g['n']:,} scores + posteriors: ncjax "
        f"{g['jax_seconds']:.3f} s on {g['devices']} devices, scikit-learn {g['sklearn_seconds']:.3f} s -> "
        f"{g['speedup']:.1f}x; max posterior difference {g['max_posterior_diff']:.1e}")
  return payload
