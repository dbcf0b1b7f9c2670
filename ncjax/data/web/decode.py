"""The per-example work of the web reader — decode, random resized crop, normalise, tokenise — on threads or on
worker processes, so that a host's input rate grows with its cores.

An example arrives as an `ExampleSpec` (its caption, the image bytes it is shown with, the seed of its crop, its
flags) and leaves as (float32 image, int32 tokens), or as the reason it is a bad record (an image that does not
decode, an empty caption). Nothing here reads files or knows the order: ncjax.data.web.pipeline fetched the bytes.

Two decoders, the same results bitwise (tests/data/test_web_decode.py):
* `ThreadDecoder` (input.web.workers=0): a thread pool in the training process. Pillow and simplejpeg release the
  GIL while they decode and resize; the Python around them (the crop's draws, tokenising) does not, so on a many-core
  host the rate stops growing after a few threads.
* `ProcessDecoder` (input.web.workers=N): N spawned processes, each with its own tokenizer (rebuilt from its JSON).
  The parent sends the bytes (a JPEG is ~10-30 KB); a worker writes the normalised image straight into a
  shared-memory batch buffer (no 600 KB pickle per 224-px image) and returns the tokens. The parent copies the
  finished batch out of shared memory, so a buffer is reused only after the batch left it.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import io
import multiprocessing
import os
import re
import threading

import numpy as np

from ncjax.data import preprocess, streams


@dataclasses.dataclass(frozen=True)
class ExampleSpec:
  """One example to make: caption `caption` shown with `image` (bytes; another pair's under injected noise), its crop
  drawn from streams.crop_rng(*crop), `bad` the reason it is unusable when known before decoding."""
  id: int
  caption: str | None
  image: bytes | None
  crop: tuple
  clean: bool = True
  bad: str = ""


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  image_size: int
  normalization: str = "openai"
  augment: bool = True
  crop_scale: tuple = (0.9, 1.0)
  decoder: str = "pil"
  tokenizer_json: str = ""


class BadExample(ValueError):
  """The example's own content is unusable (skipped and counted by the caller)."""


# ---------------------------------------------------------------------------------------------------------------
# one image
# ---------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _normalization_table(normalization: str) -> np.ndarray:
  """(3, 256) float32: preprocess.normalize of every uint8 value per channel (the same float32 arithmetic)."""
  return np.ascontiguousarray(preprocess.normalize(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, 1),
                                                   normalization).T)


def normalize(pixels: np.ndarray, normalization: str, out: np.ndarray | None = None) -> np.ndarray:
  """preprocess.normalize, bitwise, as one table look-up per channel (about twice as fast at 224 px)."""
  table = _normalization_table(normalization)
  if out is None:
    out = np.empty(pixels.shape, np.float32)
  for k in range(3):
    np.take(table[k], pixels[..., k], out=out[..., k], mode="clip")   # uint8 indices: clip never clips
  return out


def decode_train(data: bytes, size: int, rng: np.random.Generator, normalization: str, scale,
                 decoder: str = "pil", out: np.ndarray | None = None) -> np.ndarray:
  """JPEG/PNG bytes -> the random resized crop at size x size, normalised (train_transform without the array round
  trip; PIL's draft mode lets the JPEG decoder scale down by 2/4/8 when the crop allows). decoder='simplejpeg'
  decodes JPEGs with simplejpeg (pip install ncjax[web]): its pixels may differ from PIL's by a level, so a run keeps
  one decoder."""
  from PIL import Image
  if decoder == "simplejpeg" and data[:2] == b"\xff\xd8":
    import simplejpeg
    px = simplejpeg.decode_jpeg(data, colorspace="RGB")
    left, top, cw, ch = preprocess.random_resized_crop_box(rng, px.shape[1], px.shape[0], scale)
    img = Image.fromarray(px).resize((size, size), Image.BICUBIC, box=(left, top, left + cw, top + ch))
    return normalize(np.asarray(img), normalization, out)
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
  return normalize(np.asarray(img), normalization, out)


def decode_eval(data: bytes, size: int, normalization: str) -> np.ndarray:
  from PIL import Image
  with Image.open(io.BytesIO(data)) as im:
    return preprocess.eval_transform(im.convert("RGB"), size, normalization)


