"""Bad inputs at the trainer's edge (README "When something is wrong"): each is a clear error that names the
problem, raised before work is lost, and nothing already written is damaged."""

import contextlib
import json
import resource
import signal

import jax
import numpy as np
import pytest

import cli_in_process
from helpers import ROOT, TEST_MODEL, load_config, override, tiny_clip_config
from ncjax import checkpoint as ckpt_lib
from ncjax import train


def test_workdir_that_cannot_take_files_fails_before_any_work(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  with pytest.raises(ckpt_lib.CheckpointWriteError, match=r"workdir .*a_file/run is not writable"):
    train.Trainer(tiny_clip_config(total_steps=1), str(blocker / "run"))


def test_too_little_free_space_for_one_checkpoint_is_refused_up_front(tmp_path, monkeypatch):
  trainer = train.Trainer(tiny_clip_config(total_steps=1), str(tmp_path))
  monkeypatch.setattr(ckpt_lib.shutil, "disk_usage", lambda path: type("U", (), dict(free=1024))())
  with pytest.raises(ckpt_lib.CheckpointWriteError, match=r"has 0.0 MiB free, but one checkpoint of this run .*takes"):
    trainer.run()
  assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()


@contextlib.contextmanager
def _file_size_limit(kib=64):
  """This process under a file-size limit (RLIMIT_FSIZE, what bash's `ulimit -f` sets) while the block runs, SIGXFSZ
  ignored, so that a write past the limit fails with EFBIG as a full disk fails with ENOSPC, instead of killing the
  process; both put back afterwards (lowering a soft limit and raising it back up to the hard one needs no
  privilege)."""
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, hard))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, handler)


# After the failed save, a tensorstore write still pending completes on orbax's event loop, already closed: in a
# process of its own the command's exit (os._exit) came first and nothing showed; in this process it is reported.
@pytest.mark.filterwarnings(r"ignore:(?s)Exception ignored in.*RuntimeError. Event loop is closed"
                            r":pytest.PytestUnraisableExceptionWarning")
def test_checkpoint_write_failure_mid_run_keeps_the_last_checkpoint_and_resumes(tmp_path, caplog):
  """The disk fills up during a run (here: a 64 KiB file-size limit on the process while the command runs, which
  fails tensorstore's writes as a full disk would): one clear line, the storage kind's exit status, the earlier
  checkpoints intact, and the same run later resumes from the last of them. The run before and after the failure
  train through `train.train` (the same config as the command's), the failing one is the `ncjax train` command
  under the limit, through the CLI's `main` in this process (tests/cli_in_process.py; tests/cli/test_errors.py
  runs a real process for what only a process shows): it reuses this process's compiled step instead of a fresh
  process compiling the run again."""
  overrides = {"log.progress": False, "log.every_steps": 1, "ckpt.every_steps": 1,
               "evals.zeroshot.enabled": False, "evals.retrieval.enabled": False,
               "evals.noise_detection.enabled": False}
  # tiny_clip_config's data, batch and epochs: the same compiled step as the other runs of this file (the lr
  # schedule spans the configured epochs, whatever the steps run)
  config_arg = f"model={TEST_MODEL},noise=0.4,batch=64,epochs=2"
  cfg = override(load_config("clip", config_arg), **overrides)
  assert int(train.train(cfg, str(tmp_path), until=2).state["step"]) == 2
  args = ["train", f"--config=configs/clip.py:{config_arg}", f"--workdir={tmp_path}", "--cpu_devices=8",
          "--until_step=4"] + [f"--config.{k}={v}" for k, v in overrides.items()]
  with _file_size_limit():
    out = cli_in_process.run(args, cwd=ROOT)
  assert out.returncode == 5, out.stderr[-3000:]   # storage (ncjax.errors)
  assert "resumed from step 2" in out.stderr, out.stderr[-3000:]
  assert ("ncjax: error: saving the checkpoint of step" in out.stderr and "File too large" in out.stderr
          and "the last complete checkpoint (step 2) is intact" in out.stderr), out.stderr[-3000:]
  manager = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  assert manager.latest_step() == 2
  manager.close()
  state, _, step = ckpt_lib.restore_state_on_host(str(tmp_path))
  assert step == 2 and all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"]))
  with caplog.at_level("INFO", logger="ncjax"):
    assert int(train.train(cfg, str(tmp_path), until=4).state["step"]) == 4
  assert "resumed from step 2" in caplog.text
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]


def test_resuming_with_other_noisy_pairs_or_another_model_is_refused(tmp_path):
  train.train(tiny_clip_config(total_steps=1), str(tmp_path))
  with pytest.raises(ValueError, match=r"cannot resume .*step 1.*: the noisy pairs .* differs: checkpoint '[0-9a-f]+'"):
    train.Trainer(tiny_clip_config(total_steps=2, **{"noise.seed": 1}), str(tmp_path)).run()
  with pytest.raises(ValueError, match=r"cannot resume .*: the method differs: checkpoint 'clip', this config 'siglip'"):
    train.Trainer(tiny_clip_config(total_steps=2, **{"method.name": "siglip",
                                                                                "model.logit_bias_init": -10.0}), str(tmp_path)).run()
  with pytest.raises(ValueError, match=r"written by another model or method .* shapes differ \(.*: checkpoint \(.*"
                                       r"\), config \("):
    train.Trainer(tiny_clip_config(total_steps=2, **{"model.embed_dim": 32}), str(tmp_path)).run()
  # Nothing was touched: the checkpoint still resumes under its own config.
  assert int(train.train(tiny_clip_config(total_steps=2), str(tmp_path)).state["step"]) == 2
