"""The trainer on dynamic noise and on a built (record-backed) dataset, with evaluation."""

import jax
import ml_collections
import numpy as np

from helpers import tiny_clip_config
from ncjax import train


def test_trainer_with_in_batch_noise_runs_and_resumes_exactly(tmp_path):
  cfg = tiny_clip_config(total_steps=4, **{"noise.kind": "in_batch_resample", "noise.ratio": 0.1})
  full = train.train(cfg, str(tmp_path / "a"))
  train.train(cfg, str(tmp_path / "b"), until=2)
  resumed = train.train(cfg, str(tmp_path / "b"))
  for x, y in zip(jax.tree.leaves(jax.device_get(full.params)), jax.tree.leaves(jax.device_get(resumed.params))):
    np.testing.assert_array_equal(x, y)


def test_training_from_a_built_karpathy_dataset_with_retrieval_eval(built, tmp_path):
  cfg = tiny_clip_config(total_steps=2, **{"input.dataset": "tfds:karpathy/flickr30k",
                                           "input.data_dir": built["data_dir"], "input.global_batch_size": 8,
                                           "noise.kind": "caption_shuffle", "noise.ratio": 0.2})
  with cfg.unlocked():
    cfg.evals = ml_collections.ConfigDict(dict(retrieval=dict(type="retrieval", split="test")))
  from ncjax import evaluation
  result = train.train(cfg, str(tmp_path))
  res = evaluation.final(cfg, result, str(tmp_path))["retrieval"]
  assert 0 <= res["i2t_R@1"] <= 100 and res["i2t_R@10"] == 100.0  # 2 test images: everything within top 10
