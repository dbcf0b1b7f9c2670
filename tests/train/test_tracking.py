"""Tracking and profiling: a Weights & Biases run (offline mode, no network) that a resumed run continues, and a
jax.profiler trace of the steps `log.profile_steps` names, one directory per process."""

import glob
import gzip
import json
import os
import struct
import subprocess
import sys

import pytest

import multiprocess
from ncjax import logging_utils

# The run happens in a child process, so that no jax.profiler session or wandb thread outlives it in a test worker
# (suspected, then ruled out, as the cause of make test-all's segfault in XLA's compile: issue 37).
_RUN = """
import sys
sys.path.insert(0, {tests!r})
from ncjax import runtime
runtime.configure_cpu_devices(8)
from helpers import tiny_clip_config
from ncjax import train
cfg = tiny_clip_config(total_steps=4, **{{"log.wandb": True, "log.wandb_mode": "offline", "log.every_steps": 1,
                                         "log.profile_steps": "3:4", "log.wandb_project": "ncjax-test"}})
train.train(cfg, {workdir!r}, until=2)     # stops after step 2 (a preempted run), then resumes to the end
train.train(cfg, {workdir!r})
"""


def wandb_records(path: str) -> list:
  """The protobuf records of a .wandb file (wandb's LevelDB-style log: 7-byte file header, 32 KiB blocks, each
  record chunk a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes)."""
  from wandb.proto import wandb_internal_pb2 as pb
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  pos, block, out, buf = 7, 32768, [], b""
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:        # a block's tail too short for a header is padding
      pos += left
      continue
    length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
    if length == 0 and kind == 0:
      pos += left
      continue
    chunk = data[pos + 7:pos + 7 + length]
    pos += 7 + length
    buf = chunk if kind in (1, 2) else buf + chunk
    if kind in (1, 4):
      record = pb.Record()
      record.ParseFromString(buf)
      out.append(record)
  return out


@pytest.mark.slow   # make test-all (21 s): an offline wandb run and a profiler trace
def test_wandb_run_continues_on_resume_and_the_profile_holds_the_chosen_steps(tmp_path):
  # imported here, not at the file's top: every pytest worker collects this file, and wandb takes ~1.5 s to import
  # (a missing wandb still fails this test, it is not skipped)
  import wandb  # noqa: F401
  workdir = str(tmp_path / "run")
  code = _RUN.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), workdir=workdir)
  done = subprocess.run([sys.executable, "-c", code], env=multiprocess.env(), capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  run_id = open(os.path.join(workdir, logging_utils.WANDB_ID_FILE)).read().strip()
  runs = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*")))
  assert len(runs) == 2 and all(r.endswith(f"-{run_id}") for r in runs)   # one wandb run, written twice
  steps = []
  for run in runs:
    records = wandb_records(os.path.join(run, f"run-{run_id}.wandb"))
    assert [(r.run.run_id, r.run.project) for r in records if r.WhichOneof("record_type") == "run"] == [
        (run_id, "ncjax-test")]
    history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    keys = {"/".join(i.nested_key) or i.key for h in history for i in h.item}
    assert {"train/loss", "train/grad_norm", "train/lr/default"} <= keys, keys
    steps.append([h.step.num for h in history])
  assert steps == [[1, 2], [3, 4]]
  # the trace of step 3 (the resumed run's second step: compiled already), in profile/process_0, the step a
  # StepTraceAnnotation
  traces = sorted(glob.glob(os.path.join(workdir, "profile", "process_0", "plugins", "profile", "*")))
  assert len(traces) == 1 and os.listdir(os.path.join(workdir, "profile")) == ["process_0"]
  annotated = []
  for trace in traces:
    assert glob.glob(os.path.join(trace, "*.xplane.pb"))
    with gzip.open(os.path.join(trace, "perfetto_trace.json.gz")) as f:
      events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    annotated.append(sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train"))
  assert annotated == [[3]]


def test_profile_steps_are_checked():
  assert logging_utils.parse_profile_steps("") is None
  assert logging_utils.parse_profile_steps("5:8") == (5, 8)
  for bad in ("5", "8:5", "a:b", "-1:3"):
    with pytest.raises(ValueError, match="log.profile_steps must be 'A:B'"):
      logging_utils.parse_profile_steps(bad)
  # a window outside the steps this invocation runs traces nothing
  assert logging_utils.StepProfiler("/tmp/x", (10, 12), start=0, stop=4).done
  assert logging_utils.StepProfiler("/tmp/x", (0, 2), start=3, stop=8).done
