"""The order of web-scale training data: which pair every (step, position) reads, a pure function of the seed, the
step and the datasets' shard counts — computed on demand, never as an N-long array.

Mixture. Datasets d = 0..D-1 with weights w_d are interleaved in blocks of `block` positions: block b holds exactly
k_d = round(block * w_d) positions of dataset d (largest remainders, so sum k_d = block), arranged by a permutation
drawn from (seed, stream, b). Position t therefore reads dataset d's `q`-th pair with q = (t // block) * k_d + (the
number of d's before t in its block): counts up to any step are closed-form, so resume needs nothing but the step,
and the composition is exact (k_d / block) and recorded with every checkpoint.

Indexed order (stream 0 over the global position step * B + j, the same for any process count): dataset d's
q-th pair is pair `perm_{d,e}(q mod N_d)` of epoch e = q // N_d, perm an on-demand permutation
(ncjax.data.web.permutation) drawn from (seed, d, e): a global shuffle per epoch of each dataset, in O(1) memory. A
dataset whose weight exceeds its share of the pairs simply runs through more of its own epochs (upsampling).

Block order (index mode read in blocks, stream 0 like the indexed order): dataset d's pairs are cut into blocks of
`block` consecutive ids (the last one shorter); epoch e lists the blocks in the order of an on-demand permutation
drawn from (seed, d, e), and its pairs are the blocks' pairs in that order, so dataset d's q-th pair is a pure
function of q and every epoch is still a permutation of the dataset. The web reader then reads a run of consecutive
positions with one ranged request per block, and shuffles a window of them (ncjax.data.web.pipeline).

Streamed order (stream 1 + p over process p's own position step * b + j): process p reads its own samples only.
Epoch e of dataset d lists its shards in the order of a permutation drawn from (seed, d, e); the samples of that
list, N_d in all, are cut into P contiguous runs of N_d // P or N_d // P + 1 (process p takes run p), so that every
sample is read exactly once per epoch over the processes even when shard sizes differ (a shard on a run's border is
read in part by two processes: the second skips into it). With `resample`, shards are drawn with replacement from
(seed, d, p, window) instead (open_clip's --dataset-resampled). The sequence is cut into windows of `window`
shard segments; a window's segments are read interleaved (one sample of each in turn) through a shuffle buffer of
`buffer` samples emptied at the window's end, its draws from (seed, d, p, window). Resuming inside a window
re-reads that window from its start (at most `window` segments) and skips what was already used.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ncjax.data.web.permutation import Permutation

MIX = 0x6D697820       # 'mix '
SHARDS = 0x73686472    # 'shdr'
RESAMPLE = 0x72736D70  # 'rsmp'
BUFFER = 0x62756666    # 'buff'
EPOCH = 0x65706F63     # 'epoc'

ORDER_VERSION = 3      # recorded in checkpoints: a change here reorders every web-scale run (2: streamed epochs are
                       # exact partitions over the processes, 2026-11-25; 3: block reads deal a window across an
                       # epoch's end with no pair twice in a batch, and injected noise's deal with it, 2026-11-27)
BLOCKS = 0x626C6F6B    # 'blok'
GROUPS = 0x67727073    # 'grps'


def block_counts(weights, block: int) -> np.ndarray:
  """Positions of each dataset per block: round(block * w / sum(w)) by largest remainders (sums to block)."""
  w = np.asarray(weights, np.float64)
  if w.ndim != 1 or len(w) == 0 or (w < 0).any() or w.sum() <= 0:
    raise ValueError(f"mixture weights must be non-negative with a positive sum, got {list(weights)}")
  exact = block * w / w.sum()
  counts = np.floor(exact).astype(np.int64)
  short = block - int(counts.sum())
  order = np.argsort(-(exact - counts), kind="stable")
  counts[order[:short]] += 1
  if ((counts == 0) & (w > 0)).any():
    raise ValueError(f"a mixture block of {block} positions gives no position to a dataset of weight "
                     f"{w[(counts == 0) & (w > 0)][0] / w.sum():.2g}: raise input.web.mix_block")
  return counts


@dataclasses.dataclass(frozen=True)
class Mixture:
  """Which dataset, and which of its pairs (the ordinal q), each position of a stream reads."""
  weights: tuple
  block: int
  seed: int

  @functools.cached_property
  def counts(self) -> np.ndarray:
    return block_counts(self.weights, self.block)

  @functools.lru_cache(maxsize=8)
  def arrangement(self, stream: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of each position, its rank among that dataset's positions) in block b of `stream`."""
    counts = self.counts
    labels = np.repeat(np.arange(len(counts)), counts)
    if len(counts) > 1:
      labels = np.random.Generator(np.random.PCG64([self.seed, stream, b, MIX])).permutation(labels)
    rank = np.empty(self.block, np.int64)
    for d in range(len(counts)):
      where = labels == d
      rank[where] = np.arange(int(where.sum()))
    return labels, rank

  def choose(self, stream: int, positions) -> tuple[np.ndarray, np.ndarray]:
    """(dataset, ordinal within it) of each position of `stream`."""
    positions = np.asarray(positions, np.int64)
    if len(self.weights) == 1:
      return np.zeros_like(positions), positions
    blocks, offsets = np.divmod(positions, self.block)
    datasets, ordinals = np.empty_like(positions), np.empty_like(positions)
    for b in np.unique(blocks):
      sel = blocks == b
      labels, rank = self.arrangement(stream, int(b))
      d = labels[offsets[sel]]
      datasets[sel] = d
      ordinals[sel] = int(b) * self.counts[d] + rank[offsets[sel]]
    return datasets, ordinals

  def consumed(self, stream: int, position: int) -> np.ndarray:
    """How many pairs of each dataset positions [0, position) of `stream` read."""
    b, o = divmod(int(position), self.block)
    out = b * self.counts.astype(np.int64)
    if o:
      labels, _ = self.arrangement(stream, b)
      out = out + np.bincount(labels[:o], minlength=len(self.counts))
    return out


