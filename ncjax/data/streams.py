"""The data layer's random streams, independent of one another by construction.

  noise  PCG64(noise.seed)                            which captions are shuffled (ncjax.data.noise; unchanged, so
                                                      every recorded noise index and its sha256 stay valid)
  order  PCG64([input.shuffle_seed, epoch, ORDER])    the permutation of epoch `epoch`
  crop   PCG64([input.shuffle_seed, step, j, CROP])   the random resized crop of example j of step `step`

Why the tags: numpy's SeedSequence pads its entropy with zeros before mixing, so the seeds `s`, `[s, 0]` and
`[s, 0, 0]` are the same generator. Until 2026-11-23 the order of epoch 0 was drawn from `[seed, 0]` and the noise
from `seed`; NC-bench sets both seeds to the cell's seed and both default to 0, so the permutation that chose the
noisy captions also ordered epoch 0: its first floor(r N) examples were exactly the noisy pairs. A nonzero tag in
a position no other stream leaves at zero makes every stream differ from the noise stream and from each other.
"""

from __future__ import annotations

import numpy as np

# ASCII 'ordr' and 'crop': arbitrary, nonzero, and never changed (a change reorders every run).
ORDER = 0x6F726472
CROP = 0x63726F70

# Recorded in each checkpoint's data-iterator state: a run resumed under another order version warns.
ORDER_VERSION = 2


def order_rng(seed: int, epoch: int) -> np.random.Generator:
  """The generator of epoch `epoch`'s permutation."""
  return np.random.Generator(np.random.PCG64([int(seed), int(epoch), ORDER]))


def crop_rng(seed: int, step: int, position: int) -> np.random.Generator:
  """The generator of the augmentation of the example at global position `position` of step `step`'s batch."""
  return np.random.Generator(np.random.PCG64([int(seed), int(step), int(position), CROP]))
