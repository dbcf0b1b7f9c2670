"""Learning-rate schedules: NCU's run-wide cosine counted from epoch 1 (the public code's formula), per-stage
schedules, GSC's step decay, and Adam vs AdamW."""

import math

import numpy as np
import pytest

from helpers import load_config
from ncjax import optim


def public_multiplier(step, warmup, total):
  """NCU's public cosine_scheduler, restated: (step + 1) / W in warm-up, then 0.5 (1 + cos(pi (s - W) / (T - W)))."""
  if step < warmup:
    return (step + 1) / warmup
  return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def test_ncu_paper_schedule_follows_the_public_formula_across_both_stages():
  cfg = load_config("ncu", "setting=paper")
  assert cfg.optim.schedule_scope == "run" and cfg.optim.schedule_offset_epochs == 1
  prompt = cfg.method.epochs_prompt
  spe, epochs = 1600, prompt + cfg.num_epochs   # CC3M at a global batch of 2048; the run: prompt + unlearning stage
  run_steps = spe * epochs
  stage1 = optim.ScheduleContext(stage_start=0, stage_steps=prompt * spe, run_steps=run_steps, steps_per_epoch=spe)
  stage2 = optim.ScheduleContext(stage_start=prompt * spe, stage_steps=(epochs - prompt) * spe, run_steps=run_steps,
                                 steps_per_epoch=spe)
  m1, m2 = optim.multiplier_fn(cfg.optim, stage1), optim.multiplier_fn(cfg.optim, stage2)
  for count in (0, 1, 799, 3199):   # stage 1 counts from the optimiser's first step
    assert float(m1(count)) == pytest.approx(public_multiplier(spe + count, 100, run_steps), rel=1e-5)
  for count in (0, 5000, 12799):
    assert float(m2(count)) == pytest.approx(public_multiplier(spe * (prompt + 1) + count, 100, run_steps),
                                             rel=1e-4, abs=1e-6)
  assert float(m1(0)) == pytest.approx(0.978, abs=1e-3)          # the warm-up never applies
  assert float(m1(prompt * spe - 1)) == pytest.approx(0.80, abs=0.01)
  assert float(m2(0)) == pytest.approx(float(m1(prompt * spe - 1)), abs=1e-3)   # stage 2 continues, not 1.0


def test_stage_scope_restarts_each_stage_with_its_own_warmup():
  cfg = load_config("ncu", "")          # digits preset: per-stage schedules
  assert cfg.optim.schedule_scope == "stage"
  ctx = optim.ScheduleContext(stage_start=100, stage_steps=50, run_steps=150, steps_per_epoch=10)
  m = optim.multiplier_fn(cfg.optim, ctx)
  assert float(m(0)) == 0.0 and float(m(cfg.optim.warmup_steps)) == pytest.approx(1.0)
  assert float(m(49)) < 0.01


def test_gsc_paper_step_decay_and_adam():
  cfg = load_config("gsc", "setting=paper")
  assert (cfg.optim.name, cfg.optim.grad_clip_norm, cfg.optim.schedule) == ("adam", 2.0, "step")
  ctx = optim.ScheduleContext(stage_start=0, stage_steps=600, run_steps=600, steps_per_epoch=10)
  m = optim.multiplier_fn(cfg.optim, ctx)
  np.testing.assert_allclose([float(m(s)) for s in (0, 149, 150, 299, 300, 599)],
                             [1.0, 1.0, 0.2, 0.2, 0.04, 0.2 ** 3], rtol=1e-6)
  with pytest.raises(ValueError, match="unknown optim.schedule_scope 'epoch'"):
    with cfg.unlocked():
      cfg.optim.schedule_scope = "epoch"
    optim.multiplier_fn(cfg.optim, ctx)
