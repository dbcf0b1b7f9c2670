"""The input of a run as typed, frozen values: what the data layer takes instead of config sections.

`ncjax.experiment.resolve` builds them once from `config.input`, `config.input.web`, `config.noise` and
`config.concept` (next to the model spec and the method's options); below it, nothing reads those sections. The
defaults are config_lib's (tests/test_config.py checks they agree), so a test or a tool can build a spec by hand with
only the fields it cares about.
"""

from __future__ import annotations

import dataclasses

WEB_MODES = ("auto", "index", "stream")
WEB_READS = ("auto", "pair", "block")
WEB_DECODERS = ("pil", "simplejpeg")
TRAIN_ON = ("all", "retain", "forget_retain")
NOISE_TRAIN_ON = ("all", "clean")


@dataclasses.dataclass(frozen=True)
class WebSpec:
  """`input.web`: how img2dataset output is read (ncjax.data.web.pipeline; config_lib documents each field)."""
  mode: str = "auto"              # 'auto' (indexed when built, else streamed) | 'index' | 'stream'
  read: str = "auto"              # indexed: 'auto' (block on an object store) | 'pair' | 'block'
  block: int = 64                 # pairs per ranged read when read='block'
  shuffle_pairs: int = 4096       # block reads: pairs shuffled together per process
  window_batches: int = 16        # block reads: ... and at least this many per-process batches
  weights: str | tuple = ""       # a mixture's 'w1::w2' (default: the datasets' sizes)
  resample: bool = False          # streamed shards drawn with replacement
  window: int = 8                 # streamed shard segments read interleaved
  buffer: int = 2048              # the streamed shuffle buffer, in pairs
  mix_block: int = 1000           # positions per mixture block
  caption_key: str = "caption"
  clean_key: str = ""
  cache_dir: str = ""             # the host's copy of a gs:// index (ncjax.data.web.host_cache)
  cache_bytes: int = 32 << 30     # ... least recently used files evicted beyond this
  vocab_captions: int = 200_000   # a word vocabulary counts at most this many captions
  max_vocab: int = 65_536         # ... and keeps at most this many words
  decoder: str = "pil"            # 'pil' | 'simplejpeg'
  workers: int = 0                # decode processes (0: threads of the training process; -1: one per core)
  max_inflight: int = 64          # ranged reads in flight
  io_deadline_s: float = 300.0    # how long a read retries a store that does not answer (ncjax.data.web.store)
  request_timeout_s: float = 60.0 # one request to the store, at most (gcsfs's own default: no limit)
  filter: str = ""                # a directory written by `ncjax filter`: train on its kept pairs (web.subset)
  max_skipped_fraction: float = 0.01   # more bad records than this fraction of the pairs read stops the run
  split_gap_bytes: int = -1       # filtered block reads: a gap of unread bytes this long is its own request (-1:
                                  # measured, the bytes one request's cost would read)

  def __post_init__(self):
    for name, allowed in (("mode", WEB_MODES), ("read", WEB_READS), ("decoder", WEB_DECODERS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"input.web.{name} must be one of {allowed}, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """`config.input`: the dataset, the batch, the order's seed, the image transforms and the readers' settings."""
  dataset: str = "digits"
  data_dir: str = ""
  split: str = "train"
  global_batch_size: int = 256
  shuffle_seed: int = 0
  eval_batch_size: int = 512
  min_word_count: int = 1
  on_bad_record: str = "skip"
  normalization: str = "openai"
  resize: str = "shortest"
  augment: bool = True
  crop_scale: tuple = (0.9, 1.0)
  num_threads: int = 8
  prefetch: int = 4
  eval_workers: int = -1          # evaluation decode workers (-1: one per usable core, 0: serially)
  eval_decode: str = "thread"     # 'thread' | 'process'
  web: WebSpec = WebSpec()

  def on(self, dataset: str, data_dir: str = "") -> "InputSpec":
    """The same settings over another dataset (an evaluator's), under `data_dir` when given."""
    return dataclasses.replace(self, dataset=dataset, data_dir=data_dir or self.data_dir)


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
  """`config.noise`: the injected noise (ncjax.data.noise checks the combinations when it builds one)."""
  kind: str = "none"              # 'none' | 'caption_shuffle' | 'image_shuffle' | 'file' | 'in_batch_resample'
  ratio: float = 0.0
  seed: int = 0
  derangement: bool = False
  file: str = ""
  per_device: bool = False
  train_on: str = "all"           # 'all' | 'clean': only the pairs the noise left intact (a perfect filter)

  def __post_init__(self):
    if self.train_on not in NOISE_TRAIN_ON:
      raise ValueError(f"unknown noise.train_on {self.train_on!r}; expected one of {NOISE_TRAIN_ON}")


@dataclasses.dataclass(frozen=True)
class ConceptSpec:
  """`config.concept`: a concept to unlearn and which pairs the run trains on (ncjax.data.concepts)."""
  classes: tuple = ()
  subreddits: tuple = ()
  keywords: tuple = ()
  train_on: str = "all"           # 'all' | 'retain' | 'forget_retain'

  def __post_init__(self):
    if self.train_on not in TRAIN_ON:
      raise ValueError(f"unknown concept.train_on {self.train_on!r}; expected one of {TRAIN_ON}")

  @property
  def named(self) -> bool:
    """Whether a concept is set at all."""
    return bool(self.classes or self.subreddits or self.keywords)
