"""Independent recomputations of evaluation metrics, for tests that check an evaluator's output against them.

Nothing here calls ncjax's metric code: recall is restated from its definition (NCR / SCAN: an image is a hit at K
when any of its captions ranks in its top K; a caption when its own image ranks in its top K; ties go to the lower
index, as ncjax.evals.retrieval documents), in numpy, one query at a time.

`ScoreSpy` records the score matrices an evaluator ranks (it wraps, never replaces, ncjax.evals.common.score_matrix),
so that a test can (1) check the evaluator's matrix against scores it computes itself from the run's parameters,
and (2) recompute the reported metrics from that exact matrix: a last-bit difference between two float32 matrix
products could swap a near-tie, which would make a comparison of metrics from two different matrices flaky.
"""

from __future__ import annotations

import numpy as np


def ranks(similarity, caption_to_image):
  """0-based (i2t rank per image with captions, t2i rank per caption), by sorting each query's row / column."""
  s = np.asarray(similarity)
  c2i = np.asarray(caption_to_image)
  n_img, n_cap = s.shape
  i2t = []
  for i in range(n_img):
    own = np.flatnonzero(c2i == i)
    if len(own) == 0:
      continue
    order = np.argsort(-s[i], kind="stable")          # descending; equal scores keep index order
    position = np.empty(n_cap, int)
    position[order] = np.arange(n_cap)
    i2t.append(position[own].min())
  t2i = [int(np.flatnonzero(np.argsort(-s[:, j], kind="stable") == c2i[j])[0]) for j in range(n_cap)]
  return np.asarray(i2t), np.asarray(t2i)


def recall(similarity, caption_to_image, ks=(1, 5, 10)) -> dict:
  """R@K in percent both ways, rsum, and 1-based median / mean ranks (NCR's conventions)."""
  i2t, t2i = ranks(similarity, caption_to_image)
  out = {}
  for k in ks:
    out[f"i2t_R@{k}"] = 100.0 * np.mean(i2t < k)
    out[f"t2i_R@{k}"] = 100.0 * np.mean(t2i < k)
  out["rsum"] = sum(out[f"i2t_R@{k}"] + out[f"t2i_R@{k}"] for k in ks)
  out["i2t_medr"] = float(np.floor(np.median(i2t)) + 1)
  out["t2i_medr"] = float(np.floor(np.median(t2i)) + 1)
  out["i2t_meanr"] = float(np.mean(i2t) + 1)
  out["t2i_meanr"] = float(np.mean(t2i) + 1)
  return out


def assert_recall_matches(reported: dict, similarity, caption_to_image, prefix: str = ""):
  """Every R@K, rsum and rank the evaluator reported equals the recomputation (to float rounding)."""
  import pytest
  expected = recall(similarity, caption_to_image)
  for key, value in expected.items():
    assert reported[prefix + key] == pytest.approx(value, abs=1e-9), (prefix + key, reported[prefix + key], value)


class ScoreSpy:
  """Records every (images, captions) score matrix ncjax's evaluators compute while installed (monkeypatch)."""

  def __init__(self, monkeypatch):
    from ncjax.evals import common
    self.matrices = []
    original = common.score_matrix

    def recording(eval_model, a, b):
      out = original(eval_model, a, b)
      self.matrices.append(np.asarray(out))
      return out

    monkeypatch.setattr(common, "score_matrix", recording)

  def of_shape(self, shape) -> np.ndarray:
    found = [m for m in self.matrices if m.shape == tuple(shape)]
    assert found, f"no score matrix of shape {shape} was computed; shapes: {[m.shape for m in self.matrices]}"
    return found[-1]


def split_embeddings(eval_model, split, tokenizer, config, image_size: int):
  """The split's image and caption embeddings computed here, on one device, without ncjax.evals."""
  import jax
  from ncjax import data as data_lib
  images = data_lib.eval_images(split, image_size, config.input.normalization, config.input.resize)
  images = np.asarray(images[np.arange(split.num_images)])
  img = np.asarray(jax.jit(eval_model.encode_image)(images))
  txt = np.asarray(jax.jit(eval_model.encode_text)(np.asarray(tokenizer.encode(list(split.captions)))))
  return img, txt


