"""Bayesian contrastive learning: Gamma pair weights by Gibbs sampling inside a stochastic-EM weighted InfoNCE.

Per step (Algorithm 1): logits = cos / tau, s = exp(cos / tau) with tau = 1 / exp(logit_scale), the model's learned
temperature, unless `loss.tau` fixes it (the paper's similarity is e^{x1^T x2}, Sec. 2: tau = 1 — `tau=1`; a learned
temperature is ncjax's default, as InfoNCE's) with a stop-gradient copy for sampling; for each direction
(image->text rows, text->image rows) draw u and the weights with `ncjax.samplers.gamma.gibbs` from w = 1 for
`loss.n_sweeps` sweeps, keyed by the step's RNG; then the weighted InfoNCE of Eq. 202-203 on the live logits.
Optional (paper Sec. 2.2): a per-sample moving average of u kept in method state by example id
(`loss.u_momentum` > 0), the weights then redrawn given the averaged u.

Weight options (`loss.weights`), because with the paper's rates b = 0 the sampler is degenerate (methods.md §3.2):
  'paper'         b_+ = b_- = 0 as stated; the weighted probabilities follow a fixed Dirichlet, whatever s.
  'unit_prior'    rates b_+ = 1 + a_+, b_- = a_- so that the prior means are 1 and u s (a softmax-like
                  probability) moves the weights: hard negatives weigh less, and w_+'s conditional mean
                  (1 + a_+) / (u s_+ + 1 + a_+) falls from 1 as the positive grows confident — to 0.84 on average
                  for a confident one, lower in draws where the exponential u makes u s_+ > 1 (44% of them; down
                  to ~0.2: docs/methods.md, "Bayesian CL"). w_+ acts only through the denominator (methods.md
                  §3.1): a smaller w_+ pulls its positive harder, so noisy positives (w_+ near 1) are pulled a
                  little less than confident ones — by little (docs/methods.md, "Bayesian CL").
  'row_mean'      the paper's rates, each anchor's negative weights divided by their mean (and w_+ by its
                  prior-to-posterior ratio), so weights are relative and near 1.
  'prior'         weights drawn from their priors with unit means, w_+ ~ Ga(a_+, a_+), w_- ~ Ga(a_-, a_-),
                  whatever s (an ablation: the Gamma draws' own noise, with no information from the data).
The default is chosen by experiment on noisy digits and documented in the README.
Per-sample diagnostics (state): the effective positive probability w+ s+ / (w+ s+ + sum w- s-) and w+ itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ncjax.losses import bayes, contrastive
from ncjax.methods.base import BenchEntry, Update
from ncjax.methods.registry import register
from ncjax.methods.two_tower import TwoTowerMethod, stored_clamps
from ncjax.numerics import diagonal
from ncjax.options import Options, loss_option
from ncjax.samplers import gamma

WEIGHTS = ("paper", "unit_prior", "row_mean", "prior")


@dataclasses.dataclass(frozen=True)
class BayesOptions(Options):
  """The paper's hyper-parameters: a_u = 1, b_u = 0, a_+ = 5, a_- = 10, b_+ = b_- = 0, 2 Gibbs sweeps from w = 1."""
  a_u: float = loss_option(1.0)
  b_u: float = loss_option(0.0)
  a_pos: float = loss_option(5.0)
  b_pos: float = loss_option(0.0)
  a_neg: float = loss_option(10.0)
  b_neg: float = loss_option(0.0)
  n_sweeps: int = loss_option(2)
  w_init: float = loss_option(1.0)
  weights: str = loss_option("unit_prior")   # see the module docstring
  u_momentum: float = loss_option(0.0)       # > 0: per-sample moving average of u (paper Sec. 2.2)
  tau: float = loss_option(0.0)              # fixed temperature of s = exp(cos / tau) (paper: 1); 0: learned

  def __post_init__(self):
    if self.weights not in WEIGHTS:
      raise ValueError(f"unknown loss.weights {self.weights!r}; expected one of {WEIGHTS}")


def rates(options: BayesOptions):
  if options.weights == "unit_prior":
    return 1.0 + options.a_pos, options.a_neg
  return options.b_pos, options.b_neg


