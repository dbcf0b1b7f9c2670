"""Assembling an experiment from a config: mesh, training split, tokenizer, noise, input pipeline and method.

Each piece is built by the module that owns it (big_vision style): the mesh by `ncjax.sharding`, the split by
`ncjax.data`, the tokenizer by `ncjax.tokenizers`, the static noise and the per-step batch transform by
`ncjax.data.noise`, the pipeline by `ncjax.data.pipeline`, the method by `ncjax.methods`. This module only wires
them together; the trainer (`ncjax.train`) consumes the result and evaluators may too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ncjax import data as data_lib
from ncjax import models, tokenizers
from ncjax import sharding as shard_lib
from ncjax.data.noise import BatchTransform, NoisyIndex, batch_transform_from_config, noise_from_config
from ncjax.data.concepts import concept_train_data
from ncjax.data.pipeline import TrainData
from ncjax.methods import Method, build_method
from ncjax import pretrained


@dataclasses.dataclass
class Experiment:
  config: Any
  mesh: jax.sharding.Mesh
  tokenizer: Any
  train_data: TrainData
  method: Method
  noisy: NoisyIndex | None
  batch_transform: BatchTransform | None = None  # dynamic noise, applied inside the jitted step

  @property
  def steps_per_epoch(self) -> int:
    return self.train_data.steps_per_epoch


def resolve_config(config):
  """The config with the architecture, preprocessing and tokenizer of a pretrained checkpoint laid in, when
  `method.init_from` names one (openai:PATH, open_clip:PATH, hf:DIR, meru:PATH); otherwise unchanged.

  The resolved config records the spec in `model.pretrained`; a config already resolved (e.g. the one stored in a
  run's checkpoint, which `ncjax eval` reuses) is returned as it is, without reading the pretrained file."""
  spec = config.method.init_from
  if not pretrained.is_pretrained_spec(spec) or config.model.get("pretrained", "") == spec:
    return config
  model_config, _ = pretrained.load(spec)
  resolved = config.copy_and_resolve_references()
  with resolved.unlocked():
    pretrained.apply_to_config(resolved, model_config)
  resolved.lock()
  return resolved


def build_tokenizer(config, captions, saved: dict | None = None, vocabulary=None):
  """The tokenizer a run saved in its checkpoint; else, for a word tokenizer, the dataset's own vocabulary when it
  has one (NCR's precomp vocabulary: its words, in its order, after ncjax's special tokens); else one built for
  this config from the training captions."""
  if saved is not None:
    return tokenizers.tokenizer_from_json(saved)
  kind = models.tokenizer_kind_of(config.model)
  if kind == "word" and vocabulary:
    ncr_specials = {"<pad>", "<start>", "<end>", "<unk>"}
    specials = ncr_specials | set(tokenizers.WordTokenizer.SPECIALS)
    words = [w for w in dict.fromkeys(vocabulary) if w not in specials]
    return tokenizers.WordTokenizer(list(tokenizers.WordTokenizer.SPECIALS) + words,
                                    models.context_length_of(config.model))
  return tokenizers.build_tokenizer(captions, context_length=models.context_length_of(config.model),
                                    min_count=config.input.min_word_count, kind=kind)


def build_experiment(config, *, devices=None, saved_tokenizer: dict | None = None) -> Experiment:
  mesh = shard_lib.make_mesh(config.mesh, devices)
  image_size = models.image_size_of(config.model)
  split = data_lib.load_split(config.input, config.input.split, image_size)
  tokenizer = build_tokenizer(config, split.captions, saved_tokenizer, vocabulary=split.vocabulary)
  noisy = noise_from_config(config.noise, split.caption_to_image)
  train_data = concept_train_data(config, split, tokenizer, mesh, noisy, image_size=image_size)
  method = build_method(config, tokenizer=tokenizer, num_examples=train_data.num_examples,
                        noise_sha256=train_data.noise_sha256)
  return Experiment(config, mesh, tokenizer, train_data, method, noisy, batch_transform_from_config(config.noise))
