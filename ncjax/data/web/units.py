"""The reading units of a web run (ncjax.data.web.pipeline): the ranged reads of one step (read 'pair', stream)
or of one window (read 'block'), and how their bytes become those steps' examples — a caption with the image the
noise shows it (`ExampleSpec`s for ncjax.data.web.decode). Read 'pair' reads each pair and each noisy pair's partner
with a request of its own; read 'block' reads each block the window touches whole (a filtered block: its kept pairs,
cut where the unread bytes between two are worth more than a request); streamed, the process's `StreamReader`s
read their shard segments, and a unit only takes the next samples. Which ids a step holds is ncjax.data.web.order's.
"""

from __future__ import annotations

import numpy as np

from ncjax.data.web import dataset as web
from ncjax.data.web import decode as web_decode
from ncjax.data.web import store
from ncjax.data.web.order import WebOrder
from ncjax.data.web.stages import Unit


class Units:
  """The units of a web run's steps (`units(start, stop)`), each the reads it needs and a `build(raw)` that turns
  their bytes into its steps' examples."""

  def __init__(self, datasets: list[web.WebDataset], order: WebOrder, kept, readers=None, split_gap_bytes: int = 0):
    self.datasets, self.order, self.kept, self.readers = datasets, order, kept, readers
    self.offsets, self.noise, self.seed, self.block = order.offsets, order.noise, order.seed, order.block
    self.mode, self.read = order.mode, order.read
    self.process_index, self.local_batch_size = order.process_index, order.local_batch_size
    self.split_gap_bytes = int(split_gap_bytes)
    self.measured_gap = None   # (path -> bytes): the reader's RequestCost, set by the run that reads (-1 above)

  def _locate(self, gid: int) -> tuple[int, int]:
    d = int(np.searchsorted(self.offsets, gid, side="right") - 1)
    return d, int(gid - self.offsets[d])

  def describe(self, gid: int) -> str:
    d, j = self._locate(gid)
    ds = self.datasets[d]
    s, k = ds.locate(j)
    return f"{ds.shards[int(s)]} sample {int(k)}"

  def _runs(self, gids) -> list:
    """(dataset, ranges per shard touched) of runs of consecutive global ids, each within one dataset."""
    out = []
    for first, last in gids:
      d, j = self._locate(first)
      ds = self.datasets[d]
      for s, a, b_, lo, n in ds.index.run_ranges(ds, j, j + (last - first)):
        out.append((d, s, a, b_, lo, n, store.Range(ds.shards[s], a, b_, ds.version_of(s))))
    return out

  def _cut(self, d: int, first: int, last: int) -> list[tuple[int, int]]:
    """Dataset d's ids [first, last] (a filtered block) as [start, end) spans of ids: one, unless the unread bytes
    between two consecutive kept pairs exceed input.web.split_gap_bytes (-1: measured, RequestCost.gap_bytes),
    where the span is cut in two."""
    ds, kept = self.datasets[d], self.kept[d]
    ids = np.flatnonzero(kept.flags(first, last + 1)) + first
    limit = self.split_gap_bytes
    if limit < 0:   # measured: the bytes one request's own cost would read on this store
      limit = self.measured_gap(ds.root) if self.measured_gap is not None else -1
    if len(ids) < 2 or limit <= 0:
      return [(first, last + 1)]
    offsets = np.asarray(ds.index.offsets[np.minimum(np.concatenate([ids, ids + 1]), ds.num_examples - 1)],
                         np.int64)
    starts, ends = offsets[:len(ids)], offsets[len(ids):]
    missing = int(ds.index.missing)
    gap = starts[1:] - ends[:-1]                       # bytes from the end of one kept pair to the next one's start
    shard = np.searchsorted(ds.starts, ids, side="right")
    cut = (gap > limit) & (starts[1:] != missing) & (ends[:-1] != missing) & \
        (shard[1:] == shard[:-1])                     # (across a shard's end the run is split anyway)
    bounds = np.flatnonzero(cut) + 1
    pieces = np.split(ids, bounds)
    return [(int(p[0]), int(p[-1]) + 1) for p in pieces]

  def _single_runs(self, gids: np.ndarray) -> list:
    """_runs of single ids, computed for all of them at once (read 'pair': a step's ids in one pass)."""
    out = []
    dsets = np.searchsorted(self.offsets, gids, side="right") - 1
    for d in np.unique(dsets):
      ds = self.datasets[d]
      local = gids[dsets == d] - self.offsets[d]
      shards, starts, ends = ds.index.sample_ranges(ds, local)
      for j, s, a, b_ in zip(local.tolist(), shards.tolist(), starts.tolist(), ends.tolist()):
        if a >= 0:   # a sample its tar lacks is not read (it reads as a bad record)
          out.append((int(d), s, a, b_, j, 1, store.Range(ds.shards[s], a, b_, ds.version_of(s))))
    return out

  def _samples_of(self, runs, raw) -> dict:
    """{global id: Sample} from the bytes of `runs`."""
    out = {}
    for (d, s, a, _, lo, n, _), data in zip(runs, raw):
      ds = self.datasets[d]
      for j, sample in web.parse_run(ds, s, a, lo, n, data).items():
        sample.id = int(self.offsets[d] + j)
        out[sample.id] = sample
    return out

  def _missing(self, gid: int) -> web.Sample:
    d, j = self._locate(gid)
    return web.Sample(gid, bad=self.datasets[d]._missing_reason(j))

  def _spec(self, gid: int, partner: int, samples: dict, crop: tuple) -> web_decode.ExampleSpec:
    """The example of caption `gid` shown with the image of pair `partner` (itself unless the noise says another)."""
    d, _ = self._locate(gid)
    sample = samples.get(gid) or self._missing(gid)
    image = sample if partner == gid else (samples.get(partner) or self._missing(partner))
    bad = sample.bad or (f"the image of pair {image.id} (shown with this caption by the noise): {image.bad}"
                         if image.bad else "")
    own = self.datasets[d].own_clean(sample) if not bad else True
    return web_decode.ExampleSpec(int(gid), sample.caption, image.image, crop, bool(own and image is sample), bad)

  def _pair_unit(self, step: int) -> Unit:
    """Read 'pair': one step, one ranged read per pair and per noisy pair's partner."""
    first = self.process_index * self.local_batch_size
    ids = self.order.local_ids(step, self.process_index)
    partners = self.noise.image_of(ids) if self.noise is not None else ids   # the whole batch at once
    wanted = np.unique(np.concatenate([ids, partners]))
    runs = self._single_runs(wanted)

    def build(raw):
      samples = self._samples_of(runs, raw)
      return [[self._spec(int(g), int(p), samples, (self.seed, step, first + k))
               for k, (g, p) in enumerate(zip(ids.tolist(), partners.tolist()))]]

    return Unit([step], [r[-1] for r in runs], build)

  def _block_unit(self, window: int, start: int, stop: int) -> Unit:
    """Read 'block': the steps of window `window` in [start, stop), from this process's share of the window, each
    block it touches read whole with one request (two where it crosses a shard's end)."""
    G, b = self.order.steps_per_window, self.local_batch_size
    first = self.process_index * b
    ids, perm = self.order.window_share(window, self.process_index)
    steps = [s for s in range(window * G, (window + 1) * G) if start <= s < stop]
    used = np.concatenate([ids[perm[(s - window * G) * b:(s - window * G + 1) * b]] for s in steps])
    if self.noise is not None:   # the partners' blocks: mostly read anyway (the order lists a group's blocks together)
      used = np.unique(np.concatenate([used, self.noise.image_of(used)]))
    spans = []
    for d in np.unique(np.searchsorted(self.offsets, used, side="right") - 1):
      local = used[(used >= self.offsets[d]) & (used < self.offsets[d + 1])] - self.offsets[d]
      kept = self.kept[d]
      if kept is None:
        for blk in np.unique(local // self.block):
          lo = int(self.offsets[d] + blk * self.block)
          spans.append((lo, int(min(lo + self.block, self.offsets[d + 1]))))
      else:   # a block of consecutive kept ranks: the ids from its first to its last kept pair, one request —
        # cut where the bytes between two kept pairs are worth more than a request (input.web.split_gap_bytes)
        blocks = np.unique(kept.rank(local) // self.block)
        firsts = kept.select(blocks * self.block)
        lasts = kept.select(np.minimum((blocks + 1) * self.block, kept.kept) - 1)
        for lo, hi in zip(firsts.tolist(), lasts.tolist()):
          spans.extend((int(self.offsets[d] + x), int(self.offsets[d] + y)) for x, y in self._cut(d, lo, hi))
    runs = self._runs(spans)

    def build(raw):
      samples = self._samples_of(runs, raw)
      out = []
      for s in steps:
        batch = ids[perm[(s - window * G) * b:(s - window * G + 1) * b]]
        partners = self.noise.image_of(batch) if self.noise is not None else batch
        out.append([self._spec(int(g), int(p), samples, (self.seed, s, first + k))
                    for k, (g, p) in enumerate(zip(batch, partners))])
      return out

    return Unit(steps, [r[-1] for r in runs], build)

  def _stream_unit(self, step: int) -> Unit:
    first, b = self.process_index * self.local_batch_size, self.local_batch_size
    positions = step * b + np.arange(b, dtype=np.int64)

    def build(raw):
      del raw
      datasets, ordinals = self.order.mixture.choose(self.order.stream(), positions)
      specs = []
      for k, (d, q) in enumerate(zip(datasets, ordinals)):
        sample = self.readers[d].take(int(q))
        gid = int(self.offsets[d] + sample.id)
        sample.id = gid
        specs.append(self._spec(gid, gid, {gid: sample}, (self.seed, step, first + k)))
      return [specs]

    return Unit([step], [], build)

  def units(self, start_step: int, stop_step: int):
    """The units of steps [start_step, stop_step), in order."""
    if self.mode == "stream":
      for s in range(start_step, stop_step):
        yield self._stream_unit(s)
    elif self.read == "pair":
      for s in range(start_step, stop_step):
        yield self._pair_unit(s)
    else:
      G = self.order.steps_per_window
      for g in range(start_step // G, (stop_step - 1) // G + 1 if stop_step > start_step else 0):
        yield self._block_unit(g, start_step, stop_step)
