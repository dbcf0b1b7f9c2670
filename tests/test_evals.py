import numpy as np
import pytest

from ncjax.evals import noise, retrieval, zeroshot


def test_recall_at_k_hand_made_with_variable_captions_and_ties():
  # 3 images; image 0 has 2 captions, image 1 has 1, image 2 has 3 (caption->image explicit, not k per image).
  c2i = np.array([0, 0, 1, 2, 2, 2])
  s = np.array([
      [0.1, 0.9, 0.8, 0.0, 0.0, 0.0],   # image 0: its caption 1 is ranked first -> i2t rank 0
      [0.5, 0.5, 0.5, 0.0, 0.0, 0.0],   # image 1: its caption 2 ties with captions 0, 1 (lower index first) -> rank 2
      [0.9, 0.0, 0.0, 0.1, 0.2, 0.3],   # image 2: best own caption (5, 0.3) is behind caption 0 -> rank 1
  ], np.float32)
  i2t, t2i = retrieval.ranks(s, c2i)
  np.testing.assert_array_equal(i2t, [0, 2, 1])
  # t2i: caption 0 -> image 0 has 0.1, beaten by 0.5 and 0.9 -> rank 2; caption 1 -> 0.9 best -> 0;
  # caption 2 -> image 1 has 0.5 < 0.8 -> 1; captions 3, 4, 5 -> image 2 is best -> 0.
  np.testing.assert_array_equal(t2i, [2, 0, 1, 0, 0, 0])
  r = retrieval.recall_at_k(s, c2i, ks=(1, 2))
  assert r["i2t_R@1"] == pytest.approx(100 / 3) and r["i2t_R@2"] == pytest.approx(200 / 3)
  assert r["t2i_R@1"] == pytest.approx(400 / 6) and r["t2i_R@2"] == pytest.approx(500 / 6)
  assert r["rsum"] == pytest.approx(100 / 3 + 200 / 3 + 400 / 6 + 500 / 6)
  assert r["i2t_medr"] == 2.0 and r["t2i_meanr"] == pytest.approx(1 + 3 / 6)
  assert r["text_retrieval_recall@1"] == pytest.approx(1 / 3)


def test_recall_identity_is_perfect_and_folds_average():
  n = 10
  c2i = np.repeat(np.arange(n), 2)
  s = (c2i[None, :] == np.arange(n)[:, None]).astype(np.float32)
  r = retrieval.recall_at_k(s, c2i)
  assert r["i2t_R@1"] == 100.0 and r["t2i_R@1"] == 100.0 and r["rsum"] == 600.0
  folds = retrieval.recall_at_k_folds(s, c2i, n_folds=5)
  assert folds["i2t_R@1"] == 100.0


def test_recall_rejects_mismatched_index():
  with pytest.raises(ValueError, match="n_captions"):
    retrieval.recall_at_k(np.zeros((2, 3)), np.array([0, 1]))


def test_zero_shot_ensemble_equals_numpy_reference():
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(5, 7, 12)).astype(np.float32)
  ref = emb / np.linalg.norm(emb, axis=-1, keepdims=True)
  ref = ref.mean(1)
  ref /= np.linalg.norm(ref, axis=-1, keepdims=True)
  np.testing.assert_allclose(zeroshot.ensemble_sphere(emb), ref, rtol=1e-6)


def test_zero_shot_accuracy_top1_top5_and_mean_per_class():
  scores = np.array([[3, 2, 1], [1, 3, 2], [1, 2, 3], [3, 2, 1]], np.float32)
  labels = np.array([0, 1, 1, 2])
  acc = zeroshot.accuracy(scores, labels, 3)
  assert acc["acc1"] == pytest.approx(0.5)
  assert np.isnan(acc["acc5"])  # fewer than 5 classes
  assert acc["mean_per_class_recall"] == pytest.approx((1 + 0.5 + 0) / 3)


def test_auc_matches_sklearn_and_precision_recall():
  from sklearn.metrics import roc_auc_score
  rng = np.random.default_rng(1)
  clean = rng.uniform(size=500) > 0.4
  scores = rng.normal(size=500) + clean * 1.0
  scores[:50] = np.round(scores[:50])  # ties
  m = noise.detection_metrics(scores, clean, flagged=scores < 0.0)
  assert m["auc"] == pytest.approx(roc_auc_score(clean, scores), abs=1e-12)
  flagged = scores < 0.0
  tp = (flagged & ~clean).sum()
  assert m["precision"] == pytest.approx(tp / flagged.sum()) and m["recall"] == pytest.approx(tp / (~clean).sum())
