"""Mesh construction and sharding rules.

The mesh has a 'data' axis and an 'fsdp' axis (Auto axis types: ott-jax's Sinkhorn and GSPMD-inserted gathers work
under Auto, not under Explicit). The global batch is split over both axes; with fsdp > 1 each parameter is split
along its largest dimension divisible by the fsdp size. Per-sample method state (leading dimension = the state
capacity) is split over every device. Nothing here hard-codes a device count.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


def make_mesh(mesh_config, devices=None) -> jax.sharding.Mesh:
  devices = jax.devices() if devices is None else devices
  n = len(devices)
  fsdp = int(mesh_config.fsdp)
  data = int(mesh_config.data)
  if fsdp < 1:
    raise ValueError(f"mesh.fsdp must be >= 1, got {fsdp}")
  if data == -1:
    if n % fsdp:
      raise ValueError(f"mesh.fsdp={fsdp} does not divide the {n} available devices")
    data = n // fsdp
  if data * fsdp != n:
    raise ValueError(f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, but {n} are available; "
                     f"use mesh.data=-1 to take the rest")
  return jax.make_mesh((data, fsdp), ("data", "fsdp"), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, P(tuple(mesh.axis_names)))


def _fsdp_spec(shape, fsdp_size: int, min_size: int = 1024) -> P:
  if fsdp_size == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  order = sorted(range(len(shape)), key=lambda d: -shape[d])
  for d in order:
    if shape[d] % fsdp_size == 0:
      spec = [None] * len(shape)
      spec[d] = "fsdp"
      return P(*spec)
  return P()


def param_shardings(abstract_params, mesh):
  fsdp_size = mesh.shape["fsdp"]
  return jax.tree.map(lambda x: NamedSharding(mesh, _fsdp_spec(x.shape, fsdp_size)), abstract_params)


def spread_over_mesh(abstract_params, param_sh, mesh):
  """Shardings that split each parameter the mesh would otherwise hold whole on every device (replicated) along
  its largest dimension divisible by the device count, over all the mesh's axes; a parameter already split (FSDP)
  or with no such dimension keeps its sharding."""
  n = mesh.devices.size
  axes = tuple(mesh.axis_names)

  def rule(x, sh):
    if n == 1 or any(part is not None for part in sh.spec):
      return sh
    dims = [i for i, d in enumerate(x.shape) if d % n == 0]
    if not dims:
      return sh
    dim = max(dims, key=lambda i: x.shape[i])
    return NamedSharding(mesh, P(*[axes if i == dim else None for i in range(x.ndim)]))

  return jax.tree.map(rule, abstract_params, param_sh)


def initialise_params(init_fn, abstract_params, param_sh, mesh, draw=None):
  """`init_fn()`'s parameters laid out as `param_sh`, each value drawn once across the mesh: computed split over
  every device (`spread_over_mesh`), then gathered. Computed under `param_sh` itself, a replicated parameter's
  random initialisation would run whole on every device: on 8 CPU devices a 49,408-token embedding took 8-10 s
  instead of ~1 s. JAX's threefry keys are partitionable (`jax_threefry_partitionable`, the default), so the
  values are bitwise those of an unsplit initialisation.

  `draw`: a tree of bools shaped like `abstract_params` (None: every leaf). A leaf marked False is not computed —
  the program returns only the drawn leaves, so XLA drops the random draws of the others — and comes back as its
  `jax.ShapeDtypeStruct` (with its sharding), for a checkpoint to fill (`InitSource.initialise`). The drawn leaves
  are bitwise those of a full initialisation: the same keys, the same program up to the outputs dropped."""
  spread = spread_over_mesh(abstract_params, param_sh, mesh)
  if draw is None:
    return jax.jit(lambda: jax.lax.with_sharding_constraint(init_fn(), spread), out_shardings=param_sh)()
  treedef = jax.tree.structure(abstract_params)
  wanted = treedef.flatten_up_to(draw)
  spread_leaves, sh_leaves = treedef.flatten_up_to(spread), treedef.flatten_up_to(param_sh)

  def drawn_only():
    leaves = treedef.flatten_up_to(init_fn())
    return [jax.lax.with_sharding_constraint(x, s) for x, s, w in zip(leaves, spread_leaves, wanted) if w]

  drawn = iter(())
  if any(wanted):
    drawn = iter(jax.jit(drawn_only, out_shardings=[s for s, w in zip(sh_leaves, wanted) if w])())
  abstract = treedef.flatten_up_to(abstract_params)
  return treedef.unflatten([next(drawn) if w else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                            for a, s, w in zip(abstract, sh_leaves, wanted)])


def state_shardings(abstract_state, mesh, capacity: int):
  """Per-sample arrays (leading dim == capacity, divisible by the device count) are split over all devices."""
  n = mesh.devices.size

  def rule(x):
    if x.ndim >= 1 and x.shape[0] == capacity and capacity % n == 0:
      return NamedSharding(mesh, P(tuple(mesh.axis_names)))
    return NamedSharding(mesh, P())

  return jax.tree.map(rule, abstract_state)


def state_capacity(num_examples: int, mesh) -> int:
  """Per-sample state length: num_examples rounded up to a multiple of the device count."""
  n = mesh.devices.size
  return -(-num_examples // n) * n


def _path_key(path) -> tuple:
  return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def like_params_shardings(abstract_tree, abstract_params, param_sh, mesh):
  """Shardings for an optimiser state: a leaf whose path ends with a parameter's path and has that parameter's
  shape gets that parameter's sharding; anything else (counts, scalars) is replicated."""
  by_path = {}
  for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(abstract_params)[0], jax.tree.leaves(param_sh)):
    by_path[_path_key(path)] = (leaf.shape, sh)

  def rule(path, leaf):
    key = _path_key(path)
    for start in range(len(key)):
      hit = by_path.get(key[start:])
      if hit is not None and hit[0] == leaf.shape:
        return hit[1]
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(rule, abstract_tree)


def shard_rows(x):
  """Inside a jitted computation under `jax.set_mesh`: constrain `x` to be split along its first axis over every
  mesh axis (the batch layout), so an N x M matrix of the global batch is never replicated. A no-op without a
  mesh or when the rows do not divide."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or x.shape[0] % mesh.size:
    return x
  return jax.lax.with_sharding_constraint(x, P(tuple(mesh.axis_names), *([None] * (x.ndim - 1))))
