"""DisNCL (Dang et al., TIP 2025) on SGRAF's region backbone: disentangled modality-invariant / -exclusive subspaces,
filtration, adaptive-margin hinge and bootstrapped soft targets (ncjax.losses.disncl; methods.md §5).

  python -m ncjax.main --config=configs/disncl.py:noise=0.4 --workdir=/tmp/disncl --cpu_devices=8

Model (one module 'model'): SGRAF's region encoder f and bi-GRU text encoder g (joint space D); disentangled
encoders f_s, f_x (image) and g_s, g_x (text), three-layer MLPs with LeakyReLU(0.2) and 256 hidden units applied to
every region / word, into subspaces of `method.subspace_dim` (512); SGRAF's similarity head on the invariant subspace
(retrieval, training and evaluation all run there: H(V_s, T_s)); eight pair critics T(x, y) (three-layer MLPs on
[x; y], LeakyReLU 0.2, 256 hidden) for the JSD estimates — four trained with the encoders (the MI terms the
encoders maximise), four adversarial (`adv_*`: the MI terms the encoders minimise, maximised by their critics).
MI terms see per-sample vectors: regions / valid words mean-pooled (`method.critic_pool='mean'`, or 'max'; the paper
does not say how a set of regions enters a critic: a reconstruction).

Schedule (the paper's implementation details): a warm-up stage of `method.warmup_epochs` (5) epochs of L_align
with the constant margin 0.2 on every pair, then `config.num_epochs` (50) epochs with two updates per step:
  1. 'adversary': the adv_* critics ascend their JSD estimates (everything else frozen);
  2. 'main': everything else descends L_Dis + L_reg + L_align + L_soft with the adv_* critics frozen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ncjax.losses import disncl as L
from ncjax.methods.base import ParamGroup, Stage, Update
from ncjax.methods.registry import register
from ncjax.methods.sgraf import RegionMethod
from ncjax import models
from ncjax.models import sgraf
from ncjax.numerics import f32

ADVERSARIAL = ("adv_cross_v", "adv_cross_t", "adv_reg_v", "adv_reg_t")
COOPERATIVE = ("inv_v", "inv_t", "exc_v", "exc_t")


class MLP(nnx.Module):
  """Three linear layers with LeakyReLU(0.2) between them (the paper's f_s, f_x, g_s, g_x and critics)."""

  def __init__(self, din: int, hidden: int, dout: int, *, rngs: nnx.Rngs):
    self.l1 = nnx.Linear(din, hidden, rngs=rngs)
    self.l2 = nnx.Linear(hidden, hidden, rngs=rngs)
    self.l3 = nnx.Linear(hidden, dout, rngs=rngs)

  def __call__(self, x):
    x = jax.nn.leaky_relu(self.l1(f32(x)), 0.2)
    return self.l3(jax.nn.leaky_relu(self.l2(x), 0.2))


class PairCritic(nnx.Module):
  """T(x, y) = MLP([x; y]) for every pair of a batch. The first layer is split, W [x; y] = W_x x + W_y y, so the
  B x B score matrix costs two B x din products and B^2 hidden-size additions instead of B^2 concatenations."""

  def __init__(self, dx: int, dy: int, hidden: int, *, rngs: nnx.Rngs):
    self.wx = nnx.Linear(dx, hidden, rngs=rngs)
    self.wy = nnx.Linear(dy, hidden, use_bias=False, rngs=rngs)
    self.l2 = nnx.Linear(hidden, hidden, rngs=rngs)
    self.l3 = nnx.Linear(hidden, 1, rngs=rngs)

  def __call__(self, x, y):
    """(B, B) scores T(x_i, y_j)."""
    h = jax.nn.leaky_relu(self.wx(f32(x))[:, None, :] + self.wy(f32(y))[None, :, :], 0.2)
    return self.l3(jax.nn.leaky_relu(self.l2(h), 0.2))[..., 0]


class DisNCLModel(sgraf.RegionScoring, nnx.Module):
  """Encoders, disentangling MLPs, the SGRAF head on the invariant subspace (similarity / pair_score from
  `RegionScoring`) and the pair critics."""

  def __init__(self, *, spec: dict, vocab_size: int, pad_id: int, subspace_dim: int, hidden: int,
               critic_pool: str = "mean", rngs: nnx.Rngs):
    if critic_pool not in ("mean", "max"):
      raise ValueError(f"unknown method.critic_pool {critic_pool!r}; expected 'mean' or 'max'")
    self.critic_pool = critic_pool
    d, s = spec["embed_dim"], subspace_dim
    self.img = sgraf.RegionEncoder(spec["feature_dim"], d, rngs=rngs)
    self.txt = sgraf.GRUTextEncoder(vocab_size, spec["word_dim"], d, pad_id=pad_id,
                                    word_dropout=spec["word_dropout"], rngs=rngs)
    self.f_s, self.f_x = MLP(d, hidden, s, rngs=rngs), MLP(d, hidden, s, rngs=rngs)
    self.g_s, self.g_x = MLP(d, hidden, s, rngs=rngs), MLP(d, hidden, s, rngs=rngs)
    self.head = sgraf.SimilarityHead(s, spec["sim_dim"], kind=spec["head"], steps=spec["steps"],
                                     smooth=spec["smooth"], rngs=rngs)
    self.pairs_per_step = spec["pairs_per_step"]
    # critics: (x, y) dims. Invariant / exclusive vectors are s-dimensional, F_v / F_t are d-dimensional.
    dims = dict(inv_v=(s, d), inv_t=(s, d), exc_v=(s, d), exc_t=(s, d),
                adv_cross_v=(s, d), adv_cross_t=(s, d), adv_reg_v=(s, s), adv_reg_t=(s, s))
    for name, (dx, dy) in dims.items():
      setattr(self, name, PairCritic(dx, dy, hidden, rngs=rngs))

  # --- encoders ---------------------------------------------------------------------------------------------------
  def features(self, regions, tokens, rng=None):
    """Everything one batch needs: local features of both subspaces, pooled vectors for the MI terms
    (`critic_pool`: 'mean' over regions / valid words, or 'max')."""
    f_v = self.img(regions)                                  # (B, R, D)
    f_t, mask = self.txt(tokens, rng)                        # (B, L, D), (B, L)
    m = f32(mask)[..., None]

    def pool_t(x):
      if self.critic_pool == "max":
        return jnp.max(jnp.where(m > 0, x, -jnp.inf), axis=1)
      return jnp.sum(x * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)

    def pool_v(x):
      return jnp.max(x, axis=1) if self.critic_pool == "max" else jnp.mean(x, axis=1)

    v_s, v_x = sgraf.l2norm(self.f_s(f_v)), self.f_x(f_v)
    t_s, t_x = sgraf.l2norm(self.g_s(f_t)) * m, self.g_x(f_t) * m
    return dict(v_s=v_s, t_s=t_s, mask=mask, pooled=dict(
        f_v=pool_v(f_v), f_t=pool_t(f_t), v_s=pool_v(v_s), t_s=pool_t(t_s), v_x=pool_v(v_x), t_x=pool_t(t_x)))

  def encode_image(self, regions):
    return sgraf.l2norm(self.f_s(self.img(regions)))

  def encode_text(self, tokens):
    f_t, mask = self.txt(tokens)
    return sgraf.pack_text(sgraf.l2norm(self.g_s(f_t)) * f32(mask)[..., None], mask)

  # --- MI terms ---------------------------------------------------------------------------------------------------
  def terms(self, pooled) -> L.DisentangleTerms:
    p = pooled
    return L.DisentangleTerms(
        inv_v=L.jsd_mi(self.inv_v(p["v_s"], p["f_t"])), inv_t=L.jsd_mi(self.inv_t(p["t_s"], p["f_v"])),
        kl=2.0 * L.gaussian_kl_bound(p["v_s"], p["t_s"]),   # both conditional terms; each is ||mu_v - mu_t||^2 / 2
        exc_v=L.jsd_mi(self.exc_v(p["v_x"], p["f_v"])), exc_t=L.jsd_mi(self.exc_t(p["t_x"], p["f_t"])),
        cross_v=L.jsd_mi(self.adv_cross_v(p["v_x"], p["f_t"])), cross_t=L.jsd_mi(self.adv_cross_t(p["t_x"], p["f_v"])),
        reg_v=L.jsd_mi(self.adv_reg_v(p["v_s"], p["v_x"])), reg_t=L.jsd_mi(self.adv_reg_t(p["t_s"], p["t_x"])))


@register("disncl")
class DisNCL(RegionMethod):

  def create_modules(self):
    self.check_region_model()
    tok, mc = self.tokenizer, self.config.method
    return {"model": DisNCLModel(spec=models.region_spec(self.config.model), vocab_size=tok.vocab_size,
                                 pad_id=tok.pad_id, subspace_dim=mc.subspace_dim, hidden=mc.hidden,
                                 critic_pool=mc.critic_pool, rngs=nnx.Rngs(self.config.seed))}

  def _similarity(self, model, batch, rng):
    feats = model.features(batch["image"], batch["tokens"], rng)
    h = model.head.matrix(feats["v_s"], feats["t_s"], feats["mask"], pairs_per_step=model.pairs_per_step)
    return h, feats

  def warmup_loss(self, params, state, batch, rng):
    """L_align with the constant margin on every pair (the paper's 5 warm-up epochs); with
    loss.all_negatives_epochs > 0 the hinge is summed over every negative instead of the hardest (the synthetic
    preset: from a random start the max-violation hinge collapses, see ncjax.methods.sgraf)."""
    model = self.bind(params).model
    h, _ = self._similarity(model, batch, rng)
    lc = self.config.loss
    negatives = "all" if lc.all_negatives_epochs else "hardest"
    loss, metrics = L.align_loss(h, lc.margin, reduction=lc.reduction, negatives=negatives)
    return loss, (metrics, state)

  def adversary_loss(self, params, state, batch, rng):
    model = self.bind(params).model
    feats = jax.lax.stop_gradient(model.features(batch["image"], batch["tokens"], rng))
    loss, metrics = L.adversary_loss(model.terms(feats["pooled"]))
    return loss, (metrics, state)

  def main_loss(self, params, state, batch, rng):
    """L_Dis + L_reg + L_align (filtered, adaptive margin) + L_soft, each with its weight (all 1 in the paper)."""
    model = self.bind(params).model
    lc, mc = self.config.loss, self.config.method
    h, feats = self._similarity(model, batch, rng)
    dis, m_dis = L.disentangle_loss(model.terms(feats["pooled"]), gamma=mc.gamma, beta1=mc.beta1, beta2=mc.beta2)
    keep = L.filtration(h) if mc.filtration else jnp.ones(h.shape[0], bool)
    confidence = L.diagonal_confidence(h, lc.temperature)
    margins = L.soft_margin(confidence, lc.margin, lc.margin_kind, lc.margin_base)
    align, m_align = L.align_loss(h, margins, keep, reduction=lc.reduction)
    if lc.soft_target == "bootstrap":
      soft, m_soft = L.soft_loss(h, h, beta3=mc.beta3, temperature=lc.temperature)
    elif lc.soft_target == "soft_infonce":   # L2RM's Soft_InfoNCE on labels beta3 I + (1 - beta3) sg(H)
      labels = mc.beta3 * jnp.eye(h.shape[0]) + (1.0 - mc.beta3) * jax.lax.stop_gradient(h)
      soft, m_soft = L.soft_infonce(h, labels, temperature=lc.temperature)
    else:
      raise ValueError(f"unknown loss.soft_target {lc.soft_target!r}; expected 'bootstrap' or 'soft_infonce'")
    loss = lc.w_dis * dis + lc.w_align * align + lc.w_soft * soft
    metrics = dict(m_dis, **m_align, **m_soft, l_dis=dis, clean_confidence=jnp.mean(confidence))
    return loss, (metrics, state)

  def stages(self):
    optim, mc = self.config.optim, self.config.method
    frozen = [ParamGroup(optim.freeze, None, name="frozen")] if optim.freeze else []
    adversarial = "model/(" + "|".join(ADVERSARIAL) + ")/.*"
    adversary = Update("adversary", self.adversary_loss, tuple(
        frozen + [ParamGroup(adversarial, optim.lr, optim.weight_decay, name="adversary"), ParamGroup(".*", None)]))
    main = Update("main", self.main_loss, tuple(
        frozen + [ParamGroup(adversarial, None, name="adversary_frozen"),
                  ParamGroup(".*", optim.lr, optim.weight_decay, name="default")]))
    stages = []
    if mc.warmup_epochs:
      stages.append(Stage("warmup", mc.warmup_epochs, (Update("align", self.warmup_loss,
                                                             self.default_param_groups()),)))
    stages.append(Stage("train", self.config.num_epochs, (adversary, main)))
    return tuple(stages)
