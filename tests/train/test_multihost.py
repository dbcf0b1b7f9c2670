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

pytestmark = pytest.mark.multiprocess


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow   # make test-all (25 s); make test's 2 x 4 == 1 x 8 is test_multiprocess_evaluation.py (training and evaluation)
def test_two_processes_match_one_process(tmp_path):
  port, steps = _free_port(), 3
  out = tmp_path / "params.npz"
  worker = os.path.join(ROOT, "tests", "multihost_worker.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  procs = [subprocess.Popen([sys.executable, worker, str(i), "2", str(port), str(tmp_path / "mp"), str(out),
                             str(steps), "4"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = [p.communicate(timeout=600)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  multi = dict(np.load(out))
  single = train.train(tiny_clip_config(total_steps=steps), str(tmp_path / "sp"))
  flat = {"/".join(str(k.key) for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(single.params))[0]}
  assert set(flat) == set(multi)
  for k in flat:
    np.testing.assert_allclose(multi[k], flat[k], atol=2e-5, err_msg=k)
  # Both processes wrote one checkpoint together.
  assert (tmp_path / "mp" / "checkpoints" / str(steps) / "state").is_dir()
