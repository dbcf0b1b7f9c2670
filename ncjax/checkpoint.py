"""Checkpoints with orbax's CheckpointManager: train state (params, optimiser state, method state, step), the
data-iterator state and a JSON metadata item (resolved config, tokenizer, stage, package version, git hash, noise
hash). Orbax writes each step into a temporary directory and renames it when complete, so a run killed mid-save
leaves the previous checkpoint intact and `latest_step` only ever sees finished ones.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp

from ncjax import errors
from ncjax import fileio

log = logging.getLogger("ncjax")

# Orbax's replica-parallel save splits every replicated array (parameters, optimiser moments on a data-parallel
# mesh) across its replicas and cuts each piece out on device: one dispatched slice per replica per leaf, over a
# thousand tiny device ops (and their compiles) per save of a small model, which made a save cost ~2x a train step
# of the test suite's models. The split only pays where a slice is large enough for parallel writes to matter, so
# it is kept for slices of at least this many bytes (the big arrays of a pod-scale run). The handler is orbax's
# default one otherwise (same array-metadata store); orbax 0.12 has no public handle on either, hence the _src
# imports (orbax is pinned to 0.12.x in setup.cfg; tests/test_checkpoint.py checks that small leaves are not sliced).
MIN_REPLICA_PARALLEL_SLICE_BYTES = 4 << 20


def register_array_handler(min_replica_parallel_slice_bytes: int | None = MIN_REPLICA_PARALLEL_SLICE_BYTES):
  """Orbax's jax.Array handler for every save in this process; None: orbax's default (slices of any size)."""
  from orbax.checkpoint._src.metadata import array_metadata_store
  from orbax.checkpoint._src.serialization import type_handler_registry
  type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(
      jax.Array, ocp.type_handlers.ArrayHandler(array_metadata_store=array_metadata_store.Store(),
                                                min_slice_bytes_for_replica_parallel=min_replica_parallel_slice_bytes),
      override=True, ignore_warnings=True)


register_array_handler()


# tensorstore (orbax's array writes to gs://) retries a failing request up to 32 times with delays growing to 32 s
# (about a quarter of an hour) before it reports anything: a dead store left a run hanging for over 10 minutes
# (2026-11-25). Bounded here to ~2 minutes of retries per request; the Checkpointer's own write deadline (below)
# bounds the whole save. Orbax builds its tensorstore contexts from these module dicts (orbax 0.12 pinned).
TENSORSTORE_GCS_RETRIES = {"max_retries": 8, "initial_delay": "1s", "max_delay": "16s"}


def _bound_tensorstore_retries():
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
  for context in (ts_utils._BASE_TS_CONTEXT, ts_utils._DEFAULT_OCDBT_TS_CONTEXT):   # noqa: SLF001
    context["gcs_request_retries"] = dict(TENSORSTORE_GCS_RETRIES)


_bound_tensorstore_retries()
DEFAULT_WRITE_DEADLINE_S = 600.0


def git_hash() -> str:
  try:
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                          timeout=5).stdout.strip() or "unknown"
  except (OSError, subprocess.SubprocessError):
    return "unknown"


class CheckpointWriteError(errors.StoreError):
  """A checkpoint could not be written (disk full, read-only or vanished workdir). The checkpoints written before
  it are intact: orbax finalises a step by renaming its temporary directory, which a failed save never reaches."""


def ensure_writable(workdir: str, needed_bytes: int = 0):
  """Fail before training if `workdir` cannot take files, or (a local disk) has less free space than one
  checkpoint needs. An object store (gs://) is probed by writing and deleting one small object."""
  try:
    fileio.makedirs(workdir)
    probe = fileio.join(workdir, f".ncjax-write-probe-{os.getpid()}")
    fileio.write_bytes(probe, b"0")
    fileio.remove(probe)
  except Exception as e:  # OSError locally; the object store's client raises its own errors
    reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:300]
    raise CheckpointWriteError(getattr(e, "errno", None) or errno.EIO,
                               f"workdir {workdir} is not writable ({reason}); checkpoints, metrics.jsonl and "
                               f"evaluation results go there: choose another --workdir or fix its permissions "
                               f"(gs://: the bucket, its credentials and the network)") from None
  if fileio.is_remote(workdir):
    return
  free = shutil.disk_usage(workdir).free
  if needed_bytes and free < needed_bytes:
    raise CheckpointWriteError(errno.ENOSPC, f"workdir {workdir} has {free / 2**20:.1f} MiB free, but one "
                               f"checkpoint of this run (parameters, optimiser and per-sample state) takes "
                               f"{needed_bytes / 2**20:.1f} MiB: free some space or choose another --workdir")


# Orbax's array writes go through tensorstore, whose I/O failures arrive as ValueError / RuntimeError with the
# OS error code in the message ("Failed to write ... [os_error_code='28']"), not as OSError.
_WRITE_FAILURE = re.compile(r"Failed to write|Failed writing|Error writing|os_error_code|No space left|Read-only file")


