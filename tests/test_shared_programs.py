"""The suite's executable cache (tests/shared_programs.py): it shares programs, and it never holds the process's
memory maps up to the kernel's limit (the `make test-all` segmentation fault of issue 37)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multiprocess
import shared_programs


def _compile_distinct_programs(count: int) -> None:
  """`count` programs no earlier test compiled, each run once and then unreachable but through the cache."""
  for i in range(count):
    fn = jax.jit(lambda x, i=i: jnp.tanh(x * (i + 0.5)) @ x.T + jnp.float32(i) / 7.0)
    fn(jnp.ones((4 + i % 3, 8), jnp.float32)).block_until_ready()
    del fn


@pytest.mark.skipif(not shared_programs.install(), reason="NCJAX_TEST_SHARE_PROGRAMS=0: the suite runs uncached")
def test_a_program_compiled_again_from_a_fresh_closure_is_reused():
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  before = shared_programs.stats["reused"]
  first = jax.jit(lambda v: jnp.sin(v) * 3.25 + 1.0)(x)
  second = jax.jit(lambda v: jnp.sin(v) * 3.25 + 1.0)(x)   # a new closure: JAX's own caches miss
  assert shared_programs.stats["reused"] == before + 1
  np.testing.assert_array_equal(np.asarray(first), np.asarray(second))


@pytest.mark.skipif(not shared_programs.install(), reason="NCJAX_TEST_SHARE_PROGRAMS=0: the suite runs uncached")
def test_the_cache_gives_programs_up_before_the_process_runs_out_of_memory_maps(monkeypatch):
  # A limit just above what the process maps now stands for vm.max_map_count being near: with the cache holding
  # every program, the maps grow by each program's JIT code; bounded, they stay at the budget (plus one program).
  held = shared_programs._maps_held()
  assert held > 0, "/proc/self/maps is readable on Linux"
  budget = held + 100   # below what 60 programs map (~3 each: one LLVM module per program, tests/conftest.py)
  monkeypatch.setattr(shared_programs, "map_budget", budget)
  # a worker that compiled MAX_PROGRAMS programs already evicts one per compile by count, which frees maps as fast as
  # the new programs take them (this test failed so once the suite grew): only the map budget may drop here
  monkeypatch.setattr(shared_programs, "MAX_PROGRAMS", 10 ** 9)
  dropped = shared_programs.stats["dropped (memory maps)"]
  _compile_distinct_programs(60)
  assert shared_programs.stats["dropped (memory maps)"] > dropped
  assert shared_programs._maps_held() <= budget + 100, (shared_programs._maps_held(), budget)


_CHILD = """
import collections, jax, jax.numpy as jnp, numpy as np
from jax import monitoring
events = collections.Counter()
monitoring.register_event_listener(lambda event, **kw: events.update([event]))
out = jax.jit(lambda x: jnp.tanh(x @ x.T) * 0.375 + x.sum())(jnp.arange(12.0).reshape(3, 4) / 7)
print(events["/jax/compilation_cache/cache_hits"], events["/jax/compilation_cache/cache_misses"],
      np.asarray(out).tobytes().hex())
"""


def test_a_tests_subprocesses_share_the_sessions_compilation_cache_and_a_multi_process_job_does_not(tmp_path):
  """tests/conftest.py: a single process the suite starts loads what an earlier one compiled (the same bits out);
  the processes of one multi-process job get no cache; the test process itself keeps its programs in memory."""
  assert os.path.isdir(os.environ["NCJAX_TEST_XLA_CACHE"])
  assert not jax.config.jax_enable_compilation_cache
  single, several = multiprocess.env(), multiprocess.env(processes=2)
  assert single["JAX_ENABLE_COMPILATION_CACHE"] == "true" and several["JAX_ENABLE_COMPILATION_CACHE"] == "false"
  assert single["JAX_COMPILATION_CACHE_DIR"] == os.environ["NCJAX_TEST_XLA_CACHE"]
  env = dict(single, JAX_COMPILATION_CACHE_DIR=str(tmp_path))   # a cache of this test's own: empty at first
  runs = [subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
          for _ in range(2)]
  assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
  (hits0, misses0, bits0), (hits1, misses1, bits1) = ([int(v) for v in r.stdout.split()[:2]] + r.stdout.split()[2:]
                                                       for r in runs)
  assert hits0 == 0 and misses0 > 0          # the first compiled every program (and wrote it)
  assert hits1 == misses0 and misses1 == 0   # the second compiled none
  assert bits0 == bits1
