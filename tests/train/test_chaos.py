"""Fault-injection trials (`make chaos` runs 20 with 3 kills each): real runs SIGKILLed mid-save and resumed end
bitwise equal to uninterrupted ones. The default suite runs GSC's (per-sample labels, the epoch hook, sharded method
state); NCU's (across its stage boundary, also resumed in-process by tests/train/test_trainer.py) is in
`make test-all`."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chaos  # noqa: E402  (tests/chaos.py)


@pytest.mark.parametrize("scenario", ["gsc", pytest.param("ncu", marks=pytest.mark.slow)])
def test_sigkilled_run_resumes_bitwise(scenario, tmp_path):
  lines = []
  trials = chaos.run_trials(trials=1, kills=1, seed=1, root=str(tmp_path), scenarios=(scenario,), log=lines.append)
  report = "\n".join(lines)
  assert [t.scenario for t in trials] == [scenario], report
  assert all(t.ok for t in trials), report
  kills = [k for t in trials for k in t.kills]
  assert len(kills) == 1 and all(k.how == "mid_save" for k in kills), f"a run finished before its kill:\n{report}"
