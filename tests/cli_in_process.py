"""Run an `ncjax` command inside the test's own process: the CLI's flag parsing (`ncjax.cli.main._parse_flags`)
and its `main(argv)`, the path `ncjax` and `python -m ncjax.main` take after `absl.app.run`, without a Python
that imports JAX and ncjax again (a few seconds each under a loaded test machine).

What a subprocess adds and this does not: absl's `app.run` wrapper, the huge-pages restart and the process's own
exit (`ncjax.errors.exit_now`'s `os._exit`, which leaves no background thread time to print after the error line).
Each file that checks the CLI in-process keeps one case through a real `python -m ncjax.main` for those.

The command's exit status is what the process would exit with: `sys.exit`'s and `errors.exit_now`'s status (the
latter turned into a SystemExit here, so that the test's process stays), 1 for an exception `main` re-raises (its
traceback goes to stderr, as the interpreter prints it), 0 otherwise."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import sys
import traceback
from unittest import mock


@dataclasses.dataclass
class Result:
  """What `subprocess.run(..., capture_output=True, text=True)` gives, for the same assertions."""
  returncode: int
  stdout: str
  stderr: str


def _raise_system_exit(status: int) -> None:
  raise SystemExit(status)


def run(args: list[str], cwd: str | None = None) -> Result:
  """`ncjax ARGS` in this process (from `cwd`), its flags reset afterwards: every flag back to unparsed, the
  `--config.KEY` override flags it defined removed (so that the next command can define them again; the flags of
  modules it imported, grain's, stay)."""
  from absl import flags
  from ncjax import errors
  from ncjax.cli import main
  argv = ["ncjax", *args]
  defined_before = set(flags.FLAGS)
  ncjax_logger = logging.getLogger("ncjax")
  level_before = ncjax_logger.level
  out, err = io.StringIO(), io.StringIO()
  log_handler = logging.StreamHandler(err)   # the CLI's INFO lines (absl's handler prints them on stderr)
  ncjax_logger.addHandler(log_handler)
  status = 0
  try:
    with contextlib.ExitStack() as stack:
      stack.enter_context(mock.patch.object(sys, "argv", argv))   # ml_collections and the sweep read sys.argv
      stack.enter_context(mock.patch.object(errors, "exit_now", _raise_system_exit))
      stack.enter_context(contextlib.redirect_stdout(out))
      stack.enter_context(contextlib.redirect_stderr(err))
      if cwd is not None:
        stack.enter_context(contextlib.chdir(cwd))
      try:
        main.main(main._parse_flags(argv))   # noqa: SLF001
      except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      except Exception:  # noqa: BLE001 — an error `main` re-raises: the interpreter's traceback and status 1
        traceback.print_exc(file=err)
        status = 1
  finally:
    ncjax_logger.removeHandler(log_handler)
    ncjax_logger.setLevel(level_before)
    for name in set(flags.FLAGS) - defined_before:
      if name.startswith("config."):
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
  return Result(status, out.getvalue(), err.getvalue())

