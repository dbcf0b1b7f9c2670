"""The JAX releases ncjax runs on, and the few places where they differ: one module, not `try`s scattered around.

ncjax runs on jax/jaxlib 0.10.2 (Python 3.11, this project's CI) and 0.11.x (Python >= 3.12: today's GPU images
ship 0.11.2 with the CUDA 13 plugin, and a host without network cannot replace it). What differs between them, read
from jax 0.11's changes against the code and checked by running the suite under both:

- XLA:CPU's `--xla_cpu_use_fusion_emitters` flag (the older loop emitters, which the test suite picks for compile
  speed) is gone in jaxlib 0.11: XLA aborts the process at start-up on an unknown flag in XLA_FLAGS.
  `fast_compile_xla_flags()` gives the flags the installed jaxlib accepts.

A leaf: nothing of ncjax is imported here, and nothing here imports jax at module level (XLA_FLAGS must be set before
jax initialises its backends).
"""

from __future__ import annotations

import functools
from importlib import metadata

# The releases proven: 0.10.2 by `make test` here and in CI, 0.11.x on the GPU slice of the suite
# (benchmarks/accelerator/run.sh) and on the CPU suite under Python 3.12 (docs/testing.md).
OLDEST = (0, 10, 2)
NEWER_THAN_PROVEN = (0, 12, 0)


def _parse(version: str) -> tuple[int, ...]:
  parts = []
  for piece in version.split(".")[:3]:
    digits = "".join(c for c in piece if c.isdigit())
    parts.append(int(digits) if digits else 0)
  return tuple(parts + [0] * (3 - len(parts)))


@functools.lru_cache(maxsize=None)
def jaxlib_version() -> tuple[int, ...]:
  """The installed jaxlib's version as (major, minor, patch), read from its metadata without importing it."""
  return _parse(metadata.version("jaxlib"))


def fast_compile_xla_flags() -> tuple[str, ...]:
  """XLA flags that make XLA:CPU compile faster at the cost of slower programs (the test suite's tiny models run in
  milliseconds and compile for seconds): LLVM at -O0 (~25% faster compiles), one LLVM module per program instead of
  parts compiled on parallel threads (the suite's workers already take every core, and the split costs its own
  work: ~15% faster compiles with two processes compiling on two cores), and, where jaxlib still has them, the older
  loop emitters instead of the MLIR fusion emitters (~15%)."""
  flags = ["--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1"]
  if jaxlib_version() < (0, 11, 0):
    flags.append("--xla_cpu_use_fusion_emitters=false")
  return tuple(flags)


def with_xla_flags(current: str, flags) -> str:
  """`current` (an XLA_FLAGS value) with each of `flags` added unless the user set that flag already."""
  out = current
  for flag in flags:
    if flag.split("=")[0] not in current:
      out = f"{out} {flag}".strip()
  return out
