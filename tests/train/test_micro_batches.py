"""Gradient caching (`optim.micro_batches=K`, ncjax/models/microbatch.py): with the towers encoding the global batch
in K device-local micro-batches, each recomputed in the backward pass, every global-batch method takes the same
step as with K = 1 — on 8 devices, parameters after 2 steps within 2e-6 (float32; measured: CLIP and GSC 6e-8,
NCU's Sinkhorn stages 8e-7: the micro-batched matmuls sum in another order). The batch is never all-gathered
(the compiled step's all-gathers are K = 1's), resume stays bitwise, and a K that does not divide the per-device
batch, or a region model, is refused with the reason."""

import re
import tempfile

import jax
import numpy as np
import pytest

from helpers import assert_trees_equal, host_params, make_config, stopped_at
from ncjax import train

TOL = 2e-6
# (config, arguments): every method whose loss is a function of the global batch's embeddings.
FAST = {"clip": ("clip", "noise=0.4,batch=64,epochs=1"),
        "ncu_unlearn": ("ncu", "noise=0.4,batch=64,epochs=1,epochs_prompt=0"),
        "gsc": ("gsc", "batch=64,epochs=1")}
SLOW = {"siglip": ("siglip", "noise=0.4,batch=64,epochs=1"),
        "ncu_prompt": ("ncu", "noise=0.4,batch=64,epochs=1,epochs_prompt=1"),
        "gsc_plus": ("gsc", "batch=64,epochs=1,coteach=true"),
        "bayes": ("bayes", "batch=64,epochs=1"),
        "meru": ("meru", "batch=64,epochs=1"),
        "ac": ("ac", "batch=64,epochs=1"),
        "hac": ("hac", "batch=64,epochs=1")}


def _config(name, arg, k, **overrides):
  return make_config(name, arg, total_steps=2, **{"optim.micro_batches": k, **overrides})


def _params(name, arg, k, **overrides):
  # only the parameters are compared: no final checkpoint (an orbax save nothing reads)
  with tempfile.TemporaryDirectory() as workdir:
    return host_params(train.train(_config(name, arg, k, **{"ckpt.save_at_end": False, **overrides}), workdir))


# CLIP's runs of the tests below save every step: the resume test resumes a copy of the K = 4 run cut back to step 1.
CLIP_SAVES = {"ckpt.every_steps": 1}


@pytest.fixture(scope="module")
def clip_runs(tmp_path_factory):
  """CLIP's 2-step runs at K = 1 and K = 4, kept while this module runs: the equality, compiled-program and resume
  tests read the same two runs (a new trainer traces its programs again). Dropped, with the executables their
  trainers hold, when the module ends."""
  runs = {}

  def run(k):
    if k not in runs:
      workdir = tmp_path_factory.mktemp(f"clip_k{k}")
      runs[k] = train.train(_config(*FAST["clip"], k, **CLIP_SAVES), str(workdir)), workdir
    return runs[k][0]

  run.workdir = lambda k: runs[k][1]
  yield run
  runs.clear()


def _close(a, b, tol=TOL):
  worst = max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert worst <= tol, worst


def _check_method(config, arg, ks=(2, 4), params_of=None):
  params_of = params_of or (lambda k: _params(config, arg, k))
  ref = params_of(1)
  for k in ks:
    _close(ref, params_of(k))


@pytest.mark.parametrize("method", sorted(FAST))
def test_micro_batched_steps_equal_the_full_batch_step(method, clip_runs):
  # make test: K = 4 (make test-all: K = 2 and 4, every method)
  shared = (lambda k: host_params(clip_runs(k))) if method == "clip" else None
  _check_method(*FAST[method], ks=(4,), params_of=shared)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(SLOW) + sorted(FAST))
def test_micro_batched_steps_equal_the_full_batch_step_for_every_method(method):
  _check_method(*{**SLOW, **FAST}[method])


