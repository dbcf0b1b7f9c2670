"""NCU — "Unlearning the Noisy Correspondence Makes CLIP More Robust" (Han et al., ICCV 2025).

Pure functions over the global batch, float32. Defaults follow the public code (hhc1997/NCU, see
shared/reference/methods.md §1); where the paper differs, the paper's form is a named option:

| what | default (public code) | option (paper) |
|---|---|---|
| forget score (Eq. 2) | score='row': image->text softmax diagonal | score='mean': mean of row and column diagonals |
| relation term (Eq. 4) | rel='code': (<t_i,t_j> - <t-_i,t-_j>)^2 | rel='paper': (<t_i,t-_j> - <t_j,t-_i>)^2 |
| stage-1 weights (Eq. 6) | lambda 10 on L_rel and L_sep | any lambda |
| OT targets (Eq. 10) | kappa * rownorm(plan) + (1 - kappa) I | — |
| text-side targets | unnormalised (rows sum to 0.7 / 1 + (1-kappa)(|F|-1)) | normalize_text_targets=True |
| L_otr (Eq. 11) | combine='mean': (L_img + L_txt) / 2 | combine='sum' |
| L_sep in stage 2 (Eq. 12) | weight 1, over the whole batch | sep_scope='retained' |

Two ways in. The typed one — `prompt(..., PromptOptions)` and `unlearning(..., UnlearningOptions)` returning a
`LossOutput` (scalars for logging; transport plans only with `return_plans=True`), options built once from
`config.loss` with `.from_config`, the Sinkhorn solver passed in as an object (`ncjax.ot.KernelSinkhorn`, the
default; `OttSinkhorn`; `ReferenceSinkhorn`, the public loop) — is what the method runs. `prompt_loss` / `unlearning_loss` keep the keyword signatures
documented in the README and return `(loss, metrics)` with the plans included.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ncjax.losses import chunked, contrastive
from ncjax.losses.common import LossOutput, f32
from ncjax.numerics import diagonal, scaled_dot
from ncjax.options import read_section
from ncjax.ot.masked import KernelSinkhorn, solver_from_name
from ncjax.sharding import shard_rows

BAND = (-0.7, -0.2)  # cos(t_i, t_i^Neg) is pushed into [alpha, beta] = [-0.7, -0.2]
REL_FORMS = ("code", "paper")
COMBINES = ("mean", "sum")
SEP_SCOPES = ("all", "retained")
SOLVER_NAMES = ("kernel", "ott", "reference")


def _check_choice(name: str, value: str, allowed, meaning: str):
  if value not in allowed:
    raise ValueError(f"unknown {name} {value!r}; expected {meaning}")


@dataclasses.dataclass(frozen=True)
class PromptOptions:
  """Stage-1 options (Eq. 3-6); defaults are the public code's."""
  lambda_rel: float = 10.0
  lambda_sep: float = 10.0
  use_itm: bool = True
  use_neg_itm: bool = True
  use_rel: bool = True
  use_sep: bool = True
  rel: str = "code"
  band: tuple[float, float] = BAND

  def __post_init__(self):
    _check_choice("relation term", self.rel, REL_FORMS, "'code' or 'paper'")

  @classmethod
  def from_config(cls, loss_cfg) -> "PromptOptions":
    """From `config.loss` (stage 1's L_sep weight is `lambda_sep_prompt` there; `band` is not a setting)."""
    return read_section(cls, loss_cfg, renames=dict(lambda_sep="lambda_sep_prompt"), keep=("band",))


