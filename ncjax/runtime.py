"""Process-level JAX set-up shared by the CLI, the demo, the benchmarks and the tests."""

from __future__ import annotations

import os
import platform
import sys

# XLA's CPU collectives abort when a participant is 40 s late. With N simulated devices time-sharing a few cores,
# a device thread can be starved that long inside loops with a collective per iteration (e.g. the rejection
# sampling behind jax.random.gamma on batch-sharded arrays). Real accelerators are unaffected.
_CPU_COLLECTIVE_FLAGS = ("--xla_cpu_collective_call_terminate_timeout_seconds=1800",
                         "--xla_cpu_collective_timeout_seconds=1800")


def configure_cpu_devices(n: int) -> None:
  """Simulate `n` CPU devices (call before JAX initialises its backends)."""
  flags = os.environ.get("XLA_FLAGS", "")
  extra = [f for f in _CPU_COLLECTIVE_FLAGS if f.split("=")[0] not in flags]
  if extra:
    os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
  import jax
  jax.config.update("jax_num_cpu_devices", n)


# glibc's malloc serves every request above 32 MiB with a fresh anonymous mmap and unmaps it on free, and XLA:CPU
# allocates a program's temporaries anew at every execution: the `small` CLIP step at global batch 2048 asks for
# 13.9 GB of them (1.65 GB per simulated device), so each step the kernel faulted in and zeroed 13.9 GB again, 4 KiB
# at a time — 3.2 million page faults a step, and a third of the process's CPU time in the kernel. With the tunable
# below malloc marks those mappings for transparent huge pages (madvise), one fault per 2 MiB: first touch of fresh
# memory ran at 3.9 GB/s against 0.41 GB/s here, and the step took 11.6 against 15.4 s (`benchmarks.run
# --suites=foundation` with and without, back to back; docs/notes/bench_foundation_cpu.txt).
# Tunables are read when the process starts, so the CLI, the demo and the benchmarks restart themselves once with it.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
HUGE_PAGES_OPT_OUT = "NCJAX_HUGE_PAGES"  # =0: leave malloc as it is


def _transparent_huge_pages_mode() -> str | None:
  """The kernel's THP mode ('always', 'madvise' or 'never'), or None where there is no such setting."""
  try:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      modes = f.read().split()
  except OSError:
    return None
  return next((m.strip("[]") for m in modes if m.startswith("[")), None)


def huge_pages_environment(environ=None) -> dict | None:
  """The environment to restart with so that malloc backs large allocations with huge pages, or None where a
  restart would change nothing: not glibc 2.35+ on Linux, THP 'always' (already on) or 'never' (unavailable), the
  tunable already set, or NCJAX_HUGE_PAGES=0."""
  environ = dict(os.environ if environ is None else environ)
  if environ.get(HUGE_PAGES_OPT_OUT, "1") == "0" or "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
    return None
  libc, version = platform.libc_ver()
  try:
    new_enough = tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)  # the release that added the tunable
  except ValueError:
    new_enough = False
  if sys.platform != "linux" or libc != "glibc" or not new_enough or _transparent_huge_pages_mode() != "madvise":
    return None
  tunables = environ.get("GLIBC_TUNABLES")
  environ["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE
  return environ


def restart_with_huge_pages() -> None:
  """Re-execute this process (same pid, same command line) with HUGE_PAGES_TUNABLE, if that changes anything.
  Call it first thing in an entry point, before JAX starts threads: exec replaces the whole process image."""
  env = huge_pages_environment()
  if env is None or not sys.executable:  # an embedded interpreter has no executable to restart
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, env)
