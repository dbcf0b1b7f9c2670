"""Config schema and helpers (ml_collections).

Every config is built from `base_config()`, which fixes the schema: the sub-dicts method, model, loss, input, noise,
optim, evals, mesh, ckpt and log. Configs are locked, so a misspelt key — in a config file, a `--config.a.b=`
override or a `:k=v` argument — fails at load time with the key named.
"""

from __future__ import annotations

import ast
import math
import os
from typing import Any

import ml_collections
from ml_collections import config_dict

from ncjax import errors


def optional(value_type: type):
  """A config-argument default meaning "not set" (None) whose value, when given, is parsed as `value_type`:
  `parse_arg(arg, batch=optional(int))`. (An ml_collections placeholder, so ConfigDicts keep the type.)"""
  return config_dict.placeholder(value_type)


def _default_type(default: Any):
  """(value, type used to parse a given string) of a parse_arg default."""
  if isinstance(default, config_dict.FieldReference):
    return default.get(), default.get_type()
  return default, (type(default) if default is not None else str)


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parse `k=v,k2=v2` config arguments (big_vision style) against typed defaults.

  A default is a value (its type parses the argument) or `optional(type)` (None unless given). Unknown keys raise
  ValueError naming the key and the known ones. bool accepts true/false/1/0 (a bare `k` sets it to True).
  """
  parsed = {k: _default_type(v) for k, v in defaults.items()}
  out = ml_collections.ConfigDict({k: (config_dict.placeholder(t) if v is None else v)
                                   for k, (v, t) in parsed.items()})
  if not arg:
    return out
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    key, _, raw = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r} in {arg!r}; known arguments: {sorted(defaults)}")
    value_type = parsed[key][1]
    if not _:
      if value_type is bool:
        out[key] = True
        continue
      raise ValueError(f"config argument {key!r} needs a value ({key}=...)")
    out[key] = _parse_value(key, raw.strip(), value_type)
  return out


def parse_bool(raw: str) -> bool | None:
  """A command-line boolean (1/true/yes/on, 0/false/no/off, any case); None when `raw` is neither."""
  low = raw.lower()
  return True if low in ("1", "true", "yes", "on") else False if low in ("0", "false", "no", "off") else None


def _parse_value(key: str, raw: str, value_type: type):
  if value_type is bool:
    if (flag := parse_bool(raw)) is None:
      raise ValueError(f"config argument {key!r} expects a boolean, got {raw!r}")
    return flag
  if value_type in (int, float, str):
    try:
      return value_type(raw)
    except ValueError:
      raise ValueError(f"config argument {key!r} expects {value_type.__name__}, got {raw!r}") from None
  return ast.literal_eval(raw)


def with_preset(args: ml_collections.ConfigDict, presets: dict[str, dict], name: str) -> ml_collections.ConfigDict:
  """The user's arguments laid over the preset `name`: every argument left unset (None) takes the preset's value;
  keys only the preset has (settings users do not pass as arguments) come along. Presets are plain dicts."""
  if name not in presets:
    raise ValueError(f"unknown preset {name!r}; presets: {sorted(presets)}")
  merged = dict(presets[name])
  for key, value in args.items():
    if value is not None or key not in merged:
      merged[key] = value
  return ml_collections.ConfigDict(merged)


def base_config() -> ml_collections.ConfigDict:
  """The full schema with defaults. Config files modify it; they never add keys outside a method's own namespace."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The epochs of the method's main stage, for every method; preparatory stages some methods run first (NCU's
  # prompt stage, DisNCL's warm-up, SGRAF's all-negatives start) have their own settings and come before it.
  c.num_epochs = 10
  # The main stage's length in steps instead of num_epochs, for recipes stated in iterations (MERU: 120k at batch
  # 2048); its learning-rate schedule spans them.
  c.num_steps = config_dict.placeholder(int)
  c.total_steps = config_dict.placeholder(int)  # caps the run's steps when set (benchmarks, smoke runs)

  # The method: `name` picks it from the registry; the rest are its own options (methods add keys here).
  c.method = ml_collections.ConfigDict(dict(name="clip", init_from=""))

  # A named `size` ('tiny', 'small', 'ViT-B/16', ..., or 'custom') and explicit per-field overrides; an imported
  # checkpoint (`method.init_from=openai:PATH`, ...) sets every architecture field and records itself in
  # `pretrained`. `tokenizer`: 'auto' (CLIP's BPE for the CLIP-sized vocabularies, word otherwise), 'word', 'clip_bpe',
  # 'sentencepiece:PATH' (big_vision's SigLIP tokenisation). big_vision's towers (`big_vision:PATH` sets them):
  # text_causal=False (bidirectional text attention), posemb='sincos2d' (a fixed image position embedding instead of
  # the learned one), proj_bias=True (biases on both projections), text_pool='final' / 'first' / 'gap' / 'map'.
  # MERU's towers (configs/meru.py's paper preset, `meru:PATH`): a timm ViT — patch_bias=True, ln_pre=False,
  # posemb='sincos2d_moco' (MoCo v3's fixed table, frozen) — and act='gelu' (exact GELU) in both towers.
  # attention: 'auto' ('fused' on a TPU, else 'einsum'), 'einsum' (heads-major einsums, the fastest form on the
  # CPU and on an H100), 'recompute' (the einsums, the backward recomputing the probabilities), 'fused' (one Pallas
  # kernel per example and 128 lanes of heads: logits and softmax stay on chip; a TPU's, interpreted elsewhere), 'xla'
  # (jax.nn.dot_product_attention's XLA implementation) or 'cudnn' (cuDNN's fused attention on an NVIDIA GPU with
  # dtype bfloat16/float16 and head sizes up to 128: less memory; an error where it cannot run); every kind computes
  # the same function.
  c.model = ml_collections.ConfigDict(dict(
      size="tiny", image_type="vit", text_type="transformer",
      image_size=config_dict.placeholder(int), patch_size=config_dict.placeholder(int),
      channels=config_dict.placeholder(int), context_length=config_dict.placeholder(int),
      embed_dim=config_dict.placeholder(int),
      image_width=config_dict.placeholder(int), image_depth=config_dict.placeholder(int),
      image_heads=config_dict.placeholder(int), image_mlp_dim=config_dict.placeholder(int),
      text_width=config_dict.placeholder(int), text_depth=config_dict.placeholder(int),
      text_heads=config_dict.placeholder(int), text_mlp_dim=config_dict.placeholder(int),
      vocab_size=config_dict.placeholder(int),
      pool="tok", ln_pre=True, patch_bias=False, ln_eps=1e-5, act="quick_gelu", text_pool="eot",
      text_causal=True, posemb="learn", proj_bias=False,
      tokenizer="auto", pretrained="",
      dtype="float32", remat=False, attention="auto",
      geometry="sphere", curv_init=1.0,
      logit_scale_init=math.log(1 / 0.07), logit_bias_init=config_dict.placeholder(float),
      # Region-feature retrieval models (image_type='regions', text_type='bigru'; ncjax.models.sgraf): the region
      # feature size, word embedding, similarity head ('sgr' | 'saf'), its vector size, reasoning steps, SCAN's
      # attention smoothing, word dropout, and how many image-caption pairs the B x B similarity computes at once.
      # text_structure: GSC's caption-caption structure through the head ('attention': GSC's single-network code;
      # 'aligned': GSC+'s); pool_dropout: the dropout in SGRAF's self-attention pooling (its code: 0.4); init:
      # 'public' (SGRAF's / GSC's code: xavier-uniform Linear weights with zero biases, torch's U(+-1/sqrt(H)) GRU)
      # or 'flax' (flax's lecun-normal Linear weights, xavier / orthogonal GRU: ncjax's until 2026-11-25).
      region=ml_collections.ConfigDict(dict(feature_dim=2048, word_dim=300, sim_dim=256, head="sgr", steps=3,
                                            smooth=9.0, word_dropout=0.0, pairs_per_step=4096,
                                            text_structure="attention", pool_dropout=0.0, init="public")),
  ))

  c.loss = ml_collections.ConfigDict()  # loss hyper-parameters of the method (methods add keys)

  # dataset: 'digits', 'synthetic', or a built tfds dataset 'tfds:<builder>/<config>' under data_dir
  # (e.g. 'tfds:karpathy/flickr30k', 'tfds:web_pairs/cc3m', 'tfds:precomp/f30k_precomp').
  c.input = ml_collections.ConfigDict(dict(
      dataset="digits", data_dir="", split="train", global_batch_size=256, shuffle_seed=0,
      eval_batch_size=512, min_word_count=1, on_bad_record="skip",
      normalization="openai", resize="shortest", augment=True, crop_scale=(0.9, 1.0), num_threads=8, prefetch=4,
      # evaluation images decoded and transformed in parallel: -1 = one worker per usable core, 0 = serially
      # (`ncjax eval --num_workers`); eval_decode: 'thread' or 'process' workers
      eval_workers=-1, eval_decode="thread",
      # input.dataset='web:ROOT[::ROOT2...]' (img2dataset output, ncjax.data.web.pipeline): mode 'auto' (indexed
      # when built, else streamed) | 'index' | 'stream'; read (indexed): 'auto' (block on an object store, else
      # pair) | 'pair' (one ranged read per pair, a global shuffle for any process count) | 'block' (blocks of
      # `block` consecutive pairs per ranged read, shuffled in windows of max(`shuffle_pairs`, `window_batches` x
      # the per-process batch) pairs per process);
      # weights 'w1::w2' of a mixture (default: the datasets' sizes); resample: streamed shards drawn with
      # replacement; window shard segments read interleaved through a shuffle buffer of `buffer` pairs; mix_block:
      # positions per mixture block; caption_key / clean_key of the .json; cache_dir: the host's copy of a gs://
      # index (and filter), least recently used files evicted beyond cache_bytes; a word vocabulary counts at most
      # vocab_captions captions and keeps at most max_vocab words;
      # decoder: 'pil' or 'simplejpeg' (JPEGs; pip install 'ncjax[web]'); workers: decode processes (0: the
      # input.num_threads threads of the training process; -1: one per usable core); max_inflight: ranged reads
      # in flight; io_deadline_s: how long a read retries a store that does not answer before the run stops;
      # request_timeout_s: one request to the store at most (a stalled connection is a fault, retried);
      # filter: a directory written by `ncjax filter` (the pairs to train on, chosen by their audit scores; ids stay
      # the unfiltered data's: ncjax.data.web.subset), '' trains on every pair; max_skipped_fraction: more bad
      # records (each replaced by a repeat) than this fraction of the pairs read stops the run with one line;
      # split_gap_bytes: a filtered block read is cut where the unread bytes between kept pairs exceed this (-1:
      # the bytes one request's own cost would read, measured as the run reads: ncjax.data.web.store.RequestCost).
      web=ml_collections.ConfigDict(dict(mode="auto", read="auto", block=64, shuffle_pairs=4096, window_batches=16,
                                         weights="",
                                         resample=False, window=8, buffer=2048, mix_block=1000,
                                         caption_key="caption", clean_key="", cache_dir="", cache_bytes=32 << 30,
                                         vocab_captions=200_000, max_vocab=65_536, decoder="pil", workers=0,
                                         max_inflight=64, io_deadline_s=300.0, request_timeout_s=60.0, filter="",
                                         max_skipped_fraction=0.01, split_gap_bytes=-1)),
  ))

  # Noise applied to the training pairs; the ground-truth clean flag is kept for diagnostics only.
  # kind: 'none' | 'caption_shuffle' (NCR) | 'image_shuffle' (DECL) | 'file' (legacy .npy index) |
  #       'in_batch_resample' (Bayesian CL: fresh pairs of every global batch get another pair's text).
  c.noise = ml_collections.ConfigDict(dict(
      kind="none", ratio=0.0, seed=0, derangement=False, file="",
      per_device=False,   # in_batch_resample: within each device's batch instead of the global batch
      # 'clean': train only on the pairs the injected noise left intact — a perfect filter, the reference a
      # noise-robust method can at best reach (NC-bench's `oracle` row). The main stage keeps the step budget of
      # an epoch over all pairs (num_epochs x all pairs // batch steps: more passes over fewer pairs) unless
      # num_steps is set. Needs an injected noise index (not web data: `ncjax filter` selects pairs there).
      train_on="all",
  ))

  # A concept to unlearn (AC / HAC and their fine-tuning baselines): the pairs whose image has one of `classes`,
  # whose image's subreddit is in `subreddits` (names or ncjax.data.concepts.SUBREDDIT_GROUPS), or whose caption
  # holds one of `keywords`. train_on: 'all' pairs, the 'retain' pairs only, or 'forget_retain' batches of N + N.
  c.concept = ml_collections.ConfigDict(dict(classes=(), subreddits=(), keywords=(), train_on="all"))

  c.optim = ml_collections.ConfigDict(dict(
      name="adamw", lr=5e-4, weight_decay=0.2, b1=0.9, b2=0.98, eps=1e-6,
      grad_clip_norm=1.0, warmup_steps=0, schedule="cosine", min_lr_ratio=0.0,
      # 'stage': a schedule per stage; 'run': one over every stage (NCU's code; offset: it counts epochs from 1).
      schedule_scope="stage", schedule_offset_epochs=0, decay_every_epochs=0, decay_factor=0.1,
      freeze="",  # regex over parameter paths ('model/img/...'): matching parameters are frozen
      # > 1: the towers encode the global batch in this many device-local micro-batches, each recomputed in the
      # backward pass (GradCache): the exact full-batch gradient of every global-batch loss with the activation
      # memory of one micro-batch per device (ncjax/models/microbatch.py). Must divide the per-device batch.
      micro_batches=1,
      # The dtype the towers' weight gradients are summed across devices in: 'bf16' (their products' dtype in a
      # bf16 model: half the bytes) or 'float32' (formed and summed in float32; ncjax.models.layers.project).
      grad_reduce="bf16",
  ))

  c.evals = ml_collections.ConfigDict()  # evaluator name -> ConfigDict(type=..., every_steps=..., ...)

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))

  # Periodic checkpoints every `every_steps` steps and every `every_minutes` of wall-clock time (0: off), keeping
  # the last `keep`; a preemption (SIGTERM) always saves the step it stops at.
  # write_deadline_s: how long a save (or the wait for an asynchronous one) may take before the run stops with one
  # line, its last finished checkpoint intact (a store that stopped answering; 0: no deadline)
  c.ckpt = ml_collections.ConfigDict(dict(every_steps=0, every_minutes=5.0, keep=3, async_save=True,
                                          save_at_end=True, write_deadline_s=600.0))

  # Metrics: metrics.jsonl always (process 0); TensorBoard; Weights & Biases (`wandb=True`, process 0 only, the run
  # id kept in WORKDIR/wandb_run_id.txt so a resumed run continues the same wandb run; wandb_mode 'offline' needs
  # no network; wandb_group: `ncjax sweep` puts its runs in one group). profile_steps='A:B': a jax.profiler trace of
  # the steps from A to B in WORKDIR/profile/process_<i>/.
  c.log = ml_collections.ConfigDict(dict(every_steps=10, tensorboard=False, progress=True, wandb=False,
                                         wandb_project="ncjax", wandb_entity="", wandb_name="", wandb_mode="",
                                         wandb_group="", profile_steps=""))
  return c


