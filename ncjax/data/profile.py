"""The data-derived settings' measurements (`DataProfile`), made once per run on its training pairs: how often a
caption text is shared by several pairs and how many steps an epoch is — what a method's data-derived settings are
chosen from (GSC's cross-modal indicator: ncjax.methods.gsc.GSCOptions.from_data; NCU's prompt-stage length:
ncjax.methods.ncu.NCUOptions.from_data)."""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass(frozen=True)
class DataProfile:
  """What a method's data-derived settings ('auto', `Options.from_data`) are chosen from, measured on the run's
  training pairs: how many other pairs of a global batch have a pair's exact caption, on average (embedded digits:
  0.90 at batch 256; scenes and web captions: 0.00), over how many captions it was counted, the global batch, and
  the steps of one epoch of this data at that batch (0: not known)."""
  shared_captions_per_batch: float
  captions: int
  global_batch_size: int
  steps_per_epoch: int = 0


def caption_profile(captions, global_batch_size: int, steps_per_epoch: int = 0) -> DataProfile:
  """DataProfile of these captions (all of the data's, or a sample of them: the batch share is the same formula).

  A pair whose caption text c is held by n_c pairs meets (n_c - 1) (B - 1) / (N - 1) of them in a global batch of B
  drawn from N pairs; the profile is its mean over the pairs."""
  texts = [" ".join(str(c).lower().split()) for c in captions]
  n = len(texts)
  if n < 2:
    return DataProfile(0.0, n, int(global_batch_size), int(steps_per_epoch))
  counts = collections.Counter(texts)
  others = sum(k * (k - 1) for k in counts.values()) / n          # mean over pairs of (n_c - 1)
  return DataProfile(float(others * (global_batch_size - 1) / (n - 1)), n, int(global_batch_size),
                     int(steps_per_epoch))
