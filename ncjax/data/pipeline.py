"""Training input: a deterministic global batch for every step, assembled across processes.

The sample order is a pure function of (seed, step): epoch e visits the examples in the permutation drawn from
PCG64([seed, e]), and the global batch of step s is the slice [b*(s mod E), b*(s mod E + 1)) of epoch s // E's
permutation (the remainder of an epoch is dropped). Resuming at step s therefore continues the exact order, and the
iterator state saved in a checkpoint is just that position. Each process materialises only its contiguous part of
the global batch and `jax.make_array_from_process_local_data` assembles the global array.
"""

from __future__ import annotations

import numpy as np
import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from ncjax.data.noise import NoisyIndex
from ncjax.data.types import PairSplit


def batch_axes(mesh) -> tuple[str, ...]:
  """All mesh axes: the global batch is split over every device (data and fsdp)."""
  return tuple(mesh.axis_names)


def check_batch_divisible(global_batch: int, mesh) -> None:
  n = mesh.devices.size
  if global_batch % n:
    raise ValueError(f"global batch size {global_batch} is not divisible by the {n} devices of the mesh "
                     f"{dict(mesh.shape)}; choose a multiple of {n}")
  if global_batch % jax.process_count():
    raise ValueError(f"global batch size {global_batch} is not divisible by the {jax.process_count()} processes")


class TrainData:
  """Global batches of training pairs, keyed by stable example id (= caption index)."""

  def __init__(self, split: PairSplit, tokens: np.ndarray, global_batch_size: int, seed: int, mesh,
               noisy: NoisyIndex | None = None):
    check_batch_divisible(global_batch_size, mesh)
    n = split.num_captions
    if global_batch_size > n:
      raise ValueError(f"global batch size {global_batch_size} exceeds the {n} training examples of {split.name}")
    self.split = split
    self.tokens = np.asarray(tokens, np.int32)
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.mesh = mesh
    self.num_examples = n
    self.steps_per_epoch = n // global_batch_size
    self.caption_to_image = split.caption_to_image if noisy is None else noisy.caption_to_image
    self.clean = np.ones(n, bool) if noisy is None else noisy.clean
    self.noise_sha256 = None if noisy is None else noisy.sha256
    self.sharding = NamedSharding(mesh, P(batch_axes(mesh)))
    self._perm_cache: dict[int, np.ndarray] = {}

  def epoch_permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._perm_cache:
      self._perm_cache = {epoch: np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(
          self.num_examples)}
    return self._perm_cache[epoch]

  def indices(self, step: int) -> np.ndarray:
    epoch, pos = divmod(step, self.steps_per_epoch)
    b = self.global_batch_size
    return self.epoch_permutation(epoch)[pos * b:(pos + 1) * b]

  def iterator_state(self, step: int) -> dict:
    epoch, pos = divmod(step, self.steps_per_epoch)
    return dict(kind="epoch_permutation", seed=self.seed, next_step=int(step), epoch=int(epoch),
                batch_in_epoch=int(pos), steps_per_epoch=self.steps_per_epoch,
                global_batch_size=self.global_batch_size)

  def host_batch(self, idx: np.ndarray) -> dict[str, np.ndarray]:
    img = self.caption_to_image[idx]
    batch = dict(image=self.split.images[img], tokens=self.tokens[idx], id=idx.astype(np.int32),
                 clean=self.clean[idx])
    if self.split.image_labels is not None:
      batch["label"] = self.split.image_labels[self.split.caption_to_image[idx]].astype(np.int32)
    return batch

  def global_batch(self, step: int) -> tuple[dict[str, jax.Array], np.ndarray]:
    """(global batch arrays sharded over the mesh, the global example ids of this step)."""
    idx = self.indices(step)
    per_process = self.global_batch_size // jax.process_count()
    local = idx[jax.process_index() * per_process:(jax.process_index() + 1) * per_process]
    host = self.host_batch(local)
    arrays = {k: jax.make_array_from_process_local_data(self.sharding, v, (self.global_batch_size,) + v.shape[1:])
              for k, v in host.items()}
    return arrays, idx
