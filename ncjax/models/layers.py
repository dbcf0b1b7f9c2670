"""Transformer building blocks shared by the image and text towers (Flax NNX, used functionally).

Conventions follow CLIP so that OpenAI / open_clip weights map one-to-one later: pre-norm residual blocks,
LayerNorm eps 1e-5, fused QKV projection whose output rows are [q; k; v], QuickGELU by default.
Parameters are always float32; `dtype` is the compute dtype (bfloat16 on accelerators).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ncjax import errors

LAYER_NORM_EPS = 1e-5  # CLIP's value; flax defaults to 1e-6


def quick_gelu(x):
  """CLIP's activation, x * sigmoid(1.702 x)."""
  return x * jax.nn.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable] = {
    "quick_gelu": quick_gelu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def layer_norm(num_features: int, rngs: nnx.Rngs, eps: float = LAYER_NORM_EPS) -> nnx.LayerNorm:
  # Normalisation statistics in float32 whatever the compute dtype.
  return nnx.LayerNorm(num_features, epsilon=eps, dtype=jnp.float32, rngs=rngs)


def dense(in_features: int, out_features: int, *, dtype, rngs: nnx.Rngs, use_bias: bool = True,
          std: float | None = None) -> nnx.Linear:
  init = nnx.initializers.normal(std) if std is not None else nnx.initializers.xavier_uniform()
  return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype,
                    param_dtype=jnp.float32, kernel_init=init, rngs=rngs)


GRAD_REDUCE = ("bf16", "float32")   # `optim.grad_reduce`: the dtype the towers' weight gradients are summed in


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def project_f32_grad(spec: str, dtype, x, kernel):
  """jnp.einsum(spec, x, kernel.astype(dtype)) for a float32 `kernel`, whose gradient is computed and returned in
  float32: the weight-gradient product accumulates and outputs float32 (`preferred_element_type`), so a
  data-parallel step sums the gradient across devices in float32 (`optim.grad_reduce='float32'`). Autodiff of the
  plain einsum computes that product in the compute dtype, and XLA sums it there before widening it to the
  parameter's float32 (half the bytes on the wire, rounded at every ring step). The forward is the same product."""
  return jnp.einsum(spec, x, kernel.astype(dtype))


def _project_forward(spec, dtype, x, kernel):
  return jnp.einsum(spec, x, kernel.astype(dtype)), (x, kernel.astype(dtype))