# The arguments NC-bench passes to the config of each of its rows (ncjax.cli.ncbench.cell_config; a row is a method's
# `BenchEntry`): every config a row names accepts `data` (a dataset name), `noise` (the injected ratio), `epochs`
# (the main stage's) and `batch` (the global batch); two-tower rows also `model` (a size name); rows that start from
# another run of their cell also `init` (its workdir); rows that read another run's per-sample scores also
# `forget_scores` (its workdir). tests/cli/test_ncbench.py loads every registered row's config with them.
BENCH_ARGUMENTS = dict(every=("data", "noise", "epochs", "batch"), two_tower=("model",), start=("init",),
                       scores=("forget_scores",))


# The embedded datasets, whose configs inject synthetic noise by default (they are clean otherwise). A user's own
# data is trained as it is unless `noise=` asks for injected noise: web data carries its own.
EMBEDDED_DATASETS = ("digits", "scenes", "synthetic", "precomp_synthetic")


def noise_for(data: str, given: float | None, embedded_default: float) -> float:
  """The injected-noise ratio: the argument when given; else `embedded_default` on the embedded datasets, 0 on
  any other dataset."""
  if given is not None:
    return float(given)
  return embedded_default if data in EMBEDDED_DATASETS else 0.0


# model.size of a run that starts from another ncjax run (`init=WORKDIR`) and names no size: that checkpoint's size
# and every architecture key the config leaves unset (ncjax.experiment.with_checkpoint_model, logged);
# `model=checkpoint` asks for it by name. A pretrained init (openai:PATH, ...) replaces it with its own architecture.
CHECKPOINT_SIZE = "checkpoint"


