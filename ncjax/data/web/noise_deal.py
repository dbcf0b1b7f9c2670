"""The deal of block reads: a window's pairs dealt into batches so that no pair meets a second copy of itself and no
noisy caption meets its own image (`separate_own_images`), what the loss then sees of the injected noise
(`block_noise_statistics`, benchmarks/web_noise.py) and the one line that describes the noise (`describe_noise`).
The noise itself (which caption shows which image) is `ncjax.data.noise.BlockNoise`; the order that reads it,
ncjax.data.web.order."""

from __future__ import annotations

import numpy as np

from ncjax.data.noise import BlockNoise, DatasetNoise


def _related(ids: np.ndarray, noise) -> np.ndarray:
  """(n, 3) ids each pair must not share a global batch with: itself (a second copy, in a window across an epoch's
  end), and with injected noise the caption shown its image (holder) and the pair whose image its caption shows."""
  ids = np.asarray(ids, np.int64)
  if noise is None:
    return ids[:, None]
  return np.stack([ids, noise.holder_of(ids), noise.image_of(ids)], axis=1)


def separate_own_images(ids: np.ndarray, perm: np.ndarray, b: int, rng: np.random.Generator, noise=None,
                        neighbours=()) -> np.ndarray:
  """A deal of a window's pairs into batches of b (batch k: ids[perm[k b:(k+1) b]]) in which no pair meets another
  copy of itself (a window across an epoch's end holds the end of one epoch and the start of the next) and, with
  injected noise, no noisy caption meets its own image: a pair i and the caption shown i's image (holder) or the pair
  whose image i's caption shows go to different batches. Each conflict of the random deal `perm` moves a pair to a
  random slot of another batch, swapping it with a pair that fits where it leaves. A pair related to a pair of
  another process's share of the window (`neighbours`: (is that process after this one, its share's ids)) goes to an
  odd batch if that process comes after this one, else to an even one — the other process puts its pair on the
  opposite parity, so the two never share a global batch (a pair related to processes on both sides keeps its
  place). Needs two batches or more per window (pipeline warns where a window is one batch)."""
  n = len(ids)
  G = n // b
  if G < 2:
    return perm
  related = _related(ids, noise)                         # (n, R)
  order = np.argsort(ids, kind="stable")
  sorted_ids = ids[order]
  lo = np.searchsorted(sorted_ids, related, side="left")
  hi = np.searchsorted(sorted_ids, related, side="right")
  width = int((hi - lo).max()) if n else 0
  # conflicts[i]: the positions of this share whose pair is related to i's (i itself left out), -1 padded
  conflicts = np.full((n, related.shape[1] * max(1, width)), -1, np.int64)
  for r in range(related.shape[1]):
    for k in range(width):
      at = lo[:, r] + k
      hit = at < hi[:, r]
      conflicts[hit, r * width + k] = order[at[hit]]
  conflicts[conflicts == np.arange(n)[:, None]] = -1
  parity = np.full(n, -1, np.int64)                      # the batch parity a pair must have (-1: any)
  for after, other in neighbours:
    touches = np.isin(related, np.asarray(other, np.int64)).any(axis=1)
    want = 1 if after else 0
    parity[touches] = np.where(parity[touches] == 1 - want, -2, want)   # both sides: no parity can serve
  parity[parity == -2] = -1
  slot = np.empty(n, np.int64)
  slot[perm] = np.arange(n)
  perm = perm.copy()

  def fits(i, k):
    """May pair i sit in batch k (its related pairs where they are now, its parity)?"""
    if parity[i] >= 0 and k % 2 != parity[i]:
      return False
    return not any(j >= 0 and slot[j] // b == k for j in conflicts[i])

  def relocate(x):
    """Swap pair x into a random slot of another batch where both it and the pair it displaces fit."""
    for _ in range(256):
      s_new = int(rng.integers(n))
      e = int(perm[s_new])
      old = slot[x] // b
      if s_new // b == old or e in conflicts[x]:
        continue
      slot[x], slot[e] = s_new, slot[x]
      if fits(x, s_new // b) and fits(e, old):
        perm[slot[x]], perm[slot[e]] = x, e
        return
      slot[x], slot[e] = slot[e], s_new   # undo

  for x in np.flatnonzero((parity >= 0) & ((slot // b) % 2 != parity)).tolist():
    if (slot[x] // b) % 2 != parity[x]:
      relocate(x)
  batch_of = slot // b
  clash = (conflicts >= 0) & (batch_of[np.maximum(conflicts, 0)] == batch_of[:, None])
  for i in np.flatnonzero(clash.any(axis=1)).tolist():
    for j in conflicts[i]:
      if j >= 0 and slot[j] // b == slot[i] // b:
        relocate(int(j) if parity[j] < 0 or parity[i] >= 0 else i)
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