def _project_backward(spec, dtype, saved, dy):
  x, kernel = saved
  inputs, out = spec.split("->")
  x_axes, kernel_axes = inputs.split(",")
  dx = jnp.einsum(f"{out},{kernel_axes}->{x_axes}", dy, kernel)
  dkernel = jnp.einsum(f"{x_axes},{out}->{kernel_axes}", x, dy, preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dkernel


project_f32_grad.defvjp(_project_forward, _project_backward)


def project(spec: str, x, kernel, bias, *, dtype, grad_reduce: str = "bf16"):
  """x (.) kernel + bias in the compute dtype, kernel and bias float32 parameters (`bias` broadcast over the
  output's leading axes; None for none). grad_reduce='float32': their gradients are formed in float32
  (`project_f32_grad`; the bias added in float32, so its gradient's sum over the batch is a float32 one)."""
  if grad_reduce == "bf16":
    y = jnp.einsum(spec, x, kernel.astype(dtype))
    return y if bias is None else y + bias.astype(dtype)
  y = project_f32_grad(spec, dtype, x, kernel)
  return y if bias is None else (y.astype(jnp.float32) + bias).astype(dtype)


ATTENTION_KINDS = ("auto", "einsum", "recompute", "fused", "xla", "cudnn")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128   # cuDNN's fused attention: head sizes that are multiples of 8, up to 128


def cudnn_refusal(*, dtype, head_dim: int, platform: str) -> str | None:
  """Why cuDNN's fused attention cannot run these heads here (None when it can): it needs an NVIDIA GPU, a half
  precision compute dtype and a head size that is a multiple of 8, at most 128."""
  if platform not in ("gpu", "cuda"):
    return f"it needs an NVIDIA GPU, and this process computes on {platform!r}"
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
    return f"it takes bfloat16 or float16, and model.dtype is {jnp.dtype(dtype).name} (set model.dtype=bfloat16)"
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return f"it takes head sizes that are multiples of 8 up to {CUDNN_MAX_HEAD_DIM}, and these heads have {head_dim}"
  return None


def resolve_attention(kind: str, *, dtype, head_dim: int, platform: str | None = None) -> str:
  """The attention implementation `model.attention` asks for on `platform` (default: JAX's default backend, where
  the model is traced and run): 'auto' is the fused kernel on a TPU (its step is bound by HBM traffic, and the
  kernel keeps each head's logits and probabilities on chip: docs/notes/pod_compile_tpu.md) and the einsum path
  elsewhere — on the CPU the fastest form, and on an H100 the
  fastest of the three it ran (CLIP ViT-B/16 bf16 at 256 pairs/GPU: einsum 1,991, xla 1,951, cudnn 1,493 pairs/s;
  docs/notes/accelerator_h100.md). cuDNN's kernel stays a choice for memory (23 GiB instead of 31 GiB there); an
  explicit 'cudnn' that cannot run is an error naming why."""
  if kind not in ATTENTION_KINDS:
    raise errors.ConfigurationError(f"unknown model.attention {kind!r}; expected one of {ATTENTION_KINDS}")
  platform = jax.default_backend() if platform is None else platform
  if kind == "auto":
    return "fused" if platform == "tpu" else "einsum"
  if kind == "cudnn":
    why = cudnn_refusal(dtype=dtype, head_dim=head_dim, platform=platform)
    if why is not None:
      raise errors.ConfigurationError(f"model.attention='cudnn' cannot run: {why}; model.attention='auto' runs "
                                      f"everywhere")
  return kind


def attention_mask(n: int, *, causal: bool, key_mask):
  """The (batch or 1, 1, queries, keys) boolean mask of causal and key-padding masking, None when neither."""
  mask = None
  if causal:
    mask = jnp.tril(jnp.ones((n, n), bool))[None, None]
  if key_mask is not None:  # (b, n) True where a key may be attended to
    keys = key_mask[:, None, None, :]
    mask = keys if mask is None else mask & keys
  return mask


MASKED_LOGIT = -0.7 * float(jnp.finfo(jnp.float32).max)   # jax.nn.dot_product_attention's masked value


def _scaled_logits(q, k, mask, scale: float):
  """q k^T / sqrt(d) in float32 (the products accumulate in float32 whatever the compute dtype), masked logits at
  a large finite negative value: a fully masked row then attends uniformly, never NaN."""
  logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * jnp.float32(scale)
  return logits if mask is None else jnp.where(mask, logits, jnp.float32(MASKED_LOGIT))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attend_recomputing(q, k, v, mask, scale: float):
  """softmax(q k^T / sqrt(d)) v over heads-major (batch, heads, tokens, head_dim) arrays, the einsum path's
  function (Vaswani et al. 2017, Eq. 1), with a backward that keeps no (tokens x tokens) array from the forward.

  Autodiff of the einsum path keeps the float32 probabilities (and their compute-dtype copy) of every block until
  the backward reaches it: at ViT-B/16 and 128 pairs per chip that is 238 MB per block, written once and read
  several times, the largest arrays of the whole TPU step. Here the forward keeps q, k, v, the output and the
  rows' float32 softmax statistics (maximum and 1 / sum: two numbers per token and head); the backward recomputes
  the logits in float32 and the probabilities as exp(logits - max) / sum, rounded to the compute dtype as the
  forward's were for p v, and forms the
  logits' gradient as p (dp - rowsum(dy * y)) (the softmax's Jacobian, as FlashAttention's backward, Dao et al.
  2022, Alg. 4). Statistics and sums stay float32; one extra q k^T per block is the price (+0.7% of ViT-B/16's
  FLOPs)."""
  return _attend_forward(q, k, v, mask, scale)[0]


def _attend_forward(q, k, v, mask, scale):
  logits = _scaled_logits(q, k, mask, scale)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  weights = jnp.exp(logits - row_max)
  row_sum = jnp.sum(weights, axis=-1, keepdims=True)
  probs = (weights / row_sum).astype(v.dtype)
  y = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
  # The maximum and the sum apart, not their log-sum-exp: in float32 a masked row's maximum (-2.4e38) would absorb
  # log(sum), and its recomputed probabilities would be 1 instead of 1 / tokens.
  return y, (q, k, v, mask, y, row_max[..., 0], 1 / row_sum[..., 0])


def _attend_backward(scale, saved, dy):
  # The barrier keeps XLA from merging the recomputed logits with the forward's (common subexpressions across
  # forward and backward would bring the stored logits back, as jax.checkpoint's barrier does for remat).
  q, k, v, mask, y, row_max, inv_sum = jax.lax.optimization_barrier(saved)
  probs = (jnp.exp(_scaled_logits(q, k, mask, scale) - row_max[..., None]) * inv_sum[..., None]).astype(v.dtype)
  dv = jnp.einsum("bhqk,bhqd->bhkd", probs, dy)
  dprobs = jnp.einsum("bhqd,bhkd->bhqk", dy, v, preferred_element_type=jnp.float32)
  row_dot = jnp.sum(dy.astype(jnp.float32) * y.astype(jnp.float32), axis=-1, keepdims=True)
  dlogits = probs.astype(jnp.float32) * (dprobs - row_dot) * jnp.float32(scale)
  if mask is not None:   # a masked logit is a constant: no gradient reaches q or k through it
    dlogits = jnp.where(mask, dlogits, jnp.float32(0))
  dlogits = dlogits.astype(q.dtype)
  dq = jnp.einsum("bhqk,bhkd->bhqd", dlogits, k)
  dk = jnp.einsum("bhqk,bhqd->bhkd", dlogits, q)
  dmask = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)
  return dq, dk, dv, dmask