def size_of(given: str | None, default: str, init: str) -> str:
  """model.size: the size given; else the init checkpoint's (CHECKPOINT_SIZE) when the run starts from one; else
  the config's default (a preset's)."""
  if given is not None:
    return given
  return CHECKPOINT_SIZE if init and init != "random" else default   # 'random': experiment.RANDOM_INIT


def apply_common(c, *, model: str, data: str, batch: int, epochs: int, noise: float, lr: float,
                 noise_kind: str = "caption_shuffle", weight_decay: float = 0.1, warmup_steps: int = 20,
                 init: str = ""):
  """The settings the pretraining configs share: model size, data, batch, epochs, noise, optimiser, and the
  checkpoint to start from (`init`: an ncjax workdir, or openai:PATH / open_clip:PATH / hf:DIR / meru:PATH, whose
  architecture then replaces `model`)."""
  c.method.init_from = init
  c.model.size = model
  c.input.dataset = data
  c.input.global_batch_size = batch
  c.num_epochs = epochs
  if noise > 0:
    c.noise.kind, c.noise.ratio = noise_kind, noise
  c.optim.lr = lr
  c.optim.weight_decay = weight_decay
  c.optim.warmup_steps = warmup_steps
  return c


def add_default_evals(c):
  """Zero-shot (digits prompts), retrieval and noise detection on the dataset's test split, at the end of training.
  `--config.evals.NAME.enabled=False` switches one off (e.g. for data without a labelled test split). `dataset` and
  `data_dir` are present (empty: the training dataset and input.data_dir) so that `--config.evals.zeroshot.dataset=...`
  / `.data_dir=...` can evaluate on another built dataset."""
  # digits' own prompts on digits; elsewhere the dataset's prompts when ncjax knows them, else CLIP's generic ones
  templates = "digits" if c.input.dataset in ("digits", "tfds:digits") else "auto"
  # Web-scale training data has no test split and no in-memory pairs: name an evaluation dataset to evaluate.
  own = not c.input.dataset.startswith("web:")
  c.evals.zeroshot = dict(type="zeroshot", dataset="", data_dir="", split="test", templates=templates,
                         every_steps=0, enabled=own)
  c.evals.retrieval = dict(type="retrieval", dataset="", data_dir="", split="test", every_steps=0, enabled=own)
  c.evals.noise_detection = dict(type="noise_detection", every_steps=0, enabled=own)
  return c


