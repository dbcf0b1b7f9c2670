"""Bayesian contrastive learning with Gamma pair weights ("When Contrastive Learning Meets Bayesian Modeling").

Weighted InfoNCE (paper Eq. 202-203), per anchor i with positive score s_i+ and negatives s_ik- (s = exp(logit)):
  l_i = -log( w_i+ s_i+ / (w_i+ s_i+ + sum_k w_ik- s_ik-) ),
computed in log space from log weights (the sampler's scale drifts by orders of magnitude with b = 0). The weights come from ncjax.samplers.gamma.gibbs (stop-gradient). `em_loss` is the M-step
objective with u kept: -log s+ + u (w+ s+ + sum_k w- s-); with w = 1 and u = 1/Z its gradient equals InfoNCE's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ncjax.numerics import diagonal, f32



def _split(logits):
  n = logits.shape[0]
  eye = jnp.eye(n, dtype=bool)
  return diagonal(logits), logits, ~eye


def weighted_infonce_rows(logits, log_w_pos, log_w_neg):
  """Per-row weighted InfoNCE (anchor = row), weights given as logs; log_w_neg (N, N), diagonal ignored."""
  logits = f32(logits)
  pos, full, neg_mask = _split(logits)
  log_wpos = f32(log_w_pos)
  log_wneg = jnp.where(neg_mask, f32(log_w_neg), 0.0)
  num = log_wpos + pos
  terms = jnp.where(neg_mask, log_wneg + full, -jnp.inf)
  terms = terms.at[jnp.arange(logits.shape[0]), jnp.arange(logits.shape[0])].set(num)
  return jax.nn.logsumexp(terms, axis=1) - num


def weighted_infonce(logits, w_pos_i2t, w_neg_i2t, w_pos_t2i, w_neg_t2i):
  """Symmetric weighted InfoNCE: mean over both directions (rows of logits and of logits^T); log weights."""
  l_i2t = weighted_infonce_rows(logits, w_pos_i2t, w_neg_i2t)
  l_t2i = weighted_infonce_rows(f32(logits).T, w_pos_t2i, w_neg_t2i)
  return 0.5 * (jnp.mean(l_i2t) + jnp.mean(l_t2i)), dict(loss_i2t=jnp.mean(l_i2t), loss_t2i=jnp.mean(l_t2i))


def em_loss_rows(logits, u, w_pos, w_neg):
  """M-step objective per row: -log s+ + u (w+ s+ + sum_k w_k- s_k-)."""
  logits = f32(logits)
  pos, full, neg_mask = _split(logits)
  weighted = jnp.where(neg_mask, f32(w_neg) * jnp.exp(full), 0.0).sum(1) + f32(w_pos) * jnp.exp(pos)
  return -pos + f32(u) * weighted


def effective_positive_probability(logits, log_w_pos, log_w_neg):
  """w+ s+ / (w+ s+ + sum w- s-): what the weights make of each pair's positive (a clean score)."""
  return jnp.exp(-weighted_infonce_rows(logits, log_w_pos, log_w_neg))
