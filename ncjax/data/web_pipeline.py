"""Training input from img2dataset output at any size (`input.dataset='web:ROOT'`, mixtures 'web:A::B'): global
batches keyed by stable example ids, in an order that is a pure function of (seed, step), with host memory per
process independent of the dataset size.

Datasets. `web:ROOT[::ROOT2::...]` (open_clip's `--train-data 'a::b'`), each an img2dataset webdataset output
(ncjax.data.web); with several, `input.web.weights='w1::w2'` (open_clip's --train-data-upsampling-factors: relative
weights, default each dataset's size) sets the mixture. Dataset d's pair j has the global id offsets[d] + j with its
id j as ncjax.data.web defines it (shard order, then tar order): the same in both modes below.

Modes (`input.web.mode`):
* 'index' (default when every dataset has its index: python -m ncjax.data.build --dataset=web --manual_dir=ROOT):
  a global shuffle per epoch of each dataset (an on-demand Feistel permutation, ncjax.data.permutation), the global
  batch of step s being positions [s B, (s + 1) B) of ncjax.data.mixture's stream 0, the same for any process count;
  process p reads only its contiguous part (one ranged read per pair). Static injected noise (NCR's caption shuffle)
  needs this mode: caption i is shown with the image of another pair (`noise.PermutedNoise`, no N-long array).
* 'stream': nothing built; process p streams its own shards (every P-th of each epoch's shard permutation, or
  shards drawn with replacement with input.web.resample=True, open_clip's --dataset-resampled) through windows of
  `input.web.window` shards read interleaved and a shuffle buffer of `input.web.buffer` pairs (ncjax.data.mixture).
  Its part of the global batch is positions [s b, (s + 1) b) of its own stream; resume re-reads the current window.

Either way nothing is restored but the step: resume is bitwise. An epoch is sum N_d // B steps (with a mixture,
`num_epochs` counts passes over that many pairs, whatever the weights).

Per example: the pair's record is read, its caption tokenised (as read: there is no caption table), its image
decoded, randomly resized-cropped from `streams.crop_rng(seed, step, j)` (j its global position in the batch) and
normalised, on `input.num_threads` threads, `input.prefetch` batches ahead.

Bad records (a sample missing from a cut or corrupt tar, an image that does not decode, an empty caption) are
skipped and counted in `input/skipped_records`: in index mode the next pair of its dataset (id + 1, + 2, ...) takes
its place, as on the small-data path (ncjax.data.pipeline); in stream mode, where there is no random access, the
next usable pair of this process's part of the batch (a repeat). input.on_bad_record='raise' raises with the id.

Memory per process: the datasets' per-shard counts (S-long), the memory-mapped index (4 bytes per pair, shared
through the page cache), the prefetched batches and, streamed, one window's shuffle buffer. The mixture's
composition (each dataset's exact share) is logged at start-up and written with every checkpoint's iterator state.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import io
import logging
import queue
import threading

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ncjax import fileio
from ncjax.data import mixture as mix_lib
from ncjax.data import preprocess, readers, streams, web
from ncjax.data.noise import PermutedNoise, permuted_noise_from_config
from ncjax.data.pipeline import HOST_ONLY_PREFIX, BadRecordError, batch_axes, check_batch_divisible

log = logging.getLogger("ncjax")

PREFIX = "web:"
MODES = ("auto", "index", "stream")
DECODERS = ("pil", "simplejpeg")


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


def web_settings(input_config) -> dict:
  """input.web with its defaults (a config without the section reads as all defaults)."""
  out = dict(mode="auto", weights="", resample=False, window=8, buffer=2048, mix_block=1000, caption_key="caption",
             clean_key="", cache_dir="", vocab_captions=200_000, max_vocab=65_536, decoder="pil")
  given = input_config.get("web", None)
  if given is not None:
    unknown = set(given.keys()) - set(out)
    if unknown:
      raise ValueError(f"unknown input.web keys {sorted(unknown)}; known: {sorted(out)}")
    out.update({k: given[k] for k in given.keys()})
  if out["mode"] not in MODES:
    raise ValueError(f"input.web.mode must be one of {MODES}, got {out['mode']!r}")
  if out["decoder"] not in DECODERS:
    raise ValueError(f"input.web.decoder must be one of {DECODERS}, got {out['decoder']!r}")
  return out


def open_datasets(input_config) -> tuple[list[web.WebDataset], dict]:
  settings = web_settings(input_config)
  roots = parse_roots(input_config.dataset)
  use_index = settings["mode"] != "stream"
  datasets = [web.open_dataset(r, use_index=use_index, caption_key=settings["caption_key"],
                               clean_key=settings["clean_key"], cache_dir=settings["cache_dir"]) for r in roots]
  return datasets, settings


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


def web_tokenizer(kind: str, context_length: int, input_config, datasets, saved: dict | None = None):
  """A resumed run's tokenizer; else the fixed vocabulary of `kind`; else (kind 'word') a word vocabulary counted
  over at most input.web.vocab_captions captions and capped at input.web.max_vocab words (input.min_word_count
  applies): its size does not grow with the data. Web-scale runs should prefer model.tokenizer=clip_bpe."""
  from ncjax import tokenizers
  if saved is not None:
    return tokenizers.tokenizer_from_json(saved)
  if kind != "word":
    return tokenizers.build_tokenizer([], context_length=context_length, kind=kind)
  s = web_settings(input_config)
  caps = sample_captions(datasets, int(s["vocab_captions"]))
  log.info("word vocabulary of the web data counted over %d captions, capped at %d words", len(caps),
           s["max_vocab"])
  return tokenizers.WordTokenizer.build(caps, context_length=context_length, min_count=input_config.min_word_count,
                                        max_size=int(s["max_vocab"]))


# ---------------------------------------------------------------------------------------------------------------
# per-example work: decode, crop, normalise, tokenise
# ---------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _normalization_table(normalization: str) -> np.ndarray:
  """(3, 256) float32: preprocess.normalize of every uint8 value per channel (the same float32 arithmetic)."""
  return np.ascontiguousarray(preprocess.normalize(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, 1),
                                                   normalization).T)


def normalize(pixels: np.ndarray, normalization: str) -> np.ndarray:
  """preprocess.normalize, bitwise, as one table look-up per channel (about twice as fast at 224 px)."""
  table = _normalization_table(normalization)
  return np.stack([np.take(table[k], pixels[..., k]) for k in range(3)], axis=-1)


def decode_train(data: bytes, size: int, rng: np.random.Generator, normalization: str, scale,
                 decoder: str = "pil") -> np.ndarray:
  """JPEG/PNG bytes -> the random resized crop at size x size, normalised (train_transform without the array round
  trip; PIL's draft mode lets the JPEG decoder scale down by 2/4/8 when the crop allows). decoder='simplejpeg'
  decodes JPEGs with simplejpeg (pip install ncjax[web]; about 4x PIL's JPEG decode here, benchmarks/web_data.py):
  its pixels may differ from PIL's by a level, so a run keeps one decoder."""
  from PIL import Image
  if decoder == "simplejpeg" and data[:2] == b"\xff\xd8":
    import simplejpeg
    px = simplejpeg.decode_jpeg(data, colorspace="RGB")
    left, top, cw, ch = preprocess.random_resized_crop_box(rng, px.shape[1], px.shape[0], scale)
    img = Image.fromarray(px).resize((size, size), Image.BICUBIC, box=(left, top, left + cw, top + ch))
    return normalize(np.asarray(img), normalization)
  with Image.open(io.BytesIO(data)) as im:
    w, h = im.size
    left, top, cw, ch = preprocess.random_resized_crop_box(rng, w, h, scale)
    factor = min(cw, ch) // size
    if im.format == "JPEG" and factor >= 2:
      im.draft("RGB", (max(1, w // factor), max(1, h // factor)))
      sx, sy = im.size[0] / w, im.size[1] / h
      left, top, cw, ch = left * sx, top * sy, cw * sx, ch * sy
    img = im.convert("RGB")
    img = img.resize((size, size), Image.BICUBIC, box=(left, top, left + cw, top + ch))
  return normalize(np.asarray(img), normalization)


def decode_eval(data: bytes, size: int, normalization: str) -> np.ndarray:
  from PIL import Image
  with Image.open(io.BytesIO(data)) as im:
    return preprocess.eval_transform(im.convert("RGB"), size, normalization)


# ---------------------------------------------------------------------------------------------------------------
# streamed reading
# ---------------------------------------------------------------------------------------------------------------
class StreamReader:
  """Process p's stream of one dataset: its ordinal q -> Sample, read front to back (ordinals asked in increasing
  order; an earlier one, as after a resume, re-positions at the start of its window)."""

  def __init__(self, ds: web.WebDataset, schedule: mix_lib.ShardSchedule, buffer: int):
    self.ds, self.schedule, self.buffer = ds, schedule, int(buffer)
    self.window, self.it, self.next = None, None, 0

  def _open(self, window):
    shards = [self.ds.iter_shard(int(s)) for s in window.shards]
    self.window = window
    self.it = mix_lib.buffer_shuffle(mix_lib.interleave(shards), self.buffer, self.schedule.buffer_rng(window))
    self.next = window.start

  def take(self, q: int) -> web.Sample:
    q = int(q)
    w = self.window
    if w is None or q < self.next or q >= w.start + w.size:
      nxt = self.schedule.next_window(w) if w is not None and q >= w.start + w.size else None
      if nxt is None or not nxt.start <= q < nxt.start + nxt.size:
        nxt = self.schedule.window_at(q)
      self._open(nxt)
    while self.next < q:   # skip what was already used (resume inside a window)
      next(self.it)
      self.next += 1
    self.next += 1
    return next(self.it)


# ---------------------------------------------------------------------------------------------------------------
# the training input
# ---------------------------------------------------------------------------------------------------------------
class WebTrainData:
  """Global batches of web-scale training pairs (the interface of ncjax.data.pipeline.TrainData that the trainer
  uses: batches, iterator_state, num_examples, steps_per_epoch, noise_sha256, pairs)."""

  def __init__(self, datasets: list[web.WebDataset], tokenizer, global_batch_size: int, seed: int, mesh=None, *,
               mode: str = "auto", weights=(), resample: bool = False, window: int = 8, buffer: int = 2048,
               mix_block: int = 1000, noise: PermutedNoise | None = None, image_size: int = 224,
               normalization: str = "openai", augment: bool = True, crop_scale=(0.9, 1.0),
               on_bad_record: str = "skip", num_threads: int = 8, prefetch: int = 4, decoder: str = "pil",
               process_index: int | None = None, process_count: int | None = None):
    self.process_index = jax.process_index() if process_index is None else int(process_index)
    self.process_count = jax.process_count() if process_count is None else int(process_count)
    if mesh is not None:
      check_batch_divisible(global_batch_size, mesh)
    if global_batch_size % self.process_count:
      raise ValueError(f"global batch size {global_batch_size} is not divisible by {self.process_count} processes")
    if on_bad_record not in ("skip", "raise"):
      raise ValueError(f"input.on_bad_record must be 'skip' or 'raise', got {on_bad_record!r}")
    self.datasets, self.tokenizer = list(datasets), tokenizer
    self.sizes = np.asarray([d.num_examples for d in self.datasets], np.int64)
    self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
    self.num_examples = int(self.offsets[-1])
    if global_batch_size > self.num_examples:
      raise ValueError(f"global batch size {global_batch_size} exceeds the {self.num_examples} web pairs")
    if self.num_examples >= 2 ** 31:
      raise ValueError(f"{self.num_examples} pairs: example ids are int32 on the device (at most 2^31 - 1)")
    indexed = all(d.index is not None for d in self.datasets)
    if mode == "auto":
      mode = "index" if indexed else "stream"
    if mode == "index" and not indexed:
      missing = [d.root for d in self.datasets if d.index is None]
      raise ValueError(f"input.web.mode='index' but {missing[0]} has no index: python -m ncjax.data.build "
                       f"--dataset=web --manual_dir={missing[0]} (or input.web.mode='stream')")
    if mode == "stream" and noise is not None:
      raise ValueError("static injected noise (noise.kind caption_shuffle / image_shuffle) shows a caption with "
                       "another pair's image, which needs random access: index the data (python -m "
                       "ncjax.data.build --dataset=web --manual_dir=ROOT) and use input.web.mode='index', or use "
                       "noise.kind='in_batch_resample'")
    self.mode = mode
    self.global_batch_size, self.seed, self.mesh = int(global_batch_size), int(seed), mesh
    self.local_batch_size = self.global_batch_size // self.process_count
    self.steps_per_epoch = self.num_examples // self.global_batch_size
    self.weights = parse_weights(weights, len(self.datasets), self.sizes)
    self.mixture = mix_lib.Mixture(self.weights, int(mix_block) if len(self.datasets) > 1 else 1, self.seed)
    self.noise = noise
    self.noise_sha256 = None if noise is None else noise.sha256
    self.image_size, self.normalization = int(image_size), normalization
    self.augment, self.crop_scale, self.on_bad_record = augment, tuple(crop_scale), on_bad_record
    self.num_threads, self.prefetch = max(1, int(num_threads)), max(1, int(prefetch))
    if decoder not in DECODERS:
      raise ValueError(f"input.web.decoder must be one of {DECODERS}, got {decoder!r}")
    if decoder == "simplejpeg":
      try:
        import simplejpeg  # noqa: F401
      except ImportError as e:
        raise ValueError("input.web.decoder='simplejpeg' needs simplejpeg: pip install 'ncjax[web]'") from e
    self.decoder = decoder
    self.sharding = None if mesh is None else NamedSharding(mesh, P(batch_axes(mesh)))
    if mode == "index":
      self.perms = [mix_lib.EpochPermutations(n, self.seed, d) for d, n in enumerate(self.sizes)]
    else:
      self.readers = [StreamReader(ds, mix_lib.ShardSchedule(ds.counts, self.seed, d, self.process_index,
                                                             self.process_count, window, resample), buffer)
                      for d, ds in enumerate(self.datasets)]
    self.resample, self.window, self.buffer = bool(resample), int(window), int(buffer)
    share = self.mixture.counts / self.mixture.counts.sum()
    log.info("web data (%s): %s", mode, ", ".join(
        f"{ds.name} {n} pairs {100 * s:.2f}%" for ds, n, s in zip(self.datasets, self.sizes, share)))

  # --- order ------------------------------------------------------------------------------------------------------
  def _stream(self) -> int:
    return 0 if self.mode == "index" else 1 + self.process_index

  def _positions(self, step: int, first: int, count: int) -> np.ndarray:
    if self.mode == "index":
      return step * self.global_batch_size + first + np.arange(count, dtype=np.int64)
    return step * self.local_batch_size + (first - self.process_index * self.local_batch_size) + np.arange(
        count, dtype=np.int64)

  def indices(self, step: int) -> np.ndarray:
    """Index mode: the global example ids of step `step`'s global batch (before bad-record substitution)."""
    if self.mode != "index":
      raise ValueError("the global batch's ids are known without reading only in index mode")
    return self._ids(step, 0, self.global_batch_size)

  def _ids(self, step: int, first: int, count: int) -> np.ndarray:
    datasets, ordinals = self.mixture.choose(0, self._positions(step, first, count))
    out = np.empty(count, np.int64)
    for d in np.unique(datasets):
      sel = datasets == d
      out[sel] = self.offsets[d] + self.perms[d](ordinals[sel])
    return out

  def composition(self, step: int) -> dict:
    """Each dataset's exact share and the pairs of each read before `step` (index mode: by all processes; stream
    mode: by this process)."""
    stream = self._stream()
    upto = step * (self.global_batch_size if self.mode == "index" else self.local_batch_size)
    used = self.mixture.consumed(stream, upto)
    share = self.mixture.counts / self.mixture.counts.sum()
    return {ds.name or str(d): dict(share=float(share[d]), pairs_read=int(used[d]),
                                    epochs=float(used[d] / max(1, self.sizes[d])))
            for d, ds in enumerate(self.datasets)}

  def iterator_state(self, step: int) -> dict:
    return dict(kind=f"web_{self.mode}", order_version=mix_lib.ORDER_VERSION, seed=self.seed, next_step=int(step),
                steps_per_epoch=self.steps_per_epoch, global_batch_size=self.global_batch_size,
                num_examples=self.num_examples, processes=self.process_count,
                datasets=[fileio.absolute(d.root) if not fileio.is_remote(d.root) else d.root for d in self.datasets],
                weights=list(self.weights), mix_block=self.mixture.block, resample=self.resample,
                window=self.window, buffer=self.buffer, composition=self.composition(step))

  def pairs(self):
    """No in-memory view of web-scale pairs: evaluators that score the training pairs (noise_detection) do not
    run on web data."""
    return None

  # --- reading ----------------------------------------------------------------------------------------------------
  def _locate(self, gid: int) -> tuple[int, int]:
    d = int(np.searchsorted(self.offsets, gid, side="right") - 1)
    return d, int(gid - self.offsets[d])

  def _read(self, gid: int) -> web.Sample:
    d, j = self._locate(gid)
    return self.datasets[d].read(j)

  def _raw_samples(self, step: int) -> list:
    """This process's part of step `step`: (global id, Sample, image Sample or None) per example."""
    b, first = self.local_batch_size, self.process_index * self.local_batch_size
    if self.mode == "index":
      return [(int(g), None, None) for g in self._ids(step, first, b)]   # read by the workers
    datasets, ordinals = self.mixture.choose(self._stream(), self._positions(step, first, b))
    out = []
    for d, q in zip(datasets, ordinals):
      sample = self.readers[d].take(int(q))
      out.append((int(self.offsets[d] + sample.id), sample, None))
    return out

  def _example(self, gid: int, sample, rng_seed: tuple) -> dict:
    """One example from its pair (read now in index mode); raises BadRecordError when unusable."""
    if sample is None:
      sample = self._read(gid)
    if sample.bad:
      raise BadRecordError(sample.bad)
    caption = sample.caption
    if not caption or not caption.strip():
      raise BadRecordError("empty caption")
    image_sample, clean = sample, True
    if self.noise is not None:
      partner = int(self.noise.image_of(np.asarray([gid]))[0])
      if partner != gid:
        image_sample, clean = self._read(partner), False
        if image_sample.bad:
          raise BadRecordError(f"the image of pair {partner} (shown with this caption by the noise): "
                               f"{image_sample.bad}")
    if not image_sample.image:
      raise BadRecordError("no image")
    d, _ = self._locate(gid)
    own = self.datasets[d].own_clean(sample)
    rng = streams.crop_rng(*rng_seed)
    if self.augment:
      image = decode_train(image_sample.image, self.image_size, rng, self.normalization, self.crop_scale,
                           self.decoder)
    else:
      image = decode_eval(image_sample.image, self.image_size, self.normalization)
    return dict(image=image, tokens=self.tokenizer.encode([caption])[0], id=np.int32(gid),
                clean=np.bool_(own and clean))

  def _try(self, gid, sample, rng_seed):
    try:
      return self._example(gid, sample, rng_seed), None
    except Exception as e:   # corrupt image bytes raise PIL / OS errors
      if self.on_bad_record == "raise":
        raise BadRecordError(f"bad training record id {gid} ({self._describe(gid)}): {type(e).__name__}: {e}") \
            from e
      return None, e

  def _describe(self, gid: int) -> str:
    d, j = self._locate(gid)
    ds = self.datasets[d]
    s, k = ds.locate(j)
    return f"{ds.shards[int(s)]} sample {int(k)}"

  def _indexed_example(self, step: int, jj: int, gid: int) -> tuple[dict, int]:
    """Index mode: the pair or, when it is bad, the next of its dataset (id + 1, ...)."""
    d, j = self._locate(gid)
    n = int(self.sizes[d])
    for attempt in range(min(n, 10_000)):
      cand = int(self.offsets[d] + (j + attempt) % n)
      ex, err = self._try(cand, None, (self.seed, step, jj))
      if ex is not None:
        ex["_skipped"] = np.int32(attempt)
        return ex, attempt
    raise BadRecordError(f"no usable record among 10,000 pairs of {self.datasets[d].root} from id {gid}")

  def host_batch(self, step: int, pool=None) -> dict:
    """This process's part of the global batch of `step`."""
    b, first = self.local_batch_size, self.process_index * self.local_batch_size
    raw = self._raw_samples(step)
    run = (pool.map if pool is not None else map)
    if self.mode == "index":
      results = list(run(lambda k: self._indexed_example(step, first + k, raw[k][0]), range(b)))
      examples, skipped = [r[0] for r in results], sum(r[1] for r in results)
    else:
      tried = list(run(lambda k: self._try(raw[k][0], raw[k][1], (self.seed, step, first + k)), range(b)))
      good = [k for k, (ex, _) in enumerate(tried) if ex is not None]
      if not good:
        raise BadRecordError(f"step {step}: none of this process's {b} streamed pairs is usable "
                             f"(e.g. id {raw[0][0]}: {tried[0][1]})")
      examples, skipped = [], 0
      for k in range(b):
        if tried[k][0] is not None:
          examples.append(tried[k][0])
        else:
          skipped += 1
          log.debug("bad streamed record id %d: %s", raw[k][0], tried[k][1])
          later = [g for g in good if g > k]
          examples.append(tried[later[0] if later else good[0]][0])   # the next usable one, cyclically
    batch = {key: np.stack([e[key] for e in examples]) for key in ("image", "tokens", "id", "clean")}
    batch["_skipped"] = np.asarray(skipped, np.int32)
    return batch

  def host_batches(self, start_step: int, stop_step: int):
    """This process's host batches for steps [start_step, stop_step), `prefetch` ahead on a reader thread whose
    examples are decoded by `num_threads` threads."""
    out: queue.Queue = queue.Queue(maxsize=self.prefetch)
    stop = threading.Event()
    done = object()

    def produce():
      try:
        with cf.ThreadPoolExecutor(self.num_threads, thread_name_prefix="ncjax-web") as pool:
          for step in range(start_step, stop_step):
            batch = self.host_batch(step, pool if self.num_threads > 1 else None)
            while not stop.is_set():
              try:
                out.put(batch, timeout=0.1)
                break
              except queue.Full:
                continue
            if stop.is_set():
              return
        out.put(done)
      except BaseException as e:   # surfaced in the consumer
        out.put(e)

    thread = threading.Thread(target=produce, name="ncjax-web-reader", daemon=True)
    thread.start()
    try:
      while True:
        item = out.get()
        if item is done:
          return
        if isinstance(item, BaseException):
          raise item
        yield item
    finally:
      stop.set()

  def to_global(self, host: dict) -> dict:
    return {k: jax.make_array_from_process_local_data(self.sharding, v, (self.global_batch_size,) + v.shape[1:])
            for k, v in host.items() if not k.startswith(HOST_ONLY_PREFIX)}

  def batches(self, start_step: int, stop_step: int):
    """Yields (global batch arrays, example ids, host statistics) per step (the ids: this process's part unless
    there is one process)."""
    for host in self.host_batches(start_step, stop_step):
      stats = {"skipped_records": int(host["_skipped"])}
      yield self.to_global(host), np.asarray(host["id"]), stats

  def global_batch(self, step: int):
    arrays, ids, _ = next(self.batches(step, step + 1))
    return arrays, ids


def train_data_from_config(input_config, noise_config, *, image_size: int, tokenizer_kind: str,
                           context_length: int, mesh, saved_tokenizer: dict | None = None, concept=None):
  """(WebTrainData, tokenizer) of `config.input` when input.dataset is 'web:...'."""
  if concept is not None and (concept.classes or concept.subreddits or concept.keywords):
    raise ValueError("concept unlearning (concept.*) is not available on web data (input.dataset='web:...')")
  datasets, s = open_datasets(input_config)
  tokenizer = web_tokenizer(tokenizer_kind, context_length, input_config, datasets, saved_tokenizer)
  n = sum(d.num_examples for d in datasets)
  noise = permuted_noise_from_config(noise_config, n)
  data = WebTrainData(datasets, tokenizer, input_config.global_batch_size, input_config.shuffle_seed, mesh,
                      mode=s["mode"], weights=s["weights"], resample=s["resample"], window=s["window"],
                      buffer=s["buffer"], mix_block=s["mix_block"], noise=noise, image_size=image_size,
                      normalization=input_config.normalization, augment=input_config.augment,
                      crop_scale=input_config.crop_scale, on_bad_record=input_config.on_bad_record,
                      num_threads=input_config.num_threads, prefetch=input_config.prefetch, decoder=s["decoder"])
  return data, tokenizer
