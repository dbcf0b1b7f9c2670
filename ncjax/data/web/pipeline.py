"""Training input from img2dataset output at any size (`input.dataset='web:ROOT'`, mixtures 'web:A::B'): global
batches keyed by stable example ids, in an order that is a pure function of (seed, step) for a given process count,
with host memory per process independent of the dataset size, read at the rate a pod consumes it from local disk or
an object store.

Datasets. `web:ROOT[::ROOT2::...]` (open_clip's `--train-data 'a::b'`), each an img2dataset webdataset output
(ncjax.data.web.dataset); with several, `input.web.weights='w1::w2'` (open_clip's
--train-data-upsampling-factors: relative weights, default each dataset's size) sets the mixture. Dataset d's pair
j has the global id offsets[d] + j with its id j as ncjax.data.web.dataset defines it (shard order, then tar order):
the same in every mode below.

Modes (`input.web.mode`) and, indexed, how the index is read (`input.web.read`):
* 'index' + read 'pair' (the default on local disk): a global shuffle per epoch of each dataset (an on-demand
  permutation), the global batch of step s being positions [s B, (s + 1) B) of ncjax.data.web.mixture's stream 0 — the
  same for any process count; process p reads its contiguous part, one ranged read per pair, all of a step's reads
  (and the next steps') in flight at once. Injected noise (`noise.PermutedNoise`, per dataset of a mixture as block
  reads' is: `noise.DatasetNoise`) shows a caption with any other pair's image of its own dataset: one more read per
  noisy pair, in the same flight.
* 'index' + read 'block' (the default when a dataset is on an object store): the same positions, but dataset d's
  epoch lists its pairs as blocks of `input.web.block` consecutive ids in a permuted block order
  (mixture.BlockOrder). Steps are grouped into windows of G = max(ceil(input.web.shuffle_pairs / b),
  input.web.window_batches) steps (b the per-process batch; 16 batches at least by default, at most an epoch);
  process p reads its contiguous share of the window's positions — whole blocks, one ranged request each, the next
  window's requests in flight while this one trains — and shuffles that share (a permutation drawn from (seed,
  window, p, P)) into its G local batches. Every epoch is still each pair once; a batch holds on average
  K b / (G b) = K / G pairs of one block (64 / 16 = 4 at the defaults, at any batch size). Requests per pair: 1 / K
  (plus two per window at the share's edges). The order depends on the process count.
  Injected noise is `noise.BlockNoise`, per dataset of a mixture: blocks are paired across the dataset, a noisy
  caption is shown an image of the other block of its pair, and the order lists a pair's blocks together, so the
  partner's block is read anyway (the reader reads it wherever it is not: nothing is ever missing); exactly
  floor(ratio N_d) captions of each dataset are shown another image; the deal into batches
  (`noise_deal.separate_own_images`) keeps each noisy caption's own image out of its global batch, and a pair's
  second copy out of a batch of a window across an epoch's end; a window of fewer than 3 steps, too short for the
  deal, is said in one warning; `noise_deal.block_noise_statistics` measures what the loss sees
  (benchmarks/web_noise.py).
* 'stream': nothing built; process p streams its own share of each epoch (ncjax.data.web.mixture: an exact partition
  of the epoch's shard list by sample counts, every pair read once per epoch over the processes) through windows of
  `input.web.window` shard segments read interleaved and a shuffle buffer of `input.web.buffer` pairs. Injected
  static noise needs an index; `in_batch_resample` works in every mode.
Nothing is restored but the step: resume is bitwise. A resume whose shuffle seed, process count, mode, read, block,
window, buffer, weights or mixture block differ where the order depends on them, or whose shards are not those the
checkpoint pinned, is refused with one line (`check_resume`).
An epoch is sum N_d // B steps (with a mixture, `num_epochs` counts passes over that many pairs, whatever the
weights).

Pipeline, three stages connected by bounded queues: a fetch thread submits the ranged reads of the next units (a
step, or a window) to ncjax.data.web.store.RangeReader — `input.web.max_inflight` requests at once — and turns the
bytes into `ExampleSpec`s (tar members parsed, the noise partner looked up per batch); a decode thread hands each step's
specs to the decoder (ncjax.data.web.decode: `input.num_threads` threads, or `input.web.workers` processes writing
into shared memory) and assembles the host batch; the training loop takes finished batches, `input.prefetch` ahead.

Faults (ncjax.data.web.store). A fault of the store is retried with backoff for `input.web.io_deadline_s` seconds,
then stops the run with one line (its last checkpoint intact); every request has a timeout
(`input.web.request_timeout_s`), so a store that stops answering is a fault too; a TLS certificate that does not
verify or credentials refused after one refresh stop it at once. A missing, changed or added shard is one error
naming it: every shard is pinned to what the run listed at start-up (an object's generation and checksum, a local
file's size, modification time and inode), checked by every read of it, in every mode (each object request asks for
the generation; a local descriptor's fstat is compared after each read), and the pins go with every checkpoint (a
resume on changed data is refused). Only a record's own content (a sample missing from a cut tar, an image that does
not decode, an empty or non-UTF-8 caption) makes a bad record: it is counted in `input/skipped_records`, and its
slot takes the next usable pair of this process's part of the batch (a repeat); input.on_bad_record='raise' raises
with the id instead, and more than `input.web.max_skipped_fraction` (1%) of the pairs read stops the run.

Memory per process: the datasets' per-shard counts (S-long), the memory-mapped index (4 bytes per pair, one copy per
host in the page cache), the bytes of at most two windows (block read) or `prefetch` + 2 steps (pair read), the
prefetched batches and, streamed, one window's shuffle buffer. The mixture's composition (each dataset's exact
share) is logged at start-up and written with every checkpoint's iterator state.

Modules: this one checks the settings and wires the parts (`WebTrainData`) and keeps the resume checks; the order
and windows are ncjax.data.web.order's, the reading units ncjax.data.web.units', the assembly of batches
ncjax.data.web.assembly's and the noise deal ncjax.data.web.noise_deal's.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ncjax import errors
from ncjax import fileio
from ncjax.data.web import assembly
from ncjax.data.web import mixture as mix_lib
from ncjax.data.web import order as order_lib
from ncjax.data.web import store
from ncjax.data.web import dataset as web
from ncjax.data.web import decode as web_decode
from ncjax.data.web import stages as web_stages
from ncjax.data.web.noise_deal import describe_noise
from ncjax.data.web.stream import StreamReader
from ncjax.data.web.units import Units
from ncjax.data.noise import BlockNoise, DatasetNoise, PermutedNoise, permuted_noise
from ncjax.data.specs import WEB_DECODERS, WEB_MODES, WEB_READS, ConceptSpec, InputSpec, NoiseSpec, WebSpec
from ncjax.tokenizers import TokenizerSpec
from ncjax.data.pipeline import batch_axes, check_batch_divisible

log = logging.getLogger("ncjax")

PREFIX = "web:"
MODES, READS, DECODERS = WEB_MODES, WEB_READS, WEB_DECODERS


def is_web(dataset: str) -> bool:
  return str(dataset).startswith(PREFIX)


def parse_roots(dataset: str) -> list[str]:
  """'web:/a::/b' -> ['/a', '/b'] ('::' as open_clip separates datasets; gs:// roots keep their '://')."""
  body = dataset[len(PREFIX):]
  roots = [r for r in _split_colons(body) if r]
  if not roots:
    raise ValueError(f"input.dataset={dataset!r}: expected web:ROOT or web:ROOT1::ROOT2 (img2dataset outputs)")
  return roots


def _split_colons(text: str) -> list[str]:
  parts, cur, i = [], "", 0
  while i < len(text):
    if text.startswith("::", i):
      parts.append(cur)
      cur, i = "", i + 2
    elif text.startswith("://", i):
      cur, i = cur + "://", i + 3
    else:
      cur, i = cur + text[i], i + 1
  parts.append(cur)
  return parts


def parse_weights(weights, n: int, sizes) -> tuple[float, ...]:
  """input.web.weights: '' (each dataset's size), 'w1::w2' or a sequence of n non-negative numbers."""
  if weights in ("", None, ()):
    return tuple(float(s) for s in sizes)
  values = [float(w) for w in (_split_colons(weights) if isinstance(weights, str) else weights)]
  if len(values) != n:
    raise ValueError(f"input.web.weights={weights!r} gives {len(values)} weights for {n} datasets")
  return tuple(values)


def open_datasets(spec: InputSpec) -> list[web.WebDataset]:
  """The datasets `spec.dataset` names ('web:A::B'), opened with `spec.web`'s settings."""
  w = spec.web
  policy = store.RetryPolicy(deadline_s=float(w.io_deadline_s), request_timeout_s=float(w.request_timeout_s))
  fileio.bound_requests(policy.request_timeout_s)
  return [web.open_dataset(r, use_index=w.mode != "stream", caption_key=w.caption_key, clean_key=w.clean_key,
                           cache_dir=w.cache_dir, policy=policy, cache_bytes=w.cache_bytes)
          for r in parse_roots(spec.dataset)]


# ---------------------------------------------------------------------------------------------------------------
# the tokenizer of a web run
# ---------------------------------------------------------------------------------------------------------------
def sample_captions(datasets, limit: int) -> list[str]:
  """Up to `limit` captions in id order over the datasets' first shards (their parquets, else their tars)."""
  out: list[str] = []
  per = max(1, limit // max(1, len(datasets)))
  for ds in datasets:
    got = 0
    for s in range(len(ds.shards)):
      if got >= per:
        break
      caps = web.read_parquet_captions(ds.shards[s], per - got, ds.caption_key)
      if not caps:
        caps = [x.caption or "" for x, _ in zip(ds.iter_shard(s), range(per - got))]
      out.extend(caps)
      got += len(caps)
  return out


def web_tokenizer(spec: TokenizerSpec, web_spec: WebSpec, datasets, saved: dict | None = None):
  """A resumed run's tokenizer; else the fixed vocabulary of `spec.kind`; else (kind 'word') a word vocabulary
  counted over at most input.web.vocab_captions captions and capped at input.web.max_vocab words
  (input.min_word_count applies): its size does not grow with the data. Web-scale runs should prefer
  model.tokenizer=clip_bpe."""
  from ncjax import tokenizers
  if saved is not None or spec.kind != "word":
    return spec.build(saved=saved)
  caps = sample_captions(datasets, int(web_spec.vocab_captions))
  log.info("word vocabulary of the web data counted over %d captions, capped at %d words", len(caps),
           web_spec.max_vocab)
  return tokenizers.WordTokenizer.build(caps, context_length=spec.context_length, min_count=spec.min_word_count,
                                        max_size=int(web_spec.max_vocab))


# ---------------------------------------------------------------------------------------------------------------
# the training data of a web run: its settings here; its order (ncjax.data.web.order), reading units
# (ncjax.data.web.units) and batch assembly (ncjax.data.web.assembly) in their own modules
# ---------------------------------------------------------------------------------------------------------------
class WebTrainData:
  """Global batches of web-scale training pairs (the interface of ncjax.data.pipeline.TrainData that the trainer
  uses: batches, iterator_state, check_resume, num_examples, steps_per_epoch, noise_sha256, pairs)."""

  def __init__(self, datasets: list[web.WebDataset], tokenizer, global_batch_size: int, seed: int, mesh=None, *,
               mode: str = "auto", read: str = "auto", block: int = 64, shuffle_pairs: int = 4096, weights=(),
               resample: bool = False, window: int = 8, buffer: int = 2048, mix_block: int = 1000,
               noise: PermutedNoise | BlockNoise | DatasetNoise | None = None, image_size: int = 224,
               normalization: str = "openai",
               augment: bool = True, crop_scale=(0.9, 1.0), on_bad_record: str = "skip", num_threads: int = 8,
               prefetch: int = 4, decoder: str = "pil", workers: int = 0, max_inflight: int = 64,
               io_deadline_s: float = store.DEFAULT_DEADLINE_S, request_timeout_s: float = 60.0,
               process_index: int | None = None,
               process_count: int | None = None, subset=None, window_batches: int = 16,
               max_skipped_fraction: float = 0.01, split_gap_bytes: int = -1):
    self.process_index = jax.process_index() if process_index is None else int(process_index)
    self.process_count = jax.process_count() if process_count is None else int(process_count)
    if mesh is not None:
      check_batch_divisible(global_batch_size, mesh)
    if global_batch_size % self.process_count:
      raise errors.TopologyError(f"global batch size {global_batch_size} is not divisible by {self.process_count} "
                                 f"processes; choose a multiple of {self.process_count}")
    if on_bad_record not in ("skip", "raise"):
      raise ValueError(f"input.on_bad_record must be 'skip' or 'raise', got {on_bad_record!r}")
    self.datasets, self.tokenizer = list(datasets), tokenizer
    self.sizes = np.asarray([d.num_examples for d in self.datasets], np.int64)
    self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
    self.num_examples = int(self.offsets[-1])   # the id space: per-sample state is this long, filtered or not
    # input.web.filter (ncjax.data.web.subset): the order runs over each dataset's kept pairs, which keep their ids
    self.subset = subset
    self.kept = list(subset.kept) if subset is not None else [None] * len(self.datasets)
    self.order_sizes = subset.kept_sizes if subset is not None else self.sizes
    self.num_trained = int(self.order_sizes.sum())
    if global_batch_size > self.num_trained:
      raise ValueError(f"global batch size {global_batch_size} exceeds the {self.num_trained} web pairs"
                       + (" kept by the filter" if subset is not None else ""))
    if self.num_examples >= 2 ** 31:
      raise ValueError(f"{self.num_examples} pairs: example ids are int32 on the device (at most 2^31 - 1)")
    indexed = all(d.index is not None for d in self.datasets)
    if mode == "auto":
      mode = "index" if indexed else "stream"
    if mode not in ("index", "stream"):
      raise ValueError(f"input.web.mode must be one of {MODES}, got {mode!r}")
    if mode == "index" and not indexed:
      missing = [d.root for d in self.datasets if d.index is None]
      raise ValueError(f"input.web.mode='index' but {missing[0]} has no index: python -m ncjax.data.build "
                       f"--dataset=web --manual_dir={missing[0]} (or input.web.mode='stream')")
    if mode == "stream" and noise is not None:
      raise ValueError("static injected noise (noise.kind caption_shuffle / image_shuffle) shows a caption with "
                       "another pair's image, which needs random access: index the data (python -m "
                       "ncjax.data.build --dataset=web --manual_dir=ROOT) and use input.web.mode='index', or use "
                       "noise.kind='in_batch_resample'")
    if read not in READS:
      raise ValueError(f"input.web.read must be one of {READS}, got {read!r}")
    if read == "auto":
      read = "block" if any(fileio.is_remote(d.root) for d in self.datasets) else "pair"
    self.mode, self.read = mode, (read if mode == "index" else "")
    self.global_batch_size, self.seed, self.mesh = int(global_batch_size), int(seed), mesh
    self.local_batch_size = self.global_batch_size // self.process_count
    self.steps_per_epoch = self.num_trained // self.global_batch_size
    self.weights = parse_weights(weights, len(self.datasets), self.order_sizes)
    self.mixture = mix_lib.Mixture(self.weights, int(mix_block) if len(self.datasets) > 1 else 1, self.seed)
    self.block = max(1, int(block))
    self.window_batches = max(1, int(window_batches))
    self.steps_per_window = order_lib.steps_per_window(self.read, shuffle_pairs, self.local_batch_size,
                                                       self.window_batches, self.steps_per_epoch)
    blocks = isinstance(noise, BlockNoise) or isinstance(noise, DatasetNoise) and any(
        isinstance(p, BlockNoise) for p in noise.parts)
    if self.read == "pair" and blocks:
      raise ValueError("block noise (a partner image from the paired block) goes with input.web.read='block'")
    if subset is not None and self.read == "block" and noise is not None:
      raise errors.ConfigurationError("injected block noise with input.web.filter: a noisy caption's partner may be a "
                                      "pair the filter dropped, outside the blocks read; use input.web.read='pair'")
    if self.read == "block" and isinstance(noise, PermutedNoise):
      if not noise.derangement:
        log.info("block reads derange the noisy captions: exactly floor(ratio N) are shown another image")
      parts = [BlockNoise(int(n), noise.ratio, noise.seed, self.block, d) for d, n in enumerate(self.sizes)]
      noise = parts[0] if len(parts) == 1 else DatasetNoise(tuple(int(o) for o in self.offsets[:-1]), tuple(parts))
    elif isinstance(noise, PermutedNoise) and noise.n == self.num_examples:
      noise = noise.per_dataset(self.sizes)   # one protocol in every read mode: NCR's noise of each dataset apart
    self.noise = noise
    self.noise_sha256 = None if noise is None else noise.sha256
    if decoder not in DECODERS:
      raise ValueError(f"input.web.decoder must be one of {DECODERS}, got {decoder!r}")
    if decoder == "simplejpeg":
      try:
        import simplejpeg  # noqa: F401
      except ImportError as e:
        raise errors.MissingDependency("input.web.decoder='simplejpeg' needs simplejpeg: pip install 'ncjax[web]'") \
            from e
    self.settings = web_decode.DecodeSettings(int(image_size), normalization, bool(augment), tuple(crop_scale),
                                              decoder, "")
    self.on_bad_record = on_bad_record
    self.num_threads, self.prefetch = max(1, int(num_threads)), max(1, int(prefetch))
    self.workers = web_decode.usable_workers(workers)
    self.policy = store.RetryPolicy(deadline_s=float(io_deadline_s), request_timeout_s=float(request_timeout_s))
    for ds in self.datasets:
      ds.policy = self.policy
    self.max_inflight = max(1, int(max_inflight))
    self.sharding = None if mesh is None else NamedSharding(mesh, P(batch_axes(mesh)))
    self.order = order_lib.WebOrder(self.mixture, self.offsets, self.order_sizes, self.kept, self.noise, mode=mode,
                                    read=self.read, block=self.block, seed=self.seed,
                                    global_batch_size=self.global_batch_size, process_index=self.process_index,
                                    process_count=self.process_count, steps_per_window=self.steps_per_window)
    readers = None if mode == "index" else [StreamReader(ds, mix_lib.ShardSchedule(
        ds.counts if kept is None else kept.count_between(ds.starts), self.seed, d, self.process_index,
        self.process_count, window, resample), buffer, kept)
        for d, (ds, kept) in enumerate(zip(self.datasets, self.kept))]
    self.reading = Units(self.datasets, self.order, self.kept, readers, split_gap_bytes)
    self.resample, self.window, self.buffer = bool(resample), int(window), int(buffer)
    self.shuffle_pairs = int(shuffle_pairs)
    self.last_reads = dict(requests=0, bytes=0)
    share = self.mixture.counts / self.mixture.counts.sum()
    how = mode if mode == "stream" else f"index, {self.read} reads" + (
        f" (blocks of {self.block}, {self.steps_per_window} steps per window)" if self.read == "block" else "")
    log.info("web data (%s): %s", how, ", ".join(
        f"{ds.name} {n} pairs {100 * s:.2f}%" for ds, n, s in zip(self.datasets, self.order_sizes, share)))
    if subset is not None:
      log.info("%s", subset.describe())
    if self.noise is not None:
      log.info("injected noise: %s", describe_noise(self.noise))
    if self.read == "block" and self.noise is not None and self.steps_per_window < 3:
      why = (f"an epoch is only {self.steps_per_epoch} batch(es) of {self.global_batch_size} pairs"
             if self.steps_per_epoch < 3 else "input.web.shuffle_pairs and window_batches give that")
      log.warning("block reads with injected noise: a window of %d step(s) (%s) is too short for the deal that keeps "
                  "a noisy caption's own image out of its batch (it needs 3 batches or more), so some noisy captions "
                  "will meet their own image there, shown with another caption; read per pair "
                  "(input.web.read='pair'), or make the batch at most a third of the data", self.steps_per_window, why)
    self.max_skipped_fraction = float(max_skipped_fraction)
    if not 0.0 <= self.max_skipped_fraction <= 1.0:
      raise errors.ConfigurationError(f"input.web.max_skipped_fraction must be in [0, 1], got "
                                      f"{max_skipped_fraction}")
    self.split_gap_bytes = int(split_gap_bytes)


  def indices(self, step: int) -> np.ndarray:
    """Index mode: the global example ids of step `step`'s global batch (before bad-record substitution)."""
    return self.order.indices(step)

  def composition(self, step: int) -> dict:
    """Each dataset's exact share and the pairs of each read before `step` (index mode: by all processes; stream
    mode: by this process)."""
    used = self.order.consumed(step)
    share = self.mixture.counts / self.mixture.counts.sum()
    return {ds.name or str(d): dict(share=float(share[d]), pairs_read=int(used[d]),
                                    epochs=float(used[d] / max(1, self.order_sizes[d])))
            for d, ds in enumerate(self.datasets)}

  # --- resume -----------------------------------------------------------------------------------------------------
  def iterator_state(self, step: int) -> dict:
    return dict(kind=f"web_{self.mode}", read=self.read, order_version=mix_lib.ORDER_VERSION, seed=self.seed,
                next_step=int(step), steps_per_epoch=self.steps_per_epoch, global_batch_size=self.global_batch_size,
                num_examples=self.num_examples, processes=self.process_count,
                datasets=[fileio.absolute(d.root) for d in self.datasets], weights=list(self.weights),
                mix_block=self.mixture.block, resample=self.resample, window=self.window, buffer=self.buffer,
                block=self.block, steps_per_window=self.steps_per_window, composition=self.composition(step),
                noise=self.noise.spec if self.noise is not None else None,
                shards=[d.pins_record() for d in self.datasets] if all(d.pins for d in self.datasets) else [],
                filter=self.subset.digest if self.subset is not None else "")

  def order_settings(self) -> dict:
    """What the order of the remaining steps depends on (beyond seed and step), with the config key of each."""
    out = {"input.shuffle_seed": ("seed", self.seed),
           "input.web.mode": ("kind", f"web_{self.mode}"), "input.web.weights": ("weights", list(self.weights)),
           "input.web.mix_block": ("mix_block", self.mixture.block),
           "input.web.filter": ("filter", self.subset.digest if self.subset is not None else "")}
    if self.mode == "index":
      out["input.web.read"] = ("read", self.read)
    if self.mode == "stream" or self.read == "block":
      out["the process count"] = ("processes", self.process_count)
    if self.mode == "stream":
      out.update({"input.web.window": ("window", self.window), "input.web.buffer": ("buffer", self.buffer),
                  "input.web.resample": ("resample", self.resample)})
    if self.read == "block":
      out.update({"input.web.block": ("block", self.block),
                  "input.web.shuffle_pairs and window_batches (steps per window)":
                      ("steps_per_window", self.steps_per_window)})
    return out

  def check_resume(self, saved: dict) -> None:
    """Refuse, in one line, a resume whose data order would not continue the checkpoint's: another mode, read,
    block, window, buffer, weights, mixture block or — where the order depends on it — process count."""
    if not saved or not str(saved.get("kind", "")).startswith("web_"):
      return
    differ = []
    for key, (field, value) in self.order_settings().items():
      before = saved.get(field)
      if field == "read" and before is None:
        before = "pair"   # checkpoints written before input.web.read existed read per pair
      if field == "filter" and before is None:
        before = ""       # checkpoints written before input.web.filter existed trained on every pair
      if before is not None and before != value:
        differ.append(f"{key}: checkpoint {before!r}, now {value!r}")
    for ds, record in zip(self.datasets, saved.get("shards") or []):
      if ds.pins and (change := ds.changed_since(record)):
        raise errors.CheckpointError(f"cannot resume: the data is not what the checkpoint trained on: {change} since "
                                     f"the run started, so its ids would name other pairs; restore it, or start a "
                                     f"new --workdir")
    if differ:
      raise errors.CheckpointError(f"cannot resume: the web data's order of the remaining steps would differ "
                                   f"({'; '.join(differ)}): resume with the checkpoint's settings, or start a new "
                                   f"--workdir")

  def pairs(self):
    """No in-memory view of web-scale pairs: evaluators that score the training pairs (noise_detection) do not
    run on web data."""
    return None

  def close(self) -> None:
    """Close what reading opened outside `batches` (which closes its own reader and decoder with the generator):
    each dataset's random-access reader, the streamed readers' open shards. Reading again opens them anew."""
    for ds in self.datasets:
      ds.close()
    for reader in self.reading.readers or ():
      reader.close()


  # --- assembly ---------------------------------------------------------------------------------------------------
  def assemble(self, step: int, specs: list, decoded) -> dict:
    """This process's host batch of `step` from its decoded examples (ncjax.data.web.assembly.assemble)."""
    return assembly.assemble(step, specs, decoded, self.on_bad_record, self.reading.describe)

  def host_batch(self, step: int) -> dict:
    """This process's part of the global batch of `step`, read and decoded now (tests, tools)."""
    return next(self.host_batches(step, step + 1))

  def host_batches(self, start_step: int, stop_step: int):
    """This process's host batches for steps [start_step, stop_step): the reads of the next units in flight, each
    step's examples made by the decoder, `prefetch` batches ahead (ncjax.data.web.stages)."""
    reader = store.RangeReader(self.policy, max_inflight=self.max_inflight, local_threads=min(64, self.max_inflight))
    self.reading.measured_gap = reader.gap_bytes
    decoder, context = assembly.make_decoder(self.settings, self.tokenizer, workers=self.workers,
                                             num_threads=self.num_threads, prefetch=self.prefetch)

    def on_close():
      self.last_reads = dict(requests=reader.requests, bytes=reader.bytes,
                             split_gap_bytes={k: c.gap_bytes() for k, c in reader.cost.items()})
      decoder.close()
      reader.close()

    def start_batch(step, specs):
      pending = decoder.submit(specs, context)
      return web_decode.Deferred(lambda: self.assemble(step, specs, pending.result()))

    yield from web_stages.run(self.reading.units(start_step, stop_step), reader.submit, start_batch,
                              prefetch=self.prefetch, readahead=2 if self.read == "block" else self.prefetch + 2,
                              on_close=on_close)

  def to_global(self, host: dict) -> dict:
    return assembly.to_global(host, self.sharding, self.global_batch_size)

  def batches(self, start_step: int, stop_step: int):
    """Yields (global batch arrays, example ids, host statistics) per step (the ids: this process's part unless
    there is one process)."""
    guard = assembly.SkipGuard(self.max_skipped_fraction)
    for host in self.host_batches(start_step, stop_step):
      stats = {"skipped_records": int(host["_skipped"])}
      guard.add(len(host["id"]), stats["skipped_records"])
      yield self.to_global(host), np.asarray(host["id"]), stats

  def global_batch(self, step: int):
    arrays, ids, _ = next(self.batches(step, step + 1))
    return arrays, ids


def train_data(spec: InputSpec, noise: NoiseSpec, concept: ConceptSpec, tokenizer: TokenizerSpec, *,
               image_size: int, mesh, saved_tokenizer: dict | None = None):
  """(WebTrainData, tokenizer) of an input spec whose dataset is 'web:...'."""
  if concept.named:
    raise ValueError("concept unlearning (concept.*) is not available on web data (input.dataset='web:...')")
  datasets = open_datasets(spec)
  built = web_tokenizer(tokenizer, spec.web, datasets, saved_tokenizer)
  n = sum(d.num_examples for d in datasets)
  w = spec.web
  data = WebTrainData(datasets, built, spec.global_batch_size, spec.shuffle_seed, mesh,
                      mode=w.mode, read=w.read, block=w.block, shuffle_pairs=w.shuffle_pairs,
                      weights=w.weights, resample=w.resample, window=w.window, buffer=w.buffer,
                      mix_block=w.mix_block, noise=permuted_noise(noise, n), image_size=image_size,
                      normalization=spec.normalization, augment=spec.augment,
                      crop_scale=spec.crop_scale, on_bad_record=spec.on_bad_record,
                      num_threads=spec.num_threads, prefetch=spec.prefetch, decoder=w.decoder,
                      workers=w.workers, max_inflight=w.max_inflight, io_deadline_s=w.io_deadline_s,
                      request_timeout_s=w.request_timeout_s,
                      subset=_subset(w, datasets), window_batches=w.window_batches,
                      max_skipped_fraction=w.max_skipped_fraction, split_gap_bytes=w.split_gap_bytes)
  return data, built


def _subset(web: WebSpec, datasets):
  """input.web.filter's kept pairs, checked against the datasets (None without a filter)."""
  if not web.filter:
    return None
  from ncjax.data.web import subset
  return subset.open_subset(web.filter, datasets, web.cache_dir, web.cache_bytes)