attend_recomputing.defvjp(_attend_forward, _attend_backward)


class MultiHeadAttention(nnx.Module):
  """Self-attention with a fused QKV projection (rows [q; k; v], as CLIP's in_proj).

  `attention` (`model.attention`; resolved once here, `resolve_attention`): 'einsum' — the heads-major einsums
  below, tuned for the CPU; 'recompute' — the same einsums under `attend_recomputing`, whose backward recomputes
  the probabilities from q, k, v and the rows' float32 log-sum-exp instead of keeping them; 'fused' — token-major
  projections around one Pallas kernel per example and 128 lanes of heads (`fused_attention.attend`: logits,
  softmax and p v on chip; the TPU's choice; Pallas' interpreter elsewhere), the recomputing einsums where a key
  mask is given or a sequence is longer than the kernel takes;
  'xla' — `jax.nn.dot_product_attention(implementation='xla')` on token-major q, k, v; 'cudnn' — the same call with
  cuDNN's fused (flash) attention kernel, bf16/fp16 on NVIDIA GPUs; 'auto' — fused on a TPU, else einsum. The
  parameters and the arithmetic are the same for every kind: logits and softmax in float32, masked logits at jax's
  large negative value (a fully masked row attends uniformly, never NaN)."""

  def __init__(self, width: int, heads: int, *, dtype, rngs: nnx.Rngs, attention: str = "einsum",
               grad_reduce: str = "bf16"):
    if width % heads:
      raise ValueError(f"attention width {width} is not divisible by the number of heads {heads}")
    self.heads = heads
    self.dtype = dtype
    self.grad_reduce = grad_reduce
    self.attention = resolve_attention(attention, dtype=dtype, head_dim=width // heads)
    self.pad_odd_tokens = self.attention == "cudnn"   # see _attend_token_major
    self.qkv = dense(width, 3 * width, dtype=dtype, rngs=rngs, std=width ** -0.5)
    self.out = dense(width, width, dtype=dtype, rngs=rngs, std=width ** -0.5)

  def __call__(self, x, *, causal: bool = False, key_mask=None):
    b, n, w = x.shape
    h = self.heads
    d = w // h
    x = x.astype(self.dtype)
    if self.attention in ("einsum", "recompute", "fused"):
      return self._einsum(x, causal, key_mask)
    kernel = self.qkv.kernel[...].reshape(w, 3, h, d).astype(self.dtype)
    bias = self.qkv.bias[...].reshape(3, h, d).astype(self.dtype)
    out_kernel = self.out.kernel[...].reshape(h, d, w).astype(self.dtype)
    out_bias = self.out.bias[...].astype(self.dtype)
    # Token-major (batch, tokens, heads, head_dim), the layout jax.nn.dot_product_attention and cuDNN take.
    q, k, v = (jnp.einsum("bnw,whd->bnhd", x, kernel[:, i]) + bias[i] for i in range(3))
    y = self._attend_token_major(q, k, v, causal, key_mask)
    return jnp.einsum("bnhd,hdw->bnw", y, out_kernel) + out_bias

  def _attend_token_major(self, q, k, v, causal, key_mask):
    """`jax.nn.dot_product_attention` on (batch, tokens, heads, head_dim). cuDNN's fused kernel trains only on an
    even number of tokens (jax 0.11's flash-attention check counts every training call as biased, and a biased
    call needs even lengths; seen on an H100: ViT-B/16's 197 tokens were refused), so an odd count is padded by
    one token that the sequence lengths exclude: it is attended by nobody and its output row is dropped, so the
    function, and its gradient, are unchanged."""
    b, n = q.shape[:2]
    pad = self.pad_odd_tokens and n % 2 == 1
    if pad:
      # the padded value is the mean of the real ones: a row whose every key is masked attends uniformly, and
      # where a kernel counts the padded key among those (XLA's does), the mean of n + 1 values is still theirs
      q, k = (jnp.pad(t, ((0, 0), (0, 1), (0, 0), (0, 0))) for t in (q, k))
      v = jnp.concatenate([v, jnp.mean(v, axis=1, keepdims=True, dtype=jnp.float32).astype(v.dtype)], axis=1)
      if key_mask is not None:
        key_mask = jnp.pad(key_mask, ((0, 0), (0, 1)))
    m = q.shape[1]
    mask = None
    if key_mask is not None:
      # cuDNN takes a mask as a bias of the full (batch, 1, queries, keys) shape; the causal mask goes into it too,
      # so that a row with every key masked attends uniformly to all keys, as the einsum path's does (cuDNN's own
      # causal mask would exclude the later keys from that uniform average)
      mask = jnp.broadcast_to(attention_mask(m, causal=causal, key_mask=key_mask), (b, 1, m, m))
      causal = False
    lengths = jnp.full((b,), n, jnp.int32) if pad else None
    y = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal, query_seq_lengths=lengths,
                                     key_value_seq_lengths=lengths, implementation=self.attention)
    return y[:, :n] if pad else y

  def _einsum(self, x, causal, key_mask):
    """Scaled dot-product attention, computed heads-major: the fused kernel viewed as (width, 3, heads, head_dim)
    projects each of q, k, v straight into (batch, heads, tokens, head_dim), the two attention matmuls then batch
    over leading (batch, heads) axes, and the output projection contracts (heads, head_dim) directly. The
    token-major form (project to (batch, tokens, 3 * width), split, attend) made XLA transpose q, k, v and their
    gradients around every attention matmul: 16% of the `small` CLIP step on CPU went to those copies. Same
    arithmetic as `jax.nn.dot_product_attention`."""
    n, w = x.shape[1:]
    h = self.heads
    d = w // h
    kernel = self.qkv.kernel[...].reshape(w, 3, h, d)
    bias = self.qkv.bias[...].reshape(3, h, d)
    proj = functools.partial(project, dtype=self.dtype, grad_reduce=self.grad_reduce)
    if self.attention == "fused":
      from ncjax.models import fused_attention   # (Pallas, imported by the runs that take this path only)
      if key_mask is None and n <= fused_attention.MAX_TOKENS:
        # Token-major: the kernel reads each head's columns of (batch, tokens, width) q, k, v as the projections
        # write them, and writes its output as the output projection reads it.
        with jax.named_scope("attention_projections"):
          q, k, v = (proj("bnw,wv->bnv", x, kernel[:, i].reshape(w, w), bias[i].reshape(w)) for i in range(3))
        with jax.named_scope("attention_core"):
          y = fused_attention.attend(q, k, v, heads=h, causal=causal, scale=d ** -0.5)
        with jax.named_scope("attention_projections"):
          return proj("bnv,vw->bnw", y, self.out.kernel[...], self.out.bias[...])
    with jax.named_scope("attention_projections"):
      q, k, v = (proj("bnw,whd->bhnd", x, kernel[:, i], bias[i][:, None, :]) for i in range(3))
    mask = attention_mask(n, causal=causal, key_mask=key_mask)
    with jax.named_scope("attention_core"):
      if self.attention in ("recompute", "fused"):
        y = attend_recomputing(q, k, v, mask, d ** -0.5)
      else:
        probs = jax.nn.softmax(_scaled_logits(q, k, mask, d ** -0.5), axis=-1).astype(self.dtype)
        y = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
    with jax.named_scope("attention_projections"):
      return proj("bhnd,hdw->bnw", y, self.out.kernel[...].reshape(h, d, w), self.out.bias[...])


