"""Checkpoints with orbax's CheckpointManager: train state (params, optimiser state, method state, step), the
data-iterator state and a JSON metadata item (resolved config, tokenizer, stage, package version, git hash, noise
hash). Orbax writes each step into a temporary directory and renames it when complete, so a run killed mid-save
leaves the previous checkpoint intact and `latest_step` only ever sees finished ones.
"""

from __future__ import annotations

import logging
import os
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger("ncjax")


def git_hash() -> str:
  try:
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                          timeout=5).stdout.strip() or "unknown"
  except (OSError, subprocess.SubprocessError):
    return "unknown"


class Checkpointer:
  """Save every `every_steps` (and at the end), keep `keep`, restore the latest (auto-resume)."""

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep if keep and keep > 0 else None,
                                           enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=dict(
        state=ocp.StandardCheckpointHandler(), meta=ocp.JsonCheckpointHandler(), data=ocp.JsonCheckpointHandler()))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state, meta: dict, data_state: dict, *, force: bool = False) -> bool:
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta), data=ocp.args.JsonSave(data_state)),
        force=force)

  def read_meta(self, step: int) -> dict:
    out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(),
                                                             data=ocp.args.JsonRestore()))
    return dict(out["meta"], data=out["data"])

  def restore(self, step: int, abstract_state):
    """Restore the train state into `abstract_state` (ShapeDtypeStructs with shardings: resharding on load)."""
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return out["state"]

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, "checkpoints")


def _locate(path: str) -> tuple[str, int | None]:
  path = os.path.abspath(path)
  base = os.path.basename(path.rstrip("/"))
  if base.isdigit() and os.path.isdir(os.path.join(path, "state")):
    return os.path.dirname(path), int(base)
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return os.path.join(path, "checkpoints"), None
  if os.path.isdir(path):
    return path, None
  raise FileNotFoundError(f"no checkpoint directory at {path} (expected WORKDIR, WORKDIR/checkpoints or "
                          f"WORKDIR/checkpoints/STEP)")


def _open_step(path: str) -> tuple[Checkpointer, int, dict]:
  """(checkpointer, step, metadata) for a workdir (latest step), a checkpoints dir or a step dir."""
  directory, step = _locate(path)
  ckpt = Checkpointer(directory, async_save=False)
  step = ckpt.latest_step() if step is None else step
  if step is None:
    ckpt.close()
    raise FileNotFoundError(f"{directory} holds no finished checkpoint")
  return ckpt, step, ckpt.read_meta(step)


def read_source_meta(path: str) -> dict:
  """Metadata (config, tokenizer, ...) of the checkpoint `path` points at (latest step of a workdir)."""
  ckpt, _, meta = _open_step(path)
  ckpt.close()
  return meta


def restore_params(path: str):
  """(params as host arrays, metadata, step) of the checkpoint `path` points at; the caller places them.

  Works whatever the device count the run was saved with: the state is restored onto one local device."""
  ckpt, step, meta = _open_step(path)
  item = ckpt.manager.item_metadata(step)["state"]
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device), item,
                        is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
  state = ckpt.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
  ckpt.close()
  return jax.tree.map(np.asarray, state["params"]), meta, step


def overlay_params(params, source: str, abstract_params, param_sh):
  """Initialise modules from another run's checkpoint: every top-level module present in both is copied
  (shapes must agree); modules the source lacks (e.g. NCU's prompt) keep their fresh initialisation."""
  src, _, step = restore_params(source)
  out = dict(params)
  copied = []
  for name, sub in src.items():
    if name not in params:
      continue
    want = jax.tree.map(lambda a: a.shape, abstract_params[name])
    got = jax.tree.map(lambda a: tuple(np.shape(a)), sub)
    if jax.tree.structure(want) != jax.tree.structure(got) or jax.tree.leaves(want) != jax.tree.leaves(got):
      raise ValueError(f"module {name!r} of {source} (step {step}) does not match this model's shapes")
    out[name] = jax.tree.map(lambda a, s: jax.device_put(np.asarray(a), s), sub, param_sh[name])
    copied.append(name)
  if not copied:
    raise ValueError(f"checkpoint {source} shares no module with this method (it has {sorted(src)})")
  log.info("initialised %s from %s (step %d)", copied, source, step)
  return out
