"""NCU and its gradient-ascent baseline, end to end on digits: stages, freezes, sharding, forget records."""

import math

import numpy as np
import jax
import pytest

from helpers import leaves as _leaves, make_config, tiny_clip_config
from ncjax import train


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("clip")
  train.train(tiny_clip_config(total_steps=3), str(workdir))
  return str(workdir)


def ncu_config(init, **kw):
  return make_config("ncu", f"init={init},batch=64,epochs=2,epochs_prompt=1",
                     **{"method.frozen_text_blocks": 1, **kw})


def test_ncu_stages_train_and_freeze_the_right_groups(clip_run, tmp_path):
  cfg = ncu_config(clip_run)
  trainer = train.Trainer(cfg, str(tmp_path))
  spe = trainer.exp.steps_per_epoch
  init = _leaves(trainer.init_params())
  clip_params = _leaves(train.ckpt_lib.restore_params(clip_run)[0])
  for k, v in clip_params.items():   # the model starts from the CLIP checkpoint
    np.testing.assert_array_equal(init[k], v)
  after_prompt = _leaves(trainer.run(until=spe).params)
  changed = {k for k in init if not np.array_equal(init[k], after_prompt[k])}
  assert "prompt/ctx" in changed
  assert not {k for k in changed if k.startswith("model/img/")}           # image tower frozen in stage 1
  assert any(k.startswith("model/txt/") for k in changed)                 # text tower trains (public code)
  done = _leaves(train.train(cfg, str(tmp_path)).params)                  # resumes into stage 2
  changed2 = {k for k in done if not np.array_equal(after_prompt[k], done[k])}
  assert "prompt/ctx" not in changed2
  assert not {k for k in changed2 if k.startswith(("model/txt/transformer/block_0/", "model/txt/pos_embedding"))}
  assert any(k.startswith("model/txt/transformer/block_1/") for k in changed2)
  assert any(k.startswith("model/img/") for k in changed2)
  assert 0.0 <= float(done["model/logit_scale"]) <= math.log(100) + 1e-6


def test_ncu_step_on_8_devices_equals_step_on_1(clip_run, tmp_path, devices):
  cfg = ncu_config(clip_run, total_steps=2)
  eight = train.train(cfg, str(tmp_path / "8"))
  one = train.train(cfg, str(tmp_path / "1"), devices=devices[:1])
  a, b = _leaves(eight.params), _leaves(one.params)
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=5e-5, err_msg=k)


def test_gradient_ascent_baseline_runs_and_records_forget_sets(clip_run, tmp_path):
  cfg = ncu_config(clip_run, total_steps=2, **{"method.name": "ncu_ga"})
  res = train.train(cfg, str(tmp_path))
  assert np.isfinite(res.metrics["loss"]) and res.metrics["loss_ascent"] <= 0
  st = jax.device_get(res.state["method_state"])
  assert st["forgotten"].sum() == int(np.floor(0.4 * 64)) * 2   # two batches, 25 forgotten each
