"""DisNCL (Dang et al., TIP 2025) on SGRAF's region backbone: disentangled modality-invariant / -exclusive subspaces,
filtration, adaptive-margin hinge and bootstrapped soft targets (ncjax.losses.disncl; methods.md §5).

  python -m ncjax.main --config=configs/disncl.py:noise=0.4 --workdir=/tmp/disncl --cpu_devices=8

Model (one module 'model', ncjax.models.disncl): SGRAF's region encoder f and bi-GRU text encoder g (joint space D);
disentangled encoders f_s, f_x (image) and g_s, g_x (text), three-layer MLPs with LeakyReLU(0.2) and 256 hidden
units applied to every region / word, into subspaces of `method.subspace_dim` (512); SGRAF's similarity head on the
invariant subspace (retrieval, training and evaluation all run there: H(V_s, T_s)); eight pair critics T(x, y)
(three-layer MLPs on [x; y], LeakyReLU 0.2, 256 hidden) for the JSD estimates — four trained with the encoders (the
MI terms the encoders maximise), four adversarial (`adv_*`: the MI terms the encoders minimise, maximised by their
critics).
MI terms see per-sample vectors: regions / valid words mean-pooled (`method.critic_pool='mean'`, or 'max'; the paper
does not say how a set of regions enters a critic: a reconstruction).

Schedule (the paper's implementation details): a warm-up stage of `method.warmup_epochs` (5) epochs of L_align
with the constant margin 0.2 on every pair, then `config.num_epochs` (50) epochs with two updates per step:
  1. 'adversary': the adv_* critics ascend their JSD estimates (everything else frozen);
  2. 'main': everything else descends L_Dis + L_reg + L_align + L_soft with the adv_* critics frozen.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ncjax.losses import disncl as L
from ncjax.methods.base import BenchEntry, ParamGroup, Stage, Update
from ncjax.methods.registry import register
from ncjax.methods.sgraf import HingeOptions, RegionMethod
from ncjax.models.disncl import ADVERSARIAL, build_disncl_model
from ncjax.options import loss_option, method_option

SOFT_TARGETS = ("bootstrap", "soft_infonce")


@dataclasses.dataclass(frozen=True)
class DisNCLOptions(HingeOptions):
  """The paper's settings (gamma 0.5, beta1 = beta2 = 0.1, beta3 0.5, margin base 10, 5 warm-up epochs, subspaces
  of 512 and MLPs of 256 hidden units); the reconstructed pieces are options (README "DisNCL")."""
  warmup_epochs: int = method_option(5)
  subspace_dim: int = method_option(512)
  hidden: int = method_option(256)
  gamma: float = method_option(0.5)
  beta1: float = method_option(0.1)
  beta2: float = method_option(0.1)
  beta3: float = method_option(0.5)
  filtration: bool = method_option(True)
  critic_pool: str = method_option("mean")        # how regions / words become the critics' vectors
  # the warm-up stage's hinge: 'all_mean' (every negative averaged: NCR / MSCN's public warm-up, the paper preset),
  # 'all' (summed: the synthetic preset's VSE++ start) or 'hardest'
  warmup_negatives: str = loss_option("all_mean")
  margin_kind: str = loss_option("exponential")
  margin_base: float = loss_option(10.0)
  temperature: float = loss_option(0.1)           # L_soft's and the confidence's tau
  soft_target: str = loss_option("bootstrap")     # 'bootstrap' | L2RM's 'soft_infonce'
  w_dis: float = loss_option(1.0)
  w_align: float = loss_option(1.0)
  w_soft: float = loss_option(1.0)

  def __post_init__(self):
    if self.soft_target not in SOFT_TARGETS:
      raise ValueError(f"unknown loss.soft_target {self.soft_target!r}; expected 'bootstrap' or 'soft_infonce'")


def disentangle_terms(model, pooled) -> L.DisentangleTerms:
  """The JSD estimates of every critic (ncjax.losses.disncl) and the Gaussian KL bound of the invariant vectors."""
  c = model.critic_scores(pooled)
  return L.DisentangleTerms(
      inv_v=L.jsd_mi(c["inv_v"]), inv_t=L.jsd_mi(c["inv_t"]),
      kl=2.0 * L.gaussian_kl_bound(pooled["v_s"], pooled["t_s"]),   # both conditional terms; each ||mu_v - mu_t||^2 / 2
      exc_v=L.jsd_mi(c["exc_v"]), exc_t=L.jsd_mi(c["exc_t"]),
      cross_v=L.jsd_mi(c["adv_cross_v"]), cross_t=L.jsd_mi(c["adv_cross_t"]),
      reg_v=L.jsd_mi(c["adv_reg_v"]), reg_t=L.jsd_mi(c["adv_reg_t"]))


@register("disncl")
class DisNCL(RegionMethod):

  Options = DisNCLOptions
  bench = (BenchEntry("disncl", "DisNCL: invariant/exclusive disentangling with filtration and soft targets",
                      "disncl", model_kind="region"),)

  def create_modules(self):
    tok, o = self.tokenizer, self.options
    return {"model": build_disncl_model(self.model_spec, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                                        subspace_dim=o.subspace_dim, hidden=o.hidden, critic_pool=o.critic_pool,
                                        seed=self.setup.seed)}

  def _similarity(self, model, batch, rng):
    feats = model.features(batch["image"], batch["tokens"], rng)
    # the head's pooling dropout (SGRAF's, model.region.pool_dropout) from its own stream
    h = model.head.matrix(feats["v_s"], feats["t_s"], feats["mask"], pairs_per_step=model.pairs_per_step,
                          rng=jax.random.fold_in(rng, 1))
    return h, feats

  def warmup_loss(self, params, state, batch, rng):
    """L_align with the constant margin on every pair (the paper's 5 warm-up epochs), over the negatives
    `loss.warmup_negatives` names: averaged over all of them as the same group's public code warms up (the paper
    preset), or summed (the synthetic preset: from a random start the max-violation hinge collapses, see
    ncjax.methods.sgraf)."""
    model = self.bind(params).model
    h, _ = self._similarity(model, batch, rng)
    o = self.options
    loss, metrics = L.align_loss(h, o.margin, reduction=o.reduction, negatives=o.warmup_negatives)
    return loss, (metrics, state)

  def adversary_loss(self, params, state, batch, rng):
    model = self.bind(params).model
    feats = jax.lax.stop_gradient(model.features(batch["image"], batch["tokens"], rng))
    loss, metrics = L.adversary_loss(disentangle_terms(model, feats["pooled"]))
    return loss, (metrics, state)

  def main_loss(self, params, state, batch, rng):
    """L_Dis + L_reg + L_align (filtered, adaptive margin) + L_soft, each with its weight (all 1 in the paper)."""
    model = self.bind(params).model
    o = self.options
    h, feats = self._similarity(model, batch, rng)
    dis, m_dis = L.disentangle_loss(disentangle_terms(model, feats["pooled"]), gamma=o.gamma, beta1=o.beta1,
                                    beta2=o.beta2)
    keep = L.filtration(h) if o.filtration else jnp.ones(h.shape[0], bool)
    confidence = L.diagonal_confidence(h, o.temperature)
    margins = L.soft_margin(confidence, o.margin, o.margin_kind, o.margin_base)
    align, m_align = L.align_loss(h, margins, keep, reduction=o.reduction)
    if o.soft_target == "bootstrap":
      soft, m_soft = L.soft_loss(h, h, beta3=o.beta3, temperature=o.temperature)
    else:   # L2RM's Soft_InfoNCE on labels beta3 I + (1 - beta3) sg(H)
      labels = o.beta3 * jnp.eye(h.shape[0]) + (1.0 - o.beta3) * jax.lax.stop_gradient(h)
      soft, m_soft = L.soft_infonce(h, labels, temperature=o.temperature)
    loss = o.w_dis * dis + o.w_align * align + o.w_soft * soft
    metrics = dict(m_dis, **m_align, **m_soft, l_dis=dis, clean_confidence=jnp.mean(confidence))
    return loss, (metrics, state)

  def stages(self):
    setup, o = self.setup, self.options
    frozen = self.frozen_groups()
    adversarial = "model/(" + "|".join(ADVERSARIAL) + ")/.*"
    adversary = Update("adversary", self.adversary_loss, tuple(
        frozen + [ParamGroup(adversarial, setup.lr, setup.weight_decay, name="adversary"), ParamGroup(".*", None)]))
    main = Update("main", self.main_loss, tuple(
        frozen + [ParamGroup(adversarial, None, name="adversary_frozen"),
                  ParamGroup(".*", setup.lr, setup.weight_decay, name="default")]))
    stages = []
    if o.warmup_epochs:
      stages.append(Stage("warmup", o.warmup_epochs, (Update("align", self.warmup_loss,
                                                            self.default_param_groups()),)))
    stages.append(self.main_stage("train", (adversary, main)))
    return tuple(stages)
