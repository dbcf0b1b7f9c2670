"""Region-feature retrieval (SGRAF backbone): the learned B x B similarity and the methods' train steps.

1. SGRAF's similarity H over every pair of a global batch, forward + backward, at growing batch sizes: time, and the
   compiler's per-device temporary memory on 1 device and on all devices of the mesh (the B x B work is split over
   the batch axis by the partitioner: per-device memory falls with the device count).
2. Full train steps of GSC on SGRAF and DisNCL (its discriminator update + encoder update) against SGRAF's hinge
   step, same model, data and global batch, in one run (the configs' synthetic preset: SAF head, 12 x 64 regions).
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import common

METHODS = {
    "SGRAF hinge": ("sgraf", "all_negatives_epochs"),   # the max-violation stage
    "GSC on SGRAF": ("gsc", None),
    "DisNCL": ("disncl", None),
}


def _config(name: str, batch: int):
  from ncjax.config_lib import load_config_file
  config_name, _ = METHODS[name]
  arg = f"batch={batch},noise=0.4" + (",backbone=sgraf" if config_name == "gsc" else "")
  arg += ",warmup=0" if config_name in ("disncl", "gsc") else ""
  cfg = load_config_file(config_name, arg)
  with cfg.unlocked():
    cfg.loss.all_negatives_epochs = 0
  return cfg


def _similarity_cost(batch: int, devices) -> dict:
  import jax
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P
  from ncjax.models.sgraf import RegionRetrievalModel
  model = RegionRetrievalModel(feature_dim=64, embed_dim=64, vocab_size=64, word_dim=64, sim_dim=32, head="saf",
                               rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  rng = np.random.default_rng(0)
  regions = rng.normal(size=(batch, 12, 64)).astype(np.float32)
  tokens = rng.integers(4, 64, size=(batch, 16)).astype(np.int32)

  def loss(p, img, tok):
    m = nnx.merge(graphdef, p)
    return jax.numpy.sum(m.similarity(m.encode_image(img), m.encode_text(tok)))

  out = {}
  for label, devs in (("1", devices[:1]), ("all", devices)):
    mesh = jax.make_mesh((len(devs),), ("data",), devices=devs, axis_types=(jax.sharding.AxisType.Auto,))
    batch_sh, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    args = (jax.device_put(params, rep), jax.device_put(regions, batch_sh), jax.device_put(tokens, batch_sh))
    compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
    out[f"temp_mb_{label}"] = compiled.memory_analysis().temp_size_in_bytes / 2 ** 20
    if label == "all":
      out["seconds"] = common.time_fn(compiled, *args, repeats=2)[0]
  return out


def run(quick: bool = False) -> dict:
  import jax
  devices = jax.devices()
  sizes = (64, 128) if quick else (128, 256, 512)
  sim_rows = []
  for b in sizes:
    r = _similarity_cost(b, devices)
    sim_rows.append(dict(batch=b, pairs=b * b, **r))
  for prev, cur in zip(sim_rows, sim_rows[1:]):
    cur["time_exponent"] = float(np.log(cur["seconds"] / prev["seconds"]) / np.log(cur["batch"] / prev["batch"]))
  common.report(f"SGRAF similarity H over B x B pairs, forward + backward ({len(devices)} devices; temp memory per "
                f"device on 1 and on {len(devices)} devices)", sim_rows,
                [("batch", "B", "d"), ("pairs", "pairs", "d"), ("seconds", "s", ".3f"),
                 ("time_exponent", "time ~ B^k", ".2f"), ("temp_mb_1", "MB/dev (1)", ".1f"),
                 ("temp_mb_all", f"MB/dev ({len(devices)})", ".1f")])
  step_rows = []
  for batch in ((64,) if quick else (128, 512)):
    base = None
    for name in METHODS:
      t0 = time.perf_counter()
      sec = common.train_step_seconds(_config(name, batch))
      base = base or sec
      step_rows.append(dict(method=name, batch=batch, seconds=sec, vs_sgraf=sec / base,
                            wall=time.perf_counter() - t0))
  common.report("Train step on region features (synthetic preset, 40% noise): each method vs SGRAF's hinge step",
                step_rows, [("method", "method", "s"), ("batch", "batch", "d"), ("seconds", "s/step", ".3f"),
                            ("vs_sgraf", "vs SGRAF", ".2f")])
  payload = dict(similarity=sim_rows, steps=step_rows)
  common.write("region", payload)
  return payload