def make_example(spec: ExampleSpec, settings: DecodeSettings, tokenizer, out: np.ndarray | None = None):
  """(image, tokens) of one spec; BadExample when its content is unusable. With `out`, the image is written there."""
  if spec.bad:
    raise BadExample(spec.bad)
  if not spec.caption or not spec.caption.strip():
    raise BadExample("empty caption")
  if not spec.image:
    raise BadExample("no image")
  try:
    if settings.augment:
      image = decode_train(spec.image, settings.image_size, streams.crop_rng(*spec.crop), settings.normalization,
                           settings.crop_scale, settings.decoder, out)
    else:
      image = decode_eval(spec.image, settings.image_size, settings.normalization)
      if out is not None:
        out[...] = image
  except Exception as e:  # noqa: BLE001 — PIL raises many types for bytes that are not an image
    if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno is not None):
      raise   # the machine's fault (out of memory, a disk or pipe error), not the record's: never a skip
    text = re.sub(r" ?<[^>]*>", "", str(e))   # PIL names the BytesIO object: an address, different every run
    raise BadExample(f"the image does not decode: {type(e).__name__}: {text}") from None
  return image, tokenizer.encode([spec.caption])[0]


def _tokenizer_from(settings: DecodeSettings):
  from ncjax import tokenizers
  return tokenizers.tokenizer_from_json(settings.tokenizer_json)


# ---------------------------------------------------------------------------------------------------------------
# decoders: a batch of specs -> (images, tokens, errors)
# ---------------------------------------------------------------------------------------------------------------
class ThreadDecoder:
  """Examples made on `threads` threads of this process."""

  def __init__(self, settings: DecodeSettings, tokenizer, threads: int):
    self.settings, self.tokenizer = settings, tokenizer
    self.threads = max(1, int(threads))
    self.pool = cf.ThreadPoolExecutor(self.threads, thread_name_prefix="ncjax-decode") if self.threads > 1 else None

  def decode(self, specs: list[ExampleSpec], context_length: int):
    """(images (b, S, S, 3) float32, tokens (b, L) int32, errors: list of str or None per example)."""
    b, size = len(specs), self.settings.image_size
    images = np.zeros((b, size, size, 3), np.float32)
    tokens = np.zeros((b, context_length), np.int32)
    errors: list[str | None] = [None] * b

    def one(k):
      try:
        _, tokens[k] = make_example(specs[k], self.settings, self.tokenizer, images[k])
      except BadExample as e:
        errors[k] = str(e)

    list(self.pool.map(one, range(b))) if self.pool is not None else [one(k) for k in range(b)]
    return images, tokens, errors

  def submit(self, specs: list[ExampleSpec], context_length: int) -> "_Done":
    """The batch made now (the threads share this process: nothing to overlap)."""
    return _Done(self.decode(specs, context_length))

  def close(self):
    if self.pool is not None:
      self.pool.shutdown(wait=True, cancel_futures=True)


_WORKER: dict = {}


def _worker_init(settings: DecodeSettings):
  _WORKER.update(settings=settings, tokenizer=_tokenizer_from(settings), shm={})


def _attach(name: str):
  """The parent's shared-memory buffer, mapped without registering it with multiprocessing's resource tracker (which
  would unlink the parent's buffer when this worker exits; Python 3.13's track=False does the same)."""
  import mmap
  path = os.path.join("/dev/shm", name.lstrip("/"))
  with open(path, "r+b") as f:
    return mmap.mmap(f.fileno(), 0)


def _worker_make(shm_name: str, shape: tuple, rows: list[int], specs: list[ExampleSpec]):
  segments = _WORKER["shm"]
  if shm_name not in segments:
    if len(segments) > 16:   # buffers of finished runs
      for old in list(segments)[:8]:
        segments.pop(old).close()
    segments[shm_name] = _attach(shm_name)
  images = np.ndarray(shape, np.float32, buffer=segments[shm_name])
  out = []
  for row, spec in zip(rows, specs):
    try:
      _, tok = make_example(spec, _WORKER["settings"], _WORKER["tokenizer"], images[row])
      out.append((tok, None))
    except BadExample as e:
      out.append((None, str(e)))
  return out


