"""Alignment calibration for concept unlearning: AC on CLIP (Wang et al., arXiv 2406.03603, mapped to image-text
pairs) and HAC / HAC-reg on MERU (Pujol Vidal et al., CVPRW 2025; the slides in shared/papers, equations (1)-(11)).

A batch holds N retain pairs (x^r_i, t^r_i) and N forget pairs (x^f_i, t^f_i); x', t' are all 2N images / texts
(retain first). With sim the model's similarity (cosine for AC, negative Lorentz distance -d_L for HAC) and
tau = 1 / exp(logit_scale):

  (3) L_retain = -1/(2N) sum_i [ log softmax_j(sim(x^r_i, t'_j)/tau)_i + log softmax_j(sim(x'_j, t^r_i)/tau)_i ]
                 (each retain pair's softmax runs over all 2N texts, resp. images, of the batch)
  (4) L_neg    = -1/(2N^2) sum_i sum_{j != i} [sim(x^f_i, t^f_j) + sim(x^f_j, t^f_i)] / tau
                 (maximises the forget set's cross-pair similarity)
  (5) L_pos    =  1/N sum_i sim(x^f_i, t^f_i) / tau          (pushes true forget pairs apart)
  (6) L_perf   =  1/(2N) sum_i [ log 1/(2N) sum_j exp(sim(x^f_i, t'_j)/tau) + log 1/(2N) sum_j exp(sim(x'_j, t^f_i)/tau) ]
  (1, 2) L_AC  = L_retain + eps (alpha L_neg + beta L_pos + gamma L_perf)

HAC (7) adds, with MERU's entailment cone of the text (ext = oxy_angle(text, image), aper = half_aperture(text)):
  (8) L_r-ent   = 1/N sum_i relu(ext(t^r_i, x^r_i) - aper(t^r_i))     (retain images inside their text's cone)
  (9) L_f-ent   = 1/N sum_i relu(aper(t^f_i) - ext(t^f_i, x^f_i))     (forget images pushed out of it)
  L_HAC = L_AC + omega_r L_r-ent + omega_f L_f-ent, and HAC-reg (10, 11) adds
  (11) L_norm-reg = 1/N sum_i (||x^f_i||_L + ||t^f_i||_L), ||.||_L the Lorentz norm d_L(O, .).

Readings of the slides, each a named option (the alternative kept):
  * eq. (9) is printed with *retain* indices, which would push retained images out of their cones; the text calls
    it the forget-side ("entailment calibration") term, so `f_ent_on='forget'` is the default and
    `f_ent_on='retain'` reproduces the slide as printed.
  * eq. (11) adds the norms (+), i.e. pulls the forget embeddings towards the origin (more generic): the default
    `norm_reg='toward_origin'`; `norm_reg='away'` subtracts them instead.
  * L_perf (6) is implemented as printed; AC's public code (SimCLR/MoCo only) has no direct counterpart for CLIP.
Defaults: the slides' best rows, alpha = gamma = 0.5, beta = 0.5, eps = 0.1, omega_r = 0.2, omega_f = 1.0 (and
lam = 0.5 for HAC-reg, Table 4).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ncjax.models import lorentz
from ncjax.numerics import diagonal, f32, scaled_dot

F_ENT_ON = ("forget", "retain")
NORM_REG = ("toward_origin", "away")


def _check(image_retain, text_retain, image_forget, text_forget):
  shapes = {tuple(jnp.shape(x)) for x in (image_retain, text_retain, image_forget, text_forget)}
  if len(shapes) != 1 or len(next(iter(shapes))) != 2:
    raise ValueError(f"alignment calibration needs N retain and N forget pairs of the same (N, D) shape; got "
                     f"{[tuple(jnp.shape(x)) for x in (image_retain, text_retain, image_forget, text_forget)]}")


def calibration_terms(logits) -> dict:
  """L_retain, L_neg, L_pos, L_perf (eq. 3-6) of a 2N x 2N logit matrix (scale x similarity): rows = images,
  columns = texts, retain first then forget (pair i of each half on the diagonal)."""
  logits = f32(logits)
  two_n = logits.shape[0]
  n = two_n // 2
  diag = diagonal(logits)
  row_lse = jax.nn.logsumexp(logits, axis=1)
  col_lse = jax.nn.logsumexp(logits, axis=0)
  retain = 0.5 * (jnp.mean(row_lse[:n] - diag[:n]) + jnp.mean(col_lse[:n] - diag[:n]))
  forget = logits[n:, n:]
  off = ~jnp.eye(n, dtype=bool)
  cross = jnp.sum(jnp.where(off, forget, 0.0)) + jnp.sum(jnp.where(off, forget.T, 0.0))
  neg = -cross / (2.0 * n * n)
  pos = jnp.mean(diagonal(forget))
  log_2n = jnp.log(jnp.asarray(two_n, jnp.float32))
  perf = 0.5 * (jnp.mean(row_lse[n:] - log_2n) + jnp.mean(col_lse[n:] - log_2n))
  return dict(loss_retain=retain, loss_neg=neg, loss_pos=pos, loss_perf=perf)


def _combine(terms: dict, *, alpha, beta, gamma, epsilon):
  forget = alpha * terms["loss_neg"] + beta * terms["loss_pos"] + gamma * terms["loss_perf"]
  return terms["loss_retain"] + epsilon * forget, forget


def ac_loss(image_retain, text_retain, image_forget, text_forget, logit_scale, *, alpha: float = 0.5,
            beta: float = 0.5, gamma: float = 0.5, epsilon: float = 0.1):
  """AC (eq. 1-6) on L2-normalised embeddings with cosine similarity; returns (loss, metrics)."""
  _check(image_retain, text_retain, image_forget, text_forget)
  images = jnp.concatenate([f32(image_retain), f32(image_forget)], 0)
  texts = jnp.concatenate([f32(text_retain), f32(text_forget)], 0)
  terms = calibration_terms(scaled_dot(images, texts, logit_scale))
  loss, forget = _combine(terms, alpha=alpha, beta=beta, gamma=gamma, epsilon=epsilon)
  pos = jnp.sum(images * texts, axis=1)
  n = f32(image_retain).shape[0]
  return loss, dict(terms, loss_forget=forget, retain_pos_similarity=jnp.mean(pos[:n]),
                    forget_pos_similarity=jnp.mean(pos[n:]))


def entailment_violation(texts, images, curv, min_radius: float = 0.1):
  """ext(t, x) - aper(t) per pair: MERU's exterior angle of the image at its text minus the text cone's half
  aperture (positive: the image lies outside its text's cone)."""
  return lorentz.oxy_angle(texts, images, curv) - lorentz.half_aperture(texts, curv, min_radius)


def hac_loss(image_retain, text_retain, image_forget, text_forget, logit_scale, curv, *, alpha: float = 0.5,
             beta: float = 0.5, gamma: float = 0.5, epsilon: float = 0.1, omega_r: float = 0.2,
             omega_f: float = 1.0, lam: float = 0.0, f_ent_on: str = "forget", norm_reg: str = "toward_origin",
             min_radius: float = 0.1, similarity: Callable | None = None):
  """HAC / HAC-reg (eq. 7-11) on MERU space components (after exp_map0) with curvature `curv` (c > 0).

  sim = -d_L unless `similarity(images, texts)` is given (with omega = lam = 0 and the cosine it is AC exactly).
  lam > 0 is HAC-reg. Returns (loss, metrics)."""
  _check(image_retain, text_retain, image_forget, text_forget)
  if f_ent_on not in F_ENT_ON:
    raise ValueError(f"unknown f_ent_on {f_ent_on!r}; expected one of {F_ENT_ON}")
  if norm_reg not in NORM_REG:
    raise ValueError(f"unknown norm_reg {norm_reg!r}; expected one of {NORM_REG}")
  xr, tr, xf, tf = (f32(x) for x in (image_retain, text_retain, image_forget, text_forget))
  curv = f32(curv)
  images, texts = jnp.concatenate([xr, xf], 0), jnp.concatenate([tr, tf], 0)
  sim = -lorentz.pairwise_dist(images, texts, curv) if similarity is None else f32(similarity(images, texts))
  terms = calibration_terms(jnp.exp(f32(logit_scale)) * sim)
  loss, forget = _combine(terms, alpha=alpha, beta=beta, gamma=gamma, epsilon=epsilon)
  r_ent = jnp.mean(jax.nn.relu(entailment_violation(tr, xr, curv, min_radius)))
  f_pairs = (tf, xf) if f_ent_on == "forget" else (tr, xr)
  f_ent = jnp.mean(jax.nn.relu(-entailment_violation(*f_pairs, curv, min_radius)))
  norms = jnp.mean(lorentz.hyperbolic_norm(xf, curv) + lorentz.hyperbolic_norm(tf, curv))
  norm_term = norms if norm_reg == "toward_origin" else -norms
  loss = loss + omega_r * r_ent + omega_f * f_ent + lam * norm_term
  n = xr.shape[0]
  return loss, dict(terms, loss_forget=forget, loss_r_ent=r_ent, loss_f_ent=f_ent, loss_norm_reg=norm_term,
                    forget_norm=jnp.mean(lorentz.hyperbolic_norm(xf, curv)),
                    retain_norm=jnp.mean(lorentz.hyperbolic_norm(xr, curv)),
                    retain_pos_similarity=jnp.mean(diagonal(sim)[:n]),
                    forget_pos_similarity=jnp.mean(diagonal(sim)[n:]))
