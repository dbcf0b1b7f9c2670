"""Checkpoint saves of replicated state: no per-replica device slicing for small arrays, exact round trip."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ncjax import checkpoint as ckpt_lib


def test_replicated_leaves_are_saved_without_device_slices_and_restore_exactly(tmp_path, devices, monkeypatch):
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  rng = np.random.default_rng(0)
  state = {f"w{i}": jax.device_put(rng.normal(size=(64, 7)).astype(np.float32), replicated) for i in range(12)}
  state["per_sample"] = jax.device_put(rng.normal(size=(64,)).astype(np.float32), rows)
  slices = []
  real_slice = jax.lax.slice_in_dim
  monkeypatch.setattr(jax.lax, "slice_in_dim", lambda *a, **k: slices.append(1) or real_slice(*a, **k))
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), keep=1)
  ckpt.save(3, state, {"note": "x"}, {"epoch": 0}, force=True)
  ckpt.close()
  # orbax's default cuts each replicated leaf into 8 device slices (one per replica): 96 dispatches here
  assert not slices, f"{len(slices)} device slices for arrays below {ckpt_lib.MIN_REPLICA_PARALLEL_SLICE_BYTES} B"
  got, meta, step = ckpt_lib.restore_state_on_host(str(tmp_path))
  assert step == 3 and meta["note"] == "x"
  for name, value in state.items():
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(jax.device_get(value)))
