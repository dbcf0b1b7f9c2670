"""The noise deal of block reads: a window's pairs dealt into batches so that no noisy caption meets its own image
(`separate_own_images`), what the loss then sees of the injected noise (`block_noise_statistics`,
benchmarks/web_noise.py) and the one line that describes the noise (`describe_noise`). The noise itself (which
caption shows which image) is `ncjax.data.noise.BlockNoise`; the order that reads it, ncjax.data.web.order."""

from __future__ import annotations

import numpy as np

from ncjax.data.noise import BlockNoise, DatasetNoise


def separate_own_images(ids: np.ndarray, perm: np.ndarray, b: int, holder: np.ndarray, rng: np.random.Generator,
                        image: np.ndarray | None = None, neighbours=()) -> np.ndarray:
  """A deal of a window's pairs into batches of b (batch k: ids[perm[k b:(k+1) b]]) in which no noisy caption
  meets its own image: pair i's image is shown with caption holder[i] (and i's caption with image[i]'s image), so
  i and holder[i] go to different batches. Each conflict of the random deal `perm` moves the holder to a random slot
  of another batch, swapping it with a pair that has no conflict there. A pair whose holder or partner lies in
  another process's share of the window (`neighbours`: (is that process after this one, its share's ids)) goes to
  an odd batch if that process comes after this one, else to an even one — the other process puts it on the
  opposite parity, so the two never share a global batch. Needs three batches or more per window."""
  n = len(ids)
  order = np.argsort(ids, kind="stable")
  sorted_ids = ids[order]

  def index_of(values):
    pos = np.minimum(np.searchsorted(sorted_ids, values), n - 1)
    return np.where(sorted_ids[pos] == values, order[pos], -1)

  moved = holder != ids
  hidx = np.where(moved, index_of(holder), -1)         # the index of the caption showing i's image
  shown = np.full(n, -1, np.int64)
  shown[hidx[hidx >= 0]] = np.flatnonzero(hidx >= 0)    # the index of the pair whose image i's caption shows
  parity = np.full(n, -1, np.int64)                    # the batch parity a pair must have (-1: any)
  if image is not None:
    for after, other in neighbours:
      outside = np.isin(holder, other) | np.isin(image, other)
      parity[moved & outside] = 1 if after else 0
  slot = np.empty(n, np.int64)
  slot[perm] = np.arange(n)
  perm = perm.copy()
  G = n // b

  def fits(i, k):
    """May pair i sit in batch k (its neighbours where they are now, its parity)?"""
    if parity[i] >= 0 and G > 1 and k % 2 != parity[i]:
      return False
    return not any(j >= 0 and slot[j] // b == k for j in (hidx[i], shown[i]))

  def relocate(x):
    """Swap pair x into a random slot of another batch where both it and the pair it displaces fit."""
    for _ in range(256):
      s_new = int(rng.integers(n))
      e = int(perm[s_new])
      old = slot[x] // b
      if s_new // b == old or e in (hidx[x], shown[x]):
        continue
      slot[x], slot[e] = s_new, slot[x]
      if fits(x, s_new // b) and fits(e, old):
        perm[slot[x]], perm[slot[e]] = x, e
        return
      slot[x], slot[e] = slot[e], s_new   # undo

  for x in np.flatnonzero((parity >= 0) & ((slot // b) % 2 != parity)).tolist():
    if G > 1 and (slot[x] // b) % 2 != parity[x]:
      relocate(x)
  batch_of = slot // b
  conflicts = np.flatnonzero((hidx >= 0) & (batch_of == np.where(hidx >= 0, batch_of[np.maximum(hidx, 0)], -1)))
  for i in conflicts.tolist():
    x = int(hidx[i])
    if slot[x] // b == slot[i] // b:
      relocate(x if parity[x] < 0 or parity[i] >= 0 else i)
  return perm


def block_noise_statistics(data, steps) -> dict:
  """What the loss sees of injected noise over the global batches of `steps` of `data` (a WebTrainData in index
  mode, any read), with the real order code: the share of captions shown another pair's image (in those batches, and
  exactly over the data), how far (in ids: shard neighbours are close) a noisy caption's partner lies, and how often
  a noisy caption's own image is in its batch (shown with another caption: an in-batch negative NCR's protocol
  almost never makes)."""
  noise = data.noise
  shown, distance, own, total = 0, [], 0, 0
  for s in steps:
    ids = data.indices(int(s))
    image = noise.image_of(ids)
    noisy = image != ids
    total += len(ids)
    shown += int(noisy.sum())
    distance.append(np.abs(image - ids)[noisy])
    own += int(np.isin(noise.holder_of(ids[noisy]), ids).sum())
  distance = np.concatenate(distance) if distance else np.zeros(0, np.int64)
  return dict(shown_another_image=shown / max(1, total), exact=noise.num_noisy / data.num_examples,
              median_partner_distance=float(np.median(distance)) if distance.size else 0.0,
              own_image_in_batch=own / max(1, shown), pairs=total)


def describe_noise(noise) -> str:
  """One line: the injected noise's protocol and parameters (logged at start-up; the checkpoint keeps its spec)."""
  if isinstance(noise, DatasetNoise):
    return "; ".join(f"dataset {d}: {describe_noise(p) if p is not None else 'none'}"
                     for d, p in enumerate(noise.parts))
  if isinstance(noise, BlockNoise):
    return (f"NCR's caption shuffle in paired blocks of {noise.block} (a noisy caption shows an image of the other "
            f"block of its group, read with it), {noise.num_noisy} of {noise.n} captions (ratio {noise.ratio:g}, "
            f"derangement), seed {noise.seed}, kept out of the caption's own image's batch")
  return (f"NCR's caption shuffle over the whole dataset, {noise.num_noisy} of {noise.n} captions (ratio "
          f"{noise.ratio:g}{', derangement' if noise.derangement else ''}), seed {noise.seed}")