def _is_write_failure(e: Exception) -> bool:
  return isinstance(e, OSError) or (isinstance(e, (ValueError, RuntimeError)) and bool(_WRITE_FAILURE.search(str(e))))


def _errno_of(e: Exception) -> int | None:
  if isinstance(e, OSError) and e.errno:
    return e.errno
  m = re.search(r"os_error_code='?(\d+)", str(e))
  return int(m.group(1)) if m else None


class Checkpointer:
  """Save every `every_steps` (and at the end), keep `keep`, restore the latest (auto-resume)."""

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True,
               write_deadline_s: float = DEFAULT_WRITE_DEADLINE_S):
    """`write_deadline_s` (config ckpt.write_deadline_s): how long a save, or the wait for an asynchronous one, may
    take before the run stops with one line — a store that does not answer must not hang a run for ever."""
    self.directory = fileio.absolute(directory)
    self.write_deadline_s = float(write_deadline_s)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep if keep and keep > 0 else None,
                                           enable_async_checkpointing=async_save, create=True,
                                           # a run killed mid-save leaves STEP.orbax-checkpoint-tmp: removed here
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=dict(
        state=ocp.StandardCheckpointHandler(), meta=ocp.JsonCheckpointHandler(), data=ocp.JsonCheckpointHandler()))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def _within_deadline(self, fn, what: str):
    """fn() in a helper thread, given `write_deadline_s` to finish: past that, CheckpointWriteError (the thread is
    left to the process's exit; the step it was writing never gets its commit marker, so it is not a checkpoint)."""
    if not self.write_deadline_s or self.write_deadline_s <= 0:
      return fn()
    import concurrent.futures as cf
    pool = cf.ThreadPoolExecutor(1, thread_name_prefix="ncjax-ckpt-deadline")
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    try:
      return future.result(timeout=self.write_deadline_s)
    except cf.TimeoutError:
      raise self._write_error(TimeoutError(f"not finished after {self.write_deadline_s:g} s (ckpt.write_deadline_s)"),
                              what, look=False) from None

  def save(self, step: int, state, meta: dict, data_state: dict, *, force: bool = False) -> bool:
    try:
      return self._within_deadline(lambda: self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta), data=ocp.args.JsonSave(data_state)),
          force=force), f"saving the checkpoint of step {step}")
    except CheckpointWriteError:
      raise
    except Exception as e:  # this save, or an earlier asynchronous one surfacing here
      if not (_is_write_failure(e) or fileio.is_remote(self.directory)):   # remote: any client error is one
        raise
      raise self._write_error(e, f"saving the checkpoint of step {step} (or the asynchronous save before it)") \
          from e

  def _write_error(self, e: Exception, what: str, look: bool = True) -> CheckpointWriteError:
    finished = []
    try:   # (not when the store stopped answering: listing it would hang as long again)
      finished = self.manager.all_steps(read=True) if look and fileio.isdir(self.directory) else []
    except Exception:   # the storage itself is gone (a dead object store): say so rather than raise again
      finished = []
    kept = (f"the last complete checkpoint (step {max(finished)}) is intact and a re-run resumes from it"
            if finished else "the checkpoints written before it are intact (orbax finalises a step only once "
            "it is whole) and a re-run resumes from the latest")
    code = _errno_of(e)
    reason = os.strerror(code) if code else str(e).splitlines()[0][:300]
    where = ("the object store unreachable, or the bucket's permissions?" if fileio.is_remote(self.directory) else
             "disk full, quota or file-size limit, or a read-only filesystem?")
    return CheckpointWriteError(code or errno.EIO, f"{what} to {self.directory} failed: {reason} ({where}); {kept}")

  def read_meta(self, step: int) -> dict:
    out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(),
                                                             data=ocp.args.JsonRestore()))
    return dict(out["meta"], data=out["data"])

  def restore(self, step: int, abstract_state):
    """Restore the train state into `abstract_state` (ShapeDtypeStructs with shardings: resharding on load)."""
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return out["state"]

  def restore_parts(self, step: int, abstract_parts: dict):
    """Restore only some top-level entries of the train state (e.g. {'params': ..., 'method_state': ...} for
    evaluation: no optimiser state is read), into ShapeDtypeStructs with shardings (resharding on load)."""
    reader = ocp.CheckpointManager(self.directory, item_handlers=dict(state=ocp.PyTreeCheckpointHandler()))
    try:
      out = reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item=abstract_parts, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_parts),
          partial_restore=True)))
    finally:
      reader.close()
    return out["state"]

  def stored_shapes(self, step: int) -> dict:
    """The train state's stored array metadata (shape, dtype) by path, as a pytree."""
    return self.manager.item_metadata(step)["state"]

  def wait(self):
    try:
      self._within_deadline(self.manager.wait_until_finished, "an asynchronous checkpoint save")
    except CheckpointWriteError:
      raise
    except Exception as e:
      if not (_is_write_failure(e) or fileio.is_remote(self.directory)):
        raise
      raise self._write_error(e, "an asynchronous checkpoint save") from e

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def check_state_shapes(ckpt: Checkpointer, step: int, abstract_state):
  """Compare a checkpoint's stored shapes with the state this config builds, naming the first leaves that
  differ (a checkpoint of another model size, tokenizer or dataset), before orbax's restore fails opaquely."""
  stored = ckpt.manager.item_metadata(step)["state"]
  is_leaf = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
  # Orbax stores named tuples (optax states) as dicts: compare paths by their names only.
  name = lambda path: "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
  stored_shapes = {name(p): tuple(m.shape)
                   for p, m in jax.tree_util.tree_flatten_with_path(stored, is_leaf=is_leaf)[0]}
  wanted = {name(p): tuple(a.shape) for p, a in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
  missing = sorted(set(wanted) - set(stored_shapes))
  extra = sorted(set(stored_shapes) - set(wanted))
  differ = [f"{k}: checkpoint {stored_shapes[k]}, config {wanted[k]}"
            for k in sorted(set(wanted) & set(stored_shapes)) if stored_shapes[k] != wanted[k]]
  if missing or extra or differ:
    parts = ([f"shapes differ ({'; '.join(differ[:3])}{' ...' if len(differ) > 3 else ''})"] if differ else []) + \
            ([f"absent from the checkpoint: {missing[:3]}"] if missing else []) + \
            ([f"not in this config's state: {extra[:3]}"] if extra else [])
    raise errors.CheckpointError(f"checkpoint {ckpt.directory}/{step} was written by another model or method than "
                                 f"this config "
                     f"builds: {'; '.join(parts)}. Resume with the config it was trained with (its "
                     f"meta/metadata holds it) or use a new --workdir.")


def checkpoint_dir(workdir: str) -> str:
  return fileio.join(workdir, "checkpoints")


def _locate(path: str) -> tuple[str, int | None]:
  path = fileio.absolute(path)
  base = fileio.basename(path)
  if base.isdigit() and fileio.isdir(fileio.join(path, "state")):
    return fileio.dirname(path), int(base)
  if fileio.isdir(fileio.join(path, "checkpoints")):
    return fileio.join(path, "checkpoints"), None
  if fileio.isdir(path):
    return path, None
  raise errors.MissingCheckpoint(f"no checkpoint directory at {path} (expected WORKDIR, WORKDIR/checkpoints or "
                                 f"WORKDIR/checkpoints/STEP)")


def _open_step(path: str) -> tuple[Checkpointer, int, dict]:
  """(checkpointer, step, metadata) for a workdir (latest step), a checkpoints dir or a step dir."""
  directory, step = _locate(path)
  ckpt = Checkpointer(directory, async_save=False)
  step = ckpt.latest_step() if step is None else step
  if step is None:
    ckpt.close()
    raise errors.MissingCheckpoint(f"{directory} holds no finished checkpoint: give a run's workdir whose training "
                                   f"saved at least one step")
  return ckpt, step, ckpt.read_meta(step)


def read_source_meta(path: str) -> dict:
  """Metadata (config, tokenizer, ...) of the checkpoint `path` points at (latest step of a workdir)."""
  ckpt, _, meta = _open_step(path)
  ckpt.close()
  return meta


def restore_state_on_host(path: str):
  """(whole train state as host arrays, metadata, step) of the checkpoint `path` points at.

  Works whatever the device count the run was saved with: the state is restored onto one local device."""
  ckpt, step, meta = _open_step(path)
  item = ckpt.manager.item_metadata(step)["state"]
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device), item,
                        is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
  state = ckpt.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
  ckpt.close()
  return jax.tree.map(np.asarray, state), meta, step