@pytest.mark.slow
def test_micro_batches_compose_with_fsdp_remat_bf16_and_chunked_losses():
  arg = "noise=0.4,batch=64,epochs=1"
  over = {"mesh.fsdp": 2, "model.remat": True, "loss.chunk_rows": 16}
  _close(_params("clip", arg, 1, **over), _params("clip", arg, 2, **over))
  bf16 = {"model.dtype": "bfloat16"}   # bf16 towers: their rounding, not the micro-batching, sets the tolerance
  _close(_params("clip", arg, 1, **bf16), _params("clip", arg, 4, **bf16), tol=2e-3)


def _compiled_step(result):
  """The compiled train step (one device's program after SPMD partitioning) of CLIP at batch 64 on 8 devices: the
  program the run trained with, lowered again from its trainer and final state."""
  trainer = result.trainer
  prog = trainer.program(trainer.spans[0])
  batch, _ = trainer.exp.train_data.global_batch(0)
  with jax.set_mesh(trainer.exp.mesh):
    return prog.step.lower(result.state, batch).compile().as_text()


def _all_gathers(hlo):
  return sorted(re.findall(r"= (\w+\[[\d,]*\])\S* all-gather", hlo))


def _patch_embeddings(hlo):
  """The shapes the image tower's patch embedding (a convolution to 64 channels of 4 x 4 patches) produces."""
  return set(re.findall(r"= (f32\[\d+,4,4,64\])\S* convolution\(", hlo))


def test_micro_batches_run_in_k_pieces_and_stay_on_their_devices(clip_runs):
  """With K = 4 the compiled step encodes each device's 8 images as 4 micro-batches of 2 (the patch embedding's
  activations are 2 images deep, inside a loop of 4 trips; with K = 1 they are 8 deep) — the program really runs K
  pieces, not the whole batch at once. And no all-gather of the image or token batch: the step gathers what K = 1's
  gathers (the embeddings the global-batch loss needs, and a few vectors), nothing more."""
  one, four = _compiled_step(clip_runs(1)), _compiled_step(clip_runs(4))
  assert "f32[8,4,4,64]" in _patch_embeddings(one) and "f32[2,4,4,64]" not in _patch_embeddings(one)
  assert _patch_embeddings(four) == {"f32[2,4,4,64]"}, _patch_embeddings(four)
  assert '"known_trip_count":{"n":"4"}' in four
  gathered = _all_gathers(four)
  assert _all_gathers(one) == gathered
  assert not any(s.startswith("f32[64,16,16") or s.startswith("s32[64,16") for s in gathered), gathered


def test_a_micro_batched_run_resumes_bitwise(clip_runs, tmp_path):
  """Stopped after step 1 and resumed: bitwise the uninterrupted run (the equality test's CLIP run at K = 4, resumed
  from a copy of its workdir cut back to its step-1 checkpoint; a SIGKILL mid-run: below)."""
  whole = clip_runs(4)
  resumed = train.train(_config(*FAST["clip"], 4, **CLIP_SAVES), stopped_at(clip_runs.workdir(4), 1, tmp_path / "r"))
  assert int(resumed.state["step"]) == int(whole.state["step"]) == 2
  assert_trees_equal(whole.state, resumed.state)