# Region-feature retrieval (SGRAF backbone) presets shared by configs/sgraf.py, configs/disncl.py and
# configs/gsc.py:backbone=sgraf. 'paper': NCR / GSC / DisNCL's F30K setting (36 x 2048 BUTD regions, 1024-d joint
# space, word_dim 300, sim_dim 256, Adam 2e-4, batch 128, gradient clipping 2); 'synthetic': the embedded
# precomp_synthetic data (12 x 64 regions) with a small model and SAF's cheaper head (SGR's three reasoning steps
# cost 3x on a CPU; head=sgr selects it), for CPU demos and tests. all_negatives_epochs: epochs of the hinge summed
# over every negative before max violation (VSE++'s remedy: from a random initialisation the max-violation hinge
# collapses every score to one value on this data — measured, see README).
REGION_PRESETS = {
    # SGRAF's dropout: 0.4 on the word embeddings and in its self-attention pooling (its code's nn.Dropout(0.4)).
    "paper": dict(model="sgraf", data="tfds:precomp/f30k_precomp", batch=128, lr=2e-4, feature_dim=2048,
                  word_dim=300, sim_dim=256, head="sgr", all_negatives_epochs=0, word_dropout=0.4,
                  pool_dropout=0.4, warmup_negatives="all_mean"),
    "synthetic": dict(model="sgraf_small", data="precomp_synthetic", batch=64, lr=1e-3, feature_dim=64,
                      word_dim=64, sim_dim=32, head="saf", all_negatives_epochs=3, word_dropout=0.0,
                      pool_dropout=0.0, warmup_negatives="all"),
}


