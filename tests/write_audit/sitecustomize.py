"""Imported at start-up by a test's subprocess that has this directory on its PYTHONPATH
(tests/multiprocess.py: `record_writes`): a process of a multi-process job other than process 0 appends every path
it opens for writing under NCJAX_TEST_WRITES_UNDER to NCJAX_TEST_WRITES_LOG, after a first line saying it watches
(so that a test can tell "wrote nothing" from "was not watched"). How a test proves that only process 0 writes a
run's files: the processes write the same names, so the files alone cannot tell."""

import os
import sys

_UNDER = os.environ.get("NCJAX_TEST_WRITES_UNDER")
_LOG = os.environ.get("NCJAX_TEST_WRITES_LOG")
_OTHER_PROCESS = any(a.startswith("--process_id=") and a != "--process_id=0" for a in sys.argv)

if _UNDER and _LOG and _OTHER_PROCESS:
  _UNDER = os.path.abspath(_UNDER)
  _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT

  def _record(line: str) -> None:
    with open(_LOG, "a") as f:   # (outside _UNDER: this open is not recorded)
      f.write(line + "\n")

  def _hook(event, args):
    if event != "open":
      return
    path, mode, flags = args
    writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
    if writing and isinstance(path, (str, bytes, os.PathLike)):
      where = os.path.abspath(os.fsdecode(path))
      if where.startswith(_UNDER + os.sep) or where == _UNDER:
        _record(where)

  _record(f"watching {' '.join(a for a in sys.argv if a.startswith('--process_id='))}")
  sys.addaudithook(_hook)