class MlpBlock(nnx.Module):

  def __init__(self, width: int, mlp_dim: int, *, act: str, dtype, rngs: nnx.Rngs, grad_reduce: str = "bf16"):
    self.act = ACTIVATIONS[act]
    self.dtype, self.grad_reduce = dtype, grad_reduce
    self.fc = dense(width, mlp_dim, dtype=dtype, rngs=rngs, std=(2 * width) ** -0.5)
    self.proj = dense(mlp_dim, width, dtype=dtype, rngs=rngs, std=width ** -0.5)

  def __call__(self, x):
    if self.grad_reduce == "bf16":
      return self.proj(self.act(self.fc(x)))
    proj = functools.partial(project, dtype=self.dtype, grad_reduce=self.grad_reduce)
    h = proj("...w,wm->...m", x.astype(self.dtype), self.fc.kernel[...], self.fc.bias[...])
    return proj("...m,mw->...w", self.act(h), self.proj.kernel[...], self.proj.bias[...])


class ResidualBlock(nnx.Module):
  """Pre-norm transformer block: x + attn(ln_1(x)); x + mlp(ln_2(x))."""

  def __init__(self, width: int, heads: int, mlp_dim: int, *, act: str, dtype, rngs: nnx.Rngs,
               ln_eps: float = LAYER_NORM_EPS, attention: str = "einsum", grad_reduce: str = "bf16"):
    if grad_reduce not in GRAD_REDUCE:
      raise errors.ConfigurationError(f"unknown optim.grad_reduce {grad_reduce!r}; expected one of {GRAD_REDUCE}")
    self.dtype = dtype
    self.ln_1 = layer_norm(width, rngs, ln_eps)
    self.attn = MultiHeadAttention(width, heads, dtype=dtype, rngs=rngs, attention=attention,
                                   grad_reduce=grad_reduce)
    self.ln_2 = layer_norm(width, rngs, ln_eps)
    self.mlp = MlpBlock(width, mlp_dim, act=act, dtype=dtype, rngs=rngs, grad_reduce=grad_reduce)

  def __call__(self, x, *, causal: bool = False, key_mask=None):
    # The named scopes label the compiled program's instructions by part (benchmarks/pod_compile.py's breakdown).
    with jax.named_scope("layer_norm"):
      h = self.ln_1(x).astype(self.dtype)
    h = self.attn(h, causal=causal, key_mask=key_mask)
    with jax.named_scope("residual"):
      x = x + h.astype(x.dtype)
    with jax.named_scope("layer_norm"):
      h = self.ln_2(x).astype(self.dtype)
    with jax.named_scope("mlp"):
      # (No jax.checkpoint policy here: with CLIP's QuickGELU the TPU compiler already recomputes the activation
      # from the first product on its own — a policy recomputing it changed neither the peak nor the bytes of a
      # compiled ViT-B/16 block — and recomputing the layer norms raised XLA's bytes accessed; see
      # docs/notes/pod_compile_tpu.md.)
      h = self.mlp(h)
    with jax.named_scope("residual"):
      return x + h.astype(x.dtype)


