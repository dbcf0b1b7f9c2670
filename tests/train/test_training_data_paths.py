"""The trainer on dynamic noise and on a built (record-backed) dataset, with evaluation."""

import os

import jax
import ml_collections
import numpy as np

import recompute
from helpers import stopped_at, tiny_clip_config
from ncjax import train


def test_file_backed_dataset_with_dynamic_noise_resumes_mid_epoch_exactly(built, tmp_path):
  """A run on the built (ArrayRecord) digits with in-batch resampled noise (fresh noisy pairs drawn inside every
  step), stopped at step 3 of a 22-step epoch and resumed, ends bitwise equal to the uninterrupted run: the record
  pipeline's order and crops continue mid-epoch, and the noise drawn at each step is drawn again on resume."""
  # the one save is step 3's (the resume's start); the two runs' ends are compared in memory, unsaved (~0.5 s each)
  cfg = tiny_clip_config(total_steps=5, **{"input.dataset": "tfds:digits", "input.data_dir": built["data_dir"],
                                           "noise.kind": "in_batch_resample", "noise.ratio": 0.1,
                                           "ckpt.every_steps": 3, "ckpt.save_at_end": False})
  full = train.train(cfg, str(tmp_path / "a"))
  assert full.experiment.steps_per_epoch == 22 and type(full.experiment.train_data.split.images) is not np.ndarray
  assert full.experiment.batch_transform is not None   # the noise is the step's own, not a static index
  stopped = stopped_at(tmp_path / "a", 3, tmp_path / "b")   # the run as it stood after saving step 3
  assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == ["3"]   # the resumed call starts from step 3
  resumed = train.train(cfg, stopped)
  assert int(resumed.state["step"]) == 5
  for x, y in zip(jax.tree.leaves(jax.device_get(full.state)), jax.tree.leaves(jax.device_get(resumed.state))):
    np.testing.assert_array_equal(x, y)


def test_training_from_a_built_karpathy_dataset_with_retrieval_eval(built, tmp_path, monkeypatch):
  cfg = tiny_clip_config(total_steps=2, **{"input.dataset": "tfds:karpathy/flickr30k",
                                           "input.data_dir": built["data_dir"], "input.global_batch_size": 8,
                                           "noise.kind": "caption_shuffle", "noise.ratio": 0.2,
                                           "ckpt.save_at_end": False})   # evaluated in memory: no save
  with cfg.unlocked():
    cfg.evals = ml_collections.ConfigDict(dict(retrieval=dict(type="retrieval", split="test")))
  from ncjax import evaluation
  result = train.train(cfg, str(tmp_path))
  spy = recompute.ScoreSpy(monkeypatch)
  res = evaluation.final(cfg, result, str(tmp_path))["retrieval"]
  # The test split's 2 images and 13 captions (6 + 7), embedded here from the run's parameters: the evaluator ranked
  # these scores, and its recalls and ranks are what an independent restatement computes from them.
  own, c2i = recompute.own_scores(result, cfg)
  assert own.shape == (2, 13) and c2i.tolist() == [0] * 6 + [1] * 7
  ranked = spy.of_shape(own.shape)
  np.testing.assert_allclose(ranked, own, atol=1e-5)
  recompute.assert_recall_matches(res, ranked, c2i)
