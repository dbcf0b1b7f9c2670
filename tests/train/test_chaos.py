"""Two fault-injection trials (`make chaos` runs 20 with 3 faults each, on 1 and 2 processes): a run SIGKILLed
mid-save and a run preempted by SIGTERM (it saves the step it stops at and exits 75) are resumed and end bitwise
equal to uninterrupted ones."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chaos  # noqa: E402  (tests/chaos.py)


def test_sigkilled_and_preempted_runs_resume_bitwise(tmp_path):
  lines = []
  trials = chaos.run_trials(trials=2, kills=1, seed=1, root=str(tmp_path), log=lines.append,
                            scenarios=("ncu_short", "gsc_short"),
                            faults={"ncu_short": ["mid_save"], "gsc_short": ["sigterm"]})
  report = "\n".join(lines)
  assert [t.scenario for t in trials] == ["ncu_short", "gsc_short"], report
  assert all(t.ok for t in trials), report
  kills = [k for t in trials for k in t.kills]
  assert [k.how for k in kills] == ["mid_save", "sigterm"], f"a run finished before its fault:\n{report}"
  assert kills[1].exits == [chaos.PREEMPTED], report


@pytest.mark.slow
def test_two_processes_preempted_anywhere_stop_together_and_resume_bitwise(tmp_path):
  """SIGTERM to one of two processes mid-run and again as the last steps run (where jax's preemption barrier
  deadlocked, one process past its last sync call): both stop at the same step (75) or finish (0), never hang,
  and the resumed run ends bitwise equal to the uninterrupted one."""
  lines = []
  trials = chaos.run_trials(trials=1, kills=2, seed=3, root=str(tmp_path), log=lines.append,
                            scenarios=("gsc_2proc",), faults={"gsc_2proc": ["sigterm", "sigterm_late"]})
  report = "\n".join(lines)
  assert all(t.ok for t in trials), report
  kills = [k for t in trials for k in t.kills]
  assert kills and kills[0].exits == [chaos.PREEMPTED, chaos.PREEMPTED], report