@dataclasses.dataclass(frozen=True)
class UnlearningOptions:
  """Stage-2 options (Eq. 8-12); defaults are the public code's. `solver(cost, mask, a, b)` returns a
  `SinkhornOutput` (ncjax.ot). `share_plan=True` (kernel solvers): solve the image-side problem once and use its
  transpose for the text side — the two problems are transposes of each other (same normalised cost, transposed
  mask, swapped marginals) so their entropic optima coincide, but the public code stops both after at most 100
  unconverged iterations, where the two plans differ: at N = 2048 one solve moves the loss by ~3e-3 relative. The
  default (False) solves both sides as the public code does, whose iterates the kernel solver reproduces exactly."""
  kappa: float = 0.7
  solver: Callable = KernelSinkhorn()
  share_plan: bool = False
  chunk_rows: int = 0      # > 0: ncjax.losses.chunked's memory-lean form, rows processed in chunks of this size
  normalize_text_targets: bool = False
  combine: str = "mean"
  lambda_sep: float = 1.0
  sep_scope: str = "all"
  band: tuple[float, float] = BAND

  def __post_init__(self):
    _check_choice("combine", self.combine, COMBINES, "'mean' (public code) or 'sum' (paper Eq. 11)")
    _check_choice("sep_scope", self.sep_scope, SEP_SCOPES, "'all' or 'retained'")

  @classmethod
  def from_config(cls, loss_cfg) -> "UnlearningOptions":
    """From `config.loss`: the Sinkhorn solver named by `SinkhornSettings`, every other field by its name."""
    sinkhorn = read_section(SinkhornSettings, loss_cfg)
    solver = solver_from_name(sinkhorn.solver, epsilon=sinkhorn.epsilon, max_iterations=sinkhorn.sinkhorn_iterations,
                              threshold=sinkhorn.sinkhorn_threshold, kernel_dtype=sinkhorn.sinkhorn_dtype)
    return read_section(cls, loss_cfg, keep=("band",), solver=solver)


@dataclasses.dataclass(frozen=True)
class SinkhornSettings:
  """Which masked Sinkhorn solver stage 2 runs, as `config.loss` names it (public-code values)."""
  solver: str = "kernel"            # 'kernel' | 'ott' | 'reference' (ncjax.ot.masked)
  epsilon: float = 0.03
  sinkhorn_iterations: int = 100
  sinkhorn_threshold: float = 1e-4
  sinkhorn_dtype: str = "float32"   # 'bfloat16': the kernel stored in bf16 (half the mat-vec traffic)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TransportPlans:
  """Stage 2's N x (N+1) plans and targets (image side) and their (N+1) x N text-side counterparts."""
  plan_img: jax.Array
  plan_txt: jax.Array
  targets_img: jax.Array
  targets_txt: jax.Array
  mask: jax.Array


def clean_confidence(image_emb, text_emb, logit_scale, score: str = "row", chunk: int = 0):
  """Eq. 2: w_i = softmax_row(s V T^T)_ii ('row', the public code) or the mean with the column softmax ('mean').
  chunk > 0 computes the softmax diagonals without the N x N matrix (ncjax.losses.chunked)."""
  _check_choice("forget score", score, ("row", "mean"), "'row' (public code) or 'mean' (paper Eq. 2)")
  if chunk:
    row, col = chunked.softmax_diagonals(image_emb, text_emb, logit_scale, chunk=chunk)
  else:
    logits = scaled_dot(image_emb, text_emb, logit_scale)
    row = diagonal(jax.nn.softmax(logits, axis=1))
    col = diagonal(jax.nn.softmax(logits, axis=0)) if score == "mean" else None
  return row if score == "row" else 0.5 * (row + col)


def select_forget(image_emb, text_emb, logit_scale, ratio: float, score: str = "row", chunk: int = 0):
  """(forget_mask, clean_score): the floor(ratio * N) pairs of the global batch with the lowest confidence.

  No gradient flows through the selection. Ties go to the lower index (a stable order)."""
  w = jax.lax.stop_gradient(clean_confidence(image_emb, text_emb, logit_scale, score, chunk))
  return lowest_fraction(w, ratio), w


def lowest_fraction(scores, ratio: float):
  """bool[N]: the floor(ratio * N) entries with the lowest score (ties to the lower index) — the selection rule of
  Eq. 2, whatever the score: the model's confidence, or a prior per-sample score (`select_forget_by_score`)."""
  n = scores.shape[0]
  k = int(np.floor(ratio * n))
  if k <= 0:
    return jnp.zeros((n,), bool)
  order = jnp.argsort(jax.lax.stop_gradient(f32(scores)), stable=True)
  return jnp.zeros((n,), bool).at[order[:k]].set(True)


