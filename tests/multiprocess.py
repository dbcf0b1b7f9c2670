"""Run `python -m ncjax.main ...` as N local processes of one JAX job (the stand-in for a pod host each), as
launch/local_multiprocess.sh does: each with `--cpu_devices`, `--num_processes`, `--process_id` and a coordinator
on 127.0.0.1. Used by the multi-process tests and `make chaos`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def env(extra: dict | None = None, processes: int = 1) -> dict:
  """The environment of a test's subprocess: the test session's compilation cache (tests/conftest.py) for a single
  process; none for the processes of a multi-process job (the cache is checked there only for one process)."""
  out = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  if processes > 1:
    out["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  out.update(extra or {})
  return out


def commands(args: list[str], processes: int, devices: int, heartbeat_timeout: int = 20) -> list[list[str]]:
  """One command per process (a single process: plain `--cpu_devices`)."""
  base = [sys.executable, "-m", "ncjax.main", *args, f"--cpu_devices={devices}"]
  if processes == 1:
    return [base]
  port = free_port()
  return [base + [f"--num_processes={processes}", f"--process_id={i}", f"--coordinator_address=127.0.0.1:{port}",
                  f"--heartbeat_timeout={heartbeat_timeout}", "--shutdown_timeout=60"] for i in range(processes)]


def start(args: list[str], *, processes: int = 2, devices: int = 4, log_dir: str, extra_env=None,
          heartbeat_timeout: int = 20) -> list[subprocess.Popen]:
  """Start the processes, each logging to LOG_DIR/process_<i>.log (a file: an unread pipe would block a trainer)."""
  os.makedirs(log_dir, exist_ok=True)
  procs = []
  for i, cmd in enumerate(commands(args, processes, devices, heartbeat_timeout)):
    log = open(os.path.join(log_dir, f"process_{i}.log"), "a")
    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env(extra_env, processes), stdout=log,
                                  stderr=subprocess.STDOUT, text=True))
    log.close()
  return procs


def wait(procs, timeout: float = 900) -> list[int]:
  codes = []
  for p in procs:
    try:
      codes.append(p.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  return codes


def record_writes(under: str, log: str) -> dict:
  """Extra environment under which every process but process 0 records the files it opens for writing under
  `under` into `log` (tests/write_audit/sitecustomize.py), its first line saying it watches."""
  audit = os.path.join(ROOT, "tests", "write_audit")
  return dict(NCJAX_TEST_WRITES_UNDER=under, NCJAX_TEST_WRITES_LOG=log,
              PYTHONPATH=os.pathsep.join([audit, ROOT, os.environ.get("PYTHONPATH", "")]))


def run(args: list[str], *, processes: int = 2, devices: int = 4, log_dir: str, extra_env=None,
        timeout: float = 900) -> list[int]:
  """Run to the end; the exit status of every process."""
  return wait(start(args, processes=processes, devices=devices, log_dir=log_dir, extra_env=extra_env), timeout)


def logs(log_dir: str, tail: int | None = 3000) -> str:
  """Every process's log (its last `tail` characters; None: whole)."""
  out = []
  for name in sorted(os.listdir(log_dir)):
    if name.startswith("process_"):
      with open(os.path.join(log_dir, name)) as f:
        text = f.read()
      out.append(f"--- {name}\n{text if tail is None else text[-tail:]}")
  return "\n".join(out)
