"""A run that starts from an ncjax checkpoint (`init=WORKDIR`) takes the checkpoint's model — its size and every
architecture key the config leaves unset, logged (ncjax.experiment.with_checkpoint_model; the conflicts of given
keys: tests/test_recipes.py) — through the CLI (its `main(argv)`, in this process: tests/cli_in_process.py): NCU
from a `micro` CLIP workdir with two text blocks, without `model=`."""

import numpy as np

import cli_in_process
from helpers import leaves, make_config
from ncjax import checkpoint as ckpt_lib, train


def test_ncu_from_a_micro_clip_with_its_own_text_depth_runs_through_the_cli_without_model(tmp_path):
  # the CLIP workdir: micro (one image block, where NCU's default tiny has two) with two text blocks (micro has one),
  # its step-0 checkpoint written without a training step (what matters here is the model, not what it learned)
  clip = str(tmp_path / "clip")
  trainer = train.Trainer(make_config("clip", "model=micro,batch=64,epochs=1", **{"model.text_depth": 2}), clip)
  state, span = trainer.restore_or_init()
  trainer.save(state, 0, span, force=True)
  trainer.checkpointer.wait()
  workdir = tmp_path / "ncu"
  out = cli_in_process.run(
      ["train", f"--config=ncu:init={clip},batch=64,epochs=1,epochs_prompt=1", "--config.total_steps=1",
       "--config.evals={}", "--config.log.progress=False", f"--workdir={workdir}", "--cpu_devices=8"],
      cwd=str(tmp_path))
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"the model of the checkpoint init={clip} starts from: model.size='micro', model.text_depth=2" \
      in out.stderr, out.stderr[-3000:]
  params, meta, step = ckpt_lib.restore_params(str(workdir))
  assert step == 1 and (meta["config"]["model"]["size"], meta["config"]["model"]["text_depth"]) == ("micro", 2)
  start, after = leaves(ckpt_lib.restore_params(clip)[0]), leaves(params)
  # the checkpoint's two text blocks (micro has one), and micro's one image block (NCU's default tiny has two)
  assert any(k.startswith("model/txt/transformer/block_1/") for k in after), sorted(after)
  assert not any(k.startswith("model/img/transformer/block_1/") for k in after), sorted(after)
  for key in (k for k in start if k.startswith("model/img/")):                 # the CLIP's, frozen in NCU's stage 1
    np.testing.assert_array_equal(after[key], start[key])