class EpochPermutations:
  """Dataset d's ordinal q -> its local pair id: an on-demand permutation of [0, N_d) per epoch of d."""

  def __init__(self, size: int, seed: int, dataset: int):
    self.size, self.seed, self.dataset = int(size), int(seed), int(dataset)
    self._perm = functools.lru_cache(maxsize=4)(lambda e: Permutation(self.size, self.seed, self.dataset, e, EPOCH))

  def __call__(self, ordinals) -> np.ndarray:
    ordinals = np.asarray(ordinals, np.int64)
    epochs, within = np.divmod(ordinals, self.size)
    out = np.empty_like(ordinals)
    for e in np.unique(epochs):
      sel = epochs == e
      out[sel] = self._perm(int(e))(within[sel])
    return out


class BlockOrder:
  """Dataset d's ordinal q -> its local pair id when the data is read in blocks of `block` consecutive ids: epoch
  e = q // N lists the blocks in the order of a permutation drawn from (seed, d, e) (see the module docstring).
  `groups` (a noise.BlockNoise of the dataset) lists units of two blocks instead — the blocks whose captions
  exchange images, which the reader then finds together — in the order of a permutation of the units."""

  def __init__(self, size: int, block: int, seed: int, dataset: int, groups=None):
    self.size, self.block, self.seed, self.dataset = int(size), max(1, int(block)), int(seed), int(dataset)
    self.groups = groups
    if groups is not None:
      if groups.n != self.size or groups.block != self.block:
        raise ValueError(f"block noise of {groups.n} pairs in blocks of {groups.block} for an order of {self.size} "
                         f"pairs in blocks of {self.block}")
      self.unit, self.num_units, self.short = groups.unit, groups.num_units, groups.last_size
    else:
      self.unit, self.num_units = self.block, -(-self.size // self.block)
      self.short = self.size - (self.num_units - 1) * self.block     # the last block's length (== block if whole)
    tags = (BLOCKS,) if groups is None else (BLOCKS, GROUPS)
    self._perm = functools.lru_cache(maxsize=4)(
        lambda e: Permutation(self.num_units, self.seed, self.dataset, e, *tags))

  def __call__(self, ordinals) -> np.ndarray:
    ordinals = np.asarray(ordinals, np.int64)
    epochs, u = np.divmod(ordinals, self.size)
    out = np.empty_like(ordinals)
    k, last = self.unit, self.num_units - 1
    for e in np.unique(epochs):
      sel = epochs == e
      perm = self._perm(int(e))
      at = int(perm.inverse(last))          # where the short unit sits in this epoch's list
      v = u[sel]
      before = v < at * k
      inside = (~before) & (v < at * k + self.short)
      slot = np.where(before, v // k, np.where(inside, at, at + 1 + (v - at * k - self.short) // k))
      within = np.where(before, v % k, np.where(inside, v - at * k, (v - at * k - self.short) % k))
      units = np.asarray(perm(slot), np.int64)
      out[sel] = units * k + within if self.groups is None else self.groups.ids_of_units(units, within)
    return out


@dataclasses.dataclass
class Window:
  """A run of one process's stream: its shard segments (shard, first sample, end sample), their sample count and
  the first stream ordinal."""
  key: tuple
  segments: np.ndarray      # int64 (k, 3)
  start: int
  size: int

  @property
  def shards(self) -> np.ndarray:
    return self.segments[:, 0]


class ShardSchedule:
  """Process p's stream of one dataset as shard segments, cut into windows (see the module docstring)."""

  def __init__(self, counts, seed: int, dataset: int, process: int, processes: int, window: int,
               resample: bool = False):
    self.counts = np.asarray(counts, np.int64)
    self.seed, self.dataset, self.process, self.processes = int(seed), int(dataset), int(process), int(processes)
    self.window, self.resample = max(1, int(window)), bool(resample)
    total = int(self.counts.sum())
    if total == 0:
      raise ValueError(f"dataset {dataset} has no samples")
    # process p's share of every epoch: samples [lo, hi) of the epoch's shard list (the same length every epoch)
    self.lo, self.hi = self.process * total // self.processes, (self.process + 1) * total // self.processes
    if not resample and self.hi <= self.lo:
      raise ValueError(f"dataset {dataset} has {total} samples for {processes} processes: each process streams its "
                       f"own share, so set input.web.resample=True (shards drawn with replacement) or read it "
                       f"indexed (input.web.mode='index')")
    self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

  @property
  def epoch_size(self) -> int:
    """Samples this process reads per epoch of the dataset: N // P or N // P + 1."""
    return self.hi - self.lo

  def epoch_segments(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """((k, 3) segments of this process in `epoch`, cumulative sample counts of its windows, starting at 0)."""
    if epoch not in self._epochs:
      perm = Permutation(len(self.counts), self.seed, self.dataset, epoch, SHARDS)
      order = np.asarray(perm(np.arange(len(self.counts))), np.int64)
      ends = np.cumsum(self.counts[order])
      begins = ends - self.counts[order]
      take = (ends > self.lo) & (begins < self.hi)
      shards = order[take]
      first = np.maximum(self.lo - begins[take], 0)
      last = np.minimum(self.hi - begins[take], self.counts[shards])
      segments = np.stack([shards, first, last], axis=1).astype(np.int64)
      sizes = last - first
      bounds = np.concatenate([[0], np.cumsum([sizes[i:i + self.window].sum()
                                                for i in range(0, len(segments), self.window)])]).astype(np.int64)
      if len(self._epochs) > 8:
        self._epochs.pop(next(iter(self._epochs)))
      self._epochs[epoch] = (segments, bounds)
    return self._epochs[epoch]

  def resampled_window(self, w: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64([self.seed, self.dataset, self.process, w, RESAMPLE]))
    shards = rng.integers(0, len(self.counts), self.window)
    return np.stack([shards, np.zeros_like(shards), self.counts[shards]], axis=1).astype(np.int64)

  def window_at(self, ordinal: int) -> Window:
    """The window holding stream ordinal `ordinal` of this process."""
    ordinal = int(ordinal)
    if self.resample:
      w, start = 0, 0
      while True:   # windows are O(window * shard size) samples: a few thousand steps of walking at most
        segments = self.resampled_window(w)
        size = int((segments[:, 2] - segments[:, 1]).sum())
        if ordinal < start + size:
          return Window(("r", w), segments, start, size)
        start += size
        w += 1
    epoch, within = divmod(ordinal, self.epoch_size)
    segments, bounds = self.epoch_segments(epoch)
    i = int(np.searchsorted(bounds, within, side="right") - 1)
    return Window(("e", epoch, i), segments[i * self.window:(i + 1) * self.window],
                  epoch * self.epoch_size + int(bounds[i]), int(bounds[i + 1] - bounds[i]))

  def next_window(self, window: Window) -> Window:
    if self.resample:   # without walking from the first window again
      w = int(window.key[1]) + 1
      segments = self.resampled_window(w)
      return Window(("r", w), segments, window.start + window.size, int((segments[:, 2] - segments[:, 1]).sum()))
    return self.window_at(window.start + window.size)

  def buffer_rng(self, window: Window) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([self.seed, self.dataset, self.process, *[
        int(x) for x in window.key[1:]], 1 if window.key[0] == "r" else 0, BUFFER]))


def interleave(iterators):
  """One item of each iterator in turn; an exhausted one drops out."""
  live = list(iterators)
  while live:
    keep = []
    for it in live:
      try:
        yield next(it)
      except StopIteration:
        continue
      keep.append(it)
    live = keep


def buffer_shuffle(items, size: int, rng: np.random.Generator):
  """A shuffle buffer of `size` items, emptied in a random order at the end: deterministic given the rng."""
  buf = []
  draws, k = np.empty(0, np.int64), 0
  for x in items:
    if len(buf) < size:
      buf.append(x)
      continue
    if k == len(draws):
      draws, k = rng.integers(0, size, 4096), 0
    r = int(draws[k])
    k += 1
    out, buf[r] = buf[r], x
    yield out
  for i in rng.permutation(len(buf)):
    yield buf[i]
