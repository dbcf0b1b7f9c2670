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
  Image-level noise (DECL) is the same protocol on data with one caption per image (web data)."""
  n: int
  ratio: float
  seed: int
  derangement: bool = False

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
    return Permutation(self.n, self.seed, self.TAG), (Permutation(m, self.seed, self.TAG, 1) if m else None)

  def image_of(self, ids) -> np.ndarray:
    """The pair whose image caption `ids` is shown with."""
    ids = np.asarray(ids, np.int64)
    p, q = self._perms
    out = ids.copy()
    if q is None:
      return out
    rank = np.asarray(p(ids), np.int64).reshape(ids.shape)
    noisy = rank < q.n
    if noisy.any():
      r = rank[noisy]
      target = q((q.inverse(r) + 1) % q.n) if self.derangement else q(r)
      out[noisy] = p.inverse(np.asarray(target, np.int64))
    return out

  def clean(self, ids) -> np.ndarray:
    return self.image_of(ids) == np.asarray(ids, np.int64)

  @property
  def sha256(self) -> str:
    """What the noise is (no index to hash): the protocol, its parameters and the permutation's version."""
    from ncjax.data.web.permutation import ROUNDS
    spec = f"permuted-caption-noise:v1:rounds={ROUNDS}:n={self.n}:ratio={self.ratio!r}:seed={self.seed}:" \
           f"derangement={bool(self.derangement)}"
    return hashlib.sha256(spec.encode()).hexdigest()

  @property
  def spec(self) -> dict:
    return dict(level="caption", protocol="permuted", ratio=self.ratio, seed=self.seed,
                derangement=self.derangement, n_captions=self.n)


@functools.lru_cache(maxsize=8192)
def _block_partners(n: int, ratio: float, seed: int, block: int, derangement: bool, b: int) -> np.ndarray:
  lo = b * block
  m = min(block, n - lo)
  count = int(np.floor(ratio * (lo + m))) - int(np.floor(ratio * lo))   # the running totals telescope to floor(r n)
  rng = np.random.Generator(np.random.PCG64([int(seed), int(b), BlockNoise.TAG]))
  chosen = rng.permutation(m)[:count]
  out = np.arange(m, dtype=np.int64)
  if count:
    out[chosen] = np.roll(chosen, 1) if derangement else chosen[rng.permutation(count)]
  out.setflags(write=False)
  return out + lo


@dataclasses.dataclass(frozen=True)
class BlockNoise:
  """NCR's caption-level protocol inside blocks of `block` consecutive ids — the noise of web data read in blocks
  (input.web.read='block', ncjax.data.web.pipeline), where a caption's partner image comes from its own block, which
  the reader fetches whole anyway: no request per noisy pair. Block b = ids [b K, min((b + 1) K, n)) gets
  floor(r (b K + m)) - floor(r b K) noisy captions (m its length: exactly floor(r n) over the dataset, 25 or 26 of 64
  at r = 0.4), chosen by a permutation drawn from (seed, b), their images permuted among themselves (a few keep
  their own, as NCR's; derangement=True: a single cycle, every chosen caption changes image). A static function of
  the id: the same pairs are noisy in every epoch, for any process count or read order."""
  n: int
  ratio: float
  seed: int
  block: int
  derangement: bool = False

  TAG = 0x626E6F69   # 'bnoi'

  def __post_init__(self):
    if not 0.0 <= self.ratio <= 1.0:
      raise ValueError(f"noise ratio must be in [0, 1], got {self.ratio}")
    if self.block < 1:
      raise ValueError(f"noise block must be >= 1, got {self.block}")

  @property
  def num_noisy(self) -> int:
    return int(np.floor(self.ratio * self.n))

  def image_of(self, ids) -> np.ndarray:
    """The pair whose image caption `ids` is shown with (always of the same block)."""
    ids = np.asarray(ids, np.int64)
    flat = ids.reshape(-1)
    out = np.empty_like(flat)
    blocks, within = np.divmod(flat, self.block)
    for b in np.unique(blocks):
      sel = blocks == b
      out[sel] = _block_partners(self.n, float(self.ratio), int(self.seed), int(self.block), bool(self.derangement),
                                 int(b))[within[sel]]
    return out.reshape(ids.shape)

  def clean(self, ids) -> np.ndarray:
    return self.image_of(ids) == np.asarray(ids, np.int64)

  @property
  def sha256(self) -> str:
    spec = f"block-caption-noise:v1:n={self.n}:ratio={self.ratio!r}:seed={self.seed}:block={self.block}:" \
           f"derangement={bool(self.derangement)}"
    return hashlib.sha256(spec.encode()).hexdigest()

  @property
  def spec(self) -> dict:
    return dict(level="caption", protocol="block", ratio=self.ratio, seed=self.seed, block=self.block,
                derangement=self.derangement, n_captions=self.n)


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
