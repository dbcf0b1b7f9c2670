"""Process-level JAX set-up shared by the CLI, the demo, the benchmarks and the tests."""

from __future__ import annotations

import os

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
