"""GSC's label update: the jitted GMM fit on 10^6 scores vs scikit-learn (same machine, same run). The GSC and
Bayesian-CL train steps against CLIP are in benchmarks/steps.py."""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks import common


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
  g = gmm_vs_sklearn(100_000 if quick else 1_000_000)
  common.write("gsc_bayes", dict(gmm=g))
  common.report("GSC's GMM (2 components, 10 EM iterations, k-means init) + posteriors vs scikit-learn", [g],
                [("n", "scores", ",d"), ("jax_seconds", "ncjax s", ".3f"), ("devices", "devices", "d"),
                 ("sklearn_seconds", "scikit-learn s", ".3f"), ("speedup", "speed-up", ".1f"),
                 ("max_posterior_diff", "max posterior diff", ".1e")])
  return dict(gmm=g)
