"""The suite's executable cache (tests/shared_programs.py): it shares programs, and it never holds the process's
memory maps up to the kernel's limit (the `make test-all` segmentation fault of issue 37)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
  budget = held + 200
  monkeypatch.setattr(shared_programs, "map_budget", budget)
  # a worker that compiled MAX_PROGRAMS programs already evicts one per compile by count, which frees maps as fast as
  # the new programs take them (this test failed so once the suite grew): only the map budget may drop here
  monkeypatch.setattr(shared_programs, "MAX_PROGRAMS", 10 ** 9)
  dropped = shared_programs.stats["dropped (memory maps)"]
  _compile_distinct_programs(60)
  assert shared_programs.stats["dropped (memory maps)"] > dropped
  assert shared_programs._maps_held() <= budget + 100, (shared_programs._maps_held(), budget)
