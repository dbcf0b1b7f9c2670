"""A pytest plugin for the accelerator check's test slice (`-p benchmarks.accelerator.pytest_counts`): each test's
outcome is appended to the JSON-lines file named by $NCJAX_PYTEST_COUNTS as soon as it is known, so the counts
survive a slice stopped at its time limit (`timeout` kills pytest before it prints its summary). `summarise` reads
the file back for the check's table.
"""

from __future__ import annotations

import json
import os

ENV = "NCJAX_PYTEST_COUNTS"


def pytest_runtest_logreport(report):
  path = os.environ.get(ENV)
  # A passing test is known at its call; setup and teardown only matter when they fail or skip it.
  if not path or (report.when != "call" and report.outcome == "passed"):
    return
  row = dict(nodeid=report.nodeid, when=report.when, outcome=report.outcome, xfail=hasattr(report, "wasxfail"),
             seconds=round(report.duration, 3))
  if report.failed:   # why, in the record itself: a slice stopped at its limit prints no summary
    row["why"] = _why(report)
  with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")


def _why(report) -> str:
  """The failure's first `E` line (pytest's exception line), else its text's last line, at most 300 characters."""
  text = str(report.longrepr or "")
  first = next((line[1:].strip() for line in text.splitlines() if line.startswith("E ")), None)
  last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
  return (first if first is not None else last)[:300]


def summarise(path: str) -> dict:
  """{passed, failed, errors, skipped, failures: [node ids], why: {node id: its failure's line}}: a test counts
  once — an error in its setup or teardown, else its call's outcome (an expected failure counts as skipped)."""
  per_test: dict[str, str] = {}
  why: dict[str, str] = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        if r.get("why"):
          why.setdefault(r["nodeid"], r["why"])
        if r["when"] != "call" and r["outcome"] == "failed":
          outcome = "errors"
        elif r["outcome"] == "skipped" or r["xfail"]:
          outcome = "skipped"
        else:
          outcome = r["outcome"]
        if per_test.get(r["nodeid"]) != "errors":
          per_test[r["nodeid"]] = outcome
  counts = {k: sum(v == k for v in per_test.values()) for k in ("passed", "failed", "errors", "skipped")}
  counts["failures"] = sorted(n for n, v in per_test.items() if v in ("failed", "errors"))
  counts["why"] = {n: why[n] for n in counts["failures"] if n in why}
  return counts
