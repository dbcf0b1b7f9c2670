"""Assembling an experiment from a config: the one place the raw config is interpreted.

`resolve(config)` turns it into typed, frozen pieces once — the model spec (`ncjax.models.ModelSpec`), the method's
class and its options (`Method.Options.from_config`), the starting point (`InitSource`: nothing, an ncjax run, or
a pretrained checkpoint), the input, noise and concept specs (`ncjax.data.specs`) and the tokenizer spec — and
`build_experiment` wires the rest, each piece built by the module that owns it (big_vision style): the mesh by
`ncjax.sharding`, the split by `ncjax.data`, the tokenizer by `ncjax.tokenizers`, the static noise and the per-step
batch transform by `ncjax.data.noise`, the pipeline by `ncjax.data.pipeline` (or `ncjax.data.web.pipeline`), another
run's per-sample scores by `ncjax.data.scores`, the method by `ncjax.methods`. Below this module nothing reads a
config section; the trainer (`ncjax.train`) and the evaluation (`ncjax.evaluation`) consume the result.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import ml_collections
import numpy as np

from ncjax import errors
from ncjax import checkpoint as ckpt_lib
from ncjax import config_lib
from ncjax import data as data_lib
from ncjax import models, pretrained, tokenizers
from ncjax import sharding as shard_lib
from ncjax.data import scores as scores_lib
from ncjax.data.web import pipeline as web_pipeline
from ncjax.data.profile import caption_profile
from ncjax.data.concepts import concept_train_data
from ncjax.data.noise import BatchTransform, NoisyIndex, batch_transform, noise_index
from ncjax.data.pipeline import TrainData
from ncjax.data.pipeline import train_data as pipeline_train_data
from ncjax.data.specs import ConceptSpec, InputSpec, NoiseSpec, WebSpec
from ncjax.methods import Method, MethodSetup, build_method, method_class
from ncjax.models.microbatch import check_micro_batches
from ncjax.options import Options, read_section

log = logging.getLogger("ncjax")


RANDOM_INIT = "random"   # method.init_from: start from random weights, on purpose


@dataclasses.dataclass(frozen=True)
class InitSource:
  """Where a run's parameters start (`method.init_from`): nothing ('none'; `init=random` says so on purpose, for a
  method that otherwise refuses to start without a trained model), another ncjax run's latest checkpoint ('run': its
  modules, its tokenizer and its model, see `with_checkpoint_model`), or a pretrained checkpoint ('pretrained':
  openai:PATH, open_clip:PATH, hf:DIR, meru:PATH — it also defines the architecture, see `resolve_config`)."""
  kind: str
  spec: str = ""

  @classmethod
  def parse(cls, init_from: str) -> "InitSource":
    if not init_from or init_from == RANDOM_INIT:
      return cls("none", init_from)
    return cls("pretrained" if pretrained.is_pretrained_spec(init_from) else "run", init_from)

  def saved_tokenizer(self) -> dict | None:
    """A run's vocabulary comes with its weights; None otherwise."""
    return ckpt_lib.read_source_meta(self.spec)["tokenizer"] if self.kind == "run" else None

  def initialise(self, init_fn, abstract_params, shardings, mesh):
    """A run's starting parameters, placed with `shardings`: the source's modules laid over a fresh
    initialisation (`init_fn`), of which only the leaves the source does not provide are computed — a fine-tuning
    run does not compile and run the random draws of a model it overwrites (a ViT-L/14's ~430M values)."""
    def fresh(draw=None):
      return shard_lib.initialise_params(init_fn, abstract_params, shardings, mesh, draw=draw)

    if self.kind == "pretrained":
      params = pretrained.overlay(fresh, self.spec, abstract_params, shardings)
    elif self.kind == "run":
      params = ckpt_lib.overlay_params(fresh, self.spec, abstract_params, shardings)
    else:
      return fresh()
    unfilled = [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_leaves_with_path(params)
                if isinstance(x, jax.ShapeDtypeStruct)]
    if unfilled:   # a leaf marked as the source's that the source did not fill: a bug in its overlay
      raise AssertionError(f"{self.spec}: no value for {unfilled[:5]}")
    return params


