"""Baseline contrastive losses: CLIP's symmetric InfoNCE and SigLIP's pairwise sigmoid loss.

Both take embeddings of the *global* batch (under `jax.jit` with batch-sharded inputs GSPMD inserts the gathers)
and compute logits, softmax and log-sigmoid in float32. `logit_scale` is the log of the logit multiplier:
logits = exp(logit_scale) * similarity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ncjax.numerics import diagonal, f32, scaled_dot



def cosine_logits(image_emb, text_emb, logit_scale):
  """exp(logit_scale) * image_emb @ text_emb.T in float32 (embeddings already normalised)."""
  return scaled_dot(image_emb, text_emb, logit_scale)


def _pair_similarities(image_emb, text_emb):
  """(diagonal of V T^T, mean of its off-diagonal entries) from row dots and column sums: no second N x N matmul."""
  pos = jnp.sum(image_emb * text_emb, axis=1)
  n = pos.shape[0]
  off_sum = jnp.dot(jnp.sum(image_emb, axis=0), jnp.sum(text_emb, axis=0)) - jnp.sum(pos)
  return pos, off_sum / max(n * (n - 1), 1)


def column_argmax_is_diagonal(logits):
  """`argmax(logits, axis=0) == arange(n)` (the first maximum of each column is its diagonal entry), computed from
  column reductions only. With the logits split by rows over a pod, `argmax` over axis 0 gathered every chip's
  per-column (value, index) candidates — at N = 32,768 on 256 chips, 64 MiB of all-gathers and a 16 MiB all-to-all
  per step for a logged metric (the TPU compiler's program, benchmarks/pod_compile.py); a column max and a column
  min of the first row index attaining it are two all-reduces of N numbers."""
  n = logits.shape[0]
  rows = jnp.arange(n)[:, None]
  column_max = jnp.max(logits, axis=0)
  first_max_row = jnp.min(jnp.where(logits == column_max[None, :], rows, n), axis=0)
  return first_max_row == jnp.arange(logits.shape[1])


def infonce_from_logits(logits, weights=None):
  """Symmetric InfoNCE (CLIP, Radford et al. 2021, Eq. of Fig. 3) on an N x N logit matrix, positives on the diagonal.

  Per pair i: l_i = 1/2 [-log softmax_row(logits)_ii - log softmax_col(logits)_ii].
  loss = mean_i(w_i * l_i) with w = 1 by default, so per-pair weights act as GSC's soft labels do
  (they scale each pair's term; they are not renormalised).
  """
  logits = f32(logits)
  n = logits.shape[0]
  if logits.ndim != 2 or logits.shape[1] != n:
    raise ValueError(f"infonce needs a square logit matrix, got shape {logits.shape}")
  diag = diagonal(logits)
  loss_i2t = jax.nn.logsumexp(logits, axis=1) - diag
  loss_t2i = jax.nn.logsumexp(logits, axis=0) - diag
  per_pair = 0.5 * (loss_i2t + loss_t2i)
  if weights is None:
    loss = jnp.mean(per_pair)
  else:
    weights = f32(weights)
    if weights.shape != (n,):
      raise ValueError(f"infonce weights must have shape ({n},), got {weights.shape}")
    loss = jnp.mean(weights * per_pair)
  idx = jnp.arange(n)
  metrics = dict(
      loss_i2t=jnp.mean(loss_i2t), loss_t2i=jnp.mean(loss_t2i),
      acc_i2t=jnp.mean(jnp.argmax(logits, axis=1) == idx),
      acc_t2i=jnp.mean(column_argmax_is_diagonal(logits)),
      per_pair_loss=per_pair)
  return loss, metrics


def infonce(image_emb, text_emb, logit_scale, weights=None):
  """CLIP's symmetric InfoNCE over the global batch; returns (loss, metrics).

  Args:
    image_emb, text_emb: (N, D) L2-normalised embeddings; pair i is (image_emb[i], text_emb[i]).
    logit_scale: log of the logit multiplier (scalar).
    weights: optional (N,) per-pair weights; loss = mean_i(w_i * l_i).
  """
  image_emb, text_emb = f32(image_emb), f32(text_emb)
  if image_emb.shape != text_emb.shape or image_emb.ndim != 2:
    raise ValueError(f"image and text embeddings must both be (N, D); got {image_emb.shape} and {text_emb.shape}")
  loss, metrics = infonce_from_logits(scaled_dot(image_emb, text_emb, logit_scale), weights)
  pos, neg = _pair_similarities(image_emb, text_emb)
  metrics.update(pos_similarity=jnp.mean(pos), neg_similarity=neg, logit_scale=jnp.exp(f32(logit_scale)))
  return loss, metrics


def sigmoid_from_logits(logits):
  """SigLIP (Zhai et al. 2023, Alg. 1): -1/N sum_ij log sigmoid(z_ij * logits_ij), z = +1 on the diagonal, -1 off it."""
  logits = f32(logits)
  n = logits.shape[0]
  signs = 2.0 * jnp.eye(n, dtype=jnp.float32) - 1.0
  per_entry = -jax.nn.log_sigmoid(signs * logits)
  loss = jnp.sum(per_entry) / n
  metrics = dict(loss_pos=jnp.sum(diagonal(per_entry)) / n,
                 loss_neg=(jnp.sum(per_entry) - jnp.sum(diagonal(per_entry))) / n)
  return loss, metrics


def sigmoid(image_emb, text_emb, logit_scale, bias):
  """SigLIP's pairwise sigmoid loss over the global batch; returns (loss, metrics).

  logits = exp(logit_scale) * image_emb @ text_emb.T + bias.
  """
  image_emb, text_emb = f32(image_emb), f32(text_emb)
  if image_emb.shape != text_emb.shape or image_emb.ndim != 2:
    raise ValueError(f"image and text embeddings must both be (N, D); got {image_emb.shape} and {text_emb.shape}")
  logits = scaled_dot(image_emb, text_emb, logit_scale) + f32(bias)
  loss, metrics = sigmoid_from_logits(logits)
  idx = jnp.arange(logits.shape[0])
  metrics.update(pos_similarity=jnp.mean(jnp.sum(image_emb * text_emb, axis=1)), logit_scale=jnp.exp(f32(logit_scale)),
                 logit_bias=f32(bias), acc_i2t=jnp.mean(jnp.argmax(logits, axis=1) == idx))
  return loss, metrics
