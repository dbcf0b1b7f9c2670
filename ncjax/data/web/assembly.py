"""The assembly of a web run's batches (ncjax.data.web.pipeline): the decoder of a process's examples, its host
batch from the decoded examples (a bad record replaced by a repeat, or raised), the bound on bad records
(`SkipGuard`), and the global batch over the mesh."""

from __future__ import annotations

import dataclasses
import logging
import math

import jax
import numpy as np

from ncjax.data.pipeline import HOST_ONLY_PREFIX, BadRecordError
from ncjax.data.web import decode as web_decode

log = logging.getLogger("ncjax")


def assemble(step: int, specs: list, decoded, on_bad_record: str, describe) -> dict:
  """This process's host batch of `step` from its decoded examples: a bad one counted and replaced by the next
  usable example of the batch (cyclically), or raised with on_bad_record='raise' (`describe(id)` says where the
  record lies)."""
  images, tokens, errors = decoded
  b = len(specs)
  good = [k for k in range(b) if errors[k] is None]
  bad = [k for k in range(b) if errors[k] is not None]
  if bad and on_bad_record == "raise":
    k = bad[0]
    raise BadRecordError(f"bad training record id {specs[k].id} ({describe(specs[k].id)}): {errors[k]}")
  if not good:
    raise BadRecordError(f"step {step}: none of this process's {b} pairs is usable (e.g. id {specs[0].id}: "
                         f"{errors[0]})")
  source = np.arange(b)
  for k in bad:
    later = [g for g in good if g > k]
    source[k] = later[0] if later else good[0]
    log.debug("bad web record id %d: %s", specs[k].id, errors[k])
  ids = np.asarray([specs[k].id for k in source], np.int32)
  clean = np.asarray([specs[k].clean for k in source], np.bool_)
  if bad:
    images, tokens = images[source], tokens[source]
  return dict(image=images, tokens=tokens, id=ids, clean=clean, _skipped=np.asarray(len(bad), np.int32))


def make_decoder(settings: web_decode.DecodeSettings, tokenizer, *, workers: int, num_threads: int, prefetch: int):
  """(decoder, context length): `workers` spawned processes writing into shared memory, else `num_threads`
  threads."""
  context = tokenizer.context_length
  if workers > 0:
    settings = dataclasses.replace(settings, tokenizer_json=tokenizer.to_json())
    return web_decode.ProcessDecoder(settings, workers, buffers=prefetch + 3), context
  return web_decode.ThreadDecoder(settings, tokenizer, num_threads), context


def to_global(host: dict, sharding, global_batch_size: int) -> dict:
  """The global batch arrays of this process's host batch (host-only keys left out)."""
  return {k: jax.make_array_from_process_local_data(sharding, v, (global_batch_size,) + v.shape[1:])
          for k, v in host.items() if not k.startswith(HOST_ONLY_PREFIX)}


class SkipGuard:
  """input.web.max_skipped_fraction: stop the run, in one line, once more than this fraction of the pairs read
  since it started were bad records (each replaced by a repeat) — a fault of this size is a bug to fix or data to
  repair, never a quiet change of what is trained. Judged once 10 / fraction pairs were read (1,000 at the default
  0.01), so that one bad record early on does not stop a run; fraction 0 stops at the first."""

  def __init__(self, fraction: float):
    self.fraction, self.read, self.skipped = float(fraction), 0, 0
    self.after = 1 if self.fraction == 0 else math.ceil(10 / self.fraction)

  def add(self, pairs: int, skipped: int) -> None:
    self.read += int(pairs)
    self.skipped += int(skipped)
    if self.fraction < 1 and self.read >= self.after and self.skipped > self.fraction * self.read:
      raise BadRecordError(f"{self.skipped} of the {self.read} web pairs read since the run started were bad records "
                           f"({100 * self.skipped / self.read:.2f}% > input.web.max_skipped_fraction="
                           f"{self.fraction:g}), each replaced by a repeat: input.on_bad_record='raise' names the "
                           f"first one; repair or re-index the data, or raise input.web.max_skipped_fraction")
