"""benchmarks/accelerator: the check that runs on a GPU host, run here by its plan at smoke sizes on one CPU device.

A GPU session is one short call with no network, so what can fail before it does should fail here: the plan must
fit the call with every section in it, every section must produce measurements (a row with a finite positive
value, no failed row), the NCU loss restated from the public code must reproduce methods.md §1.7 and equal ncjax's
loss, the memory search must land under its limit, the output folder must hold no more files than come back, a
budget cut must read "not run (time)", and the GPU slice's tests must hold whatever backend JAX reports.
"""

import json
import math
import os
import subprocess
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SH = os.path.join("benchmarks", "accelerator", "run.sh")
MOST_FILES_BACK = 8   # the device tool returns at most 8 files from a call


def _env(**extra):
  env = dict(os.environ)
  # run.sh runs `python3` from PATH: this interpreter's (the repository's .venv under `make test`).
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env.pop("PYTHON", None)
  env.pop("OUT", None)
  env.update(extra)
  return env


def _run(*args, env=None, timeout=600):
  return subprocess.run(["bash", RUN_SH, *args], cwd=REPO, env=env or _env(), capture_output=True, text=True,
                        timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("acc_smoke")
  proc = _run("--smoke", "--out", str(out))
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
  with open(out / "accelerator.json") as f:
    return json.load(f), proc.stdout, out


def _measured(r):
  return r["status"] == "ok" and r["value"] is not None and math.isfinite(r["value"]) and r["value"] > 0


def test_the_default_plan_fits_one_call_with_every_section_and_the_smoke_run_follows_it(smoke):
  proc = _run("--plan")
  assert proc.returncode == 0, proc.stderr
  text = proc.stdout
  assert "left out: nothing" in text
  for worker in ("a256", "a512", "torch", "cd", "e1", "e2"):
    assert f"    {worker} " in text
  # a shorter call drops the lowest priorities first, and says so
  short = _run("--plan", "--total_s", "400").stdout
  left = short.strip().splitlines()[-1]
  assert left.startswith("left out: e2") and "a256" not in left and "a512" not in left

  summary, _, _ = smoke   # the smoke run ran by the same plan: every worker prepared, then took its turn
  assert set(summary["workers"]) == {"a256", "a512", "torch", "cd", "e1", "e2"}
  for name, w in summary["workers"].items():
    assert w["status"] == "ok" and w["prepare_s"] > 0 and w["turn_s"] > 0 and w["planned_turn_s"] > 0, (name, w)


def test_smoke_run_measures_every_section(smoke):
  summary, stdout, out = smoke
  rows = summary["rows"]
  failed = [(r["section"], r["config"], r["status"]) for r in rows if r["status"].startswith("failed")]
  assert not failed
  for section in "abcde":
    assert any(_measured(r) for r in rows if r["section"] == section), section
  by = lambda section, **kw: [r for r in rows if r["section"] == section and all(r.get(k) == v for k, v in kw.items())]

  # a: every attention kind the CPU runs, at both batches, with an MFU against the measured matmul rate (the CPU
  # has no datasheet peak: that column is empty here and filled on a GPU)
  for kind in ("einsum", "xla"):
    for batch in (8, 16):
      (r,) = by("a", attention=kind, batch=batch)
      assert _measured(r) and r["mfu_measured"] > 0 and r["mfu_peak"] is None and r["finite"]
      assert r["footprint_bytes"] > 0
  (cudnn, *_) = by("a", attention="cudnn")
  assert cudnn["status"].startswith("skipped: it needs an NVIDIA GPU")

  # b: eager at both batches, fused AdamW and the traced step at the largest, and ncjax's best over open_clip's best
  modes = sorted((r["batch"], r["mode"]) for r in by("b") if r.get("mode") and _measured(r))
  assert modes == [(8, "eager"), (16, "eager"), (16, "eager, fused AdamW"), (16, "torch.compile (eager)")]
  assert len([r for r in by("b") if r["unit"] == "x" and _measured(r)]) == 2

  # c: the restatement reproduces the notes' values, equals ncjax's loss, and both sides are timed
  (cross,) = by("c", check="crosscheck")
  assert cross["max_abs_diff"] < 1e-5 and cross["same_forget"] and cross["same_iterations"]
  (value,) = by("c", check="value")
  assert value["n"] == 64 and value["rel_diff"] < 1e-4
  for side in ("jax", "torch"):
    assert [r["n"] for r in by("c", side=side) if _measured(r)] == [64, 128]

  # d: each search ends under its limit with one real step at the batch it found, in at most two candidates
  for remat in (False, True):
    fit = [r for r in by("d", remat=remat) if r["unit"] == "examples"]
    assert len(fit) == 1 and _measured(fit[0]) and 0 < fit[0]["vs"] <= 1 and len(fit[0]["tried"]) <= 2
    step = [r for r in by("d", remat=remat) if r["unit"] == "pairs/s"]
    assert len(step) == 1 and _measured(step[0]) and step[0]["batch"] == fit[0]["batch"]

  # e: CLIP's step (section a's) is the reference of the others'
  (clip,) = by("e", method="CLIP")
  assert clip["vs"] == 1.0
  others = [r for r in by("e") if r["method"] != "CLIP"]
  assert others and all(_measured(r) and r["vs"] > 0 for r in others)


def test_the_output_folder_holds_what_comes_back_and_the_table_ends_the_output(smoke):
  summary, stdout, out = smoke
  files = [os.path.join(d, f) for d, _, names in os.walk(out) for f in names]
  assert len(files) <= MOST_FILES_BACK
  assert sorted(os.path.basename(f) for f in files) == ["accelerator.json", "accelerator.md", "logs.tar.gz",
                                                        "rows.jsonl"]
  with tarfile.open(out / "logs.tar.gz") as tar:   # every worker's log is in the archive
    logs = {os.path.basename(n) for n in tar.getnames()}
  assert {"a256+a512+cd+e1+e2.log", "torch.log", "versions.txt"} <= logs
  md = (out / "accelerator.md").read_text()
  assert "| MFU (datasheet peak) | MFU (measured matmul) |" in md and "(in progress" not in md
  tail = stdout.strip().splitlines()
  assert tail[-1].startswith("run.sh: done") and any(line.startswith("section ") for line in tail[-60:])


def test_a_budget_cut_reads_not_run_never_failed(tmp_path):
  """Section e given less time than its preparation: its turn is cut and its process stopped, and what it did not
  measure reads "not run (time)"."""
  env = _env(PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", "benchmarks.accelerator.bench", "--smoke", "--sections", "e",
                         "--measure_s", "1", "--out", str(tmp_path / "out"), "--logs", str(tmp_path / "logs")],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "out" / "accelerator.json") as f:
    rows = json.load(f)["rows"]
  e = [r for r in rows if r["section"] == "e"]
  assert e and all(r["status"] == "not run (time)" for r in e), e
  assert not [r for r in rows if r["status"].startswith("failed")]


