"""Bayesian CL's weighted InfoNCE and M-step objective against plain InfoNCE."""

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
