"""A fault-injection trial (`make chaos` runs 20 with 3 faults each, on 1 and 2 processes): a GSC run preempted by
SIGTERM (it saves the step it stops at and exits 75), started again and SIGKILLed mid-save, then started a third time,
ends bitwise equal to the uninterrupted run — its parameters, optimiser state, per-sample labels and predictions
across their end-of-epoch updates, and its metrics. NCU's two stages are `make chaos`'s (and test-all's) scenario;
`make test` resumes them across the stage boundary in tests/methods/test_ncu_method.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chaos  # noqa: E402  (tests/chaos.py)


def test_a_preempted_then_sigkilled_run_resumes_bitwise(tmp_path):
  lines = []
  trials = chaos.run_trials(trials=1, kills=2, seed=1, root=str(tmp_path), log=lines.append,
                            scenarios=("gsc_short",), faults={"gsc_short": ["sigterm", "mid_save"]})
  report = "\n".join(lines)
  assert [t.scenario for t in trials] == ["gsc_short"], report
  assert all(t.ok for t in trials), report
  kills = [k for t in trials for k in t.kills]
  assert [k.how for k in kills] == ["sigterm", "mid_save"], f"a run finished before its fault:\n{report}"
  assert kills[0].exits == [chaos.PREEMPTED], report


@pytest.mark.slow
def test_ncu_sigkilled_mid_save_on_either_side_of_its_stage_boundary_resumes_bitwise(tmp_path):
  lines = []
  trials = chaos.run_trials(trials=1, kills=2, seed=1, root=str(tmp_path), log=lines.append,
                            scenarios=("ncu_short",), faults={"ncu_short": ["mid_save", "after_step"]})
  report = "\n".join(lines)
  assert all(t.ok for t in trials) and len(trials[0].kills) == 2, report


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