def select_forget_by_score(prior_scores, ratio: float, threshold: float | None = None):
  """The forget set of a global batch from per-sample clean scores another method estimated (composition: GSC's
  soft correspondence labels, Bayesian CL's positive probabilities; higher = cleaner) instead of the current
  model's softmax diagonal: the lowest `ratio` of the batch (NCU's rule), or with `threshold` every pair scoring
  below it (a batch may then forget none or all of its pairs; the losses handle both)."""
  prior_scores = jax.lax.stop_gradient(f32(prior_scores))
  if threshold is not None:
    return prior_scores < threshold
  return lowest_fraction(prior_scores, ratio)


def band_loss(text_emb, neg_text_emb, weights=None, band=BAND):
  """L_sep (Eq. 3): mean_i [alpha - c_i]_+ + [c_i - beta]_+ with c_i = <t_i, t_i^Neg>, over rows with weight 1."""
  c = jnp.sum(f32(text_emb) * f32(neg_text_emb), axis=-1)
  per = jax.nn.relu(band[0] - c) + jax.nn.relu(c - band[1])
  if weights is None:
    return jnp.mean(per)
  weights = f32(weights)
  return jnp.sum(weights * per) / jnp.maximum(jnp.sum(weights), 1.0)


def relation_sum(text_emb, neg_text_emb, weights, rel: str = "code"):
  """sum_ij w_i w_j Delta_ij^2 of Eq. 4 through D x D Gram matrices, in O(N D^2) instead of O(N^2 D):
    'code'  (<t_i,t_j> - <t-_i,t-_j>)^2: ||T'WT||^2 - 2||T'WT-||^2 + ||T-'WT-||^2
    'paper' (<t_i,t-_j> - <t_j,t-_i>)^2: 2 <T'WT, T-'WT-> - 2 tr(G G), G = T'WT-
  (W = diag(w), ||.|| the Frobenius norm); the same sums as the N x N forms."""
  t, tn, w = f32(text_emb), f32(neg_text_emb), f32(weights)
  tw, tnw = t * w[:, None], tn * w[:, None]
  g_tt, g_nn, g_tn = tw.T @ t, tnw.T @ tn, tw.T @ tn
  if rel == "code":
    return jnp.sum(g_tt * g_tt) - 2.0 * jnp.sum(g_tn * g_tn) + jnp.sum(g_nn * g_nn)
  return 2.0 * jnp.sum(g_tt * g_nn) - 2.0 * jnp.sum(g_tn * g_tn.T)


def prompt(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask,
           options: PromptOptions = PromptOptions()) -> LossOutput:
  """Stage 1 (Eq. 3-6), on the retained pairs only: learn the hardest-negative prompt.

  L = lambda_rel L_rel + lambda_sep L_sep + L_yes + L_no, with B' retained pairs and m_ij = +1 on the diagonal,
  -1 off it: L_yes = -1/B' sum_ij log sigmoid(m_ij s <v_i, t_j>) (no bias), L_no the same with -m_ij and t^Neg,
  L_rel = 1/B' sum_ij Delta_ij^2, L_sep the band term averaged over the retained pairs.
  """
  o = options
  v, t, tn = f32(image_emb), f32(text_emb), f32(neg_text_emb)
  keep = (~jnp.asarray(forget_mask, bool)).astype(jnp.float32)
  pair = keep[:, None] * keep[None, :]
  n_keep = jnp.maximum(jnp.sum(keep), 1.0)
  n = v.shape[0]
  m = 2.0 * jnp.eye(n, dtype=jnp.float32) - 1.0
  terms = {}
  if o.use_itm:
    terms["loss_yes"] = -jnp.sum(pair * jax.nn.log_sigmoid(m * scaled_dot(v, t, logit_scale))) / n_keep
  if o.use_neg_itm:
    terms["loss_no"] = -jnp.sum(pair * jax.nn.log_sigmoid(-m * scaled_dot(v, tn, logit_scale))) / n_keep
  if o.use_rel:
    terms["loss_rel"] = o.lambda_rel * relation_sum(t, tn, keep, o.rel) / n_keep
  if o.use_sep:
    terms["loss_sep"] = o.lambda_sep * band_loss(t, tn, keep, o.band)
  loss = sum(terms.values()) if terms else jnp.zeros((), jnp.float32)
  scalars = dict(terms, n_retained=jnp.sum(keep), neg_text_cosine=jnp.sum(keep * jnp.sum(t * tn, -1)) / n_keep)
  return LossOutput(loss, scalars)