def resolve_config(config):
  """The config with the architecture, preprocessing and tokenizer of a pretrained checkpoint laid in, when
  `method.init_from` names one (openai:PATH, open_clip:PATH, hf:DIR, meru:PATH); otherwise unchanged.

  The resolved config records the spec in `model.pretrained`; a config already resolved (e.g. the one stored in a
  run's checkpoint, which `ncjax eval` reuses) is returned as it is, without reading the pretrained file."""
  spec = config.method.init_from
  if not pretrained.is_pretrained_spec(spec) or config.model.pretrained == spec:
    return config
  model_config, _ = pretrained.load(spec)
  resolved = config.copy_and_resolve_references()
  with resolved.unlocked():
    pretrained.apply_to_config(resolved, model_config)
  resolved.lock()
  return resolved


def with_checkpoint_model(config):
  """The config of a run that starts from another ncjax run (`method.init_from=WORKDIR`), with that checkpoint's
  model: its size when `model.size` is 'checkpoint' (config_lib.CHECKPOINT_SIZE: no size given), and every
  architecture key the config leaves unset (a tower field left to the size, a choice at its default), logged. A key
  the config gives that builds another model than the checkpoint's is one ConfigurationError naming both values.
  Other configs are returned unchanged. The result names its size: the run's checkpoints record the model built."""
  init = InitSource.parse(config.method.init_from)
  if init.kind != "run":
    return config
  saved = ckpt_lib.read_source_meta(init.spec)["config"]["model"]
  base = config_lib.base_config().model
  mine = config.model.to_dict()
  given = {key for key in mine if key != "region" and mine[key] != base.get(key)}
  if mine["size"] == config_lib.CHECKPOINT_SIZE:
    given.discard("size")
  given |= {f"region.{k}" for k in models.REGION_ARCHITECTURE_KEYS if mine["region"][k] != base.region[k]}
  given.add("geometry")   # the method's own (MERU's and HAC's Lorentz model): compared, never taken
  taken = {}
  for key in ["size", *models.architecture_of(ml_collections.ConfigDict(saved))]:
    if key in given:
      continue
    section, name = (mine["region"], key[len("region."):]) if key.startswith("region.") else (mine, key)
    value = (saved.get("region") or {}).get(name) if key.startswith("region.") else saved.get(key)
    if name in section and value is not None and section[name] != value:
      taken[key] = section[name] = value
  if mine["size"] == config_lib.CHECKPOINT_SIZE:   # a checkpoint written before its config recorded its size
    raise errors.CheckpointError(f"the checkpoint init={init.spec} records no model size: pass model=")
  have, want = models.architecture_of(ml_collections.ConfigDict(mine)), models.architecture_of(
      ml_collections.ConfigDict(saved))
  differ = [key for key in want if have.get(key) != want[key]]
  if differ:
    key = next((k for k in differ if k in given), None)
    if key is None:
      raise errors.ConfigurationError(
          f"model.size={mine['size']!r} builds another model than the checkpoint init={init.spec} starts from, a "
          f"{saved['size']!r} ({differ[0]} {have[differ[0]]!r} against {want[differ[0]]!r}): leave model= out to "
          f"take the checkpoint's model")
    fix = ("start from a checkpoint of this geometry" if key == "geometry" else
           f"leave model.{key} out to take the checkpoint's, or start from a checkpoint of this model")
    raise errors.ConfigurationError(f"model.{key}={have[key]!r}, but the checkpoint init={init.spec} starts from "
                                    f"has {key}={want[key]!r}: {fix}")
  if taken:
    log.info("the model of the checkpoint init=%s starts from: %s", init.spec,
             ", ".join(f"model.{key}={value!r}" for key, value in taken.items()))
  out = config.copy_and_resolve_references()
  with out.unlocked():
    out.model = ml_collections.ConfigDict(mine)
  out.lock()
  return out


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A config's typed pieces (`resolve`)."""
  config: Any              # the config with a pretrained architecture laid in (what checkpoints record)
  model: models.ModelSpec
  method_class: type
  options: Options
  init: InitSource
  input: InputSpec
  noise: NoiseSpec
  concept: ConceptSpec
  tokenizer: tokenizers.TokenizerSpec

  def setup(self, *, tokenizer, num_examples: int, prior_scores=None, main_stage_steps: int | None = None
            ) -> MethodSetup:
    """main_stage_steps: the main stage's length in steps when the data, not the config, sets it (noise.train_on=
    'clean'); config.num_steps wins when given."""
    c = self.config
    num_steps = c.num_steps if c.num_steps is not None else main_stage_steps
    return MethodSetup(model=self.model, tokenizer=tokenizer, num_examples=num_examples, num_epochs=c.num_epochs,
                       num_steps=num_steps, seed=c.seed, lr=c.optim.lr, weight_decay=c.optim.weight_decay,
                       freeze=c.optim.freeze,
                       micro_batches=c.optim.micro_batches, prior_scores=prior_scores)

  def method(self, *, tokenizer, num_examples: int, prior_scores=None, main_stage_steps: int | None = None
             ) -> Method:
    return build_method(self.method_class.name, self.setup(tokenizer=tokenizer, num_examples=num_examples,
                                                           prior_scores=prior_scores,
                                                           main_stage_steps=main_stage_steps), self.options)

  def prior_scores_source(self) -> str | None:
    return self.method_class.prior_scores_source(self.options, self.init.spec if self.init.kind != "none" else "")

  def check_start(self) -> None:
    """A method that changes a trained model (unlearning) refuses to train from random weights unless asked to:
    it would run, and its results would mean nothing."""
    cls = self.method_class
    if cls.needs_trained_start and self.init.kind == "none" and self.init.spec != RANDOM_INIT:
      raise errors.ConfigurationError(
          f"method {cls.name!r} {cls.needs_trained_start} — it needs one to start from: set init= to a trained "
          f"run's workdir or a pretrained checkpoint (e.g. --config=...:init=/runs/clip or init=openai:PATH; "
          f"--config.method.init_from=... otherwise); init=random trains it from random weights on purpose")


