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

Test infrastructure only: it patches a private JAX function (`jax._src.compiler.backend_compile_and_load`,
jax pinned to 0.10.x in setup.cfg); set NCJAX_TEST_SHARE_PROGRAMS=0 to turn it off.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading

MAX_PROGRAMS = 512    # LRU bound (tiny test programs: a few MB of code each)

stats = collections.Counter()
_cache: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_lock = threading.Lock()


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
    return executable

  shared_compile_and_load._ncjax_shared = True
  compiler.backend_compile_and_load = shared_compile_and_load
  return True
