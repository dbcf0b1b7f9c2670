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


def test_recall_identity_is_perfect():
  n = 10
  c2i = np.repeat(np.arange(n), 2)
  s = (c2i[None, :] == np.arange(n)[:, None]).astype(np.float32)
  r = retrieval.recall_at_k(s, c2i)
  assert r["i2t_R@1"] == 100.0 and r["t2i_R@1"] == 100.0 and r["rsum"] == 600.0


def test_folds_evaluate_each_block_of_consecutive_images_alone_and_average():
  """NCR's COCO 1K x 5: fold f holds images [f n/5, (f+1) n/5) and their captions, ranked among themselves only.
  Random scores with each image's strongest distractors planted in another fold: the fold average must equal the
  mean of the five restated per-fold recalls (tests/recompute.py) and beat the whole-matrix recall, which the
  distractors spoil (on the identity matrix every fold scores 100 and nothing is tested)."""
  import recompute
  rng = np.random.default_rng(0)
  n, folds = 25, 5
  c2i = np.concatenate([np.repeat(np.arange(n), 2), [3, 17]])   # 2 captions per image, 3 for images 3 and 17
  s = rng.normal(size=(n, len(c2i))).astype(np.float32)
  s[c2i, np.arange(len(c2i))] += 1.0                            # own captions score higher on average
  for j, i in enumerate(c2i):                                    # the best image of every third caption lies in
    if j % 3 == 0:                                               # the next fold: a miss on the whole matrix only
      s[(i + n // folds) % n, j] = s[:, j].max() + 1.0
  got = retrieval.recall_at_k_folds(s, c2i, n_folds=folds)
  size = n // folds
  per_fold = []
  for f in range(folds):
    caps = np.flatnonzero(c2i // size == f)
    per_fold.append(recompute.recall(s[f * size:(f + 1) * size][:, caps], c2i[caps] - f * size))
  for key in ("i2t_R@1", "i2t_R@5", "t2i_R@1", "t2i_R@5", "rsum", "i2t_meanr", "t2i_medr"):
    assert got[key] == pytest.approx(np.mean([r[key] for r in per_fold]), abs=1e-9), key
  whole = recompute.recall(s, c2i)
  assert got["t2i_R@1"] > whole["t2i_R@1"] + 20 and got["t2i_R@5"] == 100.0 > whole["t2i_R@5"]
  with pytest.raises(ValueError, match="do not split into 5 equal folds"):
    retrieval.recall_at_k_folds(s[:24], c2i[c2i < 24], n_folds=5)


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


def test_linear_probe_jax_matches_sklearn_on_digits():
  from ncjax.data.embedded import digits
  from ncjax.evals import linear_probe as lp
  tr, te = digits.load("train", image_size=8), digits.load("test", image_size=8)
  xtr = tr.images[..., 0].reshape(len(tr.images), -1)
  xte = te.images[..., 0].reshape(len(te.images), -1)
  a, b = lp.train_val_split(len(xtr))
  ours = lp.linear_probe(xtr[a], tr.image_labels[a], xtr[b], tr.image_labels[b], xte, te.image_labels, 10)
  from threadpoolctl import threadpool_limits
  # scikit-learn's L-BFGS on one BLAS thread: its 64 x 10 products are far too small to split, and two OpenBLAS
  # threads spinning on a loaded 2-core machine took 39 s for the sweep's fits (one thread: 0.3 s)
  with threadpool_limits(limits=1, user_api="blas"):
    ref = lp.linear_probe(xtr[a], tr.image_labels[a], xtr[b], tr.image_labels[b], xte, te.image_labels, 10,
                          protocol="sklearn")
  assert ours["coarse_C"] == ref["coarse_C"]
  assert abs(ours["lp_acc1"] - ref["lp_acc1"]) <= 0.005
  assert ours["lp_acc1"] > 0.9


def test_linear_probe_fit_matches_sklearn_coefficients_at_fixed_c():
  from sklearn.linear_model import LogisticRegression
  from ncjax.evals import linear_probe as lp
  rng = np.random.default_rng(0)
  x = rng.normal(size=(300, 5)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(5, 3)) + 0.5 * rng.normal(size=(300, 3)), axis=1)
  ours = lp.fit(x, y, 0.5, 3)
  ref = LogisticRegression(C=0.5, max_iter=1000, tol=1e-8).fit(x, y)
  # Multinomial logits are defined up to a per-sample constant: compare centred class scores.
  s_ours = x @ np.asarray(ours["w"]) + np.asarray(ours["b"])
  s_ref = ref.decision_function(x)
  np.testing.assert_allclose(s_ours - s_ours.mean(1, keepdims=True), s_ref - s_ref.mean(1, keepdims=True),
                             atol=2e-3)


def test_lorentz_prompt_ensemble_is_tangent_space_mean():
  from ncjax.models import lorentz
  from ncjax.models.geometry import Lorentz
  geo = Lorentz(embed_dim=4)
  rng = np.random.default_rng(0)
  v = rng.normal(size=(3, 5, 4)).astype(np.float32) * 0.3
  emb = lorentz.exp_map0(v, 1.0)
  np.testing.assert_allclose(np.asarray(geo.ensemble(emb)), np.asarray(lorentz.exp_map0(v.mean(1), 1.0)),
                             atol=1e-5)


def test_unlearning_forget_retain_switches():
  from ncjax.evals import unlearning
  # Predictions with every class offered: [0, 1, 0, 2, 2]; labels [0, 0, 1, 1, 2]; forget class 0.
  scores = np.array([[3, 2, 1], [1, 3, 2], [3, 2, 1], [1, 2, 3], [2, 1, 3]], np.float32)
  labels = np.array([0, 0, 1, 1, 2])
  keep = unlearning.forget_retain_accuracy(scores, labels, [0])
  assert keep["F_acc"] == pytest.approx(0.5) and keep["R_acc"] == pytest.approx(1 / 3)
  # Without class 0 in the label set image 2 falls to class 1 (right); forget images cannot be right.
  drop = unlearning.forget_retain_accuracy(scores, labels, [0], keep_forget_classes_in_labelset=False)
  assert drop["F_acc"] == 0.0 and drop["R_acc"] == pytest.approx(2 / 3)
  macro = unlearning.forget_retain_accuracy(scores, labels, [0], average="macro")
  assert macro["R_acc"] == pytest.approx((0.0 + 1.0) / 2)
  sim = np.eye(3, dtype=np.float32)
  r = unlearning.forget_retain_retrieval(sim, np.arange(3), np.array([True, False, False]))
  assert r["forget_i2t_R@1"] == 100.0 and r["retain_t2i_R@1"] == 100.0


def test_plots_are_written(tmp_path):
  from ncjax.evals import plots
  rng = np.random.default_rng(0)
  sim = rng.normal(size=(10, 20)).astype(np.float32)
  c2i = np.repeat(np.arange(10), 2)
  stats = plots.similarity_statistics(sim, c2i)
  assert stats["positive"].shape == (20,)
  assert (stats["top_negative"] >= stats["mean_negative"]).all()
  p1 = plots.plot_similarity_distributions(sim, c2i, str(tmp_path / "sim.png"))
  p2 = plots.plot_clean_noisy_histogram(rng.normal(size=50), rng.uniform(size=50) > 0.5, str(tmp_path / "h.png"))
  for p in (p1, p2):
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_an_evaluation_embeds_as_the_model_does_and_a_later_one_reuses_its_compiled_encoders(devices):
  """Every batch of a split has one shape (the last one padded), and the parameters are an argument of the jitted
  encoder, not constants of its program: an evaluation with other parameters (the next periodic one) runs the
  program the first one compiled, and both embed as the model itself does, row for row."""
  import jax
  from helpers import make_config
  from ncjax import sharding as shard_lib
  from ncjax.evals import common
  from ncjax.experiment import method_from_config
  from ncjax.tokenizers import WordTokenizer
  method = method_from_config(make_config("clip"), tokenizer=WordTokenizer.build(["a b"], context_length=16),
                              num_examples=16)
  mesh = jax.sharding.Mesh(np.asarray(devices[:2]), ("data",))
  side = method.model_spec.image_size
  images = np.random.default_rng(0).normal(size=(10, side, side, 3)).astype(np.float32)
  first = method.init_params()
  later = jax.tree.map(lambda p: p * 1.5, first)
  whole = jax.jit(lambda params, x: method.model_for_eval(params).encode_image(x))   # all 10 rows at once
  for params in (first, later):
    eval_model = method.eval_model(params)
    got = common.embed_images(eval_model, images, 4, mesh)   # batches of 4 rows: 4, 4, then 2 padded to 4
    np.testing.assert_allclose(got, np.asarray(whole(params, images)), atol=2e-5)
  encoder = method.eval_model(first).functions.jitted("encode_image", shard_lib.replicated(mesh))
  assert encoder._cache_size() == 1   # one trace, one program, for both parameter sets and all three batches
