"""The order of a web run (ncjax.data.web.pipeline): which ids each step's global batch holds, a pure function of
(seed, step) and, where the reading is block-wise or streamed, the process count.

Index mode, read 'pair': the global batch of step s is positions [s B, (s + 1) B) of the mixture's stream 0
(ncjax.data.web.mixture), each dataset's position turned into an id by its epoch's on-demand permutation; process p
reads its contiguous part. Read 'block': the same positions through the block order (mixture.BlockOrder), grouped
into windows of `steps_per_window` steps; process p takes its contiguous share of the window's positions and deals
it into its G local batches by a permutation drawn from (seed, window, p, P) — with injected noise, a deal that keeps
each noisy caption's own image out of its batch (ncjax.data.web.noise_deal). Stream mode: process p's own stream of
the mixture; its ids are known only once read (ncjax.data.web.units). A filter's order runs over the kept ranks.
"""

from __future__ import annotations

import math

import numpy as np

from ncjax.data.noise import BlockNoise, DatasetNoise
from ncjax.data.web import mixture as mix_lib
from ncjax.data.web.noise_deal import separate_own_images

WINDOW_TAG = 0x77696E64   # 'wind'


def steps_per_window(read: str, shuffle_pairs: int, local_batch_size: int, window_batches: int,
                     steps_per_epoch: int) -> int:
  """Read 'block': at least `window_batches` batches (a batch then holds ~block / window_batches pairs of a block)
  and enough for `shuffle_pairs` pairs per process, at most an epoch's (a window never mixes more than two epochs).
  Other reads: 1."""
  if read != "block":
    return 1
  return max(1, min(max(math.ceil(int(shuffle_pairs) / local_batch_size), window_batches), steps_per_epoch))


def noise_part(noise, d: int):
  """Dataset d's block noise (its groups are the block order's units), None without block noise."""
  if isinstance(noise, BlockNoise):
    return noise
  if isinstance(noise, DatasetNoise):
    return noise.parts[d]
  return None


class KeptOrder:
  """A filtered dataset's order: the unfiltered order's permutation over the kept ranks, then the kept id of each
  rank (ncjax.data.web.subset.KeptSet.select)."""

  def __init__(self, order, kept):
    self.order, self.kept = order, kept

  def __call__(self, ordinals) -> np.ndarray:
    return self.kept.select(self.order(ordinals))


class WebOrder:
  """The ids of every step of a web run (index mode), this process's stream (stream mode)."""

  def __init__(self, mixture: mix_lib.Mixture, offsets: np.ndarray, order_sizes, kept, noise, *, mode: str,
               read: str, block: int, seed: int, global_batch_size: int, process_index: int, process_count: int,
               steps_per_window: int):
    self.mixture, self.offsets, self.noise, self.order_sizes = mixture, offsets, noise, order_sizes
    self.mode, self.read, self.block, self.seed = mode, read, block, seed
    self.global_batch_size, self.process_index, self.process_count = global_batch_size, process_index, process_count
    self.local_batch_size = global_batch_size // process_count
    self.steps_per_window = steps_per_window
    if mode == "index":
      orders = [mix_lib.BlockOrder(n, block, seed, d, noise_part(noise, d)) if read == "block"
                else mix_lib.EpochPermutations(n, seed, d) for d, n in enumerate(order_sizes)]
      self.orders = [order if k is None else KeptOrder(order, k) for order, k in zip(orders, kept)]
    self._shares: dict = {}

  def stream(self) -> int:
    """The mixture's stream this process reads: 0 (shared by every process) in index mode, its own when streamed."""
    return 0 if self.mode == "index" else 1 + self.process_index

  def ids_at(self, positions) -> np.ndarray:
    """Global ids of global positions of stream 0 (index mode)."""
    datasets, ordinals = self.mixture.choose(0, np.asarray(positions, np.int64))
    out = np.empty(len(ordinals), np.int64)
    for d in np.unique(datasets):
      sel = datasets == d
      out[sel] = self.offsets[d] + self.orders[d](ordinals[sel])
    return out

  def window_share(self, window: int, process: int) -> tuple[np.ndarray, np.ndarray]:
    """Block read: (the ids of process `process`'s share of window `window`, in sequence order; the permutation
    that deals them out to the window's steps — with injected noise, one that keeps each noisy caption's own image
    out of its batch)."""
    key = (int(window), int(process))
    if key not in self._shares:
      g, b, G = int(window), self.local_batch_size, self.steps_per_window
      first = g * G * self.global_batch_size + process * G * b
      ids = self.ids_at(first + np.arange(G * b, dtype=np.int64))
      rng = np.random.Generator(np.random.PCG64([self.seed, g, process, self.process_count, WINDOW_TAG]))
      perm = rng.permutation(G * b)
      crossing = self.crosses_an_epoch(g)
      if G > 1 and (self.noise is not None or crossing):
        # a pair may meet a related pair in another process's share: one of a group of blocks straddling two
        # shares (the neighbours'), or, in a window across an epoch's end, a copy of it in any share
        others = [q for q in range(self.process_count) if q != process and (crossing or abs(q - process) == 1)]
        near = [(q > process, self.ids_at(g * G * self.global_batch_size + q * G * b +
                                          np.arange(G * b, dtype=np.int64))) for q in others]
        perm = separate_own_images(ids, perm, b, rng, self.noise, near)
      if len(self._shares) >= 8:
        self._shares.pop(next(iter(self._shares)))
      self._shares[key] = (ids, perm)
    return self._shares[key]

  def crosses_an_epoch(self, window: int) -> bool:
    """Whether window `window`'s positions hold the end of one epoch of a dataset and the start of the next (its
    pairs then twice, at most once per epoch)."""
    span = self.steps_per_window * self.global_batch_size
    first = self.mixture.consumed(0, window * span)
    last = self.mixture.consumed(0, (window + 1) * span)
    sizes = np.maximum(np.asarray(self.order_sizes, np.int64), 1)
    return bool(np.any((last > first) & (first // sizes != (last - 1) // sizes)))

  def local_ids(self, step: int, process: int) -> np.ndarray:
    """Index mode: the ids of process `process`'s part of step `step`'s global batch."""
    b = self.local_batch_size
    if self.read == "block":
      g, k = divmod(int(step), self.steps_per_window)
      ids, perm = self.window_share(g, process)
      return ids[perm[k * b:(k + 1) * b]]
    return self.ids_at(step * self.global_batch_size + process * b + np.arange(b, dtype=np.int64))

  def indices(self, step: int) -> np.ndarray:
    """Index mode: the global example ids of step `step`'s global batch (before bad-record substitution)."""
    if self.mode != "index":
      raise ValueError("the global batch's ids are known without reading only in index mode")
    return np.concatenate([self.local_ids(step, p) for p in range(self.process_count)])

  def consumed(self, step: int) -> np.ndarray:
    """The pairs of each dataset read before `step` (index mode: by all processes; stream mode: by this one)."""
    upto = step * (self.global_batch_size if self.mode == "index" else self.local_batch_size)
    return self.mixture.consumed(self.stream(), upto)
