"""Training input: a deterministic global batch for every step, assembled across processes.

Order. The sample order is a pure function of (seed, step): epoch e visits the examples in the permutation drawn
from `streams.order_rng(seed, e)` (a stream independent of the noise's: ncjax.data.streams), and the global batch
of step s is the slice [b*(s mod E), b*(s mod E + 1)) of epoch s // E's permutation (an epoch's remainder is
dropped). Resuming at step s continues the exact order; the iterator state in a checkpoint is that position.

Loading. Each process materialises only its contiguous part of the global batch. In-memory splits (digits,
synthetic) are gathered with one fancy index per batch; record-backed splits (tfds/ArrayRecord) go through grain: a
MapDataset over this process's example positions, mapped by `example_at` (read record, decode, random resized crop
or evaluation transform, tokenise) on grain's reader threads with prefetch, then batched. The crop of example j of
step s is drawn from `streams.crop_rng(seed, s, j)`, so it too survives resume.
`jax.make_array_from_process_local_data` assembles the global arrays.

Bad records. A corrupt image or an empty caption is skipped: the next example of the permutation's dataset order
(id + 1, + 2, ...) takes its place, so batch shapes stay static, and the skip is counted (`input/skipped_records`);
with input.on_bad_record='raise' it raises with the record's id.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ncjax import errors
from ncjax.data import preprocess, streams
from ncjax.data.tables import readers
from ncjax.data.noise import NoisyIndex
from ncjax.data.specs import InputSpec, NoiseSpec
from ncjax.data.types import PairSplit

log = logging.getLogger("ncjax")

HOST_ONLY_PREFIX = "_"  # batch keys starting with this stay on the host (input statistics)


class BadRecordError(errors.DataError):
  """A record that cannot be used (corrupt image, empty caption) under input.on_bad_record='raise'."""


def batch_axes(mesh) -> tuple[str, ...]:
  """All mesh axes: the global batch is split over every device (data and fsdp)."""
  return tuple(mesh.axis_names)


def check_batch_divisible(global_batch: int, mesh) -> None:
  n = mesh.devices.size
  if global_batch % n:
    raise errors.TopologyError(f"global batch size {global_batch} is not divisible by the {n} devices of the mesh "
                     f"{dict(mesh.shape)}; choose a multiple of {n}")
  if global_batch % jax.process_count():
    raise errors.TopologyError(f"global batch size {global_batch} is not divisible by the {jax.process_count()} "
                               f"processes; choose a multiple of {jax.process_count()}")


@dataclasses.dataclass
class TrainingPairs:
  """The training pairs as the loss saw them — caption k with image caption_to_image[k] after any injected noise —
  and their ground-truth clean flags (the data's own and the noise's): what noise detection scores. Built by the
  pipeline (`TrainData.pairs()`) or, to evaluate a saved run without its input pipeline, by
  `training_pairs_from_config`."""
  split: PairSplit
  caption_to_image: np.ndarray
  clean: np.ndarray
  noise_sha256: str | None
  image_size: int
  normalization: str
  tokens: np.ndarray | None = None   # the captions' token ids when already encoded (in-memory splits)

  @property
  def num_examples(self) -> int:
    return self.split.num_captions

  def images(self):
    """The split's images as evaluators batch over them (the evaluation transform, no augmentation)."""
    from ncjax.data import eval_images
    return eval_images(self.split, self.image_size or 0, self.normalization)

  def token_ids(self, tokenizer) -> np.ndarray:
    return self.tokens if self.tokens is not None else tokenizer.encode(self.split.captions)


def clean_flags(split: PairSplit, noisy: NoisyIndex | None) -> np.ndarray:
  """Ground truth for diagnostics (noise detection), never seen by a loss: the data's own clean flags where it has
  them (a table's clean column), and the injected noise on top."""
  own = np.ones(split.num_captions, bool) if split.pair_clean is None else np.asarray(split.pair_clean, bool)
  return own if noisy is None else own & noisy.clean