def restore_params(path: str):
  """(params as host arrays, metadata, step) of the checkpoint `path` points at; the caller places them."""
  state, meta, step = restore_state_on_host(path)
  return state["params"], meta, step


def overlay_params(fresh, source: str, abstract_params, param_sh):
  """Initialise modules from another run's checkpoint: every top-level module present in both is copied
  (shapes must agree); modules the source lacks (e.g. NCU's prompt) keep their fresh initialisation.
  `fresh(draw)` gives the fresh parameters, `draw` marking the leaves to compute (those of the modules not copied;
  see `sharding.initialise_params`)."""
  src, _, step = restore_params(source)
  copied = []
  for name, sub in src.items():
    if name not in abstract_params:
      continue
    want = jax.tree.map(lambda a: a.shape, abstract_params[name])
    got = jax.tree.map(lambda a: tuple(np.shape(a)), sub)
    if jax.tree.structure(want) != jax.tree.structure(got) or jax.tree.leaves(want) != jax.tree.leaves(got):
      raise ValueError(f"module {name!r} of {source} (step {step}) does not match this model's shapes")
    copied.append(name)
  if not copied:
    raise ValueError(f"checkpoint {source} shares no module with this method (it has {sorted(src)})")
  out = dict(fresh({name: jax.tree.map(lambda _, keep=name not in copied: keep, sub)
                    for name, sub in abstract_params.items()}))
  for name in copied:
    out[name] = jax.tree.map(lambda a, s: jax.device_put(np.asarray(a), s), src[name], param_sh[name])
  log.info("initialised %s from %s (step %d)", copied, source, step)
  return out
