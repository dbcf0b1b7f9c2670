"""What a loss returns when it has more to say than (loss, metrics): a small typed pytree.

  loss        the scalar to differentiate
  scalars     float32 scalars for logging (metrics.jsonl, TensorBoard)
  per_sample  (N,) arrays a method may write into its per-sample state by example id
  extras      large intermediate arrays (transport plans, targets), only when the caller asked for them

Jittable and usable as the auxiliary output of `jax.value_and_grad(..., has_aux=True)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ncjax.numerics import MAX_LOGIT_SCALE, f32

__all__ = ["LossOutput", "f32", "MAX_LOGIT_SCALE"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LossOutput:
  loss: jax.Array
  scalars: dict[str, jax.Array] = dataclasses.field(default_factory=dict)
  per_sample: dict[str, jax.Array] = dataclasses.field(default_factory=dict)
  extras: Any = None

  def metrics(self) -> dict:
    """scalars, per-sample arrays and any extras (a dict) in one flat dict: the legacy (loss, metrics) form."""
    out = dict(self.scalars)
    out.update(self.per_sample)
    if isinstance(self.extras, dict):
      out.update(self.extras)
    elif self.extras is not None:
      out.update({f.name: getattr(self.extras, f.name) for f in dataclasses.fields(self.extras)})
    return out