class TrainData:
  """Global batches of training pairs, keyed by stable example id (= caption index in the split)."""

  def __init__(self, split: PairSplit, tokenizer, global_batch_size: int, seed: int, mesh,
               noisy: NoisyIndex | None = None, *, subset: np.ndarray | None = None, image_size: int | None = None,
               normalization: str = "openai", augment: bool = True, crop_scale=(0.9, 1.0),
               on_bad_record: str = "skip", num_threads: int = 8, prefetch: int = 4):
    check_batch_divisible(global_batch_size, mesh)
    if on_bad_record not in ("skip", "raise"):
      raise ValueError(f"input.on_bad_record must be 'skip' or 'raise', got {on_bad_record!r}")
    self.split, self.tokenizer = split, tokenizer
    self.examples = np.arange(split.num_captions) if subset is None else np.sort(np.asarray(subset, np.int64))
    n = len(self.examples)
    if global_batch_size > n:
      raise ValueError(f"global batch size {global_batch_size} exceeds the {n} training examples of {split.name}")
    self.global_batch_size, self.seed, self.mesh = global_batch_size, seed, mesh
    self.num_examples = split.num_captions   # id space (state capacity); the subset may be smaller
    self.steps_per_epoch = n // global_batch_size
    self.caption_to_image = split.caption_to_image if noisy is None else noisy.caption_to_image
    self.clean = clean_flags(split, noisy)
    self.noise_sha256 = None if noisy is None else noisy.sha256
    self.sharding = NamedSharding(mesh, P(batch_axes(mesh)))
    self.in_memory = isinstance(split.images, np.ndarray)
    self.tokens = tokenizer.encode(split.captions) if self.in_memory else None
    self.image_size, self.normalization = image_size, normalization
    self.augment, self.crop_scale, self.on_bad_record = augment, tuple(crop_scale), on_bad_record
    self.num_threads, self.prefetch = num_threads, prefetch
    # Two epochs may be in flight at once around an epoch boundary (reader threads run ahead).
    self.epoch_permutation = functools.lru_cache(maxsize=3)(self._epoch_permutation)

  def pairs(self) -> TrainingPairs:
    return TrainingPairs(self.split, self.caption_to_image, self.clean, self.noise_sha256, self.image_size or 0,
                         self.normalization, self.tokens)

  # --- order ------------------------------------------------------------------------------------------------------
  def _epoch_permutation(self, epoch: int) -> np.ndarray:
    perm = streams.order_rng(self.seed, epoch).permutation(len(self.examples))
    return self.examples[perm]

  def indices(self, step: int) -> np.ndarray:
    """Global example ids of step `step`'s global batch (before any bad-record substitution)."""
    epoch, pos = divmod(step, self.steps_per_epoch)
    b = self.global_batch_size
    return self.epoch_permutation(epoch)[pos * b:(pos + 1) * b]

  def iterator_state(self, step: int) -> dict:
    epoch, pos = divmod(step, self.steps_per_epoch)
    return dict(kind="epoch_permutation", order_version=streams.ORDER_VERSION, seed=self.seed,
                next_step=int(step), epoch=int(epoch), batch_in_epoch=int(pos), steps_per_epoch=self.steps_per_epoch,
                global_batch_size=self.global_batch_size, num_examples=len(self.examples))

  @property
  def local_batch_size(self) -> int:
    return self.global_batch_size // jax.process_count()

  def local_indices(self, step: int) -> np.ndarray:
    b = self.local_batch_size
    return self.indices(step)[jax.process_index() * b:(jax.process_index() + 1) * b]

  # --- in-memory path ---------------------------------------------------------------------------------------------
  def _diagnostics(self, idx: np.ndarray) -> dict:
    out = dict(clean=self.clean[idx])
    if self.split.image_labels is not None:
      out["label"] = self.split.image_labels[self.split.caption_to_image[idx]].astype(np.int32)
    return out

  def host_batch(self, idx: np.ndarray, step: int | None = None) -> dict[str, np.ndarray]:
    """In-memory splits: images are already model-ready arrays. With `augment` (and pixel images, not region
    features) each example gets the random resized crop of the record path, drawn from crop_rng(seed, step, j) for
    the example's global position j in the batch, so it survives resume and does not depend on the process count."""
    images = self.split.images[self.caption_to_image[idx]]
    if self.augment and step is not None and images.ndim == 4:
      first = jax.process_index() * self.local_batch_size
      images = preprocess.random_resized_crop_arrays(
          images, [streams.crop_rng(self.seed, step, first + j) for j in range(len(images))],
          self.crop_scale)
    batch = dict(image=images, tokens=self.tokens[idx], id=idx.astype(np.int32), **self._diagnostics(idx))
    batch["_skipped"] = np.zeros((), np.int32)
    return batch

  # --- record path ------------------------------------------------------------------------------------------------
  def _load_image(self, image_index: int, rng: np.random.Generator):
    raw = self.split.images.raw(image_index)
    if self.split.images.kind == "features":
      return np.asarray(raw, np.float32)
    if raw is None or len(raw) == 0:
      raise BadRecordError("empty image bytes")
    pixels = readers.decode_image(raw)
    if self.augment:
      return preprocess.train_transform(pixels, self.image_size, rng, self.normalization, self.crop_scale)
    return preprocess.eval_transform(pixels, self.image_size, self.normalization)

  def example_at(self, position: int) -> dict:
    """Example `j` of step `s` for this process, position = s * local_batch + j."""
    b = self.local_batch_size
    step, j = divmod(int(position), b)
    jj = jax.process_index() * b + j
    idx = int(self.indices(step)[jj])
    rng = streams.crop_rng(self.seed, step, jj)
    skipped = 0
    for attempt in range(len(self.examples)):
      cand = int(self.examples[(np.searchsorted(self.examples, idx) + attempt) % len(self.examples)])
      caption = self.split.captions[cand]
      try:
        if not caption or not caption.strip():
          raise BadRecordError("empty caption")
        image = self._load_image(int(self.caption_to_image[cand]), rng)
      except Exception as e:  # corrupt image bytes raise PIL/OS errors
        if self.on_bad_record == "raise":
          raise BadRecordError(f"bad training record id {cand} ({self.split.name}): {type(e).__name__}: {e}") from e
        skipped += 1
        continue
      diag = self._diagnostics(np.asarray([cand]))
      return dict(image=image, tokens=self.tokenizer.encode([caption])[0], id=np.int32(cand),
                  clean=diag["clean"][0], **({"label": diag["label"][0]} if "label" in diag else {}),
                  _skipped=np.int32(skipped))
    raise BadRecordError(f"no usable record in {self.split.name}")

  # --- iteration --------------------------------------------------------------------------------------------------
  def host_batches(self, start_step: int, stop_step: int):
    """Iterator over this process's host batches for steps [start_step, stop_step)."""
    # grain uses at most prefetch_buffer_size threads: keep the buffer at least as large as the thread count.
    options = grain.ReadOptions(num_threads=self.num_threads,
                                prefetch_buffer_size=max(self.prefetch, self.num_threads))
    if self.in_memory:
      ds = grain.MapDataset.range(start_step, stop_step).map(lambda s: self.host_batch(self.local_indices(s), s))
      return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=self.prefetch)))
    b = self.local_batch_size
    ds = grain.MapDataset.range(start_step * b, stop_step * b).map(self.example_at)
    ds = ds.to_iter_dataset(options).batch(b, batch_fn=_stack_examples)
    return iter(ds)

  def to_global(self, host: dict) -> dict:
    out = {}
    for k, v in host.items():
      if k.startswith(HOST_ONLY_PREFIX):
        continue
      out[k] = jax.make_array_from_process_local_data(self.sharding, v, (self.global_batch_size,) + v.shape[1:])
    return out

  def batches(self, start_step: int, stop_step: int):
    """Yields (global batch arrays, this step's global example ids, host statistics) per step."""
    for step, host in zip(range(start_step, stop_step), self.host_batches(start_step, stop_step)):
      stats = {"skipped_records": int(np.sum(host["_skipped"]))}
      yield self.to_global(host), self._global_ids(step, host), stats

  def _global_ids(self, step, host):
    if jax.process_count() == 1:
      return np.asarray(host["id"])
    return self.indices(step)  # other processes' substitutions are not known here; report the drawn ids

  def global_batch(self, step: int):
    """(global batch arrays, global example ids) of one step (tests, benchmarks)."""
    arrays, ids, _ = next(self.batches(step, step + 1))
    return arrays, ids


