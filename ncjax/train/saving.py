"""The checkpoint and preemption policy of a run: when the loop saves (every `ckpt.every_steps` steps, every
`ckpt.every_minutes` minutes, at the end) and when it stops (a preemption, agreed by every process at the same step,
saves that step and exits with PREEMPTED_EXIT_STATUS so that relaunching the same command resumes)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

import jax
import numpy as np

log = logging.getLogger("ncjax")

# The exit status of a run stopped by a preemption after saving its checkpoint (BSD's EX_TEMPFAIL: "try again
# later"): relaunching the same command resumes it. launch/slurm.sbatch requeues on it.
PREEMPTED_EXIT_STATUS = 75


class Preempted(Exception):
  """Training stopped at `step` for a preemption (SIGTERM: TPU maintenance, `scancel`, SLURM's --signal,
  Kubernetes), after the checkpoint of that step was written: relaunch the same command to resume."""

  def __init__(self, step: int, workdir: str):
    super().__init__(f"preempted: saved the checkpoint of step {step} in {workdir}; relaunch the same command to "
                     f"resume (exit status {PREEMPTED_EXIT_STATUS})")
    self.step = step


class PreemptionWatch:
  """Whether a preemption was asked for, agreed by every process at the same step.

  Every process catches SIGTERM itself (a flag set by a handler); at the end of every step the processes agree with
  one all-gather of their flags (any flag set: all stop at this step, save and exit), so the decision is a collective
  every process makes the same number of times. jax's own preemption service (turned off in ncjax.main) agrees on a
  sync step through a barrier instead, and deadlocked when the notice reached one process after its last sync call:
  that process went on to the final evaluation's collectives while the other waited in the barrier (a 2-process
  chaos trial, 2026-11-23). A SIGTERM after the last step is left alone: the run ends normally, its final
  checkpoint written. SIGUSR1 (what some schedulers send ahead of a time limit) is turned into a SIGTERM."""

  def __init__(self):
    self._flag = threading.Event()
    self._previous = {}
    if threading.current_thread() is not threading.main_thread():
      return   # signal handlers can only be installed from the main thread (a trainer run in a thread: no watch)
    self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_term)
    self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_usr1)

  def _on_term(self, signum, frame):
    del signum, frame
    if not self._flag.is_set():
      log.warning("SIGTERM: saving a checkpoint at the end of this step, then stopping")
    self._flag.set()

  def _on_usr1(self, signum, frame):
    del signum, frame
    import os
    os.kill(os.getpid(), signal.SIGTERM)

  def asked(self) -> bool:
    """Whether this process was sent SIGTERM (agreed with the others by `end_of_step`)."""
    return self._flag.is_set()

  def close(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}


class SaveSchedule:
  """When the loop saves a periodic checkpoint: every `ckpt.every_steps` steps and every `ckpt.every_minutes`
  minutes of wall-clock time (0 turns either off). Process 0's clock decides for every process (end_of_step), so all
  processes save the same step."""

  def __init__(self, every_steps: int, every_minutes: float, clock=time.monotonic):
    self.every_steps, self.every_s, self.clock = int(every_steps), 60.0 * float(every_minutes), clock
    self.last = clock()

  def step_due(self, step: int) -> bool:
    return bool(self.every_steps) and step % self.every_steps == 0

  def late(self) -> bool:
    """This process's clock says a save is due (process 0's decides for all: `end_of_step`)."""
    return bool(self.every_s) and self.clock() - self.last >= self.every_s

  def saved(self):
    self.last = self.clock()


def end_of_step(watch: PreemptionWatch, schedule: SaveSchedule, step: int) -> tuple[bool, bool]:
  """(preempted, save) after `step`, the same on every process: one all-gather per step carries every process's
  SIGTERM flag (any one stops all) and process 0's save clock (until 2026-11-23 two collectives per step). Every
  process calls it once per step, so the all-gathers pair up by their order."""
  asked, late = watch.asked(), schedule.late()
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    rows = np.asarray(multihost_utils.process_allgather(np.asarray([asked, late], np.int32))).reshape(-1, 2)
    asked, late = bool(rows[:, 0].max()), bool(rows[0, 1])
  return asked, asked or late or schedule.step_due(step)



class SavePolicy:
  """The loop's saving, in one place: `after_step` saves when the schedule or a preemption asks (and raises
  `Preempted` once the preempted step's checkpoint is written); `at_end` writes the last step's checkpoint unless it
  was just written (ckpt.save_at_end). `save(step, force)` is the trainer's: it logs the pending step first."""

  def __init__(self, ckpt_config, checkpointer, workdir: str, start: int, save: Callable[[int, bool], None]):
    self.checkpointer, self.workdir, self.save = checkpointer, workdir, save
    self.schedule = SaveSchedule(ckpt_config.every_steps, ckpt_config.every_minutes)
    self.save_at_end = bool(ckpt_config.save_at_end)
    self.watch = PreemptionWatch()
    self.start = self.last_saved = int(start)

  def after_step(self, step: int) -> None:
    preempted, due = end_of_step(self.watch, self.schedule, step)
    if due:
      self.save(step, preempted)
      self.last_saved = step
      self.schedule.saved()
    if preempted:
      self.checkpointer.wait()
      raise Preempted(step, self.workdir)

  def at_end(self, stop: int) -> None:
    if self.save_at_end and stop > self.start and self.last_saved != stop:
      self.save(stop, True)

  def close(self) -> None:
    self.watch.close()
