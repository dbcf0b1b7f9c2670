"""Two fault-injection trials (`make chaos` runs 20 with 3 kills each): real runs SIGKILLed mid-save and resumed
end bitwise equal to uninterrupted ones."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chaos  # noqa: E402  (tests/chaos.py)


def test_sigkilled_ncu_and_gsc_runs_resume_bitwise(tmp_path):
  lines = []
  trials = chaos.run_trials(trials=2, kills=1, seed=1, root=str(tmp_path), log=lines.append)
  report = "\n".join(lines)
  assert [t.scenario for t in trials] == ["ncu", "gsc"], report
  assert all(t.ok for t in trials), report
  kills = [k for t in trials for k in t.kills]
  assert len(kills) == 2 and all(k.how == "mid_save" for k in kills), f"a run finished before its kill:\n{report}"