def test_an_interpreter_without_jax_is_one_line_naming_it(tmp_path):
  no_site = tmp_path / "python_without_jax"
  no_site.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")   # -S: no site-packages, so no jax
  no_site.chmod(0o755)
  proc = _run("--out", str(tmp_path / "out"), env=_env(PYTHON=str(no_site)), timeout=60)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "cannot import jax" in lines[0] and str(no_site) in lines[0] and "PYTHON=" in lines[0]


def test_mfu_is_quoted_against_the_datasheet_peak_of_the_card():
  from benchmarks.accelerator.record import datasheet_peak
  assert datasheet_peak("NVIDIA H100 80GB HBM3")[0] == 989e12       # SXM
  assert datasheet_peak("NVIDIA H100 PCIe")[0] == 756e12
  assert datasheet_peak("NVIDIA H200")[0] == 989e12
  assert datasheet_peak("NVIDIA H200 NVL")[0] == 835e12
  assert "datasheet" in datasheet_peak("NVIDIA H100 80GB HBM3")[1]
  assert datasheet_peak("cpu") is None


# The slice's tests that decide anything by the platform: attention kinds resolved, cuDNN refused or joined, bf16
# models built with the default kind.
_SENSITIVE = ["tests/models/test_attention.py", "-k", "auto or cudnn or bf16",
              "tests/models/test_models.py::test_bf16_compute_keeps_float32_params_and_outputs_close"]
_SLICE = ["tests/losses", "tests/ot", "tests/samplers", "tests/train/test_trainer.py::"
          "test_sharded_step_equals_single_device_step", "tests/models/test_models.py",
          "tests/models/test_attention.py", "tests/test_checkpoint.py"]


def _slice_reported_as_gpu(paths, tmp_path):
  env = _env(NCJAX_TEST_REPORTED_BACKEND="gpu")
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-4000:]
  assert " passed" in proc.stdout.strip().splitlines()[-1]


def test_the_slices_backend_sensitive_tests_hold_when_jax_reports_a_gpu(tmp_path):
  """JAX's default backend reported as 'gpu' (tests/conftest.py), as on the GPU host: the tests that decide
  anything by the platform (attention kinds, cuDNN's refusal, the bf16 model) still pass."""
  _slice_reported_as_gpu(_SENSITIVE, tmp_path)


@pytest.mark.slow
def test_the_whole_gpu_slice_holds_when_jax_reports_a_gpu(tmp_path):
  _slice_reported_as_gpu(_SLICE, tmp_path)


def test_the_slices_record_keeps_why_a_test_failed(tmp_path, monkeypatch):
  """A slice stopped at its time limit prints no summary (the H100 run's first cuDNN failure came back without a
  word of why): each failure's exception line is in the per-test record and in the table's status."""
  from types import SimpleNamespace
  from benchmarks.accelerator import pytest_counts
  path = tmp_path / "tests.jsonl"
  monkeypatch.setenv(pytest_counts.ENV, str(path))
  longrepr = "    def test_x():\n>       assert f() == 2\nE       assert 3 == 2\nE        +  where 3 = f()\n"
  for nodeid, outcome, text in (("t.py::test_ok", "passed", ""), ("t.py::test_x", "failed", longrepr)):
    pytest_counts.pytest_runtest_logreport(SimpleNamespace(
        nodeid=nodeid, when="call", outcome=outcome, failed=outcome == "failed", duration=0.1, longrepr=text))
  counts = pytest_counts.summarise(str(path))
  assert (counts["passed"], counts["failed"], counts["failures"]) == (1, 1, ["t.py::test_x"])
  assert counts["why"] == {"t.py::test_x": "assert 3 == 2"}