def region_preset(data) -> str:
  """The region preset of the data a config is given: 'synthetic' on the embedded precomp_synthetic, the public
  code's 'paper' on any other (a user's precomp data is BUTD's 36 x 2048 regions as F30K's and COCO's; other
  features are named by --config.model.region.feature_dim, which the run checks against the data)."""
  return "synthetic" if data is None or data in EMBEDDED_DATASETS else "paper"


def region_noise(c, noise: float, noise_file: str = ""):
  """NCR's caption-shuffle noise at `noise`, or one of the shared noise files (a per-caption int64 image index,
  `noise_file_by_caption/...` of NCR / DECL / GSC / L2RM) when `noise_file` is given."""
  if noise_file:
    c.noise.kind, c.noise.file = "file", noise_file
  elif noise > 0:
    c.noise.kind, c.noise.ratio = "caption_shuffle", noise
  return c


def region_model(c, a):
  """The SGRAF backbone and its optimiser (Adam with torch's defaults b2 = 0.999, eps = 1e-8 — SGRAF, NCR, GSC and
  MSCN use them —, no weight decay, gradient clipping 2, as NCR / SGRAF), retrieval and noise-detection evaluators
  (no zero-shot: region datasets have no class labels). `a` holds the parsed arguments with the preset laid in
  (model, data, batch, lr, feature_dim, word_dim, sim_dim, head, all_negatives_epochs, word_dropout, pool_dropout,
  warmup_negatives)."""
  c.model.size = a.model
  c.model.image_type, c.model.text_type = "regions", "bigru"
  c.model.region.feature_dim, c.model.region.word_dim, c.model.region.sim_dim = a.feature_dim, a.word_dim, a.sim_dim
  c.model.region.head = a.head
  c.model.region.word_dropout, c.model.region.pool_dropout = a.word_dropout, a.pool_dropout
  c.loss.margin = 0.2
  c.loss.warmup_negatives = a.warmup_negatives
  c.loss.reduction = "sum"   # VSE++ / SGRAF / NCR sum the hinge over the batch
  c.loss.all_negatives_epochs = a.all_negatives_epochs
  c.input.dataset = a.data
  c.input.global_batch_size = a.batch
  c.optim.name, c.optim.lr, c.optim.weight_decay, c.optim.grad_clip_norm = "adam", a.lr, 0.0, 2.0
  c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.999, 1e-8   # torch.optim.Adam's defaults
  c.optim.warmup_steps = 0
  # COCO: NCR's 5K test images ('testall') with the 1K x 5-fold average as well; F30K / CC152K: the 1K 'test' split.
  coco = "coco" in a.data
  c.evals.retrieval = dict(type="retrieval", dataset="", data_dir="", split="testall" if coco else "test",
                           every_steps=0, enabled=True, folds=5 if coco else 0)
  c.evals.noise_detection = dict(type="noise_detection", every_steps=0, enabled=True)
  return c


