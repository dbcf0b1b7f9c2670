"""ViT image tower (CLIP layout: conv patchify, class token, ln_pre, pre-norm blocks, ln_post, projection).

OpenAI / open_clip / Hugging Face CLIP: no patch bias, ln_pre. timm's ViT (MERU's image encoder): patch bias, no
ln_pre, exact GELU (`patch_bias=True, ln_pre=False, act='gelu'`); its final norm followed by class-token pooling is
our ln_post of the token; MERU fixes its position table to MoCo v3's 2-D sin-cos ('sincos2d_moco', frozen, a zero
entry for the class token).
big_vision's ViT (SigLIP's image tower): patch bias, no ln_pre, no class token ('map' or 'gap' pooling of the
final-normed tokens), a learned or fixed 'sincos2d' position embedding, and a head with a bias (`proj_bias`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ncjax.models import layers


POSEMBS = ("learn", "sincos2d", "sincos2d_moco")


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
  """big_vision's fixed 2-D position embedding ('sincos2d'), (h * w, width) float32: per patch (row y, column x),
  [sin(x w), cos(x w), sin(y w), cos(y w)] with frequencies w = temperature ** -(i / (width / 4 - 1))."""
  y, x = np.mgrid[:h, :w]
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
  x = x.reshape(-1)[:, None] * omega[None]
  y = y.reshape(-1)[:, None] * omega[None]
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def posemb_sincos_2d_moco(h: int, w: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
  """MoCo v3's fixed 2-D position embedding, as MERU builds it (`build_timm_vit(use_sincos2d_pos=True)`), (h * w,
  width) float32: per patch (row r, column c), [sin(r w), cos(r w), sin(c w), cos(c w)] with w = temperature **
  -(i / (width / 4)). Two differences from big_vision's: the row comes first (the code's `meshgrid(grid_w, grid_h)`
  indexes 'ij', so its 'w' grid runs over the rows of the row-major patch order) and the exponent divides by
  width / 4, not width / 4 - 1."""
  rows, cols = np.divmod(np.arange(h * w), w)
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))
  r = rows[:, None] * omega[None]
  c = cols[:, None] * omega[None]
  return np.concatenate([np.sin(r), np.cos(r), np.sin(c), np.cos(c)], axis=1).astype(np.float32)


SINCOS = {"sincos2d": posemb_sincos_2d, "sincos2d_moco": posemb_sincos_2d_moco}


class VisionTransformer(nnx.Module):
  """Image tower. Input: (B, H, W, C) float images already normalised. Output: pooled features and projection.

  pool: 'tok' (class token, CLIP), 'map' (attention pooling, SigLIP) or 'gap' (mean of patch tokens).
  """

  def __init__(self, *, image_size: int, patch_size: int, width: int, depth: int, heads: int, embed_dim: int,
               channels: int = 3, pool: str = "tok", ln_pre: bool = True, mlp_dim: int | None = None,
               act: str = "quick_gelu", dtype=jnp.float32, remat: bool = False, patch_bias: bool = False,
               ln_eps: float = layers.LAYER_NORM_EPS, posemb: str = "learn", proj_bias: bool = False,
               attention: str = "einsum", grad_reduce: str = "bf16", rngs: nnx.Rngs):
    if image_size % patch_size:
      raise ValueError(f"image_size {image_size} is not divisible by patch_size {patch_size}")
    if pool not in ("tok", "map", "gap"):
      raise ValueError(f"unknown pooling {pool!r}; expected 'tok', 'map' or 'gap'")
    if posemb not in POSEMBS:
      raise ValueError(f"unknown position embedding {posemb!r}; expected one of {POSEMBS}")
    if posemb in SINCOS and width % 4:
      raise ValueError(f"posemb={posemb!r} needs a width divisible by 4, got {width}")
    self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
    self.pool, self.dtype, self.width, self.posemb = pool, dtype, width, posemb
    grid = image_size // patch_size
    self.grid = grid
    scale = width ** -0.5
    self.patch_embed = nnx.Conv(channels, width, kernel_size=(patch_size, patch_size),
                                strides=(patch_size, patch_size), padding="VALID", use_bias=patch_bias,
                                dtype=dtype, param_dtype=jnp.float32, rngs=rngs)
    n_tokens = grid * grid + (1 if pool == "tok" else 0)
    if pool == "tok":
      self.cls_token = nnx.Param(scale * nnx.initializers.normal(1.0)(rngs.params(), (width,), jnp.float32))
    if posemb == "learn":
      self.pos_embedding = nnx.Param(scale * nnx.initializers.normal(1.0)(rngs.params(), (n_tokens, width),
                                                                         jnp.float32))
    self.ln_pre = layers.layer_norm(width, rngs, ln_eps) if ln_pre else None
    self.transformer = layers.Transformer(width, depth, heads, mlp_dim=mlp_dim, act=act, dtype=dtype,
                                          remat=remat, ln_eps=ln_eps, attention=attention,
                                          grad_reduce=grad_reduce, rngs=rngs)
    self.ln_post = layers.layer_norm(width, rngs, ln_eps)
    if pool == "map":
      self.map_head = layers.MAPHead(width, heads, act=act, dtype=dtype, rngs=rngs, mlp_dim=mlp_dim, ln_eps=ln_eps)
    self.proj = nnx.Param(scale * nnx.initializers.normal(1.0)(rngs.params(), (width, embed_dim), jnp.float32))
    if proj_bias:
      self.proj_bias = nnx.Param(jnp.zeros((embed_dim,), jnp.float32))
    self.has_proj_bias = proj_bias

  @property
  def feature_dim(self) -> int:
    return self.width

  def __call__(self, images, *, return_features: bool = False):
    expected = (self.image_size, self.image_size, self.channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
      raise ValueError(f"image tower expects images of shape (batch, {expected[0]}, {expected[1]}, {expected[2]}),"
                       f" got {tuple(images.shape)}")
    x = self.patch_embed(images.astype(self.dtype))
    b = x.shape[0]
    x = x.reshape(b, -1, self.width).astype(jnp.float32)
    if self.posemb in SINCOS:   # fixed, on the patch tokens only (a class token gets none: big_vision, MERU's zero)
      x = x + jnp.asarray(SINCOS[self.posemb](self.grid, self.grid, self.width))
    if self.pool == "tok":
      cls = jnp.broadcast_to(self.cls_token[...], (b, 1, self.width))
      x = jnp.concatenate([cls, x], axis=1)
    if self.posemb == "learn":
      x = x + self.pos_embedding[...]
    if self.ln_pre is not None:
      x = self.ln_pre(x)
    x = self.transformer(x)
    if self.pool == "tok":
      features = self.ln_post(x[:, 0])
    elif self.pool == "gap":   # the mean of the final-normed tokens (big_vision's order)
      features = self.ln_post(x).mean(axis=1)
    else:
      features = self.map_head(self.ln_post(x))
    features = features.astype(jnp.float32)
    emb = features.astype(self.dtype) @ self.proj[...].astype(self.dtype)
    emb = emb.astype(jnp.float32)
    if self.has_proj_bias:
      emb = emb + self.proj_bias[...]
    return (emb, features) if return_features else emb
