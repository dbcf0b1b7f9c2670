"""NCU's hardest-negative prompt (CoOp-style learned context, Zhou et al. 2022; NCU Sec. 4.2).

m = 8 shared context vectors X_1..X_m (init N(0, 0.02^2)) are written into the token embeddings right after the
start token: "[SOT] X X X X X X X X caption [EOT]" (truncated to the context length without re-inserting EOT, as
the public code does), and the sequence runs through the same text tower, giving t_i^Neg. Works with any text tower
exposing `embed_tokens` and accepting `token_embeddings`.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class NegativePrompt(nnx.Module):

  def __init__(self, n_ctx: int, width: int, *, rngs: nnx.Rngs):
    self.n_ctx = n_ctx
    self.ctx = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (n_ctx, width), jnp.float32))


def prompted_tokens(tokens, n_ctx: int, placeholder_id: int):
  """[SOT, X*n_ctx, caption tokens..., EOT, PAD...], truncated to the original length (EOT not re-inserted)."""
  b, length = tokens.shape
  filler = jnp.full((b, n_ctx), placeholder_id, tokens.dtype)
  out = jnp.concatenate([tokens[:, :1], filler, tokens[:, 1:]], axis=1)
  return out[:, :length]


def encode_negative_text(model, prompt: NegativePrompt, tokens, placeholder_id: int = 1):
  """t^Neg: the text tower over the caption with the learned context written after SOT; model geometry applied."""
  ptoks = prompted_tokens(tokens, prompt.n_ctx, placeholder_id)
  emb = model.txt.embed_tokens(ptoks)
  ctx = jnp.broadcast_to(prompt.ctx[...].astype(emb.dtype), (emb.shape[0],) + prompt.ctx.shape)
  emb = emb.at[:, 1:1 + prompt.n_ctx].set(ctx)
  return model.encode_text(ptoks, token_embeddings=emb)