def resolve(config) -> Resolved:
  """Interpret the config once: its model spec, method class and options, and starting point."""
  config = resolve_config(config)
  if config.model.size == config_lib.CHECKPOINT_SIZE:
    raise errors.ConfigurationError(
        f"model.size={config_lib.CHECKPOINT_SIZE!r} takes the model of the ncjax run init= names, and "
        f"method.init_from={config.method.init_from!r} names none: pass model= (a size name)")
  cls = method_class(config.method.name)
  if cls.needs_forget_retain_batches and config.concept.train_on != "forget_retain":
    raise ValueError(f"method {cls.name!r} trains on batches of N retain and N forget pairs: set "
                     f"concept.train_on='forget_retain' and the concept (concept.classes / subreddits / keywords); "
                     f"got concept.train_on={config.concept.train_on!r}")
  model = dataclasses.replace(models.ModelSpec.from_config(config.model),
                              grad_reduce=str(config.optim.get("grad_reduce", "bf16")))
  inp = input_spec(config.input)
  return Resolved(config, model, cls, cls.Options.from_config(config), InitSource.parse(config.method.init_from),
                  inp, noise_spec(config.noise), concept_spec(config.concept),
                  tokenizers.TokenizerSpec(model.tokenizer_kind, model.context_length, int(inp.min_word_count)))


def _checked_section(cls, section, name: str):
  """`read_section`, refusing keys the spec does not know (a config restored from elsewhere, a typo in a
  hand-written dict): they would otherwise be ignored silently."""
  if section is not None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(section.keys()) - known)
    if unknown:
      raise errors.ConfigurationError(f"unknown {name} keys {unknown}; known: {sorted(known)}")
  return read_section(cls, section)


