"""DisNCL — "Disentangled Noisy Correspondence Learning" (Dang et al., TIP 2025): its losses, and the hinge baseline.

No public code exists and the paper text stops before L_soft is defined (methods.md §5). What is verified and what is
reconstructed, piece by piece:

  filtration         [paper] eq. (2), D_clean = {i : i = argmax_j H_ij and i = argmax_j H_ji}
  align_loss         [paper] eq. (3), hinge with the hardest in-batch negative both ways, over D_clean, a per-sample
                     margin alpha_i (VSE++ / SGRAF max violation, summed as their code)
  soft_margin        [verified neighbours; the default is a reconstruction] alpha_i from a clean confidence y_i:
                     NCR's linear / exponential / sin, L2RM's 's_adaptive', BiCro's base-m exponential (m = 10 in
                     the paper's shared settings, which with base 10 is NCR's exponential); DisNCL's own formula is
                     garbled in the text
  diagonal_confidence [reconstruction] y_i = mean of the row- and column-softmax diagonals of H / tau, stop-gradient
  soft_loss          [reconstruction] L_soft: bootstrapped soft targets Y = beta3 I + (1 - beta3) sg(softmax(T / tau)),
                     cross entropy both ways (Reed et al.'s soft bootstrapping); beta3 = 1 is hard-target symmetric
                     InfoNCE (the paper's Theorem 3 case)
  soft_infonce       [verified] L2RM's Soft_InfoNCE (label matrix clipped at 1e-10, normalised per row / column)
  jsd_mi             [standard] the Jensen-Shannon MI lower bound of eq. (5) (Hjelm et al. 2019, DIM): diagonal
                     pairs are the joint, off-diagonal pairs the product of marginals
  gaussian_kl_bound  [paper] eq. (6): I(V; V_s | T) <= KL(N(mu_v, I) || N(mu_t, I)) = ||mu_v - mu_t||^2 / 2

Every function is pure, over the global batch, in float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ncjax.losses.contrastive import column_argmax_is_diagonal
from ncjax.numerics import f32

# ---------------------------------------------------------------------------------------------------------------------
# Filtration and the robust hinge (eqs. 2-3)


def filtration(similarity) -> jax.Array:
  """D_clean (eq. 2): bool[B], True where pair i is the argmax of both its row and its column (ties: the lowest
  index wins, so a row of equal scores keeps only its first pair)."""
  s = f32(similarity)
  idx = jnp.arange(s.shape[0])
  return (jnp.argmax(s, axis=1) == idx) & column_argmax_is_diagonal(s)


def _exp_margin(y, base):
  return (jnp.power(base, y) - 1.0) / (base - 1.0)


MARGINS = {
    # name: y -> fraction of the base margin (NCR's soft margins; L2RM's s_adaptive; a constant)
    "constant": lambda y, base: jnp.ones_like(y),
    "linear": lambda y, base: y,                                                  # NCR
    "exponential": _exp_margin,                                                   # NCR (base 10, its default), BiCro
    "sin": lambda y, base: jnp.sin(jnp.pi * y - jnp.pi / 2) / 2 + 0.5,            # NCR
    "l2rm": lambda y, base: y ** 2 / (y ** 2 + (1.0 - y) ** 2),                   # L2RM's s_adaptive
}


def soft_margin(confidence, margin: float = 0.2, kind: str = "exponential", base: float = 10.0):
  """alpha_i = margin * g(y_i) for a clean confidence y_i in [0, 1] (kind: a key of MARGINS)."""
  if kind not in MARGINS:
    raise ValueError(f"unknown margin kind {kind!r}; expected one of {sorted(MARGINS)}")
  y = jnp.clip(f32(confidence), 0.0, 1.0)
  return margin * MARGINS[kind](y, base)


def diagonal_confidence(similarity, temperature: float):
  """y_i = (softmax_row(H / tau)_ii + softmax_col(H / tau)_ii) / 2, stop-gradient: how strongly pair i wins its row
  and column (the clean confidence the soft margin is computed from)."""
  s = jax.lax.stop_gradient(f32(similarity)) / temperature
  return (jnp.diag(jax.nn.softmax(s, axis=1)) + jnp.diag(jax.nn.softmax(s, axis=0))) / 2


def align_loss(similarity, margins, keep=None, *, reduction: str = "sum", negatives: str = "hardest"):
  """Eq. (3): sum over kept i of [alpha_i - H_ii + H_i,h]_+ + [alpha_i - H_ii + H_h,i]_+, where h is the hardest
  in-batch negative (the caption most similar to image i; the image most similar to caption i).

  similarity (B, B) with rows = images; margins (B,) or a scalar; keep bool (B,) (None: all).
  reduction: 'sum' (VSE++ / SGRAF / NCR) or 'mean' over the kept pairs.
  negatives: 'hardest' (max violation, eq. 3 and SGRAF's max_violation=True), 'all' (every in-batch negative's
  hinge summed: VSE0 / SGRAF's max_violation=False, the stabler choice from a random initialisation) or 'all_mean'
  (every negative's hinge averaged over the whole row — `cost.mean(1)` over all B columns, the zeroed diagonal
  included, as the warm-up of the same group's public code, NCR / MSCN, computes it: B times smaller than 'all';
  until 2026-11-25 ncjax divided by the B - 1 negatives).
  Returns (loss, metrics)."""
  s = f32(similarity)
  b = s.shape[0]
  eye = jnp.eye(b, dtype=bool)
  diag = jnp.diag(s)
  alpha = jnp.broadcast_to(f32(margins), (b,))
  if negatives == "hardest":
    hardest_caption = jnp.max(jnp.where(eye, -jnp.inf, s), axis=1)     # for image i
    hardest_image = jnp.max(jnp.where(eye, -jnp.inf, s), axis=0)       # for caption i
    if b == 1:   # no negative in a batch of one
      hardest_caption = hardest_image = jnp.full((1,), -jnp.inf)
    per_sample = (jax.nn.relu(alpha - diag + hardest_caption) + jax.nn.relu(alpha - diag + hardest_image))
  elif negatives == "all":
    cost_caption = jnp.where(eye, 0.0, jax.nn.relu(alpha[:, None] - diag[:, None] + s))   # row i: image i
    cost_image = jnp.where(eye, 0.0, jax.nn.relu(alpha[None, :] - diag[None, :] + s))     # column i: caption i
    per_sample = jnp.sum(cost_caption, axis=1) + jnp.sum(cost_image, axis=0)
  elif negatives == "all_mean":
    cost_caption = jnp.where(eye, 0.0, jax.nn.relu(alpha[:, None] - diag[:, None] + s))
    cost_image = jnp.where(eye, 0.0, jax.nn.relu(alpha[None, :] - diag[None, :] + s))
    per_sample = jnp.mean(cost_caption, axis=1) + jnp.mean(cost_image, axis=0)   # NCR: cost.mean(1), B columns
  else:
    raise ValueError(f"unknown negatives {negatives!r}; expected 'hardest', 'all' or 'all_mean'")
  keep = jnp.ones((b,), bool) if keep is None else keep
  per_sample = jnp.where(keep, per_sample, 0.0)
  n_keep = jnp.sum(keep)
  loss = jnp.sum(per_sample)
  if reduction == "mean":
    loss = loss / jnp.maximum(n_keep, 1)
  elif reduction != "sum":
    raise ValueError(f"unknown reduction {reduction!r}; expected 'sum' or 'mean'")
  return loss, {"align_loss": loss, "kept_fraction": n_keep / b, "margin_mean": jnp.mean(alpha)}


# ---------------------------------------------------------------------------------------------------------------------
# Soft alignment (L_soft)


def soft_loss(similarity, target_similarity, *, beta3: float, temperature: float):
  """L_soft with bootstrapped soft targets [RECONSTRUCTION, methods.md §5.2].

  Y_row = beta3 I + (1 - beta3) sg(softmax_row(T / tau)), Y_col likewise with column softmaxes;
  L = (CE_row(Y_row, softmax_row(S / tau)) + CE_col(Y_col, softmax_col(S / tau))) / 2, each a mean over queries.
  With beta3 = 1 the targets are the identity whatever T is, and L is hard-target symmetric InfoNCE on S / tau
  (the mean of the two directions, as ncjax.losses.contrastive.infonce). Returns (loss, metrics)."""
  s = f32(similarity) / temperature
  t = jax.lax.stop_gradient(f32(target_similarity)) / temperature
  eye = jnp.eye(s.shape[0], dtype=jnp.float32)
  y_row = beta3 * eye + (1.0 - beta3) * jax.nn.softmax(t, axis=1)
  y_col = beta3 * eye + (1.0 - beta3) * jax.nn.softmax(t, axis=0)
  # Zero-weight entries contribute exactly 0 (never 0 * -inf): the log-softmax is finite for finite inputs.
  row = -jnp.mean(jnp.sum(y_row * jax.nn.log_softmax(s, axis=1), axis=1))
  col = -jnp.mean(jnp.sum(y_col * jax.nn.log_softmax(s, axis=0), axis=0))
  loss = (row + col) / 2
  return loss, {"soft_loss": loss, "soft_target_diag": jnp.mean(jnp.diag(y_row))}


def soft_infonce(similarity, labels, *, temperature: float = 0.1):
  """L2RM's Soft_InfoNCE [verified, methods.md §5.1]: labels clipped at 1e-10, normalised per row (image->text) and
  per column (text->image); -sum_j Y_ij log softmax_row(S / tau)_ij averaged over rows, plus the column term."""
  s = f32(similarity) / temperature
  y = jnp.clip(f32(labels), 1e-10, None)
  y_row = y / jnp.sum(y, axis=1, keepdims=True)
  y_col = y / jnp.sum(y, axis=0, keepdims=True)
  row = -jnp.mean(jnp.sum(y_row * jax.nn.log_softmax(s, axis=1), axis=1))
  col = -jnp.mean(jnp.sum(y_col * jax.nn.log_softmax(s, axis=0), axis=0))
  return row + col, {"soft_infonce": row + col}


# ---------------------------------------------------------------------------------------------------------------------
# Mutual-information estimators (Section IV)


def jsd_mi(scores, *, weights_joint=None, weights_marginal=None):
  """Jensen-Shannon MI lower bound (eq. 5, with f = sigmoid(T)):
    I_JSD = E_joint[-softplus(-T)] - E_marginal[softplus(T)]
  scores (B, B): T(x_i, y_j) for every in-batch pair; the diagonal is the joint, the off-diagonal pairs the product
  of marginals (optionally weighted, e.g. to represent a known distribution in a test). Its supremum over T is
  2 JSD(joint || product) - 2 log 2, reached at T = log(p_joint / p_product)."""
  t = f32(scores)
  b = t.shape[0]
  eye = jnp.eye(b, dtype=bool)
  wj = jnp.where(eye, 1.0, 0.0) if weights_joint is None else jnp.where(eye, f32(weights_joint), 0.0)
  wm = jnp.where(eye, 0.0, 1.0) if weights_marginal is None else jnp.where(eye, 0.0, f32(weights_marginal))
  joint = jnp.sum(wj * -jax.nn.softplus(-t)) / jnp.maximum(jnp.sum(wj), 1e-12)
  marginal = jnp.sum(wm * jax.nn.softplus(t)) / jnp.maximum(jnp.sum(wm), 1e-12)
  return joint - marginal


def gaussian_kl_bound(mu_a, mu_b):
  """Eq. (6): KL(N(mu_a, I) || N(mu_b, I)) = ||mu_a - mu_b||^2 / 2 per pair, averaged over the batch — the upper
  bound on I(V; V_s | T) when p(V_s | V) = N(f_s(f(V)), I) and p(T_s | T) = N(g_s(g(T)), I)."""
  d = f32(mu_a) - f32(mu_b)
  return 0.5 * jnp.mean(jnp.sum(d * d, axis=-1))


@dataclasses.dataclass(frozen=True)
class DisentangleTerms:
  """The MI estimates of one batch (each a scalar; see `disentangle_loss`)."""
  inv_v: jax.Array      # I_JSD(V_s; F_t)   (maximised: MII of the image carries the text's information)
  inv_t: jax.Array      # I_JSD(T_s; F_v)
  kl: jax.Array         # KL bounds of I(V; V_s | T) + I(T; T_s | V)  (minimised)
  exc_v: jax.Array      # I_JSD(V_x; F_v)   (maximised: MEI keeps its own modality's information)
  exc_t: jax.Array      # I_JSD(T_x; F_t)
  cross_v: jax.Array    # I_JSD(V_x; F_t)   (adversarial: minimised by the encoders, maximised by f_2)
  cross_t: jax.Array    # I_JSD(T_x; F_v)
  reg_v: jax.Array      # I_JSD(V_s; V_x)   (L_reg, adversarial)
  reg_t: jax.Array      # I_JSD(T_s; T_x)


def disentangle_loss(terms: DisentangleTerms, *, gamma: float, beta1: float, beta2: float):
  """L_Dis + L_reg for the encoders (eqs. 4, 7, 8):
    L_s   = -(I(T; V_s) + I(V; T_s)) + beta1 (I(V; V_s | T) + I(T; T_s | V))
    L_x   = -(I(V; V_x) + I(T; T_x)) + (1 + beta2) (I(T; V_x) + I(V; T_x))
    L_Dis = gamma L_s + (1 - gamma) L_x;  L_reg = I(V_s; V_x) + I(T_s; T_x)."""
  l_s = -(terms.inv_v + terms.inv_t) + beta1 * terms.kl
  l_x = -(terms.exc_v + terms.exc_t) + (1.0 + beta2) * (terms.cross_v + terms.cross_t)
  l_reg = terms.reg_v + terms.reg_t
  loss = gamma * l_s + (1.0 - gamma) * l_x + l_reg
  return loss, {"l_s": l_s, "l_x": l_x, "l_reg": l_reg, "mi_invariant": (terms.inv_v + terms.inv_t) / 2,
                "mi_cross_exclusive": (terms.cross_v + terms.cross_t) / 2, "kl_bound": terms.kl}


def adversary_loss(terms: DisentangleTerms):
  """The discriminators' objective in the adversarial updates: maximise the JSD estimates the encoders minimise
  (I(T; V_x), I(V; T_x), I(V_s; V_x), I(T_s; T_x)), i.e. minimise their negative."""
  est = terms.cross_v + terms.cross_t + terms.reg_v + terms.reg_t
  return -est, {"adversary_mi": est / 4}
