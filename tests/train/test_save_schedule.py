"""The loop's end-of-step decision (ncjax.train.end_of_step): save every N steps and every M minutes of process 0's
clock, stop and save on SIGTERM; several processes make it with one all-gather (tests/train/test_chaos.py,
test_multiprocess_evaluation.py run it on two)."""

import os
import signal

from ncjax import train


class FakeClock:
  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


def test_saves_every_n_steps_and_every_m_minutes_and_stops_on_sigterm():
  clock = FakeClock()
  schedule = train.SaveSchedule(every_steps=4, every_minutes=1.0, clock=clock)
  watch = train.PreemptionWatch()
  try:
    assert train.end_of_step(watch, schedule, 1) == (False, False)
    assert train.end_of_step(watch, schedule, 4) == (False, True)      # every 4 steps
    clock.t = 59.0
    assert train.end_of_step(watch, schedule, 5) == (False, False)
    clock.t = 60.0
    assert train.end_of_step(watch, schedule, 6) == (False, True)      # a minute since the last save
    schedule.saved()
    assert train.end_of_step(watch, schedule, 7) == (False, False)
    os.kill(os.getpid(), signal.SIGTERM)                                 # a preemption notice
    assert train.end_of_step(watch, schedule, 9) == (True, True)
  finally:
    watch.close()
  assert signal.getsignal(signal.SIGTERM) != watch._on_term   # the handler is given back (bound methods compare by ==)
