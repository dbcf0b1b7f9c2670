"""Forget/retain batches for concept unlearning: N retain + N forget pairs per global batch, deterministic."""

import ml_collections
import numpy as np
import jax
import pytest

from helpers import make_config
from ncjax import experiment
from ncjax.data import concepts
from ncjax.data.embedded import digits
from ncjax.sharding import make_mesh
from ncjax.tokenizers import WordTokenizer


def _data(train_on="forget_retain", batch=32, classes=("three",), devices=8):
  cfg = make_config("ac", f"classes={'+'.join(classes)},batch={batch}")
  with cfg.unlocked():
    cfg.concept.train_on = train_on
  split = digits.load("train", image_size=16)
  tok = WordTokenizer.build(split.captions, context_length=16)
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)), jax.devices()[:devices])
  return concepts.concept_train_data(experiment.input_spec(cfg.input), experiment.concept_spec(cfg.concept), split,
                                     tok, mesh, None, image_size=16), split


def test_every_batch_holds_n_retain_and_n_forget_pairs():
  data, split = _data()
  labels = split.image_labels[split.caption_to_image]
  forget_class = split.class_names.index("three")
  assert data.steps_per_epoch == int(np.sum(labels != forget_class)) // 16
  seen_forget = set()
  for arrays, ids, _ in data.batches(0, 12):
    flag = np.asarray(arrays["forget"])
    assert flag.sum() == 16 and (~flag).sum() == 16
    assert (labels[np.asarray(arrays["id"])[flag]] == forget_class).all()
    assert (labels[np.asarray(arrays["id"])[~flag]] != forget_class).all()
    seen_forget.update(np.asarray(arrays["id"])[flag].tolist())
  assert len(seen_forget) > 100    # the forget set cycles through fresh permutations


def test_order_is_a_function_of_the_step_and_sharding():
  a, _ = _data()
  b, _ = _data(devices=1)
  for (x, _, _), (y, _, _) in zip(a.batches(5, 7), b.batches(5, 7)):
    np.testing.assert_array_equal(np.asarray(x["id"]), np.asarray(y["id"]))
  resumed = next(a.batches(6, 7))[0]["id"]
  np.testing.assert_array_equal(np.asarray(resumed), np.asarray(next(b.batches(6, 7))[0]["id"]))


def test_retain_only_and_errors():
  data, split = _data(train_on="retain")
  labels = split.image_labels[split.caption_to_image]
  arrays, _, _ = next(data.batches(0, 1))
  assert "forget" not in arrays and (labels[np.asarray(arrays["id"])] != 3).all()
  with pytest.raises(ValueError, match="global batch size 31 is odd"):
    _data(batch=31)
  with pytest.raises(ValueError, match="the forget set has .* fewer than the N = 400"):
    _data(batch=800)
  with pytest.raises(ValueError, match="unknown concept.train_on 'some'"):
    _data(train_on="some")