def _run_block(block: ResidualBlock, x, causal, key_mask):
  return block(x, causal=causal, key_mask=key_mask)


def _run_block_remat(block: ResidualBlock, x, causal, key_mask):
  """The block under `jax.checkpoint`, closing over the block's parameters (already traced values: the trainer
  merges them in at trace time). A plain jax transform rather than `nnx.remat`, which re-splits the module's state
  and refuses to do so inside another transform's trace — the micro-batched encoders' `lax.map`
  (ncjax.models.microbatch)."""
  def run(x, key_mask):
    return block(x, causal=causal, key_mask=key_mask)
  return jax.checkpoint(run)(x, key_mask)


class Transformer(nnx.Module):
  """A stack of residual blocks named `block_0 .. block_{depth-1}` (so freezing regexes can name them)."""

  def __init__(self, width: int, depth: int, heads: int, *, mlp_dim: int | None = None, act: str = "quick_gelu",
               dtype=jnp.float32, remat: bool = False, ln_eps: float = LAYER_NORM_EPS, attention: str = "einsum",
               grad_reduce: str = "bf16", rngs: nnx.Rngs):
    self.depth = depth
    self.remat = remat
    mlp_dim = 4 * width if mlp_dim is None else mlp_dim
    for i in range(depth):
      setattr(self, f"block_{i}", ResidualBlock(width, heads, mlp_dim, act=act, dtype=dtype, rngs=rngs,
                                                ln_eps=ln_eps, attention=attention, grad_reduce=grad_reduce))

  def __call__(self, x, *, causal: bool = False, key_mask=None):
    # Rematerialisation trades one extra forward per block for activation memory (large contrastive batches).
    run = _run_block_remat if self.remat else _run_block
    for i in range(self.depth):
      x = run(getattr(self, f"block_{i}"), x, causal, key_mask)
    return x


