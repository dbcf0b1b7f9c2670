"""benchmarks/accelerator: the check that runs on a GPU host, run here at its smoke sizes on one CPU device.

A GPU session is short and has no network, so what can fail before it does should fail here: every section must
produce measurements (a row with a finite positive value, no failed row), the NCU loss restated from the public
code must reproduce methods.md §1.7 and equal ncjax's loss, and the memory search must land under its limit.
"""

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _smoke(out):
  env = dict(os.environ)
  # run.sh runs `python3` from PATH: this interpreter's (the repository's .venv under `make test`).
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env.pop("PYTHON", None)
  proc = subprocess.run(["bash", os.path.join("benchmarks", "accelerator", "run.sh"), "--smoke", "--out", str(out)],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
  with open(out / "accelerator.json") as f:
    return json.load(f), proc.stdout


def _measured(r):
  return r["status"] == "ok" and r["value"] is not None and math.isfinite(r["value"]) and r["value"] > 0


def test_smoke_run_measures_every_section(tmp_path):
  summary, stdout = _smoke(tmp_path)
  rows = summary["rows"]
  assert "accelerator check on" in stdout and (tmp_path / "accelerator.md").exists()
  failed = [(r["section"], r["config"], r["status"]) for r in rows if r["status"].startswith("failed")]
  assert not failed
  for section in "abcde":
    assert any(_measured(r) for r in rows if r["section"] == section), section
  by = lambda section, **kw: [r for r in rows if r["section"] == section and all(r.get(k) == v for k, v in kw.items())]

  # a: both attention kinds the CPU runs, at both batches, with an MFU against the measured matmul rate
  for kind in ("einsum", "xla"):
    for batch in (8, 16):
      (r,) = by("a", attention=kind, batch=batch)
      assert _measured(r) and r["vs"] > 0 and r["finite"] and r["footprint_bytes"] > 0
  (cudnn,) = by("a", attention="cudnn")
  assert cudnn["status"].startswith("skipped: it needs an NVIDIA GPU")

  # b: eager and traced open_clip at both batches, and ncjax's best over open_clip's best
  assert len([r for r in by("b") if r.get("mode") and _measured(r)]) == 4
  assert len([r for r in by("b") if r["unit"] == "x" and _measured(r)]) == 2

  # c: the restatement reproduces the notes' values, equals ncjax's loss, and both sides are timed
  (cross,) = by("c", check="crosscheck")
  assert cross["max_abs_diff"] < 1e-5 and cross["same_forget"] and cross["same_iterations"]
  (value,) = by("c", check="value")
  assert value["n"] == 64 and value["rel_diff"] < 1e-4
  for side in ("jax", "torch"):
    assert [r["n"] for r in by("c", side=side) if _measured(r)] == [64, 128]

  # d: each search ends under its limit with one real step at the batch it found
  for remat in (False, True):
    fit = [r for r in by("d", remat=remat) if r["unit"] == "examples"]
    assert len(fit) == 1 and _measured(fit[0]) and 0 < fit[0]["vs"] <= 1
    step = [r for r in by("d", remat=remat) if r["unit"] == "pairs/s"]
    assert len(step) == 1 and _measured(step[0]) and step[0]["batch"] == fit[0]["batch"]

  # e: CLIP's step is the reference of the others'
  (clip,) = by("e", method="CLIP")
  assert clip["vs"] == 1.0
  others = [r for r in by("e") if r["method"] != "CLIP"]
  assert others and all(_measured(r) and r["vs"] > 0 for r in others)
