"""One compile per distinct program per test worker: an in-memory executable cache keyed by the program's content.

The suite is compile-bound, and most of its compiles are repeats: every tiny-CLIP test traces the same init, step
and evaluation programs from fresh closures (a new Trainer, a resumed run, the 1-device twin of a sharded run),
and JAX's own caches are keyed by those closures, so each repeat compiled again (measured on
tests/train/test_trainer.py: 78 s of its 138 s of compiles were programs it had already compiled).

Here XLA's compile entry point is wrapped: a program whose StableHLO text (without source locations, which do
not change the code), device assignment and compile options equal an earlier one's gets the executable
compiled then. Same text, same devices, same options is the same executable, so the results cannot change; what
this skips is XLA's work. Programs with host callbacks are never shared (their callbacks are bound into the
executable). JAX's persistent cache stays off (tests/conftest.py): that one deserialises executables, and
deserialised collective programs hung on XLA:CPU; nothing is (de)serialised here.

What the cache costs is memory maps, not memory: every loaded XLA:CPU executable keeps its JIT-compiled code in
its own mappings (~150-400 per train step of the tiny models), and Linux caps a process at vm.max_map_count
(65,530). Held by the cache, a `make test-all` worker's programs reached that cap, and the next compile's mmap
failed inside LLVM: a segmentation fault in `backend_compile_and_load` (issue 37; reproduced in seconds with
vm.max_map_count lowered to 7,000 on tests/train/test_trainer.py, which then crashes at its 8th test with the cache
and passes without it). So the cache is bounded by the maps the process holds: after each compile, while the
process maps more than half of its limit, the oldest programs are dropped (JAX frees an executable once neither
this cache nor a live jitted function holds it).

Test infrastructure only: it patches a private JAX function (`jax._src.compiler.backend_compile_and_load`,
present in jax 0.10.2 and 0.11.2, the releases setup.cfg admits); set NCJAX_TEST_SHARE_PROGRAMS=0 to turn it
off.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading

MAX_PROGRAMS = 512    # LRU bound (tiny test programs: a few MB of code each)
MAP_SHARE = 0.5       # the cache gives programs up while the process maps more than this share of its limit

stats = collections.Counter()
_cache: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_lock = threading.Lock()


def _map_limit() -> int:
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65530        # Linux's default; elsewhere (no /proc) the count below reads 0 and nothing is dropped


def _maps_held() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return 0


def _drop_oldest_while_over(budget: int) -> None:
  """Called with _lock held. Drops a quarter of the cache at a time (a count of /proc/self/maps costs ~1 ms per 10k
  maps), oldest first, until the process is under budget or the cache is empty."""
  while _cache and _maps_held() > budget:
    for _ in range(max(1, len(_cache) // 4)):
      _cache.popitem(last=False)
      stats["dropped (memory maps)"] += 1


map_budget = int(MAP_SHARE * _map_limit())


def _key(backend, module, executable_devices, options):
  from jax._src.interpreters import mlir
  text = mlir.module_to_string(module, enable_debug_info=False)
  return (backend.platform, hashlib.sha256(text.encode()).digest(), len(text),
          tuple(d.id for d in executable_devices), options.SerializeAsString())


def install() -> bool:
  if os.environ.get("NCJAX_TEST_SHARE_PROGRAMS", "1") == "0":
    return False
  from jax._src import compiler
  if getattr(compiler.backend_compile_and_load, "_ncjax_shared", False):
    return True
  compile_and_load = compiler.backend_compile_and_load

  def shared_compile_and_load(backend, module, executable_devices, options, host_callbacks):
    if host_callbacks:
      stats["not shared (host callbacks)"] += 1
      return compile_and_load(backend, module, executable_devices, options, host_callbacks)
    key = _key(backend, module, executable_devices, options)
    with _lock:
      hit = _cache.get(key)
      if hit is not None:
        _cache.move_to_end(key)
        stats["reused"] += 1
        return hit
    executable = compile_and_load(backend, module, executable_devices, options, host_callbacks)
    with _lock:
      _cache[key] = executable
      stats["compiled"] += 1
      while len(_cache) > MAX_PROGRAMS:
        _cache.popitem(last=False)
      _drop_oldest_while_over(map_budget)   # read here: tests/test_shared_programs.py lowers it
    return executable

  shared_compile_and_load._ncjax_shared = True
  compiler.backend_compile_and_load = shared_compile_and_load
  return True