class MAPHead(nnx.Module):
  """Multihead attention pooling, as big_vision's `MAPHead` (SigLIP's 'map' pooling): a learned probe attends over
  the tokens (one query; q, k, v and output projections with biases; k and v fused here as `kv`, columns [k; v]),
  then a residual MLP on the LayerNorm'd result: y + mlp(ln(y)). `mlp_dim`: the tower's MLP width (big_vision
  passes the ViT's), 4 x width when None."""

  def __init__(self, width: int, heads: int, *, act: str, dtype, rngs: nnx.Rngs, mlp_dim: int | None = None,
               ln_eps: float = LAYER_NORM_EPS):
    if width % heads:
      raise ValueError(f"attention width {width} is not divisible by the number of heads {heads}")
    self.dtype = dtype
    self.heads = heads
    self.probe = nnx.Param(nnx.initializers.xavier_uniform()(rngs.params(), (1, 1, width), jnp.float32))
    self.q = dense(width, width, dtype=dtype, rngs=rngs)
    self.kv = dense(width, 2 * width, dtype=dtype, rngs=rngs)
    self.out = dense(width, width, dtype=dtype, rngs=rngs)
    self.ln = layer_norm(width, rngs, ln_eps)
    self.mlp = MlpBlock(width, 4 * width if mlp_dim is None else mlp_dim, act=act, dtype=dtype, rngs=rngs)

  def __call__(self, x):
    b, n, w = x.shape
    h = self.heads
    probe = jnp.broadcast_to(self.probe[...], (b, 1, w)).astype(self.dtype)
    q = self.q(probe).reshape(b, 1, h, w // h)
    kv = self.kv(x.astype(self.dtype)).reshape(b, n, 2, h, w // h)
    y = jax.nn.dot_product_attention(q, kv[:, :, 0], kv[:, :, 1]).reshape(b, 1, w)
    y = self.out(y).astype(jnp.float32)
    y = y + self.mlp(self.ln(y).astype(self.dtype)).astype(jnp.float32)
    return y[:, 0]
