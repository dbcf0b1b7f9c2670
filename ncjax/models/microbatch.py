"""Encoding a global batch in micro-batches: the exact full-batch gradient with the activations of one micro-batch
per device alive at a time — gradient caching (GradCache, Gao et al. 2021) in its JAX form.

Every loss of the seed methods is a function of the global batch's embeddings (NCU's transport plan, GSC's
structures, the Bayesian weights, InfoNCE's negatives), so plain gradient accumulation — a loss per micro-batch —
would change the objective (the negatives shrink to B / k). GradCache keeps the loss whole and splits only the
encoders: embed the micro-batches without keeping their activations, take the loss and its gradient with respect
to the embeddings over the global batch, then recompute each micro-batch's forward pass to carry that gradient into
the parameters. In JAX this is the encoder applied over the micro-batches inside `lax.map`, each wrapped in
`jax.checkpoint` with nothing saveable: the forward pass keeps only each micro-batch's input and output, and the
backward pass recomputes one micro-batch at a time. The gradient is the full-batch one (same arithmetic, another
summation order), and any randomness inside the encoder (dropout) is the same in both passes (the recomputation
replays the traced program).

The micro-batches stay on their devices: a (B, ...) batch split over D devices is viewed as (D, k, B / (D k), ...),
so micro-batch m holds rows m of every device's block, split over the same devices — no all-gather of the batch
(a plain `reshape(k, B / k, ...)` would re-lay it out across devices).
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P


def check_micro_batches(global_batch: int, devices: int, micro_batches: int) -> None:
  """A clear error when `micro_batches` does not divide the per-device batch (before anything compiles)."""
  if micro_batches < 1:
    raise ValueError(f"optim.micro_batches must be >= 1, got {micro_batches}")
  per_device, rest = divmod(global_batch, devices)
  if not rest and per_device % micro_batches:
    raise ValueError(f"optim.micro_batches={micro_batches} does not divide the per-device batch {per_device} "
                     f"(global batch {global_batch} over {devices} devices): choose a divisor of {per_device}")


def micro_batched(fn, *args, micro_batches: int):
  """fn(*args) for batch-major arrays `args` (leading dimension B, split over every mesh device), computed in
  `micro_batches` device-local micro-batches under `jax.checkpoint` (see the module docstring); the outputs (a
  pytree of batch-major arrays) in the original row order. One micro-batch, or a batch that does not split into
  micro_batches per device (evaluation's last chunk), runs `fn` whole."""
  k = int(micro_batches)
  b = args[0].shape[0]
  mesh = jax.sharding.get_abstract_mesh()
  d = 1 if mesh.empty else mesh.size
  if k <= 1 or b % (d * k):
    return fn(*args)
  per = b // (d * k)
  axes = None if mesh.empty else tuple(mesh.axis_names)

  def split(x):   # (B, ...) -> (k, D, B / (D k), ...): micro-batch m = row block m of every device
    y = x.reshape((d, k, per) + x.shape[1:]).swapaxes(0, 1)
    return y if axes is None else jax.lax.with_sharding_constraint(y, P(None, axes))

  def one(chunk):
    return fn(*(c.reshape((d * per,) + c.shape[2:]) for c in chunk))

  out = jax.lax.map(jax.checkpoint(one, policy=jax.checkpoint_policies.nothing_saveable),
                    tuple(split(a) for a in args))

  def merge(y):   # (k, D * per, ...) -> (B, ...), each row back where it came from
    y = y.reshape((k, d, per) + y.shape[2:]).swapaxes(0, 1).reshape((b,) + y.shape[2:])
    return y if axes is None else jax.lax.with_sharding_constraint(y, P(axes))

  return jax.tree.map(merge, out)
