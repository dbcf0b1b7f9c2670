import json
import os
import subprocess
import sys

import numpy as np
import pytest

import recompute
from helpers import ROOT, TEST_MODEL


def _recompute_zero_shot_and_retrieval(workdir, step, results):
  """Zero-shot top-1 (the 39 digits prompts, CLIP's ensemble restated) and retrieval recall on the 359 test images
  and 718 captions, recomputed in this process from the checkpoint's parameters (tests/recompute.py). The run
  evaluated on 8 devices and this on 1: a last-bit difference may swap a near tie, so each metric may differ by
  one query (1/359 of the images, 1/718 of the captions), as in tests/cli/test_eval_cli.py."""
  import jax
  from ncjax.evals.zeroshot import templates_for
  em, img, txt, split, tokenizer, _ = recompute.checkpoint_embeddings(workdir, step)
  weights = recompute.zero_shot_weights(em, tokenizer, split.class_names, templates_for("digits"))
  predicted = (img @ weights.T).argmax(axis=1)
  one_image = 1 / split.num_images
  assert results["zeroshot"]["acc1"] == pytest.approx(np.mean(predicted == split.image_labels), abs=one_image + 1e-9)
  expected = recompute.recall(np.asarray(jax.jit(em.score)(img, txt)), split.caption_to_image)
  for k in (1, 5, 10):
    assert results["retrieval"][f"i2t_R@{k}"] == pytest.approx(expected[f"i2t_R@{k}"], abs=100 * one_image + 1e-6)
    assert results["retrieval"][f"t2i_R@{k}"] == pytest.approx(expected[f"t2i_R@{k}"],
                                                               abs=100 / split.num_captions + 1e-6)


@pytest.mark.slow   # make test-all (47 s); make test trains through the CLI with periodic evaluation in test_adding_a_method.py
def test_cli_trains_siglip_with_periodic_evals_tensorboard_and_resume(tmp_path):
  args = [sys.executable, "-m", "ncjax.main", f"--config=configs/siglip.py:model={TEST_MODEL},noise=0.4,batch=64,epochs=1",
          f"--workdir={tmp_path}", "--cpu_devices=8", "--config.log.tensorboard=True",
          "--config.evals.zeroshot.every_steps=4", "--config.log.every_steps=2", "--config.log.progress=False",
          "--until_step=4"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  # quiet by default: orbax's per-save INFO lines only with --verbosity
  assert "checkpoint_manager.py" not in out.stderr and "zeroshot:" in out.stdout
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train_rows = [r for r in rows if r["kind"] == "train"]
  eval_rows = [r for r in rows if r["kind"] == "eval"]
  assert [r["step"] for r in train_rows] == [2, 4]
  assert "logit_bias" in train_rows[-1] and "loss" in train_rows[-1]
  assert [r["step"] for r in eval_rows] == [4]
  assert any(f.startswith("events") for f in os.listdir(tmp_path / "tensorboard"))
  final = json.loads((tmp_path / "eval" / "step_4.json").read_text())["results"]
  # The periodic evaluation of step 4 (metrics.jsonl) and the final one (eval/step_4.json) scored the same state.
  assert eval_rows[0]["zeroshot/acc1"] == final["zeroshot"]["acc1"]
  _recompute_zero_shot_and_retrieval(tmp_path, 4, final)
  # Same command again, to step 8: resumes from step 4.
  args[-1] = "--until_step=8"
  out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from step 4" in out.stderr, out.stderr[-3000:]
  steps = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit())
  assert steps[0] == 4 and steps[-1] == 8
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["kind"] == "train"] == [2, 4, 6, 8]


def test_console_script_help_lists_the_commands():
  script = os.path.join(os.path.dirname(sys.executable), "ncjax")
  out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  text = out.stdout + out.stderr
  for command in ("ncjax train --config", "ncjax eval --checkpoints", "ncjax export --checkpoint"):
    assert command in text, text[:2000]
  assert "--workdir" in text and "--cpu_devices" in text
