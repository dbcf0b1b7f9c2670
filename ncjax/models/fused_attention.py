"""Attention fused into one TPU kernel per (example, 128 lanes of heads) for the short sequences of CLIP's towers.

softmax(q k^T / sqrt(d)) v (Vaswani et al. 2017, Eq. 1) where a whole sequence fits the kernel's memory at once: a
ViT-B/16's 197 tokens, a text tower's 77. XLA computes attention as separate matrix products and a softmax, so the
(tokens x tokens) logits and probabilities of every head go to HBM and back, forward and backward — at ViT-B/16 and
128 pairs per v5e chip the largest arrays of the step (docs/notes/pod_compile_tpu.md). Here each grid step reads
one example's 128 columns of token-major q, k, v (two of ViT-B/16's 64-wide heads), and per head computes its
logits in float32, the softmax in float32 and p v, and writes only the output. The backward kernel reads q, k, v
and the output's gradient and recomputes the probabilities the same way (every row is whole, so no statistics are
kept between the passes), then forms the logits' gradient from the softmax's Jacobian, p (dp - rowsum(dp p)), in
float32 (as FlashAttention's backward, Dao et al. 2022, Alg. 4, with the row sums taken from p itself). What the
step stores for the backward is q, k and v, which the projections keep anyway. One extra q k^T per block is the
price, as `layers.attend_recomputing`'s.

Token-major because of the TPU's (sublane, 128-lane) tiles: heads-major (batch, heads, tokens, 64) arrays, as the
einsum path lays them out, are stored lane-padded to 128 in HBM, twice their size, and the kernel's operands and
output are what the step keeps for the backward. Taking (batch, tokens, width) q, k, v and writing the output the
same way cut the compiled ViT-B/16 step's peak at 128 pairs per v5e chip from 12.1 to 9.8 GiB and XLA's bytes
accessed from 137 to 118 GB (docs/notes/pod_compile_tpu.md).

The kernels are Pallas TPU kernels; on any other platform they run in Pallas' interpreter (the tests' CPU), which
computes the same function. A key-padding mask is not taken here (CLIP's towers have none): the model falls back to
the recomputing einsums where one is given, and where a sequence exceeds `MAX_TOKENS`.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

# A (tokens x tokens) float32 block and its probabilities per grid step: 4 MiB each at 1,024 tokens, inside a TPU
# core's scoped VMEM (16 MiB by default on v5e) with q, k, v and the gradients' double buffers.
MAX_TOKENS = 1024
MASKED_LOGIT = -0.7 * float(jnp.finfo(jnp.float32).max)   # as layers.MASKED_LOGIT: jax.nn's masked value

_PLATFORM: list[str | None] = [None]


@contextlib.contextmanager
def compiling_for(platform: str):
  """Trace the kernels for `platform` rather than JAX's default backend: an ahead-of-time compile for a TPU on a
  host without one (benchmarks/pod_compile.py) needs the Mosaic kernels, not the interpreter."""
  _PLATFORM.append(platform)
  try:
    yield
  finally:
    _PLATFORM.pop()


def _interpret() -> bool:
  platform = _PLATFORM[-1] or jax.default_backend()
  return platform != "tpu"


def _logits(q, k, scale: float, causal: bool):
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * jnp.float32(scale)
  if causal:
    row = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    col = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(col <= row, s, jnp.float32(MASKED_LOGIT))
  return s


def _softmax(s):
  weights = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
  return weights / jnp.sum(weights, axis=-1, keepdims=True)


def _lanes(width: int, head_dim: int) -> int:
  """Lanes per grid step: the fewest whole heads that fill whole 128-lane vregs and divide the width (two of
  ViT-B/16's 64-wide heads per step), else the whole width. Token-major blocks need no (tokens, head_dim) tile of
  their own: a heads-major (batch, heads, tokens, 64) bf16 array is stored lane-padded to 128 in HBM, twice its
  size, and the step keeps q, k, v and the output for the backward."""
  lanes = head_dim * 128 // math.gcd(head_dim, 128)
  return lanes if width % lanes == 0 else width


def _heads(refs, head_dim: int):
  """Each head's (tokens, head_dim) columns of the blocks `refs` hold, head by head."""
  for start in range(0, refs[0].shape[-1], head_dim):
    yield start, [ref[0, :, start:start + head_dim] for ref in refs]


def _forward_kernel(q_ref, k_ref, v_ref, y_ref, *, scale: float, causal: bool, head_dim: int):
  for start, (q, k, v) in _heads((q_ref, k_ref, v_ref), head_dim):
    probs = _softmax(_logits(q, k, scale, causal)).astype(v.dtype)
    y_ref[0, :, start:start + head_dim] = jnp.dot(probs, v, preferred_element_type=jnp.float32).astype(y_ref.dtype)


def _backward_kernel(q_ref, k_ref, v_ref, dy_ref, dq_ref, dk_ref, dv_ref, *, scale: float, causal: bool,
                     head_dim: int):
  transposed = (((0,), (0,)), ((), ()))
  for start, (q, k, v, dy) in _heads((q_ref, k_ref, v_ref, dy_ref), head_dim):
    columns = slice(start, start + head_dim)
    probs = _softmax(_logits(q, k, scale, causal))                      # float32, as the forward's before rounding
    dv_ref[0, :, columns] = jax.lax.dot_general(probs.astype(v.dtype), dy, transposed,
                                                preferred_element_type=jnp.float32).astype(dv_ref.dtype)
    dprobs = jax.lax.dot_general(dy, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dlogits = probs * (dprobs - jnp.sum(dprobs * probs, axis=-1, keepdims=True)) * jnp.float32(scale)
    dlogits = dlogits.astype(q.dtype)     # a masked logit's probability is 0: no gradient reaches q or k through it
    dq_ref[0, :, columns] = jnp.dot(dlogits, k, preferred_element_type=jnp.float32).astype(dq_ref.dtype)
    dk_ref[0, :, columns] = jax.lax.dot_general(dlogits, q, transposed,
                                                preferred_element_type=jnp.float32).astype(dk_ref.dtype)


def _call(kernel, inputs, outputs: int, *, head_dim: int, flops: int, transcendentals: int):
  b, n, w = inputs[0].shape
  lanes = _lanes(w, head_dim)
  block = pl.BlockSpec((1, n, lanes), lambda i, j: (i, 0, j))
  shape = jax.ShapeDtypeStruct(inputs[0].shape, inputs[0].dtype)
  moved = (len(inputs) + outputs) * inputs[0].size * inputs[0].dtype.itemsize
  return pl.pallas_call(
      functools.partial(kernel, head_dim=head_dim), grid=(b, w // lanes), in_specs=[block] * len(inputs),
      out_specs=[block] * outputs, out_shape=[shape] * outputs,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=transcendentals, bytes_accessed=moved),
      interpret=_interpret())(*inputs)


def attend(q, k, v, *, heads: int, causal: bool, scale: float):
  """softmax(q k^T scale [causal mask]) v per head over token-major (batch, tokens, width) arrays, head i in columns
  [i * head_dim, (i + 1) * head_dim) (as the projections write them; no lane-padded heads-major arrays); the logits
  and the softmax in float32, the products in q's dtype with float32 accumulation (the einsum path's arithmetic).

  Under a mesh (`jax.set_mesh`, as the trainer steps) each device attends over its own examples: a kernel is not
  partitioned by XLA, so it runs in `shard_map` over the batch axis, split over every mesh axis as the trainer
  splits the batch (replicated where the batch does not divide)."""
  fn = functools.partial(_attend, head_dim=q.shape[-1] // heads, causal=causal, scale=scale)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return fn(q, k, v)
  rows = P(tuple(mesh.axis_names)) if q.shape[0] % mesh.size == 0 else P()
  return jax.shard_map(fn, in_specs=(rows, rows, rows), out_specs=rows, check_vma=False)(q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _attend(q, k, v, head_dim: int, causal: bool, scale: float):
  return _forward(q, k, v, head_dim, causal, scale)[0]


def _forward(q, k, v, head_dim, causal, scale):
  b, n, w = q.shape
  (y,) = _call(functools.partial(_forward_kernel, scale=scale, causal=causal), [q, k, v], 1, head_dim=head_dim,
               flops=4 * b * n * n * w, transcendentals=b * n * n * (w // head_dim))
  return y, (q, k, v)


def _backward(head_dim, causal, scale, saved, dy):
  q, k, v = saved
  b, n, w = q.shape
  dq, dk, dv = _call(functools.partial(_backward_kernel, scale=scale, causal=causal), [q, k, v, dy.astype(q.dtype)],
                     3, head_dim=head_dim, flops=10 * b * n * n * w, transcendentals=b * n * n * (w // head_dim))
  return dq, dk, dv


_attend.defvjp(_forward, _backward)
