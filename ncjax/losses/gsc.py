"""GSC — "Mitigating Noisy Correspondence by Geometrical Structure Consistency Learning" (Zhao et al., CVPR 2024).

Restated from the public code (MediaBrain-SJTU/GSC, `RINCE.train_batch`; shared/reference/methods.md §2.1):

  cross-modal:  l_CM_i = 1/2 [-log softmax_row(S/tau1)_ii - log softmax_col(S/tau1)_ii] * y_i
                (negatives in the denominators are not purified; only the per-sample loss is weighted)
  indicator:    y_CM_i = 1/2 [softmax_row(S/tau1)_ii + softmax_col(S/tau1)_ii]            (stop-gradient)
  intra-modal:  A' = A * y (columns), B' = Bc * y (columns);
                l_IM_i = -log softmax_row(A' B'^T / tau2)_ii * y_i   (raw dot products, row direction only)
  structure:    S_IM_i = cos(A'_i, B'_i)                                                     (stop-gradient)
  L = mean_i l_CM_i + gamma * mean_i l_IM_i

S, A, Bc are B x B similarity matrices in their final form: sigmoid(SGR scores) in the public code's region
backbone, cosines for CLIP towers (where `batch_loss_gram` computes the same from the embeddings).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ncjax.numerics import diagonal, f32



INDICATORS = ("softmax", "max_ratio")


def cross_modal_indicator(sim, tau1: float = 0.07, indicator: str = "softmax"):
  """y_CM_i (GSC's cross-modal correspondence estimate), averaged over the row and column directions:
    'softmax'   (the public code, §2.1): the softmax diagonal softmax(S / tau1)_ii;
    'max_ratio' (ncjax's option): the diagonal's softmax relative to the largest of its row / column,
                exp((S_ii - max_j S_ij) / tau1) — 1 when the paired caption is (one of) the image's best matches.
  With k semantically equivalent pairs in a batch (a 10-class dataset: ~B/10 captions per class) a clean pair's
  softmax diagonal cannot exceed ~1/k, so 'softmax' labels collapse towards 1/k and a clean pair's weight reflects
  how many equivalents its batch holds more than whether it is clean; 'max_ratio' keeps clean pairs near 1. On
  F30K-like data (distinct pairs) the two agree for clean pairs."""
  if indicator not in INDICATORS:
    raise ValueError(f"GSC indicator {indicator!r}; expected one of {INDICATORS}")
  logits = f32(sim) / tau1
  diag = diagonal(logits)
  if indicator == "max_ratio":
    return 0.5 * (jnp.exp(diag - jnp.max(logits, axis=1)) + jnp.exp(diag - jnp.max(logits, axis=0)))
  return 0.5 * (diagonal(jax.nn.softmax(logits, axis=1)) + diagonal(jax.nn.softmax(logits, axis=0)))


def structure_score(image_sim, text_sim, y=None):
  """S_IM_i = cos(A'_i, B'_i) with the columns of both intra-modal structures weighted by y."""
  a, bc = f32(image_sim), f32(text_sim)
  if y is not None:
    a, bc = a * f32(y)[None, :], bc * f32(y)[None, :]
  num = jnp.sum(a * bc, axis=1)
  den = jnp.linalg.norm(a, axis=1) * jnp.linalg.norm(bc, axis=1)
  return num / jnp.maximum(den, 1e-12)


def _cross_modal_loss(s, y, tau1):
  logits = s / tau1
  diag = diagonal(logits)
  l_row = jax.nn.logsumexp(logits, axis=1) - diag
  l_col = jax.nn.logsumexp(logits, axis=0) - diag
  return jnp.mean(0.5 * (l_row + l_col) * y)


def _labels(s, y):
  return jnp.ones((s.shape[0],), jnp.float32) if y is None else f32(y)


def _combine(s, y, loss_cm, im_logits, s_im, tau1, gamma, indicator):
  l_im = (jax.nn.logsumexp(im_logits, axis=1) - diagonal(im_logits)) * y
  loss_im = jnp.mean(l_im)
  metrics = dict(loss_cm=loss_cm, loss_im=loss_im,
                 y_cm=jax.lax.stop_gradient(cross_modal_indicator(s, tau1, indicator)),
                 s_im=jax.lax.stop_gradient(s_im), mean_label=jnp.mean(y))
  return loss_cm + gamma * loss_im, metrics


def batch_loss(sim, image_sim, text_sim, y, tau1: float = 0.07, tau2: float = 1.0, gamma: float = 0.01,
               indicator: str = "softmax"):
  """GSC's per-batch loss; returns (loss, metrics) with metrics['y_cm'] and metrics['s_im'] per sample."""
  s = f32(sim)
  y = _labels(s, y)
  a = f32(image_sim) * y[None, :]
  bc = f32(text_sim) * y[None, :]
  im_logits = (a @ bc.T) / tau2
  return _combine(s, y, _cross_modal_loss(s, y, tau1), im_logits, structure_score(image_sim, text_sim, y), tau1,
                  gamma, indicator)


def batch_loss_gram(sim, image_emb, text_emb, y, tau1: float = 0.07, tau2: float = 1.0, gamma: float = 0.01,
                    indicator: str = "softmax", sim_scale=None):
  """`batch_loss` for structures that are the embeddings' Gram matrices, A = V V^T and Bc = T T^T (CLIP towers'
  cosine structures), through D x D products instead of N x N x N ones. With W = diag(y^2):
    A' B'^T = V V^T W T T^T = (V M) T^T,        M = V^T W T                          (D x D)
    <A'_i, B'_i> = V_i^T M T_i,   |A'_i|^2 = V_i^T (V^T W V) V_i,   |B'_i|^2 = T_i^T (T^T W T) T_i
  — the same numbers (up to float32 rounding: the sums are reassociated), at 2 N^2 D + O(N D^2) FLOPs instead of
  2 N^3, and, over a pod, with the rows split: the N x N structures are never formed, so nothing N x N is gathered
  or all-reduced (the N x N x N form made a v5e-256 step at N = 32,768 gather a bf16 N x N matrix and all-reduce a
  float32 one, 10 GiB per chip: benchmarks/pod_compile.py) — one gather of T, as the cross-modal logits need.

  sim=None: S = sim_scale * V T^T (cosines on the sphere, times the model's temperature factor), computed with the
  intra-modal logits as one product of T with the stacked rows [sim_scale V_i, V_i M / tau2]: T's gradient then
  comes from one product, and is summed over a pod's chips once (two products' partial gradients were all-reduced
  separately: 1.26-1.30x the data-parallel minimum of collective bytes, against 1.09 for CLIP)."""
  v, t = f32(image_emb), f32(text_emb)
  y = _labels(v, y)
  w = (y * y)[:, None]
  m = v.T @ (w * t)
  vm = v @ m
  if sim is None:
    scale = jnp.float32(1.0) if sim_scale is None else f32(sim_scale)
    both = jnp.einsum("nkd,md->nkm", jnp.stack([scale * v, vm / tau2], axis=1), t)
    s, im_logits = both[:, 0], both[:, 1]
  else:
    s = f32(sim)
    im_logits = (vm @ t.T) / tau2
  num = jnp.sum(vm * t, axis=1)
  a_norm2 = jnp.sum((v @ (v.T @ (w * v))) * v, axis=1)
  b_norm2 = jnp.sum((t @ (t.T @ (w * t))) * t, axis=1)
  den = jnp.sqrt(jnp.maximum(a_norm2, 0.0)) * jnp.sqrt(jnp.maximum(b_norm2, 0.0))
  return _combine(s, y, _cross_modal_loss(s, y, tau1), im_logits, num / jnp.maximum(den, 1e-12), tau1, gamma,
                  indicator)


def update_labels(state, valid, beta: float = 0.7, gmm_kwargs=None):
  """The once-per-epoch, dataset-wide label update (methods.md §2.2), jittable, over sharded per-sample state.

  state: {'pred': y_CM of the epoch, 'topo': S_IM of the epoch, 'pred_target', 'topo_target', 'y'}, arrays indexed
  by example id; valid: bool mask of the examples to update (real examples, seen in the epoch being closed; the
  state is padded to a multiple of the device count). The others are left as they are.
    1. min-max normalise topo over the valid examples;
    2. fit a 2-component GMM; prob = posterior of the component with the larger mean;
    3. topo_target <- beta * prob + (1 - beta) * topo_target;  pred_target <- beta * pred + (1 - beta) * pred_target;
    4. y = min(pred_target, topo_target).
  """
  from ncjax.samplers import gmm
  topo = f32(state["topo"])
  valid = jnp.asarray(valid, bool)
  big = jnp.finfo(jnp.float32).max
  lo = jnp.min(jnp.where(valid, topo, big))
  hi = jnp.max(jnp.where(valid, topo, -big))
  normed = jnp.where(valid, (topo - lo) / jnp.maximum(hi - lo, 1e-12), 0.0)
  params = gmm.fit(normed, sample_mask=valid, **(gmm_kwargs or {}))
  prob = gmm.posterior_of_larger_mean(params, normed)
  topo_target = jnp.where(valid, beta * prob + (1 - beta) * state["topo_target"], state["topo_target"])
  pred_target = jnp.where(valid, beta * state["pred"] + (1 - beta) * state["pred_target"], state["pred_target"])
  y = jnp.where(valid, jnp.minimum(pred_target, topo_target), state["y"])
  prob = jnp.where(valid, prob, state.get("clean_prob", jnp.ones_like(prob)))
  return dict(state, topo_target=topo_target, pred_target=pred_target, y=y, clean_prob=prob)
