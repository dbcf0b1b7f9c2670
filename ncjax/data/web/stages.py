"""The web reader's three stages, connected by bounded queues (ncjax.data.web.pipeline builds what flows through):

  fetch thread   units in order; the ranged reads of the next `readahead` units submitted at once (a store that
                 takes 30 ms per request is kept busy), each unit's bytes turned into its steps' example specs
  decode thread  each step's specs made into arrays (two steps in flight: worker processes never wait between
                 batches) and assembled into the host batch
  the caller     takes finished batches, `prefetch` ahead

An error in either thread reaches the caller, in order, as an exception; closing the generator stops both threads
(within 0.1 s, or when a read in flight ends) and calls `on_close`.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading


@dataclasses.dataclass
class Unit:
  """Steps `steps` of this process: the ranged reads they need (`ranges`, submitted ahead) and `build(raw)`, which
  turns the bytes read into each step's list of ExampleSpecs."""
  steps: list
  ranges: list
  build: object


class _Stop(Exception):
  pass


def run(units, submit, start_batch, *, prefetch: int, readahead: int, on_close=None, decode_ahead: int = 2):
  """Yields the batch of every step of `units`, in order. `submit(ranges)` starts a unit's reads and returns a handle
  whose result() is their bytes; `start_batch(step, specs)` starts making a step's batch and returns a handle whose
  result() is the batch."""
  specs_q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
  out_q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
  stop = threading.Event()
  done = object()

  def put(q, item):
    while not stop.is_set():
      try:
        q.put(item, timeout=0.1)
        return
      except queue.Full:
        continue
    raise _Stop

  def get(q):
    while not stop.is_set():
      try:
        return q.get(timeout=0.1)
      except queue.Empty:
        continue
    raise _Stop

  def forward_error(q, e):
    try:
      put(q, e)
    except _Stop:
      pass

  def fetch():
    try:
      inflight = collections.deque()
      more = True
      while True:
        while more and len(inflight) < max(1, readahead):
          unit = next(units, None)
          if unit is None:
            more = False
            break
          inflight.append((unit, submit(unit.ranges)))
        if not inflight:
          break
        unit, handle = inflight.popleft()
        raw = handle.result()
        for step, specs in zip(unit.steps, unit.build(raw)):
          put(specs_q, (step, specs))
      put(specs_q, done)
    except _Stop:
      pass
    except BaseException as e:   # surfaced in the caller, after the batches before it
      forward_error(specs_q, e)

  def decode():
    try:
      pending = collections.deque()
      while True:
        # hand on the oldest batch when the next step's specs are not there yet (no batch waits on a slow read)
        if pending and (len(pending) >= max(1, decode_ahead) or specs_q.empty()):
          put(out_q, pending.popleft().result())
          continue
        item = get(specs_q)
        if item is done or isinstance(item, BaseException):
          while pending:
            put(out_q, pending.popleft().result())
          put(out_q, item)
          return
        step, specs = item
        pending.append(start_batch(step, specs))
    except _Stop:
      pass
    except BaseException as e:
      forward_error(out_q, e)

  threads = [threading.Thread(target=fetch, name="ncjax-web-fetch", daemon=True),
             threading.Thread(target=decode, name="ncjax-web-decode", daemon=True)]
  for t in threads:
    t.start()
  try:
    while True:
      item = out_q.get()
      if item is done:
        return
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    stop.set()
    threads[1].join(timeout=30)
    threads[0].join(timeout=1)
    if on_close is not None:
      on_close()
