"""A run whose workdir and built dataset live in object storage (gs://), against a real GCS JSON API server started
on 127.0.0.1 (tests/gcs_server.py), never a mock of ncjax's own I/O: trained, SIGKILLed, resumed and evaluated, it
ends bitwise where the same run on local disk ends; and an object store that dies during a save leaves the last
complete checkpoint usable, the run ending with one clear line.

The killed run is a process of its own (`python -m ncjax.main`); the local reference and the resumed run go
through the CLI's `main` in the test's process (tests/cli_in_process.py): no second Python importing JAX and ncjax,
and the resumed run takes the reference's compiled programs from the process's program cache
(tests/shared_programs.py: the same program text, the same executable). The resumed run's state is what the killed
process wrote to the store; the reference trained on other paths (local disk)."""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli_in_process  # noqa: E402  (tests/cli_in_process.py)
import multiprocess  # noqa: E402  (tests/multiprocess.py)
from gcs_server import GCSServer  # noqa: E402

STEPS = 4
# Retrieval and noise detection evaluate the run (their JSON, plots and clean-score file written to the store too);
# zero-shot adds nothing on the store's side and costs each of the three runs its prompt encodings.
_ARGS = ["train", "--config=configs/clip.py:data=tfds:digits,model=micro,noise=0.4,batch=64,epochs=1",
         f"--config.total_steps={STEPS}", "--config.log.progress=False", "--config.log.every_steps=1",
         "--config.evals.zeroshot.enabled=False"]
# The runs on the store save every step, so that a kill lands between two checkpoints; the reference saves only its
# last step (what is compared), and saving does not change what a run computes.
_EVERY_STEP = ["--config.ckpt.every_steps=1"]


def _args(data_dir, workdir, saves=()):
  return _ARGS + [*saves, f"--config.input.data_dir={data_dir}", f"--workdir={workdir}"]


def _steps(workdir: str) -> list[int]:
  from ncjax import fileio
  ckpt = fileio.join(workdir, "checkpoints")
  try:
    return sorted(int(n) for n in fileio.listdir(ckpt) if n.isdigit())
  except Exception:   # not there yet (or the listing raced a write)
    return []


def _run_local(tmp_path):
  from ncjax.data.tables import builders as tfds_builders
  data, workdir = str(tmp_path / "tfds"), str(tmp_path / "local_run")
  tfds_builders.build("digits", None, None, data)
  out = cli_in_process.run(_args(data, workdir), cwd=multiprocess.ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


def _assert_same_run(local: str, remote: str):
  from ncjax import checkpoint as ckpt_lib, fileio
  ref, _, ref_step = ckpt_lib.restore_state_on_host(local)
  got, meta, got_step = ckpt_lib.restore_state_on_host(remote)
  assert got_step == ref_step == STEPS
  import jax
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(ref)[0], jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  evals = [json.loads(fileio.read_text(fileio.join(w, "eval", f"step_{STEPS}.json")))["results"]
           for w in (local, remote)]
  assert evals[0] == evals[1]
  rows = [[{k: v for k, v in json.loads(line).items() if k not in ("time", "examples_per_sec")}
           for line in fileio.read_text(fileio.join(w, "metrics.jsonl")).splitlines()] for w in (local, remote)]
  assert rows[0] == rows[1] and [r["step"] for r in rows[1] if r["kind"] == "train"] == list(range(1, STEPS + 1))


def test_a_gcs_run_sigkilled_and_resumed_equals_the_same_run_on_local_disk(tmp_path):
  local = _run_local(tmp_path)
  with GCSServer() as server:
    from ncjax.data.tables import builders as tfds_builders
    data, workdir = server.path("tfds"), server.path("run")
    tfds_builders.build("digits", None, None, data)     # built locally, uploaded (tfds writes local files)
    logs = str(tmp_path / "gcs_logs")
    procs = multiprocess.start(_args(data, workdir, _EVERY_STEP), processes=1, devices=8, log_dir=logs,
                               extra_env=server.env)
    t0 = time.time()
    while not [s for s in _steps(workdir) if s >= 2] and procs[0].poll() is None and time.time() - t0 < 300:
      time.sleep(0.05)
    assert procs[0].poll() is None, multiprocess.logs(logs)
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].wait()
    assert 2 <= max(_steps(workdir)) < STEPS
    out = cli_in_process.run(_args(data, workdir, _EVERY_STEP), cwd=multiprocess.ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from step" in out.stderr
    assert not os.path.exists(os.path.join(multiprocess.ROOT, "gs:"))   # nothing written to a local ./gs:/...
    _assert_same_run(local, workdir)


@pytest.mark.slow
def test_an_object_store_dying_during_a_save_keeps_the_last_checkpoint_and_ends_with_one_line(tmp_path):
  # The workdir's store dies (the data stays local here: array_record's reader retries a dead store for minutes,
  # as it would on a real outage); the run saves a checkpoint every step.
  local = _run_local(tmp_path)
  with GCSServer() as server:
    data, workdir = str(tmp_path / "tfds"), server.path("run")
    logs = str(tmp_path / "gcs_logs")
    procs = multiprocess.start(_args(data, workdir, _EVERY_STEP), processes=1, devices=8, log_dir=logs,
                               extra_env=server.env)
    t0 = time.time()
    while not [s for s in _steps(workdir) if s >= 2] and procs[0].poll() is None and time.time() - t0 < 300:
      time.sleep(0.05)
    server.kill()                                        # the object store is gone, mid-run (saves every step)
    code = procs[0].wait(timeout=600)
    text = multiprocess.logs(logs, tail=None)
    errors = [line for line in text.splitlines() if line.startswith("ncjax: error:")]
    assert code == 5 and len(errors) == 1, text[-4000:]   # storage (ncjax.errors)
    assert "gs://" in errors[0] and ("unreachable" in errors[0] or "not writable" in errors[0]), errors[0]
    assert "Traceback" not in text.split(errors[0])[-1]  # nothing after the line
    server.restart()                                     # back, with what it had stored
    saved = _steps(workdir)
    assert saved and max(saved) < STEPS
    codes = multiprocess.run(_args(data, workdir, _EVERY_STEP), processes=1, devices=8, log_dir=logs,
                             extra_env=server.env)
    assert codes == [0], multiprocess.logs(logs)
    _assert_same_run(local, workdir)
