"""DisNCL's model (Dang et al., TIP 2025) on SGRAF's region backbone: the region encoder f and bi-GRU text encoder g
(joint space D), disentangled encoders f_s, f_x (image) and g_s, g_x (text) — three-layer MLPs with LeakyReLU(0.2)
applied to every region / word, into subspaces of `subspace_dim` —, SGRAF's similarity head on the invariant
subspace, and eight pair critics T(x, y) for the JSD mutual-information estimates (ncjax.losses.disncl). The
method that trains it is ncjax.methods.disncl.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ncjax.models import sgraf
from ncjax.numerics import f32

ADVERSARIAL = ("adv_cross_v", "adv_cross_t", "adv_reg_v", "adv_reg_t")
COOPERATIVE = ("inv_v", "inv_t", "exc_v", "exc_t")
# critic -> (x, y) pooled vectors it scores: invariant / exclusive subspaces against the tower features F_v, F_t.
CRITIC_INPUTS = dict(inv_v=("v_s", "f_t"), inv_t=("t_s", "f_v"), exc_v=("v_x", "f_v"), exc_t=("t_x", "f_t"),
                     adv_cross_v=("v_x", "f_t"), adv_cross_t=("t_x", "f_v"), adv_reg_v=("v_s", "v_x"),
                     adv_reg_t=("t_s", "t_x"))


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
    init = spec.get("init", "public")
    self.img = sgraf.RegionEncoder(spec["feature_dim"], d, init=init, rngs=rngs)
    self.txt = sgraf.GRUTextEncoder(vocab_size, spec["word_dim"], d, pad_id=pad_id,
                                    word_dropout=spec["word_dropout"], init=init, rngs=rngs)
    self.f_s, self.f_x = MLP(d, hidden, s, rngs=rngs), MLP(d, hidden, s, rngs=rngs)
    self.g_s, self.g_x = MLP(d, hidden, s, rngs=rngs), MLP(d, hidden, s, rngs=rngs)
    self.head = sgraf.SimilarityHead(s, spec["sim_dim"], kind=spec["head"], steps=spec["steps"],
                                     smooth=spec["smooth"], pool_dropout=spec.get("pool_dropout", 0.0), init=init,
                                     rngs=rngs)
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

  # --- critics --------------------------------------------------------------------------------------------------
  def critic_scores(self, pooled) -> dict:
    """Each critic's (B, B) scores T(x_i, y_j) on the pooled vectors it reads (CRITIC_INPUTS); the losses turn them
    into JSD estimates (ncjax.losses.disncl)."""
    return {name: getattr(self, name)(pooled[x], pooled[y]) for name, (x, y) in CRITIC_INPUTS.items()}


def build_disncl_model(spec, *, vocab_size: int, pad_id: int, subspace_dim: int, hidden: int, critic_pool: str,
                       seed: int) -> DisNCLModel:
  """DisNCL's model over a region ModelSpec (`spec.region`)."""
  if not spec.is_region:
    raise ValueError("DisNCL runs on region features: set model.image_type='regions' and model.text_type='bigru' "
                     "(configs/disncl.py does)")
  return DisNCLModel(spec=spec.region, vocab_size=vocab_size, pad_id=pad_id, subspace_dim=subspace_dim,
                     hidden=hidden, critic_pool=critic_pool, rngs=nnx.Rngs(seed))
