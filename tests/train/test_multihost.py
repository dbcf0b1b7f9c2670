"""Two local processes x 4 CPU devices (the testable stand-in for a pod) train like one process x 8 devices."""

import os
import socket
import subprocess
import sys

import numpy as np
import jax
import pytest

from helpers import ROOT, tiny_clip_config
from ncjax import train

# make test-all. make test's 2-process training check is the GSC run of tests/train/test_multiprocess_evaluation.py,
# whose parameters are compared with the same run's on 1 process (it fails when each process feeds process 0's half
# of the batch, or draws its crops at process 0's positions); this one adds each process's batch ids, for CLIP.
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one_process(tmp_path):
  """Each worker asserts jax.process_count() == 2 (tests/multihost_worker.py); each feeds its own contiguous half of
  every global batch — the halves together are the 1-process batch — and the parameters after 3 steps equal the
  1-process run's (within 2e-5: the layouts reduce in another order)."""
  port, steps = _free_port(), 3
  out = tmp_path / "params.npz"
  worker = os.path.join(ROOT, "tests", "multihost_worker.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, JAX_ENABLE_COMPILATION_CACHE="false")  # conftest.py
  procs = [subprocess.Popen([sys.executable, worker, str(i), "2", str(port), str(tmp_path / "mp"), str(out),
                             str(steps), "4"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = [p.communicate(timeout=600)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  multi = dict(np.load(out))
  single = train.train(tiny_clip_config(total_steps=steps), str(tmp_path / "sp"))
  halves = [np.load(f"{out}.process{p}.npy") for p in range(2)]
  for s in range(steps):
    ids = single.experiment.train_data.indices(s)
    np.testing.assert_array_equal(np.concatenate([halves[0][s], halves[1][s]]), ids)
    assert len(halves[0][s]) == len(halves[1][s]) == len(ids) // 2
  flat = {"/".join(str(k.key) for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(single.params))[0]}
  assert set(flat) == set(multi)
  for k in flat:
    np.testing.assert_allclose(multi[k], flat[k], atol=2e-5, err_msg=k)
  # Both processes wrote one checkpoint together.
  assert (tmp_path / "mp" / "checkpoints" / str(steps) / "state").is_dir()