def prompt_loss(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask, *, lambda_rel: float = 10.0,
                lambda_sep: float = 10.0, use_itm: bool = True, use_neg_itm: bool = True, use_rel: bool = True,
                use_sep: bool = True, rel: str = "code", band=BAND):
  """`prompt` with keyword options; returns (loss, metrics)."""
  out = prompt(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask, PromptOptions(
      lambda_rel=lambda_rel, lambda_sep=lambda_sep, use_itm=use_itm, use_neg_itm=use_neg_itm, use_rel=use_rel,
      use_sep=use_sep, rel=rel, band=tuple(band)))
  return out.loss, out.metrics()


def extended_similarity(image_emb, text_emb, neg_text_emb):
  """S_ext = [V T^T | d] with d_i = <v_i, t_i^Neg> (the paired negative only), N x (N+1)."""
  v, t, tn = f32(image_emb), f32(text_emb), f32(neg_text_emb)
  return jnp.concatenate([v @ t.T, jnp.sum(v * tn, axis=-1, keepdims=True)], axis=1)


def transport_mask(forget_mask):
  """Eq. 8: all texts allowed, the negative column not; a forget row loses its own text and gains the negative."""
  f = jnp.asarray(forget_mask, bool)
  n = f.shape[0]
  idx = jnp.arange(n)
  mask = jnp.ones((n, n + 1), bool).at[:, n].set(False)
  mask = mask.at[idx, idx].set(~f)
  return mask.at[:, n].set(f)


def identity_targets(forget_mask):
  """I_v: 1 at (i, i) for retained rows, at (i, N+1) for forget rows."""
  f = jnp.asarray(forget_mask, bool)
  n = f.shape[0]
  idx = jnp.arange(n)
  eye = jnp.zeros((n, n + 1), jnp.float32).at[idx, idx].set(jnp.where(f, 0.0, 1.0))
  return eye.at[:, n].set(jnp.where(f, 1.0, 0.0))


def _kl_sum(target, log_pred):
  """sum T (log T - log P), entries with T = 0 contributing 0."""
  safe = jnp.where(target > 0, target, 1.0)
  return jnp.sum(jnp.where(target > 0, target * (jnp.log(safe) - log_pred), 0.0))


def _rownorm(x):
  return x / jnp.maximum(jnp.sum(x, axis=1, keepdims=True), 1e-30)


def _kl_terms(targets_v, targets_t_cols, logits, n):
  """L_img over rows of the N x (N+1) logits and L_txt over its columns (the text side's rows), without transposes."""
  loss_img = _kl_sum(targets_v, jax.nn.log_softmax(logits, axis=1)) / n
  loss_txt = _kl_sum(targets_t_cols, jax.nn.log_softmax(logits, axis=0)) / (n + 1)
  return loss_img, loss_txt


def _shared_plan_targets(o: UnlearningOptions, cost, mask, eye, n):
  """One kernel solve: image-side targets kappa rownorm(P) + (1 - kappa) I and the text side's, laid out as columns
  of the same N x (N+1) array (text j's target row is column j), with P = diag(u) K diag(v):
  rownorm(P)_ij = K_ij v_j / (K v)_i and rownorm(P^T)_ji = u_i K_ij / (K^T u)_j."""
  solver = o.solver
  kernel = shard_rows(solver.kernel(cost, mask))
  a = jnp.full((n,), 1.0 / n, jnp.float32)
  b = jnp.full((n + 1,), 1.0 / (n + 1), jnp.float32)
  u, v, it = solver.scalings(kernel, a, b)
  k32 = kernel.astype(jnp.float32)
  kv = jnp.matmul(kernel, v.astype(kernel.dtype), preferred_element_type=jnp.float32)
  ktu = jnp.matmul(u.astype(kernel.dtype), kernel, preferred_element_type=jnp.float32)
  targets_v = o.kappa * k32 * (v[None, :] / jnp.maximum(kv, 1e-30)[:, None]) + (1.0 - o.kappa) * eye
  targets_t = o.kappa * k32 * (u[:, None] / jnp.maximum(ktu, 1e-30)[None, :]) + (1.0 - o.kappa) * eye
  if o.normalize_text_targets:
    targets_t = targets_t / jnp.maximum(jnp.sum(targets_t, axis=0, keepdims=True), 1e-30)
  plans = lambda: (u[:, None] * k32 * v[None, :],)
  return targets_v, targets_t, it, it, plans