def train_data(spec: InputSpec, split: PairSplit, tokenizer, mesh, noisy: NoisyIndex | None = None, *,
               image_size: int, subset: np.ndarray | None = None) -> TrainData:
  """The training pipeline of an input spec over `split` (optionally a subset of its example ids)."""
  return TrainData(split, tokenizer, spec.global_batch_size, spec.shuffle_seed, mesh, noisy, subset=subset,
                   image_size=image_size, normalization=spec.normalization, augment=spec.augment,
                   crop_scale=spec.crop_scale, on_bad_record=spec.on_bad_record, num_threads=spec.num_threads,
                   prefetch=spec.prefetch)


def training_pairs(spec: InputSpec, noise: NoiseSpec, *, image_size: int) -> TrainingPairs:
  """The training pairs of a run without its input pipeline (evaluating a saved run): its split, the same
  injected noise (the noise index is a pure function of the noise spec) and the clean flags."""
  from ncjax.data import load_split
  from ncjax.data.noise import noise_index
  split = load_split(spec, spec.split, image_size)
  noisy = noise_index(noise, split.caption_to_image)
  return TrainingPairs(split, split.caption_to_image if noisy is None else noisy.caption_to_image,
                       clean_flags(split, noisy), None if noisy is None else noisy.sha256, image_size,
                       spec.normalization)


def _stack_examples(examples):
  out = {k: np.stack([e[k] for e in examples]) for k in examples[0] if not k.startswith(HOST_ONLY_PREFIX)}
  out["_skipped"] = np.asarray(sum(int(e["_skipped"]) for e in examples), np.int32)
  return out
