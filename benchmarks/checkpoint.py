"""Checkpoint save cost of a real train state on the simulated mesh: ncjax's array handler (no replica-parallel
slicing below 4 MiB per slice) against orbax's default one, same state, same directory kind, one run.

The train loop waits for `save()` (the device-to-host copy of every leaf; the file writes then run in a thread),
so that is the figure per step with `ckpt.every_steps=1`; `until written` adds the asynchronous writes.
"""

from __future__ import annotations

import contextlib
import tempfile
import time

import jax
import numpy as np

from benchmarks import common


def _train_state(size: str, workdir: str):
  from ncjax import train
  from ncjax.config_lib import load_config_file
  cfg = load_config_file("clip", f"model={size},data=synthetic,batch=64,epochs=1")
  with cfg.unlocked():
    cfg.evals = {}
    cfg.log.progress = False
  trainer = train.Trainer(cfg, workdir)
  state, _ = trainer.restore_or_init()
  return state


@contextlib.contextmanager
def _array_handler(kind: str):
  """orbax's default jax.Array handler for the block ('orbax'), then ncjax's again."""
  from ncjax import checkpoint as ckpt_lib
  if kind == "orbax":
    ckpt_lib.register_array_handler(None)
  try:
    yield
  finally:
    ckpt_lib.register_array_handler()


def _device_slices(fn):
  """How many device slices orbax cut while fn ran (its replica-parallel split)."""
  count = [0]
  real = jax.lax.slice_in_dim

  def counting(*a, **k):
    count[0] += 1
    return real(*a, **k)

  jax.lax.slice_in_dim = counting
  try:
    fn()
  finally:
    jax.lax.slice_in_dim = real
  return count[0]


def save_cost(size: str = "tiny", saves: int = 6) -> list[dict]:
  from ncjax import checkpoint as ckpt_lib
  rows = []
  with tempfile.TemporaryDirectory() as root:
    state = _train_state(size, f"{root}/run")
    n_leaves = len(jax.tree.leaves(state))
    n_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    for kind in ("orbax", "ncjax"):
      with _array_handler(kind):
        ckpt = ckpt_lib.Checkpointer(f"{root}/{kind}", keep=2)
        blocking, total = [], []
        slices = 0
        for step in range(saves + 1):   # the first save is a warm-up (orbax builds its handlers, jax compiles)
          t0 = time.perf_counter()
          slices = _device_slices(lambda: ckpt.save(step, state, {}, {}, force=True))
          t1 = time.perf_counter()
          ckpt.wait()
          t2 = time.perf_counter()
          if step:
            blocking.append(t1 - t0)
            total.append(t2 - t0)
        ckpt.close()
      rows.append(dict(handler=kind, size=size, leaves=n_leaves, mib=n_bytes / 2 ** 20, slices=slices,
                       save_s=float(np.median(blocking)), written_s=float(np.median(total))))
  base = rows[0]["save_s"]
  for r in rows:
    r["vs_orbax"] = r["save_s"] / base
  return rows


def run(quick: bool = False) -> dict:
  rows = save_cost("tiny") + ([] if quick else save_cost("small", saves=3))
  payload = dict(rows=rows, devices=len(jax.devices()))
  common.write("checkpoint", payload)
  common.report(f"Checkpoint save of a CLIP train state on {len(jax.devices())} devices (median of repeated saves)",
                rows, [("size", "size", "s"), ("handler", "array handler", "s"), ("leaves", "leaves", "d"),
                       ("mib", "MiB", ".1f"), ("slices", "device slices", "d"), ("save_s", "save() s", ".3f"),
                       ("written_s", "until written s", ".3f"), ("vs_orbax", "vs orbax", ".2f")])
  return payload