def sample_weights(key, logits, options: BayesOptions, log_u_override=None):
  """(log u, log w_pos, log w_neg) for the rows of `logits` (anchors = rows, negatives = off-diagonal entries)."""
  n = logits.shape[0]
  neg_mask = ~jnp.eye(n, dtype=bool)
  log_pos = diagonal(logits)
  if options.weights == "prior":   # the ablation: unit-mean prior draws, independent of the data
    k_p, k_n = jax.random.split(key)
    log_wp = gamma.log_gamma(k_p, options.a_pos, log_pos.shape) - jnp.log(options.a_pos)
    log_wn = jnp.where(neg_mask, gamma.log_gamma(k_n, options.a_neg, logits.shape) - jnp.log(options.a_neg),
                       -jnp.inf)
    return jnp.zeros_like(log_pos), log_wp, log_wn
  b_pos, b_neg = rates(options)
  log_u, log_wp, log_wn = gamma.gibbs_log(key, log_pos, logits, a_u=options.a_u, b_u=options.b_u,
                                          a_pos=options.a_pos, b_pos=b_pos, a_neg=options.a_neg, b_neg=b_neg,
                                          n_sweeps=options.n_sweeps, w_init=options.w_init, neg_mask=neg_mask)
  if log_u_override is not None:  # weights given the moving-average u: one more conditional draw
    k_p, k_n = jax.random.split(jax.random.fold_in(key, 10_000))
    log_u = log_u_override
    log_wp = gamma.sample_log_w_pos(k_p, log_u, log_pos, options.a_pos, b_pos)
    log_wn = gamma.sample_log_w_neg(k_n, log_u, logits, neg_mask, options.a_neg, b_neg)
  if options.weights == "row_mean":
    # Relative weights: negatives divided by their row mean, the positive by its conditional mean given u.
    log_wn = log_wn - (jax.nn.logsumexp(log_wn, axis=1, keepdims=True) - jnp.log(n - 1.0))
    log_wp = log_wp - (jnp.log(1.0 + options.a_pos) - jnp.logaddexp(jnp.log(b_pos), log_u + log_pos))
  return log_u, log_wp, log_wn


@register("bayes")
class BayesianCL(TwoTowerMethod):

  Options = BayesOptions
  bench = (BenchEntry("bayes", "Bayesian CL: Gamma pair weights by Gibbs sampling (stochastic EM)", "bayes"),)

  def init_state(self, capacity):
    return dict(log_u_i2t=jnp.zeros((capacity,), jnp.float32), log_u_t2i=jnp.zeros((capacity,), jnp.float32),
                seen=jnp.zeros((capacity,), bool), p_pos=jnp.ones((capacity,), jnp.float32),
                log_w_pos=jnp.zeros((capacity,), jnp.float32))

  def loss_fn(self, params, state, batch, rng):
    lc = self.options
    model = self.bind(params).model
    img, txt = model.encode_image(batch["image"]), model.encode_text(batch["tokens"])
    # s = exp(cos / tau): the model's learned temperature (loss.tau = 0), or a fixed tau (the paper's: 1).
    scale = model.get_logit_scale() if not lc.tau else jnp.log(1.0 / jnp.asarray(lc.tau, jnp.float32))
    logits = contrastive.cosine_logits(img, txt, scale)
    sg = jax.lax.stop_gradient(logits)
    ids = batch["id"]
    k1, k2 = jax.random.split(rng)
    ema = lc.u_momentum > 0
    lu1, wp1, wn1 = sample_weights(k1, sg, lc)
    lu2, wp2, wn2 = sample_weights(k2, sg.T, lc)
    if ema:  # u_i <- alpha u_i + (1 - alpha) u~_i per example id (stored as log u)
      seen = state["seen"][ids]
      mix = lambda old, new: jnp.log(lc.u_momentum * jnp.exp(old) + (1 - lc.u_momentum) * jnp.exp(new))
      avg1 = jnp.where(seen, mix(state["log_u_i2t"][ids], lu1), lu1)
      avg2 = jnp.where(seen, mix(state["log_u_t2i"][ids], lu2), lu2)
      lu1, wp1, wn1 = sample_weights(k1, sg, lc, log_u_override=avg1)
      lu2, wp2, wn2 = sample_weights(k2, sg.T, lc, log_u_override=avg2)
    loss, metrics = bayes.weighted_infonce(logits, wp1, wn1, wp2, wn2)
    p_pos = bayes.effective_positive_probability(sg, wp1, wn1)
    n = logits.shape[0]
    off = ~jnp.eye(n, dtype=bool)
    metrics.update(mean_log_w_pos=jnp.mean(wp1), mean_log_w_neg=jnp.sum(jnp.where(off, wn1, 0.0)) / (n * (n - 1)),
                   mean_log_u=jnp.mean(lu1), mean_effective_p_pos=jnp.mean(p_pos), logit_scale=jnp.exp(scale))
    new = dict(state, p_pos=state["p_pos"].at[ids].set(p_pos), log_w_pos=state["log_w_pos"].at[ids].set(wp1))
    if ema:
      new.update(log_u_i2t=state["log_u_i2t"].at[ids].set(lu1), log_u_t2i=state["log_u_t2i"].at[ids].set(lu2),
                 seen=state["seen"].at[ids].set(True))
    return loss, (metrics, new)

  def stages(self):
    return (self.main_stage("train", (Update("main", self.loss_fn, self.default_param_groups()),),
                            post_update=stored_clamps(self.model_spec)),)

  def clean_scores(self, params, state):
    del params
    return state["p_pos"], None