def _two_solve_targets(o: UnlearningOptions, cost, mask, eye, n):
  """The public code's two solves (image side on the cost, text side on its transpose)."""
  a_img = jnp.full((n,), 1.0 / n, jnp.float32)
  b_txt = jnp.full((n + 1,), 1.0 / (n + 1), jnp.float32)
  side_v = o.solver(cost, mask, a_img, b_txt)
  side_t = o.solver(cost.T, mask.T, b_txt, a_img)
  plan_v, plan_t = side_v.plan, side_t.plan
  targets_v = o.kappa * _rownorm(plan_v) + (1.0 - o.kappa) * eye
  targets_t = o.kappa * _rownorm(plan_t) + (1.0 - o.kappa) * eye.T
  if o.normalize_text_targets:
    targets_t = _rownorm(targets_t)
  return targets_v, targets_t.T, side_v.iterations, side_t.iterations, lambda: (plan_v, plan_t)


def unlearning(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask,
               options: UnlearningOptions = UnlearningOptions(), *, return_plans: bool = False) -> LossOutput:
  """Stage 2 (Eq. 8-12): masked-OT soft targets over the extended N x (N+1) similarity, two KL terms, band term.

  Cost C = (1 - S_ext) / max(1 - S_ext) (both sides share the max), mask of Eq. 8 (its transpose for the text side),
  marginals 1/N over images and 1/(N+1) over texts + negative, Sinkhorn with epsilon on the normalised cost,
  targets T = kappa rownorm(plan) + (1 - kappa) I (stop-gradient), logits Z = s S_ext:
  L_img = 1/N sum KL(T_v || softmax_row(Z)), L_txt = 1/(N+1) sum KL(T_t || softmax_row(Z^T)).
  The N x (N+1) arrays are split over the batch axis under a mesh. `extras` holds a TransportPlans with
  return_plans=True.
  """
  o = options
  forget_mask = jnp.asarray(forget_mask, bool)
  extras = None
  if o.chunk_rows and not return_plans:   # memory-lean form: no N x (N+1) array but the transport kernel
    loss_img, loss_txt, it_v, it_t = chunked.transport_kl(image_emb, text_emb, neg_text_emb, logit_scale,
                                                          forget_mask, o, chunk=o.chunk_rows)
  else:
    n = forget_mask.shape[0]
    # Logits with the scale folded into the text side (ncjax.numerics.scaled_dot); the cost unscales them.
    scale = jnp.exp(f32(logit_scale))
    logits = shard_rows(extended_similarity(image_emb, scale * f32(text_emb), scale * f32(neg_text_emb)))
    cost = 1.0 - jax.lax.stop_gradient(logits) / jax.lax.stop_gradient(scale)
    cost = cost / jnp.max(cost)
    mask = transport_mask(forget_mask)
    eye = identity_targets(forget_mask)
    one_solve = o.share_plan and hasattr(o.solver, "scalings")
    build = _shared_plan_targets if one_solve else _two_solve_targets
    targets_v, targets_t_cols, it_v, it_t, plans = build(o, cost, mask, eye, n)
    targets_v, targets_t_cols = jax.lax.stop_gradient(targets_v), jax.lax.stop_gradient(targets_t_cols)
    loss_img, loss_txt = _kl_terms(targets_v, targets_t_cols, logits, n)
    if return_plans:
      p = plans()
      plan_v = p[0]
      plan_t = p[1] if len(p) > 1 else plan_v.T
      extras = TransportPlans(plan_v, plan_t, targets_v, targets_t_cols.T, mask)
  loss_otr = 0.5 * (loss_img + loss_txt) if o.combine == "mean" else loss_img + loss_txt
  sep_weights = None if o.sep_scope == "all" else (~forget_mask).astype(jnp.float32)
  loss_sep = band_loss(text_emb, neg_text_emb, sep_weights, o.band)
  loss = loss_otr + o.lambda_sep * loss_sep
  scalars = dict(loss_img=loss_img, loss_txt=loss_txt, loss_otr=loss_otr, loss_sep=loss_sep,
                 sinkhorn_iterations_img=jnp.asarray(it_v, jnp.float32),
                 sinkhorn_iterations_txt=jnp.asarray(it_t, jnp.float32),
                 n_forget=jnp.sum(forget_mask.astype(jnp.float32)))
  return LossOutput(loss, scalars, extras=extras)


