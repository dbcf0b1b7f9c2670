"""A run that starts from an ncjax checkpoint (`init=WORKDIR`) takes the checkpoint's model — its size and every
architecture key the config leaves unset, logged (ncjax.experiment.with_checkpoint_model; the conflicts of given
keys: tests/test_recipes.py) — through the CLI: NCU from a `tiny_deep` CLIP workdir without `model=`."""

import subprocess
import sys

import numpy as np

import multiprocess
from helpers import leaves, make_config
from ncjax import checkpoint as ckpt_lib, train


def test_ncu_from_a_tiny_deep_clip_runs_through_the_cli_without_model(tmp_path):
  # the CLIP workdir: tiny_deep (NCU's default is tiny) with one text block of its own, its step-0 checkpoint written
  # without a training step (what matters here is the model, not what it learned)
  clip = str(tmp_path / "clip")
  trainer = train.Trainer(make_config("clip", "model=tiny_deep,batch=64,epochs=1", **{"model.text_depth": 1}), clip)
  state, span = trainer.restore_or_init()
  trainer.save(state, 0, span, force=True)
  trainer.checkpointer.wait()
  workdir = tmp_path / "ncu"
  out = subprocess.run(
      [sys.executable, "-m", "ncjax.main", "train", f"--config=ncu:init={clip},batch=64,epochs=1,epochs_prompt=1",
       "--config.total_steps=1", "--config.evals={}", "--config.log.progress=False", f"--workdir={workdir}",
       "--cpu_devices=8"], cwd=str(tmp_path), env=multiprocess.env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"the model of the checkpoint init={clip} starts from: model.size='tiny_deep', model.text_depth=1" \
      in out.stderr, out.stderr[-3000:]
  params, meta, step = ckpt_lib.restore_params(str(workdir))
  assert step == 1 and (meta["config"]["model"]["size"], meta["config"]["model"]["text_depth"]) == ("tiny_deep", 1)
  start, after = leaves(ckpt_lib.restore_params(clip)[0]), leaves(params)
  assert any(k.startswith("model/img/transformer/block_3/") for k in after)    # tiny_deep's fourth image block
  for key in (k for k in start if k.startswith("model/img/")):                 # the CLIP's, frozen in NCU's stage 1
    np.testing.assert_array_equal(after[key], start[key])