def own_scores(result, config, split_name: str = "test"):
  """(similarity, caption_to_image) of a finished run's evaluation split, computed here: its method's EvalModel
  on the split, scored by the model's own score function (cosine on the sphere, SGRAF's learned head)."""
  import jax
  from ncjax import data as data_lib
  exp = result.experiment
  split = data_lib.load_split(exp.resolved.input, split_name, exp.model_spec.image_size)
  em = exp.method.eval_model(result.params, result.state.get("method_state"))
  img, txt = split_embeddings(em, split, exp.tokenizer, config, exp.model_spec.image_size)
  return np.asarray(jax.jit(em.score)(img, txt)), np.asarray(split.caption_to_image)


def own_noise_auc(result) -> tuple[float, int]:
  """(ROC-AUC, number of clean x noisy pairs) of a finished run's clean scores against its training pairs' clean
  flags, by scikit-learn: the method's own per-sample scores when it keeps them, else the model's score of each
  training pair (image caption_to_image[k], caption k) computed here."""
  import jax
  from sklearn.metrics import roc_auc_score
  exp = result.experiment
  pairs = exp.train_data.pairs()
  em = exp.method.eval_model(result.params, result.state.get("method_state"))
  n = pairs.num_examples
  if em.clean_scores is not None:
    scores = np.asarray(jax.device_get(em.clean_scores[0]))[:n]
  else:
    images = np.asarray(pairs.images()[np.arange(pairs.split.num_images)])
    img = np.asarray(jax.jit(em.encode_image)(images))[pairs.caption_to_image]
    txt = np.asarray(jax.jit(em.encode_text)(np.asarray(pairs.token_ids(exp.tokenizer))))
    pair = em.pair_score or (lambda a, b: jax.numpy.diagonal(em.score(a, b)))
    scores = np.asarray(jax.jit(pair)(img, txt))
  clean = np.asarray(pairs.clean, bool)
  return float(roc_auc_score(clean, scores)), int(clean.sum()) * int((~clean).sum())


def checkpoint_embeddings(workdir: str, step: int, input_config=None, split_name: str = "test"):
  """(eval_model, image embeddings, caption embeddings, split, tokenizer, run config) of a saved checkpoint on a
  split of its own data (or of `input_config`'s), computed here on one device from the restored parameters."""
  from ncjax import data as data_lib, evaluation
  method, state, resolved, _, tokenizer, _ = evaluation.restore_for_eval(str(workdir), step)
  config, spec = resolved.config, resolved.input
  if input_config is not None:
    config = config.copy_and_resolve_references()
    with config.unlocked():
      config.input.dataset, config.input.data_dir = input_config.dataset, input_config.data_dir
    spec = spec.on(input_config.dataset, input_config.data_dir)
  split = data_lib.load_split(spec, split_name, resolved.model.image_size)
  em = method.eval_model(state["params"], state.get("method_state"))
  img, txt = split_embeddings(em, split, tokenizer, config, resolved.model.image_size)
  return em, img, txt, split, tokenizer, resolved.config


def zero_shot_weights(eval_model, tokenizer, class_names, templates, jit: bool = True) -> np.ndarray:
  """Class embeddings of a sphere model restated: each prompt embedded, normalised, averaged over the templates,
  renormalised (CLIP's prompt ensemble). `jit=False` for an encoder that is already compiled (load_model's)."""
  import jax
  prompts = [t.format(c) for c in class_names for t in templates]
  encode = jax.jit(eval_model.encode_text) if jit else eval_model.encode_text
  e = np.asarray(encode(np.asarray(tokenizer.encode(prompts))), np.float64)
  e = e.reshape(len(class_names), len(templates), -1)
  e /= np.linalg.norm(e, axis=-1, keepdims=True)
  m = e.mean(axis=1)
  return (m / np.linalg.norm(m, axis=-1, keepdims=True)).astype(np.float32)
