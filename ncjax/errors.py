"""Errors a user can cause and fix, and how every command reports them: one line `ncjax: error: ...` on stderr and
an exit status that says which kind of problem it is — never a traceback (unless asked for with `--verbose` or
NCJAX_DEBUG=1). Errors of ncjax itself (a bug) keep their traceback and exit status 1.

| status | kind | e.g. |
|---|---|---|
| 2 | usage and configuration | a misspelt config key, an unknown model size, a method that needs `init=` |
| 3 | data | a dataset not built, files not in the expected layout, a shard missing or changed |
| 4 | checkpoints | no checkpoint where one is named, a resume that would mix two runs, a pretrained file unreadable |
| 5 | storage | a workdir that cannot take files, a full disk, an object store that stopped answering |
| 6 | devices and processes | a global batch not divisible by the devices or processes |
| 7 | a missing optional dependency | `pip install 'ncjax[web]'` |
| 8 | the run diverged | a non-finite loss (the step and the example ids of its batch are named) |
| 75 | preempted (not an error): the checkpoint is saved, relaunch to resume | SIGTERM |

On several processes the message is printed once: by process 0 for what every process finds the same way (the
config, the data, the checkpoints, the device count), and by the process that found it for what is local to a host
(storage). The processes wait for one another (at most 10 s: ncjax.main), then exit without the interpreter's
shutdown, so that no background thread (orbax's writers, the input pipeline, a metrics uploader) prints after the
message; where one process alone found the problem, the others stop within the heartbeat timeout, as when a process
is lost.

A leaf module: nothing of ncjax is imported here.
"""

from __future__ import annotations

import os
import sys
import traceback

DEBUG_ENV = "NCJAX_DEBUG"


class UserError(Exception):
  """A problem with what the user asked for, which the user can fix; `status` is the exit status."""
  status = 2
  local = False   # True: found by one process for its own reasons (its disk), not by every process alike


class ConfigurationError(UserError, ValueError):
  """A config, flag or option that cannot work (status 2)."""
  status = 2


class DataError(UserError, ValueError):
  """Data missing, not built, or not in the expected layout (status 3)."""
  status = 3


class CheckpointError(UserError, ValueError):
  """A checkpoint that cannot serve: of another run, model or method, or unreadable (status 4)."""
  status = 4


class MissingCheckpoint(UserError, FileNotFoundError):
  """No checkpoint where one is named (status 4)."""
  status = 4


class StoreError(UserError, OSError):
  """Storage that does not take or give files: permissions, a full disk, an unreachable object store (status 5)."""
  status = 5
  local = True


class TopologyError(UserError, ValueError):
  """Device or process counts that the run cannot be split over (status 6)."""
  status = 6


class MissingDependency(UserError, ImportError):
  """An optional package the asked-for feature needs (status 7)."""
  status = 7


class DivergedError(UserError, FloatingPointError):
  """The run's loss went non-finite (status 8): a learning rate too high for the model, or pairs to look at."""
  status = 8


PREEMPTED_STATUS = 75
INTERNAL_STATUS = 1


def _raised_by_ncjax(e: BaseException) -> bool:
  """Whether the innermost frame of `e`'s traceback is ncjax's own code (a deliberate `raise` of a check), not a
  library's (where a ValueError is more likely a bug of ncjax's call)."""
  tb = e.__traceback__
  if tb is None:
    return False
  while tb.tb_next is not None:
    tb = tb.tb_next
  here = os.path.dirname(os.path.abspath(__file__))
  return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(here + os.sep)


def status_of(e: BaseException) -> int | None:
  """The exit status of a user error, None for an internal one (which keeps its traceback)."""
  if isinstance(e, UserError):
    return e.status
  if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)) and _raised_by_ncjax(e):
    return MissingCheckpoint.status if "checkpoint" in str(e).lower() else DataError.status
  if isinstance(e, PermissionError):
    return StoreError.status
  if isinstance(e, ValueError) and _raised_by_ncjax(e):
    return ConfigurationError.status   # a check of ncjax's own that has no kind of its own yet
  return None


def message_of(e: BaseException) -> str:
  """The error's text on one line (an OSError's strerror without its errno prefix)."""
  text = getattr(e, "strerror", None) if isinstance(e, OSError) and getattr(e, "strerror", None) else str(e)
  if isinstance(e, KeyError) and e.args:
    text = str(e.args[0])
  lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
  return " ".join(lines) if lines else type(e).__name__


def debug_requested(argv=None) -> bool:
  argv = sys.argv if argv is None else argv
  return os.environ.get(DEBUG_ENV, "") not in ("", "0") or "--verbose" in argv or "--verbose=true" in argv


def report(e: BaseException, *, process_index: int = 0, process_count: int = 1, debug: bool = False) -> int | None:
  """Print a user error as `ncjax: error: ...` (once over the processes) and return its exit status; None for an
  internal error, which the caller re-raises. With `debug`, the traceback is printed before the line."""
  status = status_of(e)
  if status is None:
    return None
  if debug:
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
  local = isinstance(e, UserError) and e.local or isinstance(e, (OSError,)) and not isinstance(e, FileNotFoundError)
  if process_count <= 1 or process_index == 0 or local:
    where = f"process {process_index}: " if process_count > 1 and local else ""
    print(f"ncjax: error: {where}{message_of(e)}", file=sys.stderr, flush=True)
  return status


def exit_now(status: int) -> None:
  """Leave without the interpreter's shutdown (no background thread prints after the message)."""
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(status)
