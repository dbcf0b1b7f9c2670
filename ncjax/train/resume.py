"""Resume checks: a workdir's latest checkpoint continues the same run, or the run stops with one line saying what
differs (another method, other noisy pairs, another dataset size or batch, web data read in another order)."""

from __future__ import annotations

import logging

import ncjax
from ncjax import errors

log = logging.getLogger("ncjax")


def check_resumable(exp, meta: dict, workdir: str) -> None:
  """Raise `CheckpointError` when checkpoint `meta` belongs to another run than experiment `exp`; warn where it was
  written by another ncjax or drew its data order another way (the run continues, as documented)."""
  where = f"{workdir} (step {meta['step']})"
  current = dict(method=exp.method.name, noise_sha256=exp.train_data.noise_sha256,
                 num_examples=exp.train_data.num_examples, steps_per_epoch=exp.steps_per_epoch)
  what = dict(method="the method", noise_sha256="the noisy pairs (noise.* settings or the data changed)",
              num_examples="the number of training examples", steps_per_epoch="the steps per epoch "
              "(input.global_batch_size or the data changed)")
  for key, value in current.items():
    if key in meta and meta[key] != value:
      raise errors.CheckpointError(f"cannot resume {where}: {what[key]} differs: checkpoint {meta[key]!r}, this "
                                   f"config {value!r}. Use a new --workdir for a different run.")
  check_order = getattr(exp.train_data, "check_resume", None)
  if check_order is not None:   # web data: the order of the remaining steps depends on more than the step
    try:
      check_order(meta.get("data") or {})
    except ValueError as e:
      raise errors.CheckpointError(f"cannot resume {where}: {str(e).removeprefix('cannot resume: ')}") from None
  order = meta.get("data", {}).get("order_version", 1)
  if order != exp.train_data.iterator_state(meta["step"]).get("order_version", order):
    log.warning("resuming %s, whose data order was drawn by an earlier ncjax (order version %s): from here the "
                "examples follow the current order, drawn independently of the noise (ncjax.data.streams)",
                where, order)
  if meta.get("ncjax_version") not in (None, ncjax.__version__):
    log.warning("resuming a checkpoint written by ncjax %s with ncjax %s", meta["ncjax_version"], ncjax.__version__)
