"""Each step's metrics, read one step late so that the host never stalls the device."""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from ncjax import errors


class StepLog:
  """Holds the last step's metrics (still on the device) until the next step is dispatched; `flush` reads them,
  stops the run on a non-finite loss (naming the step and its batch's example ids), updates the progress line and,
  every `every_steps` steps (and at the end), writes them to the metrics with the throughput since the last line."""

  def __init__(self, writer, progress, *, every_steps: int, global_batch_size: int, steps_per_epoch: int,
               start: int):
    self.writer, self.progress = writer, progress
    self.every_steps, self.global_batch_size, self.steps_per_epoch = every_steps, global_batch_size, steps_per_epoch
    self.pending = None            # (step done, ids, metrics on device, skipped records so far)
    self.last: dict = {}           # the last metrics read, on the host
    self._since = (time.perf_counter(), start)

  def push(self, done: int, ids, metrics, skipped: int) -> None:
    """Record step `done`'s metrics; the previous step's are read now (its computation has finished by then)."""
    self.flush()
    self.pending = (done, ids, metrics, skipped)

  def flush(self, final: bool = False) -> None:
    if self.pending is None:
      return
    done, ids, metrics, skipped = self.pending
    self.pending = None
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    host["input/skipped_records"] = skipped
    losses = {k: v for k, v in host.items() if k == "loss" or k.endswith("/loss")}
    if not all(math.isfinite(v) for v in losses.values()):
      raise errors.DivergedError(f"non-finite loss at step {done - 1} ({losses}): lower the learning rate "
                                 f"(optim.lr) or look at the pairs of that global batch, example ids "
                                 f"{np.sort(ids).tolist()}")
    self.progress.update(done, host)
    if done % self.every_steps == 0 or final:
      t0, n0 = self._since
      dt = time.perf_counter() - t0
      if done > n0 and dt > 0:
        host["examples_per_sec"] = (done - n0) * self.global_batch_size / dt
      host["epoch"] = done / self.steps_per_epoch
      self.writer.write(done, host)
    if done % self.every_steps == 0:
      self._since = (time.perf_counter(), done)
    self.last = host
