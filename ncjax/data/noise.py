"""Noise protocols of the noisy-correspondence literature.

`make_noisy_index` reproduces NCR's caption-level protocol (Huang et al., 2021): a random subset of ratio * N captions
has its true image indices shuffled among itself, without derangement (a few captions keep their own image), fixed
for all epochs; and DECL's image-level protocol (all captions of a selected image move together). The result is a
per-caption image index (int64, the format of the NCR/DECL/BiCro `.npy` noise files), the clean mask and a sha256.
The generator is numpy's PCG64 seeded explicitly, never the global RNG.

From the run's `NoiseSpec` (config.noise, ncjax.data.specs): `noise_index(spec, caption_to_image)` builds the static
(dataset-level) index, and `batch_transform(spec)` the dynamic per-step corruption (Bayesian CL's in-batch
resampling) that the trainer applies inside the jitted step, keyed by the step so resume reproduces it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Callable

import numpy as np

from ncjax.data.specs import NoiseSpec


@dataclasses.dataclass(frozen=True)
class NoisyIndex:
  caption_to_image: np.ndarray  # int64 (n_captions,): the (possibly corrupted) image of each caption
  clean: np.ndarray             # bool (n_captions,): caption_to_image == the true index
  sha256: str
  spec: dict

  @property
  def noisy_fraction(self) -> float:
    return float(1.0 - self.clean.mean()) if self.clean.size else 0.0

  def save(self, path: str) -> None:
    """Write the per-caption int64 image index, compatible with NCR/DECL/BiCro noise files."""
    with open(path, "wb") as f:
      np.save(f, self.caption_to_image.astype(np.int64))


def index_sha256(caption_to_image: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(caption_to_image, dtype=np.int64).tobytes()).hexdigest()


def _derange(rng: np.random.Generator, values: np.ndarray) -> np.ndarray:
  """A permutation of `values` leaving no position with its own value (when possible)."""
  n = len(values)
  if n < 2:
    return values.copy()
  # Rotating a random permutation by one moves every position; values may repeat, so check and retry.
  for _ in range(100):
    perm = rng.permutation(n)
    out = values[np.roll(perm, 1)]
    out_perm = np.empty(n, dtype=values.dtype)
    out_perm[perm] = out
    if not np.any(out_perm == values):
      return out_perm
  return out_perm


def make_noisy_index(caption_to_image, ratio: float, seed: int, level: str = "caption",
                     derangement: bool = False) -> NoisyIndex:
  """Corrupt a caption->image index as NCR ('caption') or DECL ('image') do.

  caption level: choose floor(ratio * n_captions) captions from a random permutation and shuffle their image indices
  among themselves. image level: choose floor(ratio * n_images) images and permute them among themselves; every
  caption of a chosen image follows it. derangement=True guarantees every chosen caption/image changes.
  """
  true = np.asarray(caption_to_image, dtype=np.int64)
  if true.ndim != 1:
    raise ValueError(f"caption_to_image must be 1-D, got shape {true.shape}")
  if not 0.0 <= ratio <= 1.0:
    raise ValueError(f"noise ratio must be in [0, 1], got {ratio}")
  rng = np.random.Generator(np.random.PCG64(seed))
  noisy = true.copy()
  if level == "caption":
    n_noisy = int(np.floor(ratio * len(true)))
    chosen = rng.permutation(len(true))[:n_noisy]
    values = noisy[chosen]
    noisy[chosen] = _derange(rng, values) if derangement else rng.permutation(values)
  elif level == "image":
    n_images = int(true.max()) + 1 if true.size else 0
    n_noisy = int(np.floor(ratio * n_images))
    chosen = rng.permutation(n_images)[:n_noisy]
    mapping = np.arange(n_images, dtype=np.int64)
    mapping[chosen] = _derange(rng, chosen) if derangement else rng.permutation(chosen)
    noisy = mapping[true]
  else:
    raise ValueError(f"unknown noise level {level!r}; expected 'caption' (NCR) or 'image' (DECL)")
  spec = dict(level=level, ratio=ratio, seed=seed, derangement=derangement, n_captions=int(len(true)))
  return NoisyIndex(noisy, noisy == true, index_sha256(noisy), spec)


def load_noise_file(path: str, caption_to_image) -> NoisyIndex:
  """Load a legacy NCR/DECL/BiCro noise file: a per-caption int64 image index (length n_captions)."""
  true = np.asarray(caption_to_image, dtype=np.int64)
  noisy = np.load(path)
  if noisy.shape != true.shape:
    raise ValueError(f"noise file {path} holds an index of shape {noisy.shape}; this dataset has "
                     f"{true.shape[0]} captions, so a per-caption index of shape {true.shape} is expected")
  noisy = noisy.astype(np.int64)
  n_images = int(true.max()) + 1 if true.size else 0
  if noisy.size and (noisy.min() < 0 or noisy.max() >= n_images):
    raise ValueError(f"noise file {path} refers to image {int(noisy.max())}, but the dataset has {n_images} images")
  return NoisyIndex(noisy, noisy == true, index_sha256(noisy), dict(level="file", path=path))


def corrupt_batch(key, tokens, ratio: float):
  """In-batch resampling (the Bayesian-CL protocol): floor(ratio * B) pairs of the global batch, chosen afresh every
  step, get the text of another pair of the same batch (drawn uniformly among the other B - 1, so every chosen
  pair really changes). Jittable; key it with fold_in(noise_seed, step) so resume reproduces it exactly.

  Returns (tokens', clean) with clean[i] False for the corrupted pairs.
  """
  import jax
  import jax.numpy as jnp
  b = tokens.shape[0]
  n_noisy = int(np.floor(ratio * b))
  k_choose, k_source = jax.random.split(key)
  chosen = jax.random.permutation(k_choose, b)[:n_noisy]
  offsets = jax.random.randint(k_source, (n_noisy,), 1, b)
  source = (chosen + offsets) % b
  new_tokens = tokens.at[chosen].set(tokens[source])
  clean = jnp.ones((b,), bool).at[chosen].set(False)
  return new_tokens, clean


NOISE_KINDS = ("none", "caption_shuffle", "image_shuffle", "file", "in_batch_resample")
_SHUFFLE_LEVELS = {"caption_shuffle": "caption", "image_shuffle": "image"}


def noise_index(spec: NoiseSpec, caption_to_image) -> NoisyIndex | None:
  """The static (dataset-level) noise index of `config.noise`; None for no noise or for in-batch resampling
  (applied per step by `batch_transform`)."""
  kind = spec.kind
  if kind not in NOISE_KINDS:
    raise ValueError(f"unknown noise.kind {kind!r}; expected 'none', 'caption_shuffle' (NCR), "
                     f"'image_shuffle' (DECL), 'file' or 'in_batch_resample'")
  if kind == "in_batch_resample":
    if not 0.0 < spec.ratio < 1.0:
      raise ValueError(f"noise.kind='in_batch_resample' needs 0 < noise.ratio < 1, got {spec.ratio}")
    return None
  if kind == "none":
    if spec.ratio:
      raise ValueError(f"noise.ratio={spec.ratio} but noise.kind='none'; set noise.kind "
                       f"('caption_shuffle' or 'image_shuffle')")
    return None
  if kind == "file":
    if not spec.file:
      raise ValueError("noise.kind='file' needs noise.file (a per-caption int64 .npy index)")
    return load_noise_file(spec.file, caption_to_image)
  return make_noisy_index(caption_to_image, spec.ratio, spec.seed,
                          level=_SHUFFLE_LEVELS[kind], derangement=spec.derangement)


@dataclasses.dataclass(frozen=True)
class InBatchResample:
  """The per-step batch transform of in-batch resampling: `transform(batch, step) -> batch` with new tokens and
  the clean flags of this step's corruption (jittable; the key is fold_in(PRNGKey(seed), step)).

  per_device: corrupt each device's contiguous part of the global batch on its own (floor(ratio * B / devices)
  pairs each, texts drawn from the same part), as the paper's 128 pairs per GPU; the device count is the mesh's."""
  ratio: float
  seed: int
  per_device: bool = False

  def __call__(self, batch: dict, step) -> dict:
    import jax
    key = jax.random.fold_in(jax.random.PRNGKey(self.seed), step)
    tokens = batch["tokens"]
    mesh = jax.sharding.get_abstract_mesh()
    parts = 1 if (not self.per_device or mesh.empty) else mesh.size
    if parts == 1:
      tokens, clean = corrupt_batch(key, tokens, self.ratio)
    else:
      if tokens.shape[0] % parts:
        raise ValueError(f"per-device noise: global batch {tokens.shape[0]} is not divisible by {parts} devices")
      blocks = tokens.reshape((parts, tokens.shape[0] // parts) + tokens.shape[1:])
      keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jax.numpy.arange(parts))
      new, clean = jax.vmap(lambda k, b: corrupt_batch(k, b, self.ratio))(keys, blocks)
      tokens, clean = new.reshape(tokens.shape), clean.reshape(-1)
    return dict(batch, tokens=tokens, clean=clean)


BatchTransform = Callable[[dict, object], dict]


def batch_transform(spec: NoiseSpec) -> BatchTransform | None:
  """The dynamic noise of `config.noise` as a per-step batch transform, or None for static noise kinds."""
  if spec.kind == "in_batch_resample":
    return InBatchResample(float(spec.ratio), int(spec.seed), bool(spec.per_device))
  return None


@dataclasses.dataclass(frozen=True)
class PermutedNoise:
  """NCR's caption-level protocol without an N-long index (web-scale data, ncjax.data.web.pipeline): the noisy
  captions are those whose position under an on-demand permutation P of [0, n) (ncjax.data.web.permutation) is below
  m = floor(ratio * n), and they exchange their images among themselves through a second permutation Q of [0, m):
  caption i with P(i) = r < m takes the image of pair P^-1(Q(r)) — the same distribution as `make_noisy_index`
  (a uniformly random subset of floor(ratio * n) captions, its images permuted uniformly, a few keeping their own)
  in O(1) memory. derangement=True follows a single cycle of Q instead (every chosen caption changes image).
  Image-level noise (DECL) is the same protocol on data with one caption per image (web data). `dataset`: a
  mixture's dataset d (its own permutations; `DatasetNoise` holds one per dataset, so a noisy caption is shown an
  image of its own dataset, as block reads' `BlockNoise` does); 0 is the single dataset's."""
  n: int
  ratio: float
  seed: int
  derangement: bool = False
  dataset: int = 0

  TAG = 0x6E6F6973   # 'nois'

  def __post_init__(self):
    if not 0.0 <= self.ratio <= 1.0:
      raise ValueError(f"noise ratio must be in [0, 1], got {self.ratio}")

  @property
  def num_noisy(self) -> int:
    return int(np.floor(self.ratio * self.n))

  @functools.cached_property
  def _perms(self):
    from ncjax.data.web.permutation import Permutation
    m = self.num_noisy
    d = (self.dataset,) if self.dataset else ()   # dataset 0: the permutations a single dataset always had
    return Permutation(self.n, self.seed, self.TAG, *d), (Permutation(m, self.seed, self.TAG, 1, *d) if m else None)

  def _follow(self, ids, forward: bool) -> np.ndarray:
    """Each id's pair one step along the noise (forward: the image its caption shows; back: whose caption shows its
    image): a noisy rank r moves through Q (or, deranged, to the next / previous rank of Q's single cycle)."""
    ids = np.asarray(ids, np.int64)
    p, q = self._perms
    out = ids.copy()
    if q is None:
      return out
    rank = np.asarray(p(ids), np.int64).reshape(ids.shape)
    noisy = rank < q.n
    if noisy.any():
      r = rank[noisy]
      if self.derangement:
        moved = q((q.inverse(r) + (1 if forward else -1)) % q.n)
      else:
        moved = q(r) if forward else q.inverse(r)
      out[noisy] = p.inverse(np.asarray(moved, np.int64))
    return out

  def image_of(self, ids) -> np.ndarray:
    """The pair whose image caption `ids` is shown with."""
    return self._follow(ids, True)

  def holder_of(self, ids) -> np.ndarray:
    """The pair whose caption is shown with the image of `ids` (image_of's inverse)."""
    return self._follow(ids, False)

  def clean(self, ids) -> np.ndarray:
    return self.image_of(ids) == np.asarray(ids, np.int64)

  @property
  def sha256(self) -> str:
    """What the noise is (no index to hash): the protocol, its parameters and the permutation's version."""
    from ncjax.data.web.permutation import ROUNDS
    spec = f"permuted-caption-noise:v1:rounds={ROUNDS}:n={self.n}:ratio={self.ratio!r}:seed={self.seed}:" \
           f"derangement={bool(self.derangement)}" + (f":dataset={self.dataset}" if self.dataset else "")
    return hashlib.sha256(spec.encode()).hexdigest()

  @property
  def spec(self) -> dict:
    return dict(level="caption", protocol="permuted", ratio=self.ratio, seed=self.seed,
                derangement=self.derangement, n_captions=self.n)

  def per_dataset(self, sizes) -> "PermutedNoise | DatasetNoise":
    """This protocol applied to each dataset of a mixture of these sizes apart (NCR's noise of each dataset: a
    noisy caption is shown an image of its own dataset, floor(ratio n_d) of each); itself for one dataset."""
    sizes = [int(n) for n in sizes]
    if len(sizes) == 1:
      return self
    offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    return DatasetNoise(offsets, tuple(PermutedNoise(n, self.ratio, self.seed, self.derangement, d)
                                       for d, n in enumerate(sizes)))


def _spread(t: int, sizes: list[int]) -> list[int]:
  """t items over bins of these sizes as evenly as possible (none over its size)."""
  take, left = [0] * len(sizes), t
  while left:
    open_bins = [i for i in range(len(sizes)) if take[i] < sizes[i]]
    if not open_bins:
      break
    for i in sorted(open_bins, key=lambda i: take[i])[:left]:
      take[i] += 1
      left -= 1
  return take


@dataclasses.dataclass(frozen=True)
class BlockNoise:
  """NCR's caption-level protocol for data read in blocks of `block` consecutive ids (input.web.read='block',
  ncjax.data.web.pipeline), with the partners a block reader can afford and NCR's statistics.

  Blocks are paired once for the whole run by an on-demand permutation pi of the whole blocks (ids [b K, (b+1) K)):
  group g < F // 2 is the blocks pi(2g), pi(2g+1) — two blocks from random places of the dataset, never shard
  neighbours — and one last group holds what is left (pi(F-1) when the F whole blocks are odd, and the short last
  block). Group g (2K ids; P_g = 2 K g ids before it) has t_g = 2 (floor(r P_{g+1} / 2) - floor(r P_g / 2)) noisy
  captions, the first group with t_g > 0 one more when floor(r n) is odd: exactly floor(r n) over the dataset (for
  any n except floor(r n) = 1, which no derangement can move). Its noisy captions, about half from each block and
  chosen by a permutation drawn from (seed, g), form one cycle that alternates between the two blocks, and each is
  shown the image of the next: every noisy caption is shown another pair's image (a derangement: floor(r n) of n
  captions, not NCR's few fixed points) from *another* block of its group — except where one block holds more of
  the group's noisy captions than the next largest, whose surplus the cycle takes in a row: that many captions keep a
  partner of their own block. That is one caption in the group that takes the odd one when floor(r n) is odd, and,
  in the last group, what its short block (n mod block pairs) cannot take of its share: 20 of 26 at n = 1,000,003
  and 18 of 28 at n = 453 (block 64, ratio 0.4: tests/data/test_web_noise_cases.py counts them). The block order
  (ncjax.data.web.mixture.BlockOrder)
  lists a group's blocks together, so the partner's block is read anyway; the reader reads it wherever it is not.
  A noisy caption's own image is then shown with the previous caption of its cycle (`holder_of`), which the window
  deal keeps out of its batch (ncjax.data.web.pipeline). A static function of the id: the same pairs are noisy in
  every epoch, for any process count or read order."""
  n: int
  ratio: float
  seed: int
  block: int
  dataset: int = 0      # a mixture's dataset: its own draws

  TAG = 0x626E6F69   # 'bnoi'
  PAIRS = 0x62706169  # 'bpai'

  def __post_init__(self):
    if not 0.0 <= self.ratio <= 1.0:
      raise ValueError(f"noise ratio must be in [0, 1], got {self.ratio}")
    if self.block < 1:
      raise ValueError(f"noise block must be >= 1, got {self.block}")

  # --- the groups: units of the block order ----------------------------------------------------------------------
  @property
  def num_noisy(self) -> int:
    """floor(r n) — but 0 where that is 1 (one caption cannot be shown another's image alone)."""
    count = int(np.floor(self.ratio * self.n))
    return 0 if count == 1 else count

  @functools.cached_property
  def _layout(self):
    k = self.block
    whole = self.n // k                       # F whole blocks
    short = self.n - whole * k                # the last block's length, 0 when every block is whole
    # whole blocks in pairs; what is left (an odd whole block, the short block) joins the last pair, so that every
    # group has two blocks or more whenever the dataset has two
    regular = whole // 2
    last = list(range(2 * regular, whole)) + ([whole] if short else [])
    if len(last) == 1 and regular:
      regular -= 1
      last = [2 * regular, 2 * regular + 1] + last
    from ncjax.data.web.permutation import Permutation
    pi = Permutation(whole, self.seed, self.PAIRS, self.dataset) if whole else None
    return whole, short, regular, last, pi

  @property
  def unit(self) -> int:
    """Ids per group but the last (the block order's unit)."""
    return 2 * self.block

  @property
  def num_units(self) -> int:
    _, _, regular, last, _ = self._layout
    return regular + (1 if last else 0)

  @property
  def last_size(self) -> int:
    """Ids of the last group (== unit when every group is regular)."""
    _, _, regular, last, _ = self._layout
    return self.n - regular * self.unit if last else self.unit

  def _members(self, g: int) -> list[int]:
    whole, short, regular, last, pi = self._layout
    if g < regular:
      return [int(pi(2 * g)), int(pi(2 * g + 1))]
    return [int(pi(b)) if b < whole else b for b in last]   # `last` lists slots of pi, then the short block

  def _block_size(self, b: int) -> int:
    return min(self.block, self.n - b * self.block)

  def ids_of_units(self, units, within) -> np.ndarray:
    """The id at offset `within` of group `units` (the block order's map from its units to ids)."""
    units, within = np.asarray(units, np.int64), np.asarray(within, np.int64)
    whole, _, regular, _, pi = self._layout
    k = self.block
    out = np.empty(np.broadcast(units, within).shape, np.int64)
    reg = units < regular
    if reg.any():
      second = within[reg] >= k
      blocks = np.asarray(pi(2 * units[reg] + second), np.int64)
      out[reg] = blocks * k + within[reg] - second * k
    if (~reg).any():
      members = self._members(regular)
      bounds = np.cumsum([0] + [self._block_size(b) for b in members])
      w = within[~reg]
      slot = np.searchsorted(bounds, w, side="right") - 1
      out[~reg] = np.asarray(members, np.int64)[slot] * k + w - bounds[slot]
    return out

  def group_of(self, ids) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    whole, _, regular, _, pi = self._layout
    blocks = ids // self.block
    out = np.full(ids.shape, regular, np.int64)
    inside = blocks < whole
    if inside.any():
      out[inside] = np.minimum(np.asarray(pi.inverse(blocks[inside]), np.int64) // 2, regular)
    return out

  # --- the noise -------------------------------------------------------------------------------------------------
  def _count(self, g: int) -> int:
    """t_g (see the class docstring)."""
    r, unit = self.ratio, self.unit
    prefix = lambda h: self.n if h >= self.num_units else h * unit
    t = 2 * (int(np.floor(r * prefix(g + 1) / 2)) - int(np.floor(r * prefix(g) / 2)))
    if self.num_noisy % 2 and g == self._odd_group:
      t += 1
    return t

  @functools.cached_property
  def _odd_group(self) -> int:
    """The first group with two noisy captions or more (it takes the odd one when floor(r n) is odd)."""
    if not self.ratio or self.num_noisy < 2:
      return 0
    g = max(0, int(np.ceil(1.0 / (self.ratio * self.block))) - 2)
    while 2 * (int(np.floor(self.ratio * min(self.n, (g + 1) * self.unit) / 2)) -
               int(np.floor(self.ratio * min(self.n, g * self.unit) / 2))) == 0:
      g += 1
    return g

  @functools.lru_cache(maxsize=4096)
  def _group(self, g: int):
    """(sorted ids of group g, the pair each one's caption is shown with, the caption each one's image is shown
    with), read-only."""
    members = self._members(g)
    ids = np.sort(np.concatenate([np.arange(b * self.block, b * self.block + self._block_size(b)) for b in members]))
    t = min(self._count(g), len(ids))
    rng = np.random.Generator(np.random.PCG64([int(self.seed), int(self.dataset), int(g), self.TAG]))
    image = ids.copy()
    if t >= 2:
      per_block = [rng.permutation(ids[ids // self.block == b]) for b in members]
      take = _spread(t, [len(x) for x in per_block])
      # one cycle through the blocks in turn (a1 b1 a2 b2 ...): each caption's partner is of another block, but
      # where one block has more noisy captions than the others (a short block, an odd count)
      cycle = np.concatenate([x[:c] for x, c in zip(per_block, take)])
      turn = np.concatenate([np.arange(c) for c in take])
      cycle = cycle[np.argsort(turn, kind="stable")]
      where = np.searchsorted(ids, cycle)
      image[where] = np.roll(cycle, -1)   # caption cycle[i] is shown the image of cycle[i + 1]
    holder = ids.copy()
    holder[np.searchsorted(ids, image)] = ids
    for a in (ids, image, holder):
      a.setflags(write=False)
    return ids, image, holder

  def _lookup(self, ids, column: int) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    flat = ids.reshape(-1)
    out = np.empty_like(flat)
    groups = self.group_of(flat)
    for g in np.unique(groups):
      sel = groups == g
      table = self._group(int(g))
      out[sel] = table[column][np.searchsorted(table[0], flat[sel])]
    return out.reshape(ids.shape)

  def image_of(self, ids) -> np.ndarray:
    """The pair whose image caption `ids` is shown with (from the other block of its group)."""
    return self._lookup(ids, 1)

  def holder_of(self, ids) -> np.ndarray:
    """The pair whose caption is shown with the image of `ids` (itself for a clean pair)."""
    return self._lookup(ids, 2)

  def clean(self, ids) -> np.ndarray:
    return self.image_of(ids) == np.asarray(ids, np.int64)

  @property
  def sha256(self) -> str:
    from ncjax.data.web.permutation import ROUNDS
    spec = f"block-caption-noise:v2:rounds={ROUNDS}:n={self.n}:ratio={self.ratio!r}:seed={self.seed}:" \
           f"block={self.block}:dataset={self.dataset}"
    return hashlib.sha256(spec.encode()).hexdigest()

  @property
  def spec(self) -> dict:
    return dict(level="caption", protocol="paired blocks", ratio=self.ratio, seed=self.seed, block=self.block,
                derangement=True, n_captions=self.n, noisy_captions=self.num_noisy)


@dataclasses.dataclass(frozen=True)
class DatasetNoise:
  """The noise of a mixture: each dataset's own protocol over its local ids (dataset d's ids offset by
  offsets[d]), so a noisy caption is always shown an image of its own dataset, as NCR's noise of each dataset
  would; `parts[d]` None for a dataset without noise."""
  offsets: tuple
  parts: tuple

  def _map(self, ids, method: str) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    out = ids.copy()
    d = np.searchsorted(np.asarray(self.offsets), ids, side="right") - 1
    for k in np.unique(d):
      part = self.parts[int(k)]
      if part is not None:
        sel = d == k
        out[sel] = self.offsets[int(k)] + getattr(part, method)(ids[sel] - self.offsets[int(k)])
    return out

  def image_of(self, ids) -> np.ndarray:
    return self._map(ids, "image_of")

  def holder_of(self, ids) -> np.ndarray:
    return self._map(ids, "holder_of")

  def clean(self, ids) -> np.ndarray:
    return self.image_of(ids) == np.asarray(ids, np.int64)

  @property
  def num_noisy(self) -> int:
    return sum(p.num_noisy for p in self.parts if p is not None)

  @property
  def sha256(self) -> str:
    text = "dataset-noise:v1:" + ":".join(f"{o}={p.sha256 if p is not None else '-'}"
                                           for o, p in zip(self.offsets, self.parts))
    return hashlib.sha256(text.encode()).hexdigest()

  @property
  def spec(self) -> dict:
    return dict(protocol="per dataset", datasets=[p.spec if p is not None else None for p in self.parts])


def permuted_noise(spec: NoiseSpec, n: int) -> PermutedNoise | None:
  """`config.noise` over web-scale data of n pairs: caption_shuffle / image_shuffle as `PermutedNoise`; None for no
  noise or in-batch resampling; a noise file (an N-long index) is refused."""
  kind = spec.kind
  if kind not in NOISE_KINDS:
    raise ValueError(f"unknown noise.kind {kind!r}; expected one of {NOISE_KINDS}")
  if kind == "file":
    raise ValueError("noise.kind='file' (an N-long .npy index) is not read for web-scale data; use "
                     "noise.kind='caption_shuffle' (computed on demand) or 'in_batch_resample'")
  if kind in ("none", "in_batch_resample"):
    noise_index(spec, np.zeros(0, np.int64))   # the same argument checks
    return None
  return PermutedNoise(int(n), float(spec.ratio), int(spec.seed), bool(spec.derangement))