# The shipped configs are package data (ncjax/configs/*.py): found by name from any directory. In a checkout,
# configs/ at the repository root links there, so `--config=configs/clip.py:...` keeps working from the root.
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


class ConfigError(errors.ConfigurationError):
  """A config that cannot be loaded or overridden: the message is one line naming what was asked and what exists."""


def config_names() -> list[str]:
  """The shipped configs' names ('clip', 'gsc', 'ncbench', ...)."""
  return sorted(f[:-3] for f in os.listdir(CONFIGS_DIR) if f.endswith(".py") and not f.startswith("_"))


def split_config_spec(spec: str) -> tuple[str, str | None]:
  """'clip:model=small,noise=0.4' -> ('clip', 'model=small,noise=0.4'); 'configs/clip.py' -> ('configs/clip.py',
  None). The first colon separates the file from its arguments (arguments may hold colons: data=tfds:digits)."""
  path, sep, arg = spec.partition(":")
  return path, (arg if sep else None)


def find_config_file(name: str) -> str:
  """The file a `--config` names: a shipped config by name ('clip'), a path to any .py file (relative to the
  current directory), or a shipped config's path written from the repository root ('configs/clip.py'), which is
  found from any directory."""
  if not name:
    raise ConfigError(f"--config names no config; shipped configs: {', '.join(config_names())}, or a path to a "
                      f".py file")
  if name.endswith(".py"):
    if os.path.isfile(name):
      return name
    stem = os.path.basename(name)[:-3]
    parent = os.path.basename(os.path.dirname(os.path.normpath(name)))
    if not os.path.isabs(name) and parent in ("", "configs") and stem in config_names():
      return os.path.join(CONFIGS_DIR, f"{stem}.py")
    raise ConfigError(f"no config file {name!r} (relative to {os.getcwd()}); shipped configs by name: "
                      f"{', '.join(config_names())}")
  if name in config_names():
    return os.path.join(CONFIGS_DIR, f"{name}.py")
  import difflib
  close = difflib.get_close_matches(name, config_names(), n=3, cutoff=0.5)
  raise ConfigError(f"no shipped config {name!r}{'; did you mean ' + ' or '.join(close) + '?' if close else ''} "
                    f"(shipped: {', '.join(config_names())}; or a path to a .py file)")


