"""Text transformer (CLIP layout): token + positional embeddings, causal blocks, ln_final, pooled at EOT.

big_vision's text tower (SigLIP) is the same stack without the causal mask (`causal=False`), pooled at the context's
final position ('final': its 'last', where sticky-EOS tokenisation always leaves an EOS), the first ('first'), the
mean of all positions ('gap') or a MAP head ('map'), with a head bias (`proj_bias`)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ncjax.models import layers


TEXT_POOLS = ("eot", "argmax", "last", "final", "first", "gap", "map")


def eot_positions(tokens, eot_id: int, pad_id: int = 0, pool: str = "eot"):
  """Index of the token whose feature represents the caption.

  'eot': the first EOT token; if a caption was truncated without one, its last non-pad token.
  'argmax': CLIP's convention (EOT has the largest id in its BPE vocabulary).
  'last': the last non-pad token.
  'final' / 'first': the context's final / first position, whatever the tokens (big_vision's 'last' / 'first').
  """
  if pool in ("final", "first"):
    return jnp.full(tokens.shape[:-1], tokens.shape[-1] - 1 if pool == "final" else 0, jnp.int32)
  if pool == "argmax":
    return jnp.argmax(tokens, axis=-1)
  length = tokens.shape[-1]
  last_non_pad = jnp.maximum(jnp.sum(tokens != pad_id, axis=-1) - 1, 0)
  if pool == "last":
    return last_non_pad
  if pool != "eot":
    raise ValueError(f"unknown text pooling {pool!r}; expected one of {TEXT_POOLS}")
  is_eot = tokens == eot_id
  first_eot = jnp.argmax(is_eot, axis=-1)
  return jnp.where(is_eot.any(axis=-1), first_eot, jnp.minimum(last_non_pad, length - 1))


class TextTransformer(nnx.Module):
  """Text tower. Input: int32 tokens (B, L). Output: pooled features and projection.

  `token_embeddings` may replace the looked-up embeddings (B, L, W): prompt learners (NCU's hardest-negative
  context vectors) write into them and reuse the whole tower.
  """

  def __init__(self, *, vocab_size: int, context_length: int, width: int, depth: int, heads: int,
               embed_dim: int, eot_id: int, pad_id: int = 0, pool: str = "eot", mlp_dim: int | None = None,
               act: str = "quick_gelu", dtype=jnp.float32, remat: bool = False,
               ln_eps: float = layers.LAYER_NORM_EPS, causal: bool = True, proj_bias: bool = False,
               attention: str = "einsum", grad_reduce: str = "bf16", rngs: nnx.Rngs):
    if pool not in TEXT_POOLS:
      raise ValueError(f"unknown text pooling {pool!r}; expected one of {TEXT_POOLS}")
    self.causal = causal
    self.context_length, self.width, self.vocab_size = context_length, width, vocab_size
    self.eot_id, self.pad_id, self.pool, self.dtype = eot_id, pad_id, pool, dtype
    self.token_embedding = nnx.Embed(vocab_size, width, embedding_init=nnx.initializers.normal(0.02),
                                     param_dtype=jnp.float32, rngs=rngs)
    self.pos_embedding = nnx.Param(nnx.initializers.normal(0.01)(rngs.params(), (context_length, width),
                                                                 jnp.float32))
    self.transformer = layers.Transformer(width, depth, heads, mlp_dim=mlp_dim, act=act, dtype=dtype,
                                          remat=remat, ln_eps=ln_eps, attention=attention,
                                          grad_reduce=grad_reduce, rngs=rngs)
    self.ln_final = layers.layer_norm(width, rngs, ln_eps)
    if pool == "map":
      self.map_head = layers.MAPHead(width, heads, act=act, dtype=dtype, rngs=rngs, mlp_dim=mlp_dim, ln_eps=ln_eps)
    self.proj = nnx.Param(nnx.initializers.normal(width ** -0.5)(rngs.params(), (width, embed_dim), jnp.float32))
    if proj_bias:
      self.proj_bias = nnx.Param(jnp.zeros((embed_dim,), jnp.float32))
    self.has_proj_bias = proj_bias

  @property
  def feature_dim(self) -> int:
    return self.width

  def embed_tokens(self, tokens):
    return self.token_embedding(tokens)

  def __call__(self, tokens, *, token_embeddings=None, return_features: bool = False):
    if tokens.ndim != 2 or tokens.shape[1] != self.context_length:
      raise ValueError(f"text tower expects tokens of shape (batch, {self.context_length}), got {tuple(tokens.shape)}")
    x = self.embed_tokens(tokens) if token_embeddings is None else token_embeddings
    x = x.astype(jnp.float32) + self.pos_embedding[...]
    x = self.transformer(x, causal=self.causal)
    x = self.ln_final(x)
    if self.pool == "gap":
      features = x.mean(axis=1)
    elif self.pool == "map":
      features = self.map_head(x)
    else:
      idx = eot_positions(tokens, self.eot_id, self.pad_id, self.pool)
      features = jnp.take_along_axis(x, idx[:, None, None], axis=1)[:, 0]
    features = features.astype(jnp.float32)
    emb = (features.astype(self.dtype) @ self.proj[...].astype(self.dtype)).astype(jnp.float32)
    if self.has_proj_bias:
      emb = emb + self.proj_bias[...]
    return (emb, features) if return_features else emb
