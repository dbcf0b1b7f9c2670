"""Bayesian CL's weighted InfoNCE against a float64 numpy restatement with non-unit weights, and its M-step
objective against plain InfoNCE (methods.md §3.1 / §3.3.1: with w = 1 and u = 1/Z their gradients are equal)."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest


def test_weighted_infonce_reduces_to_infonce_and_em_gradient_matches():
  from ncjax.losses import bayes, contrastive
  rng = np.random.default_rng(0)
  v = rng.normal(size=(16, 8)).astype(np.float32)
  t = rng.normal(size=(16, 8)).astype(np.float32)
  v /= np.linalg.norm(v, axis=1, keepdims=True)
  t /= np.linalg.norm(t, axis=1, keepdims=True)
  ones_p, ones_n = np.zeros(16, np.float32), np.zeros((16, 16), np.float32)   # log weights: w = 1

  def weighted(v, t):
    return bayes.weighted_infonce(contrastive.cosine_logits(v, t, 2.0), ones_p, ones_n, ones_p, ones_n)[0]

  def plain(v, t):
    return contrastive.infonce(v, t, 2.0)[0]

  assert float(weighted(v, t)) == pytest.approx(float(plain(v, t)), rel=1e-6)
  g1 = jax.grad(weighted, argnums=(0, 1))(v, t)
  g0 = jax.grad(plain, argnums=(0, 1))(v, t)
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)

  # M-step objective with w = 1 and u = 1/Z (Z from the current, stop-gradient logits): same gradient as InfoNCE rows.
  def em(v):
    logits = contrastive.cosine_logits(v, t, 2.0)
    z = jnp.sum(jnp.exp(jax.lax.stop_gradient(logits)), axis=1)
    return jnp.mean(bayes.em_loss_rows(logits, 1.0 / z, np.ones(16, np.float32), np.ones((16, 16), np.float32)))

  def rows(v):
    logits = contrastive.cosine_logits(v, t, 2.0)
    return jnp.mean(jax.nn.logsumexp(logits, 1) - jnp.diagonal(logits))

  np.testing.assert_allclose(np.asarray(jax.grad(em)(v)), np.asarray(jax.grad(rows)(v)), atol=1e-6)


def _weighted_infonce_numpy(logits, w_pos_i2t, w_neg_i2t, w_pos_t2i, w_neg_t2i):
  """methods.md §3.1's weighted InfoNCE, -log(w+ s+ / (w+ s+ + sum_k w_k- s_k-)) with s = exp(logit), restated per
  row in float64 with linear weights: image i against texts (row i of the logits), text j against images
  (column j). Returns (i2t per row, t2i per row, d mean-loss / d logits) — the gradient from its closed form
  0.5/N (P - I) + 0.5/N (Q - I)^T, P and Q the weighted softmax probabilities of the two directions."""
  z = np.asarray(logits, np.float64)
  n = len(z)
  eye = np.eye(n, dtype=bool)

  def direction(rows, w_pos, w_neg):
    w = np.where(eye, np.asarray(w_pos, np.float64)[:, None], np.asarray(w_neg, np.float64))
    terms = w * np.exp(rows)
    p = terms / terms.sum(axis=1, keepdims=True)
    return -np.log(np.diagonal(p)), p

  i2t, p = direction(z, w_pos_i2t, w_neg_i2t)
  t2i, q = direction(z.T, w_pos_t2i, w_neg_t2i)
  grad = 0.5 / n * (p - np.eye(n)) + 0.5 / n * (q - np.eye(n)).T
  return i2t, t2i, grad


def test_weighted_infonce_equals_a_numpy_restatement_with_non_unit_weights_in_both_directions():
  """Random log-weights, different for positives and negatives and for the two directions: swapping them, taking
  the weights as linear instead of logs, or a missing transpose of the text side changes the values (checked
  below), so each would fail here."""
  from ncjax.losses import bayes
  rng = np.random.default_rng(1)
  n = 12
  logits = rng.normal(scale=3.0, size=(n, n)).astype(np.float32)
  logs = [rng.normal(size=(n,)).astype(np.float32), rng.normal(size=(n, n)).astype(np.float32),
          rng.normal(size=(n,)).astype(np.float32), rng.normal(size=(n, n)).astype(np.float32)]
  i2t, t2i, grad = _weighted_infonce_numpy(logits, *[np.exp(x.astype(np.float64)) for x in logs])

  fn = lambda z: bayes.weighted_infonce(z, *logs)
  (loss, metrics), g = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logits))
  assert float(metrics["loss_i2t"]) == pytest.approx(i2t.mean(), rel=1e-5)
  assert float(metrics["loss_t2i"]) == pytest.approx(t2i.mean(), rel=1e-5)
  assert float(loss) == pytest.approx(0.5 * (i2t.mean() + t2i.mean()), rel=1e-5)
  np.testing.assert_allclose(np.asarray(g), grad, atol=1e-6)
  np.testing.assert_allclose(np.asarray(bayes.weighted_infonce_rows(logits, logs[0], logs[1])), i2t, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(bayes.effective_positive_probability(logits, logs[0], logs[1])),
                             np.exp(-i2t), rtol=1e-5)

  # the mistakes this would catch give other per-row values on these inputs
  linear = [np.exp(x.astype(np.float64)) for x in logs]
  for wrong in ((linear[2], linear[3], linear[0], linear[1]),      # directions swapped
                (linear[1].diagonal(), linear[1], linear[2], linear[3]),   # positive weight read from w_neg
                tuple(np.exp(w) for w in linear),                  # weights exponentiated twice (linear vs log)
                (linear[0], linear[1], linear[2], linear[3].T)):   # text side's weights not transposed
    a, b, _ = _weighted_infonce_numpy(logits, *wrong)
    assert max(np.abs(a - i2t).max(), np.abs(b - t2i).max()) > 1e-2


def test_prior_weights_ignore_the_similarities_and_have_unit_means():
  """loss.weights='prior' (an ablation for the README's Bayesian CL experiment): w+ ~ Ga(a+, a+) and w- ~ Ga(a-, a-)
  drawn whatever the logits — the same key gives the same weights for other similarities — with means 1 and
  spreads 1/sqrt(a) (Gamma(a, a): variance 1/a)."""
  import jax
  import jax.numpy as jnp
  from ncjax.methods.bayes import BayesOptions, sample_weights
  options = BayesOptions(weights="prior")
  key = jax.random.PRNGKey(3)
  a = jnp.asarray(np.random.default_rng(0).normal(size=(128, 128)), jnp.float32)
  _, wp, wn = sample_weights(key, a, options)
  _, wp2, wn2 = sample_weights(key, 5.0 * a + 1.0, options)
  np.testing.assert_array_equal(wp, wp2)
  np.testing.assert_array_equal(wn, wn2)
  off = ~np.eye(128, dtype=bool)
  neg = np.exp(np.asarray(wn))[off]
  assert abs(np.exp(np.asarray(wp)).mean() - 1) < 0.1 and abs(neg.mean() - 1) < 0.01
  assert abs(neg.std() - 1 / np.sqrt(10)) < 0.01 and np.all(np.isneginf(np.diag(np.asarray(wn))))