def unlearning_loss(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask, kappa: float = 0.7,
                    epsilon: float = 0.03, *, max_iterations: int = 100, threshold: float = 1e-4,
                    solver="kernel", normalize_text_targets: bool = False, combine: str = "mean",
                    lambda_sep: float = 1.0, sep_scope: str = "all", band=BAND, share_plan: bool = False):
  """`unlearning` with keyword options; returns (loss, metrics) with the plans and targets in the metrics.

  `solver` is a name ('kernel': the default, one solve in scaling form; 'ott'; 'reference': the public loop) built
  with epsilon / max_iterations / threshold, or a solver object. `share_plan` (kernel solver): one solve for both
  sides.
  """
  if isinstance(solver, str):
    if solver not in SOLVER_NAMES:
      raise ValueError(f"unknown Sinkhorn solver {solver!r}; expected one of {SOLVER_NAMES}")
    solver = solver_from_name(solver, epsilon=epsilon, max_iterations=max_iterations, threshold=threshold)
  out = unlearning(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask, UnlearningOptions(
      kappa=kappa, solver=solver, normalize_text_targets=normalize_text_targets, combine=combine,
      lambda_sep=lambda_sep, sep_scope=sep_scope, band=tuple(band), share_plan=share_plan), return_plans=True)
  return out.loss, out.metrics()


def label_smoothed_infonce_terms(logits, smoothing: float):
  """Per-pair symmetric CLIP loss with label smoothing (targets (1 - eps) on the diagonal, eps spread uniformly)."""
  n = logits.shape[0]
  targets = (1.0 - smoothing) * jnp.eye(n, dtype=jnp.float32) + smoothing / n
  i2t = -jnp.sum(targets * jax.nn.log_softmax(logits, axis=1), axis=1)
  t2i = -jnp.sum(targets * jax.nn.log_softmax(logits, axis=0), axis=0)
  return 0.5 * (i2t + t2i)


def gradient_ascent(image_emb, text_emb, logit_scale, forget_mask, *, label_smoothing: float = 0.1,
                    ga_weight: float = 1.0):
  """NCU paper Sec. 5.3's gradient-ascent baseline over the global batch: -L_CLIP on the forget set plus
  label-smoothed L_CLIP on the retained set, each averaged over its own pairs:
    loss = ga_weight * (-mean_{i in F} l_i) + mean_{i not in F} l~_i.
  Returns (loss, metrics)."""
  logits = scaled_dot(image_emb, text_emb, logit_scale)
  _, base = contrastive.infonce_from_logits(logits)
  smoothed = label_smoothed_infonce_terms(logits, label_smoothing)
  f = f32(forget_mask)
  n_f, n_r = jnp.maximum(f.sum(), 1.0), jnp.maximum((1 - f).sum(), 1.0)
  ascent = -jnp.sum(f * base["per_pair_loss"]) / n_f
  retain = jnp.sum((1 - f) * smoothed) / n_r
  return ga_weight * ascent + retain, dict(loss_ascent=ascent, loss_retain=retain)