def input_spec(section) -> InputSpec:
  """`config.input` (with its `web` section) as an InputSpec; the evaluation path uses it for another config's
  input too."""
  web = _checked_section(WebSpec, section.get("web") if section is not None else None, "input.web")
  plain = {k: section[k] for k in section.keys() if k != "web"} if section is not None else None
  return dataclasses.replace(_checked_section(InputSpec, plain, "input"), web=web)


def noise_spec(section) -> NoiseSpec:
  return _checked_section(NoiseSpec, section, "noise")


def concept_spec(section) -> ConceptSpec:
  return _checked_section(ConceptSpec, section, "concept")


def method_from_config(config, *, tokenizer, num_examples: int, prior_scores=None) -> Method:
  """The method a config describes (tests and tools that need one without the data)."""
  return resolve(config).method(tokenizer=tokenizer, num_examples=num_examples, prior_scores=prior_scores)


@dataclasses.dataclass
class Experiment:
  config: Any
  resolved: Resolved
  mesh: jax.sharding.Mesh
  tokenizer: Any
  train_data: TrainData   # or ncjax.data.web.pipeline.WebTrainData (input.dataset='web:...')
  method: Method
  noisy: NoisyIndex | None
  batch_transform: BatchTransform | None = None  # dynamic noise, applied inside the jitted step

  @property
  def steps_per_epoch(self) -> int:
    return self.train_data.steps_per_epoch

  @property
  def model_spec(self) -> models.ModelSpec:
    return self.resolved.model

  @property
  def init(self) -> InitSource:
    return self.resolved.init


def check_train_on(resolved: Resolved) -> None:
  """noise.train_on='clean' needs a static noise index to know which pairs are intact, and trains every pair it
  keeps: one line naming what does not fit."""
  if resolved.noise.train_on != "clean":
    return
  if web_pipeline.is_web(resolved.input.dataset):
    raise errors.ConfigurationError(
        "noise.train_on='clean' needs an injected noise index, and web data carries its own noise: to train on "
        "chosen pairs of web data, score them (`ncjax audit`) and select them (`ncjax filter`, then "
        "input.web.filter=DIR)")
  if resolved.noise.kind == "in_batch_resample":
    raise errors.ConfigurationError(
        "noise.train_on='clean' trains on the pairs a static noise index leaves intact; in_batch_resample corrupts "
        "different pairs at every step: use noise.kind='caption_shuffle', 'image_shuffle' or 'file'")
  if resolved.concept.train_on != "all":
    raise errors.ConfigurationError(
        f"noise.train_on='clean' and concept.train_on={resolved.concept.train_on!r} both choose the training pairs: "
        f"set one of them")


def check_region_features(spec: models.ModelSpec, split) -> None:
  """A region model's `model.region.feature_dim` against the data's region features (a user's precomp data may be
  other than BUTD's 2048): one line naming the fix, before any parameter is built."""
  if not spec.is_region or not len(split.images):
    return
  images = split.images
  if isinstance(images, np.ndarray):
    first = images[0]
  elif getattr(images, "kind", None) == "features":
    first = images.raw(0)
  else:
    return
  dim, expected = int(np.shape(first)[-1]), int(spec.region["feature_dim"])
  if dim != expected:
    raise errors.ConfigurationError(
        f"{split.name}: its region features are {dim}-dimensional and model.region.feature_dim is {expected}: pass "
        f"--config.model.region.feature_dim={dim}")


PROFILE_CAPTIONS = 20_000   # the captions a DataProfile counts (web data: its first shards'), and a context sample


# A text tower trained from scratch takes its context from the captions when its named size's is too short: the
# longest caption's tokens (start and end included), rounded up to a multiple of 8, at most CLIP's 77.
MAX_DATA_CONTEXT = 77


def _with_context(resolved: Resolved, context: int) -> Resolved:
  config = resolved.config.copy_and_resolve_references()
  with config.unlocked():
    config.model.context_length = int(context)
  config.lock()
  return resolve(config)