def _config_module(name: str):
  import importlib.util
  path = find_config_file(name)
  spec = importlib.util.spec_from_file_location(f"ncjax_config_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return path, module


def load_config_file(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a shipped config by name ('clip') or of a config file's path (`find_config_file`)."""
  path, module = _config_module(name)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{path} defines no get_config(arg)")
  return module.get_config(arg)


def load_config_spec(spec: str) -> ml_collections.ConfigDict:
  """What `--config=SPEC` loads: 'clip:model=small,noise=0.4', 'configs/clip.py:...', 'path/to/mine.py:...'.
  Every failure to find, run or parse it is a one-line ConfigError."""
  name, arg = split_config_spec(spec)
  try:
    return load_config_file(name, arg)
  except ConfigError as e:
    raise ConfigError(f"--config={spec}: {e}") from None
  except (ValueError, TypeError, KeyError, AttributeError, FileNotFoundError) as e:
    message = str(e).strip().strip('"')
    raise ConfigError(f"--config={spec}: {message}") from e


def load_sweep_points(spec: str) -> list[dict] | None:
  """A config file's own sweep (big_vision's way): `get_sweep(arg)`, a list of {dotted key: value}, one per point;
  None when the file defines none."""
  name, arg = split_config_spec(spec)
  try:
    _, module = _config_module(name)
    return module.get_sweep(arg) if hasattr(module, "get_sweep") else None
  except ConfigError as e:
    raise ConfigError(f"--config={spec}: {e}") from None
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    raise ConfigError(f"--config={spec}: get_sweep: {str(e).strip()}") from e


def config_keys(config, prefix: str = "") -> list[str]:
  """Every dotted key of a config ('optim.lr', 'evals.zeroshot.templates', ...), sections included."""
  out = []
  for key in config.keys():
    path = f"{prefix}{key}"
    out.append(path)
    value = config[key] if not isinstance(config, ml_collections.ConfigDict) else config._fields.get(key)
    if isinstance(value, ml_collections.ConfigDict):
      out.extend(config_keys(value, path + "."))
  return out


def closest_keys(config, path: str, n: int = 3) -> list[str]:
  """The config's keys closest to a misspelt dotted `path`: by the whole path, and by its last part (a key given
  in the wrong section)."""
  import difflib
  keys = config_keys(config)
  scored = {}
  leaf = path.rsplit(".", 1)[-1]
  for key in keys:
    whole = difflib.SequenceMatcher(None, path, key).ratio()
    last = difflib.SequenceMatcher(None, leaf, key.rsplit(".", 1)[-1]).ratio()
    scored[key] = max(whole, 0.9 * last)
  ranked = sorted((k for k in keys if scored[k] >= 0.6), key=lambda k: (-scored[k], k))
  return ranked[:n]


def set_dotted(cfg, overrides: dict):
  """Set dotted keys ({"optim.lr": 1e-3}) in place, as `--config.optim.lr=1e-3` would; returns cfg."""
  with cfg.unlocked():
    for key, value in overrides.items():
      node = cfg
      *parents, leaf = key.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = value
  return cfg


def check_override_path(config, path: str) -> None:
  """Raise a one-line ConfigError when `--config.PATH=...` names no key of the (locked) config: the key and the
  closest known keys (instead of ml_collections' traceback ending in AttributeError)."""
  node, walked = config, []
  for part in path.split("."):
    name = part.split("[", 1)[0]
    if not isinstance(node, ml_collections.ConfigDict):
      return   # inside a plain value (a dict, a tuple): ml_collections checks the rest
    if name not in node:
      bad = ".".join(walked + [name])
      close = closest_keys(config, path)
      hint = f"; closest known keys: {', '.join(close)}" if close else ""
      raise ConfigError(f"--config.{path}: the config has no key {bad!r}{hint}")
    node = node._fields.get(name) if isinstance(node, ml_collections.ConfigDict) else node[name]
    walked.append(name)


def lock(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  config.lock()
  return config


def from_json_dict(stored: dict) -> ml_collections.ConfigDict:
  """A config saved in a checkpoint (`to_json_dict`), laid over the current schema: keys added to ncjax since the
  checkpoint was written take their defaults, so older runs stay evaluable and exportable. Locked."""
  config = base_config()

  def merge(node, values):
    for key, value in values.items():
      if isinstance(value, dict) and key in node and isinstance(node[key], ml_collections.ConfigDict):
        merge(node[key], value)
      else:
        if key in node and isinstance(node[key], tuple) and isinstance(value, list):
          value = tuple(value)     # JSON turned tuples into lists
        node[key] = value

  with config.unlocked():
    merge(config, stored)
  return lock(config)


def to_json_dict(config: ml_collections.ConfigDict) -> dict:
  """A JSON-serialisable copy of the resolved config (stored in every checkpoint and metrics file)."""
  return config.to_dict()


def plus_list(value: str) -> tuple[str, ...]:
  """'three+five' -> ('three', 'five') (config arguments cannot hold commas)."""
  return tuple(v.strip() for v in value.split("+") if v.strip()) if value else ()


CONCEPT_VARIANTS = {
    # variant: (method on the sphere, method on MERU's geometry, concept.train_on)
    "calibrate": ("ac", "hac", "forget_retain"),
    "retain": ("clip", "meru", "retain"),      # f-C-R / f-M-R: fine-tune on the retain pairs only
    "all": ("clip", "meru", "all"),            # f-C / f-M: fine-tune on all pairs
    "original": ("clip", "meru", "all"),       # O-C / O-M: the starting model, evaluated as it is (no step)
}


# The concept AC / HAC forget when none is named: digits' 'three' (the slides' experiment); other data has other
# classes, or none, so there the concept is asked for.
DIGITS_CONCEPT = "three"


def concept_classes(a, method: str) -> str:
  """The classes to forget: `classes=` as given; on digits without a concept named, 'three'; on other data without
  classes, keywords or subreddits, a ConfigError asking for them (a guess would forget nothing, or the wrong thing)."""
  if a.classes is not None:
    return a.classes
  if a.keywords or a.subreddits:
    return ""
  if a.data in ("digits", "tfds:digits"):
    return DIGITS_CONCEPT
  raise ConfigError(f"{method} on {a.data}: which concept to forget? name it with classes=NAME[+NAME] (the data's "
                    f"class labels) or keywords=WORD[+WORD] (the pairs whose captions hold them)")


def concept_unlearning(c, a, *, geometry: str):
  """The settings AC / HAC and their baselines share (configs/ac.py, configs/hac.py): the starting checkpoint, the
  concept, forget/retain batches, the unlearning and retrieval evaluators. `a` holds the parsed arguments."""
  if a.variant not in CONCEPT_VARIANTS:
    raise ValueError(f"unknown variant {a.variant!r}; expected one of {sorted(CONCEPT_VARIANTS)}")
  sphere_method, lorentz_method, train_on = CONCEPT_VARIANTS[a.variant]
  c.method.name = sphere_method if geometry == "sphere" else lorentz_method
  c.method.init_from = a.init
  c.model.size = size_of(a.model, "tiny", a.init)
  c.model.geometry = geometry
  c.input.dataset = a.data
  c.input.global_batch_size = a.batch
  c.num_epochs = 0 if a.variant == "original" else a.epochs
  c.concept.classes = plus_list(concept_classes(a, c.method.name))
  c.concept.keywords = plus_list(a.keywords)
  c.concept.subreddits = plus_list(a.subreddits)
  c.concept.train_on = train_on
  c.optim.lr = a.lr
  c.optim.weight_decay = 0.2 if geometry == "lorentz" else 0.1
  c.optim.warmup_steps = 0
  c.loss.alpha, c.loss.beta, c.loss.gamma, c.loss.epsilon = a.alpha, a.beta, a.gamma, a.epsilon
  forget_eval = plus_list(a.eval_forget) or c.concept.classes
  if forget_eval:
    c.evals.unlearning = dict(type="unlearning", dataset="", split="test", forget_classes=forget_eval,
                              templates="picture", keep_forget_classes_in_labelset=True, average="micro",
                              retrieval=True, every_steps=0)
  c.evals.retrieval = dict(type="retrieval", dataset="", split="test", every_steps=0)
  return c
