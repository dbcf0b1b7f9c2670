"""Streamed reading of one dataset by one process: its shard segments read front to back, interleaved and shuffled in
a buffer, in the order `mixture.ShardSchedule` gives (input.web.mode='stream'; ncjax.data.web.pipeline runs it)."""

from __future__ import annotations

import numpy as np

from ncjax.data.web import dataset as web
from ncjax.data.web import mixture as mix_lib


class StreamReader:
  """Process p's stream of one dataset: its ordinal q -> Sample, read front to back (ordinals asked in increasing
  order; an earlier one, as after a resume, re-positions at the start of its window)."""

  def __init__(self, ds: web.WebDataset, schedule: mix_lib.ShardSchedule, buffer: int, kept=None):
    self.ds, self.schedule, self.buffer, self.kept = ds, schedule, int(buffer), kept
    self.window, self.it, self.next = None, None, 0

  def _segment(self, s: int, a: int, b: int):
    """Samples [a, b) of shard s; filtered (input.web.filter), its kept samples of ranks [a, b) within the shard."""
    if self.kept is None:
      return self.ds.iter_shard(s, a, b)
    if a >= b:
      return iter(())
    base = int(self.ds.starts[s])
    first_rank = int(self.kept.rank_at([base])[0])
    ids = self.kept.select(np.asarray([first_rank + a, first_rank + b - 1]))
    return (x for x in self.ds.iter_shard(s, int(ids[0]) - base, int(ids[1]) - base + 1)
            if self.kept.contains([x.id])[0])

  def _open(self, window):
    shards = [self._segment(int(s), int(a), int(b)) for s, a, b in window.segments]
    self.window = window
    self.it = mix_lib.buffer_shuffle(mix_lib.interleave(shards), self.buffer, self.schedule.buffer_rng(window))
    self.next = window.start

  def close(self) -> None:
    """Close the window's shards (their files); the next `take` opens its window again."""
    if self.it is not None:
      self.it.close()
    self.window, self.it = None, None

  def take(self, q: int) -> web.Sample:
    q = int(q)
    w = self.window
    if w is None or q < self.next or q >= w.start + w.size:
      nxt = self.schedule.next_window(w) if w is not None and q >= w.start + w.size else None
      if nxt is None or not nxt.start <= q < nxt.start + nxt.size:
        nxt = self.schedule.window_at(q)
      self._open(nxt)
    while self.next < q:   # skip what was already used (resume inside a window)
      next(self.it)
      self.next += 1
    self.next += 1
    return next(self.it)
