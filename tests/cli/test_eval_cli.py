"""`ncjax eval` over saved checkpoints: JSON per checkpoint, summary, and 8-device == 1-device evaluation."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import recompute
from helpers import ROOT, tiny_clip_config
from ncjax import train


def _eval(workdir, out, devices):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  res = subprocess.run([sys.executable, "-m", "ncjax.main", "eval", f"--checkpoints={workdir}",
                        f"--output={out}", f"--cpu_devices={devices}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
  assert res.returncode == 0, res.stderr[-3000:]
  return res


@pytest.mark.slow  # two eval subprocesses (8 and 1 devices); the fast suite checks 8 == 1 on embeddings below
def test_eval_all_checkpoints_sharded_equals_single_device(tmp_path):
  cfg = tiny_clip_config(total_steps=4, **{"ckpt.every_steps": 2, "mesh.fsdp": 2})
  with cfg.unlocked():
    cfg.evals = {"zeroshot": dict(type="zeroshot", templates="digits"),
                 "retrieval": dict(type="retrieval"), "noise_detection": dict(type="noise_detection")}
  workdir = tmp_path / "run"
  train.train(cfg, str(workdir))
  for s in (2, 4):   # the training run's own final evaluation: what is read next must be the eval's
    (workdir / "eval" / f"step_{s}.json").unlink(missing_ok=True)
  _eval(workdir, tmp_path / "out8", 8)
  eight = {s: json.loads((workdir / "eval" / f"step_{s}.json").read_text()) for s in (2, 4)}
  summary = (tmp_path / "out8" / "summary.md").read_text()
  assert summary.count("\n") == 4 and "zeroshot/acc1" in summary  # header, rule, two checkpoints
  assert (tmp_path / "out8" / "summary.csv").is_file()
  assert (workdir / "eval" / "step_4_similarity.png").is_file()
  assert (workdir / "eval" / "step_4_clean_noisy.png").is_file()
  tasks = {r["task"] for r in eight[4]["records"]}
  assert {"zeroshot_classification", "zeroshot_retrieval", "noise_detection"} <= tasks
  assert "image_retrieval_recall@5" in eight[4]["results"]["retrieval"]
  (workdir / "eval" / "step_4.json").unlink()
  _eval(str(workdir) + "/checkpoints/4", tmp_path / "out1", 1)
  one = json.loads((workdir / "eval" / "step_4.json").read_text())
  # A 4-step model scores many pairs almost equally, so a last-bit difference between an 8-way and a 1-way
  # matmul may swap one tie: rank metrics may differ by at most one query (1/359 images, 1/718 captions).
  for name, metrics in eight[4]["results"].items():
    for k, v in metrics.items():
      if k.endswith(("medr", "meanr")):
        tol = 1e-3 * v                 # a few near-tied swaps move a mean rank of ~200 by a few hundredths
      elif k == "rsum":
        tol = 6 * 100 / 359            # six percentages, one query each
      elif "R@" in k and not k.startswith(("text_", "image_")):
        tol = 100 / 359 + 1e-6         # percent
      else:
        tol = 1 / 359 + 1e-6           # fractions, accuracies, AUC, mean ranks
      assert one["results"][name][k] == pytest.approx(v, abs=tol), (name, k)


def test_restored_sharded_checkpoint_embeds_identically_on_8_and_1_devices(tmp_path, devices):
  import jax
  from helpers import leaves
  from ncjax.evals import common
  # An FSDP-sharded checkpoint, written without a training step (what is checked is the restore, not training),
  # of parameters moved off their initial values: a restore that initialised instead is caught below.
  trainer = train.Trainer(tiny_clip_config(total_steps=2, **{"mesh.fsdp": 2}), str(tmp_path))
  state, span = trainer.restore_or_init()
  state["params"] = jax.tree.map(lambda x: x + 0.01, state["params"])
  trainer.save(state, 0, span, force=True)
  trainer.checkpointer.wait()
  saved = leaves(state["params"])
  out = {}
  for n in (8, 1):
    c = tiny_clip_config(total_steps=2, **{"mesh.fsdp": 2 if n == 8 else 1})
    trainer = train.Trainer(c, str(tmp_path), devices=devices[:n])
    state, _ = trainer.restore_or_init()
    if n == 8:
      assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(state["params"]))
    restored = leaves(state["params"])
    assert restored.keys() == saved.keys()
    for key, value in saved.items():
      np.testing.assert_array_equal(restored[key], value, err_msg=key)
    em = trainer.exp.method.eval_model(state["params"])
    split = trainer.exp.train_data.split
    out[n] = (common.embed_images(em, split.images[:64], 64, trainer.exp.mesh),
              common.embed_texts(em, trainer.exp.train_data.tokens[:64], 64, trainer.exp.mesh))
  np.testing.assert_allclose(out[8][0], out[1][0], atol=1e-5)
  np.testing.assert_allclose(out[8][1], out[1][1], atol=1e-5)


def test_eval_on_other_data_keeps_the_runs_state_and_its_own_results(tmp_path, built, monkeypatch):
  # A GSC run (per-example labels sized by its 1,438 training pairs) evaluated on another built dataset of 15
  # pairs: the state is restored with the run's own config, the results go to eval/<dataset>, not over eval/. Its
  # checkpoint is its step 0, written without a training step (the state's shapes and the restore are what is checked).
  from helpers import make_config
  from ncjax import evaluation
  cfg = make_config("gsc", "noise=0.4,batch=64,epochs=1", total_steps=2)
  with cfg.unlocked():
    cfg.evals = {"retrieval": dict(type="retrieval", plot=False)}
  workdir = tmp_path / "run"
  trainer = train.Trainer(cfg, str(workdir))
  state, span = trainer.restore_or_init()
  trainer.save(state, 0, span, force=True)
  trainer.checkpointer.wait()
  other = cfg.copy_and_resolve_references()
  with other.unlocked():
    other.input.dataset, other.input.data_dir = "tfds:karpathy/flickr30k", built["data_dir"]
  spy = recompute.ScoreSpy(monkeypatch)
  results, meta = evaluation.evaluate_checkpoint(other, str(workdir), 0)
  assert meta["method"] == "gsc"
  # Retrieval on the other data's 2 test images and 13 captions: the scores it ranked are the restored
  # checkpoint's own embeddings of that split (computed here), and its metrics are recomputed from them.
  em, img, txt, split, _, _ = recompute.checkpoint_embeddings(workdir, 0, input_config=other.input)
  assert (split.num_images, split.num_captions) == (2, 13)
  ranked = spy.of_shape((2, 13))
  np.testing.assert_allclose(ranked, img @ txt.T, atol=1e-5)
  recompute.assert_recall_matches(results["retrieval"], ranked, split.caption_to_image)
  out = json.loads((workdir / "eval" / "tfds_karpathy_flickr30k_tfds" / "step_0.json").read_text())
  assert out["dataset"] == "tfds:karpathy/flickr30k" and not (workdir / "eval" / "step_0.json").exists()