def context_of_checkpoint(resolved: Resolved, saved_tokenizer: dict | None) -> tuple[Resolved, str | None]:
  """`resolved` with the text context of the checkpoint it starts from or resumes (its saved tokenizer's), when
  `model.context_length` is unset and the named size's differs: an ncjax run's context may have been chosen on its
  data (context_from_data), and its position embeddings have that length."""
  if saved_tokenizer is None or resolved.config.model.get("context_length") is not None:
    return resolved, None
  saved, have = saved_tokenizer.get("context_length"), resolved.model.context_length
  if saved is None or int(saved) == have:
    return resolved, None
  return _with_context(resolved, saved), f"model.context_length {have} -> {saved}: the checkpoint's"


def context_from_data(resolved: Resolved, captions, vocabulary=None) -> tuple[Resolved, str | None]:
  """`resolved` with a text context long enough for these captions, and the note saying so (None: unchanged).

  A named CPU size fixes a context made for its embedded data (tiny: 16 tokens, for ten-class digits captions); a
  user's captions are often longer, and truncating them all silently loses what tells a caption from another (3,000
  scenes as a user's table: every caption cut at 16 of its 17-32 tokens). Only a run that trains its text tower
  from scratch (no `method.init_from`) and leaves `model.context_length` unset is changed: a checkpoint fixes its
  context (context_of_checkpoint), and an explicit setting is the user's. The chosen length is written into the
  config, so checkpoints and `ncjax eval` rebuild the same model."""
  config = resolved.config
  if (config.model.get("context_length") is not None or config.method.init_from or not len(captions)
      or resolved.input.dataset in data_lib.DATASETS):   # the embedded datasets: their presets chose the context
    return resolved, None
  have = resolved.model.context_length
  if have >= MAX_DATA_CONTEXT:   # nothing to raise it to (CLIP's sizes): no probe at start-up
    return resolved, None
  captions = list(captions)[::max(1, len(captions) // PROFILE_CAPTIONS)]   # an even sample of a large dataset
  lengths = _token_counts(resolved, captions, vocabulary)
  longest = int(lengths.max())
  if longest <= have:
    return resolved, None
  wanted = min(MAX_DATA_CONTEXT, -(-longest // 8) * 8)
  note = (f"model.context_length {have} -> {wanted}: {float(np.mean(lengths > have)):.0%} of {len(lengths)} "
          f"training captions are longer than {have} tokens (the longest: {longest}"
          f"{'' if longest <= MAX_DATA_CONTEXT else f', cut at {MAX_DATA_CONTEXT}'}); "
          f"--config.model.context_length=N sets it")
  return _with_context(resolved, wanted), note


def _token_counts(resolved: Resolved, captions, vocabulary=None) -> np.ndarray:
  """Each caption's tokens (start and end included) under the run's tokenizer kind, counted up to
  MAX_DATA_CONTEXT + 1."""
  probe = dataclasses.replace(resolved.tokenizer, context_length=MAX_DATA_CONTEXT + 1).build(
      captions, vocabulary=vocabulary)
  return np.sum(probe.encode(captions) != probe.pad_id, axis=1)


def context_cut_on_web(resolved: Resolved, captions) -> str | None:
  """The warning of a web-data run whose text context cuts captions: the share of `captions` (a sample of the
  shards) longer than the context, and the longest (None where none is cut). Web data keeps the context it is given
  — the size's, the checkpoint's or the config's — as what it reads is too large to measure at start-up; a context
  of CLIP's 77 is not probed (CLIP's own sizes cut there by design)."""
  have = resolved.model.context_length
  if have >= MAX_DATA_CONTEXT or not len(captions):
    return None
  lengths = _token_counts(resolved, captions)
  cut = lengths > have
  if not cut.any():
    return None
  longest = int(lengths.max())
  return (f"model.context_length {have} cuts {float(np.mean(cut)):.1%} of {len(lengths)} captions sampled from the "
          f"web data's first shards (the longest: {longest}{'+' if longest > MAX_DATA_CONTEXT else ''} tokens); "
          f"--config.model.context_length=N sets it (a checkpoint's context stays its own)")


def build_experiment(config, *, devices=None, saved_tokenizer: dict | None = None) -> Experiment:
  """The whole experiment of a config. `saved_tokenizer`: the vocabulary of a checkpoint being resumed (else the
  init run's, else one built from the training captions)."""
  resolved = resolve(with_checkpoint_model(config))
  config, spec, inp = resolved.config, resolved.model, resolved.input
  mesh = shard_lib.make_mesh(config.mesh, devices)
  check_micro_batches(inp.global_batch_size, mesh.devices.size, config.optim.micro_batches)
  if saved_tokenizer is None:
    saved_tokenizer = resolved.init.saved_tokenizer()
  check_train_on(resolved)
  resolved, note = context_of_checkpoint(resolved, saved_tokenizer)
  if note:
    config, spec = resolved.config, resolved.model
    log.info("data-derived setting: %s", note)
  main_stage_steps, web_captions = None, None
  if web_pipeline.is_web(inp.dataset):   # img2dataset output at any size: nothing N-long in memory
    train_data, tokenizer = web_pipeline.train_data(inp, resolved.noise, resolved.concept, resolved.tokenizer,
                                                    image_size=spec.image_size, mesh=mesh,
                                                    saved_tokenizer=saved_tokenizer)
    noisy = None   # the web path's noise is computed on demand (train_data.noise)
    if spec.context_length < MAX_DATA_CONTEXT:   # (no read of the shards where nothing is probed)
      web_captions = web_pipeline.sample_captions(train_data.datasets, PROFILE_CAPTIONS)
      warning = context_cut_on_web(resolved, web_captions)
      if warning:
        log.warning("%s", warning)
  else:
    split = data_lib.load_split(inp, inp.split, spec.image_size)
    check_region_features(spec, split)
    resolved, note = context_from_data(resolved, split.captions, split.vocabulary)
    if note:
      config, spec = resolved.config, resolved.model
      log.info("data-derived setting: %s", note)
    tokenizer = resolved.tokenizer.build(split.captions, saved=saved_tokenizer, vocabulary=split.vocabulary)
    noisy = noise_index(resolved.noise, split.caption_to_image)
    if resolved.noise.train_on == "clean" and noisy is not None:   # the perfect filter: only the intact pairs
      train_data = pipeline_train_data(inp, split, tokenizer, mesh, noisy, image_size=spec.image_size,
                                       subset=np.flatnonzero(noisy.clean))
      main_stage_steps = config.num_epochs * (split.num_captions // inp.global_batch_size)  # all pairs' budget
    else:
      train_data = concept_train_data(inp, resolved.concept, split, tokenizer, mesh, noisy,
                                      image_size=spec.image_size)
  if resolved.options.wants_data_profile():   # settings left to the data ('auto'), chosen from it once, logged
    web = web_pipeline.is_web(inp.dataset)
    if web and web_captions is None:
      web_captions = web_pipeline.sample_captions(train_data.datasets, PROFILE_CAPTIONS)
    captions = web_captions if web else split.captions
    profile = caption_profile(captions, inp.global_batch_size, steps_per_epoch=train_data.steps_per_epoch)
    options, notes = resolved.options.from_data(profile)
    resolved = dataclasses.replace(resolved, options=options)
    for note in notes:
      log.info("data-derived setting: %s", note)
  source = resolved.prior_scores_source()
  prior = (scores_lib.load_clean_scores(source, train_data.num_examples, train_data.noise_sha256)
           if source is not None else None)
  method = resolved.method(tokenizer=tokenizer, num_examples=train_data.num_examples, prior_scores=prior,
                           main_stage_steps=main_stage_steps)
  return Experiment(config, resolved, mesh, tokenizer, train_data, method, noisy, batch_transform(resolved.noise))