@pytest.mark.slow
def test_a_micro_batched_run_sigkilled_mid_run_resumes_bitwise(tmp_path):
  """`ncjax train` with K = 2, a checkpoint every step, killed with SIGKILL once step 2's checkpoint exists (the
  process gets no chance to save or clean up), relaunched: it ends bitwise where the uninterrupted run ends."""
  import os
  import signal
  import sys
  import time
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import multiprocess
  from ncjax import checkpoint as ckpt_lib
  args = ["train", "--config=clip:model=micro,noise=0.4,batch=64,epochs=1", "--config.total_steps=6",
          "--config.optim.micro_batches=2", "--config.ckpt.every_steps=1", "--config.log.progress=False",
          "--config.evals={}"]
  whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
  assert multiprocess.run(args + [f"--workdir={whole}"], processes=1, devices=8, log_dir=whole + "_logs") == [0]
  procs = multiprocess.start(args + [f"--workdir={killed}"], processes=1, devices=8, log_dir=killed + "_logs")
  ckpts, t0 = os.path.join(killed, "checkpoints"), time.time()
  while not (os.path.isdir(ckpts) and any(n.isdigit() and int(n) >= 2 for n in os.listdir(ckpts))):
    assert procs[0].poll() is None and time.time() - t0 < 300, multiprocess.logs(killed + "_logs")
    time.sleep(0.02)
  os.kill(procs[0].pid, signal.SIGKILL)
  procs[0].wait()
  assert max(int(n) for n in os.listdir(ckpts) if n.isdigit()) < 6
  assert multiprocess.run(args + [f"--workdir={killed}"], processes=1, devices=8, log_dir=killed + "_logs") == [0]
  a, b = ckpt_lib.restore_state_on_host(whole), ckpt_lib.restore_state_on_host(killed)
  assert a[2] == b[2] == 6
  assert_trees_equal(a[0], b[0])


def test_micro_batches_that_do_not_divide_the_per_device_batch_or_a_region_model_are_refused(tmp_path):
  cfg = make_config("clip", "noise=0.4,batch=64,epochs=1", total_steps=1, **{"optim.micro_batches": 3})
  with pytest.raises(ValueError, match=r"optim.micro_batches=3 does not divide the per-device batch 8 \(global "
                                       r"batch 64 over 8 devices\)"):
    train.Trainer(cfg, str(tmp_path / "a"))
  region = make_config("sgraf", "batch=64", total_steps=1, **{"optim.micro_batches": 2})
  with pytest.raises(ValueError, match="learned B x B head"):
    train.Trainer(region, str(tmp_path / "b"))


@pytest.mark.slow
def test_micro_batches_on_two_processes_as_on_one(tmp_path):
  """2 processes x 4 devices with K = 2 take the step 1 process x 8 devices takes with K = 2 (within the 2e-5 of
  tests/train/test_multihost.py: the two layouts reduce in another order)."""
  import os
  import sys
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import multiprocess
  from ncjax import checkpoint as ckpt_lib
  args = ["train", "--config=configs/clip.py:model=micro,noise=0.4,batch=64,epochs=1", "--config.total_steps=2",
          "--config.optim.micro_batches=2", "--config.log.progress=False",
          *[f"--config.evals.{e}.enabled=False" for e in ("zeroshot", "retrieval", "noise_detection")]]
  states = {}
  for processes, devices in ((2, 4), (1, 8)):
    workdir, logs = tmp_path / f"run_{processes}", str(tmp_path / f"logs_{processes}")
    codes = multiprocess.run(args + [f"--workdir={workdir}"], processes=processes, devices=devices, log_dir=logs)
    assert set(codes) == {0}, multiprocess.logs(logs)
    states[processes] = ckpt_lib.restore_state_on_host(str(workdir))[0]["params"]
  _close(states[1], states[2], tol=2e-5)


def test_micro_batched_outputs_come_back_in_their_rows_on_a_mesh_and_without_one(devices):
  """Row for row: each output row where its input row was. The steps above cannot see a permutation that moves
  both towers' rows alike (a loss of the whole batch is the same), so the merge is checked here directly."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  from ncjax.models.microbatch import micro_batched
  x = np.arange(32 * 3, dtype=np.float32).reshape(32, 3)
  fn = lambda a: dict(double=a * 2, first=a[:, 0])   # noqa: E731
  want = fn(x)
  micro = lambda a: micro_batched(fn, a, micro_batches=4)   # noqa: E731
  unsharded = jax.jit(micro)(x)
  mesh = jax.sharding.Mesh(np.asarray(devices[:4]), ("data",))   # 8 rows a device: 4 micro-batches of 2 rows
  with jax.set_mesh(mesh):
    sharded = jax.jit(micro)(jax.device_put(x, NamedSharding(mesh, P("data"))))
  for got in (unsharded, sharded):
    for key in want:
      np.testing.assert_array_equal(np.asarray(got[key]), want[key])
