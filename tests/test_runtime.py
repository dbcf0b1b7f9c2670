"""ncjax.runtime's restart with huge-page-backed malloc (the CLI, the demo and the benchmarks call it first)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ncjax import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def glibc_with_madvise_thp(monkeypatch):
  """Pretend to be a glibc 2.36 Linux host whose kernel hands out transparent huge pages on madvise."""
  monkeypatch.setattr(runtime.sys, "platform", "linux")
  monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.36"))
  monkeypatch.setattr(runtime, "_transparent_huge_pages_mode", lambda: "madvise")


def test_the_tunable_is_added_to_glibc_tunables_already_set(glibc_with_madvise_thp):
  assert runtime.huge_pages_environment({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  env = runtime.huge_pages_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "PATH": "/bin"})
  assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
  assert env["PATH"] == "/bin"  # the rest of the environment is kept


@pytest.mark.parametrize("environ", [{"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},  # the user's own choice wins
                                     {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},  # the restarted process
                                     {"NCJAX_HUGE_PAGES": "0"}])                     # opted out
def test_no_restart_when_the_tunable_is_set_or_opted_out(glibc_with_madvise_thp, environ):
  assert runtime.huge_pages_environment(environ) is None


@pytest.mark.parametrize("libc,mode", [(("glibc", "2.34"), "madvise"),  # before the tunable existed
                                        (("", ""), "madvise"),           # musl: no glibc tunables
                                        (("glibc", "2.36"), "always"),   # every mapping gets huge pages already
                                        (("glibc", "2.36"), "never"),    # the kernel gives none
                                        (("glibc", "2.36"), None)])      # no THP support at all
def test_no_restart_where_it_would_change_nothing(monkeypatch, libc, mode):
  monkeypatch.setattr(runtime.sys, "platform", "linux")
  monkeypatch.setattr(runtime.platform, "libc_ver", lambda: libc)
  monkeypatch.setattr(runtime, "_transparent_huge_pages_mode", lambda: mode)
  assert runtime.huge_pages_environment({}) is None


def test_the_process_restarts_itself_once_in_place_with_the_tunable():
  """The real thing, in a child process: the same pid and command line, the tunable set, run exactly twice (before
  and after the exec) — or, on a host where it changes nothing, not restarted at all."""
  code = ("import os, sys; print('start', os.getpid(), os.environ.get('GLIBC_TUNABLES'), sys.argv[1:], flush=True); "
          "from ncjax import runtime; runtime.restart_with_huge_pages(); "
          "print('after', os.getpid(), os.environ.get('GLIBC_TUNABLES'), flush=True)")
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "NCJAX_HUGE_PAGES")}
  proc = subprocess.run([sys.executable, "-c", code, "arg1"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.split("\n")[:-1]
  expected = runtime.huge_pages_environment(env)
  if expected is None:
    assert [line.split()[0] for line in lines] == ["start", "after"]
  else:
    pid = lines[0].split()[1]
    assert lines == [f"start {pid} None ['arg1']", f"start {pid} glibc.malloc.hugetlb=1 ['arg1']",
                     f"after {pid} glibc.malloc.hugetlb=1"]