class ProcessDecoder:
  """Examples made by `workers` spawned processes writing into shared-memory batch buffers."""

  def __init__(self, settings: DecodeSettings, workers: int, buffers: int = 6):
    from multiprocessing import shared_memory
    self.settings, self.workers = settings, max(1, int(workers))
    self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_worker_init, initargs=(settings,))
    self._shared_memory = shared_memory
    self._free: list = []
    self._all: list = []
    self._lock = threading.Lock()
    self._buffers = max(1, int(buffers))

  def _buffer(self, nbytes: int):
    with self._lock:
      for k, shm in enumerate(self._free):
        if shm.size >= nbytes:
          return self._free.pop(k)
      shm = self._shared_memory.SharedMemory(create=True, size=max(1, nbytes))
      self._all.append(shm)
      return shm

  def _release(self, shm):
    with self._lock:
      self._free.append(shm)

  def submit(self, specs: list[ExampleSpec], context_length: int) -> "_Pending":
    """Start making a batch; its result() is what decode() returns. Two batches in flight keep every worker busy
    across the end of a batch (the last chunks of one overlap the first of the next)."""
    b, size = len(specs), self.settings.image_size
    shape = (b, size, size, 3)
    shm = self._buffer(int(np.prod(shape)) * 4)
    try:
      chunks = [r for r in (np.array_split(np.arange(b), min(b, self.workers * 4)) if b else []) if len(r)]
      futures = [self.pool.submit(_worker_make, shm.name, shape, rows.tolist(), [specs[k] for k in rows])
                 for rows in chunks]
    except BaseException:
      self._release(shm)
      raise
    return _Pending(self, shm, shape, chunks, futures, context_length)

  def decode(self, specs: list[ExampleSpec], context_length: int):
    return self.submit(specs, context_length).result()

  def close(self):
    self.pool.shutdown(wait=True, cancel_futures=True)
    with self._lock:
      for shm in self._all:
        try:
          shm.close()
          shm.unlink()
        except (FileNotFoundError, BufferError):
          pass
      self._all, self._free = [], []


class _Pending:
  """A batch being made by the worker processes."""

  def __init__(self, decoder, shm, shape, chunks, futures, context_length):
    self.decoder, self.shm, self.shape = decoder, shm, shape
    self.chunks, self.futures, self.context_length = chunks, futures, context_length

  def result(self):
    b = self.shape[0]
    try:
      tokens = np.zeros((b, self.context_length), np.int32)
      errors: list[str | None] = [None] * b
      for rows, fut in zip(self.chunks, self.futures):
        for k, (tok, err) in zip(rows, fut.result()):
          if err is None:
            tokens[k] = tok
          else:
            errors[k] = err
      view = np.ndarray(self.shape, np.float32, buffer=self.shm.buf)
      images = view.copy()   # the buffer is reused by a later batch: the batch leaves it now
      del view
      for k, err in enumerate(errors):
        if err is not None:
          images[k] = 0.0
    finally:
      for fut in self.futures:
        fut.cancel()
      self.decoder._release(self.shm)
    return images, tokens, errors


class _Done:
  def __init__(self, value):
    self.value = value

  def result(self):
    return self.value


class Deferred:
  """result() calls `fn` once (what comes after a batch's decode: assembling it)."""

  def __init__(self, fn):
    self.fn = fn

  def result(self):
    return self.fn()


def make_decoder(settings: DecodeSettings, tokenizer, *, workers: int, threads: int):
  """ProcessDecoder with `workers` > 0, else ThreadDecoder with `threads`."""
  if workers and workers > 0:
    return ProcessDecoder(settings, workers)
  return ThreadDecoder(settings, tokenizer, threads)


def usable_workers(requested: int) -> int:
  """input.web.workers: -1 -> one per usable core (at least 1), else the number asked."""
  if requested is None or int(requested) >= 0:
    return int(requested or 0)
  from ncjax.data.tables.sources import usable_cores
  return max(1, usable_cores())

