"""Reading a spec into (model config, params): the format's reader, the shape check against the model the
fields describe, every source key used or ignored; the overlay onto a method's parameters; `load_model`."""

from __future__ import annotations

import dataclasses
import functools
import os

import ml_collections
import numpy as np

from ncjax.pretrained import big_vision, hf, meru, open_clip, openai
from ncjax.pretrained.core import (CLIP_EOT_ID, IGNORED, UnsupportedArchitecture, parse_spec, PretrainedSpec,
                                    set_path)
from ncjax.pretrained.weights_io import CheckpointFormatError

READERS = {"openai": openai.read, "open_clip": open_clip.read, "hf": hf.read, "meru": meru.read,
           "big_vision": big_vision.read}


def _read(spec: PretrainedSpec):
  """(state dict, model fields, preprocess, key table) of a spec."""
  sd, fields, pre, keys = READERS[spec.format](spec)
  if not fields.get("ln_pre", True):
    keys = [k for k in keys if not k.target.startswith("img/ln_pre/")]
  if fields.get("posemb", "learn") != "learn":   # a fixed table: nothing to load (the tower computes it)
    keys = [k for k in keys if k.target != "img/pos_embedding"]
  fields["pretrained"] = str(spec)
  return sd, fields, pre, keys


def expected_shapes(fields: dict) -> dict[str, tuple]:
  """{'/'-joined path: shape} of the TwoTower these fields describe (built abstractly: no memory)."""
  import jax
  from flax import nnx
  from ncjax import models
  cfg = ml_collections.ConfigDict(dict(_config_defaults(), **fields))
  holder = {}

  def make():
    holder["m"] = models.build_two_tower(models.ModelSpec.from_config(cfg), vocab_size=fields["vocab_size"],
                                         eot_id=CLIP_EOT_ID)
    return holder["m"]

  abstract = nnx.eval_shape(make)
  _, state = nnx.split(abstract, nnx.Param)
  pure = nnx.to_pure_dict(state)
  return {"/".join(str(getattr(k, "key", k)) for k in p): tuple(v.shape)
          for p, v in jax.tree_util.tree_flatten_with_path(pure)[0]}


def _config_defaults() -> dict:
  from ncjax.config_lib import base_config
  return base_config().model.to_dict()


def load(spec: str):
  """(model_config, params) of a pretrained checkpoint. See the module docstring for the accepted specs.

  The result is cached per (spec, file modification time): resolving a config and initialising its parameters
  read the file once."""
  parsed = parse_spec(spec)
  try:
    stamp = os.path.getmtime(parsed.path)
  except OSError:
    raise FileNotFoundError(f"{spec}: no such file or directory {parsed.path!r}") from None
  model_config, params = _load_cached(spec, stamp)
  return model_config.copy_and_resolve_references(), params


@functools.lru_cache(maxsize=2)
def _load_cached(spec: str, stamp: float):
  del stamp
  parsed = parse_spec(spec)
  sd, fields, pre, keys = _read(parsed)
  want = expected_shapes(fields)
  params, used = {}, set()
  for km in keys:
    missing = [s for s in km.sources if s not in sd]
    if missing:
      raise CheckpointFormatError(f"{spec}: key {missing[0]!r} is missing; this {parsed.format} checkpoint does "
                                  f"not match the architecture inferred from it ({_describe(fields)})")
    value = np.asarray(km.to_ncjax(*[np.asarray(sd[s], np.float32) for s in km.sources]), np.float32)
    if km.target not in want:
      raise CheckpointFormatError(f"{spec}: {km.sources[0]!r} maps to {km.target!r}, which the model lacks")
    if tuple(value.shape) != want[km.target]:
      raise CheckpointFormatError(f"{spec}: key {km.sources[0]!r} has shape {tuple(np.shape(sd[km.sources[0]]))} "
                                  f"(-> {tuple(value.shape)} as {km.target!r}); the model expects "
                                  f"{want[km.target]}")
    set_path(params, km.target, value)
    used.update(km.sources)
  unexpected = sorted(k for k in sd if k not in used and not IGNORED.match(k))
  if unexpected:
    raise UnsupportedArchitecture(f"{spec}: {len(unexpected)} keys have no place in ncjax's model, e.g. "
                                  f"{unexpected[:5]}; the checkpoint's architecture is not supported")
  unfilled = sorted(set(want) - {km.target for km in keys})
  unfilled = [p for p in unfilled if p != "logit_bias"]
  if unfilled:
    raise CheckpointFormatError(f"{spec}: the checkpoint provides no value for {unfilled[:5]}")
  model_config = ml_collections.ConfigDict(dict(fields, preprocess=pre))
  return model_config, params


def overlay(fresh, spec: str, abstract_params: dict, shardings: dict) -> dict:
  """Initialise every two-tower module of a method's parameters ('model', or 'net_a' / 'net_b' under
  co-teaching) from a pretrained checkpoint, placed with `shardings`. Parameters the checkpoint lacks (a SigLIP
  bias, NCU's prompt, a discriminator) keep their fresh initialisation: `fresh(draw)` gives it, `draw` marking the
  leaves to compute (see `sharding.initialise_params`)."""
  import jax
  _, loaded = load(spec)
  towers = [name for name, sub in abstract_params.items()
            if isinstance(sub, dict) and "img" in sub and "txt" in sub]
  if not towers:
    raise ValueError(f"{spec}: this method has no two-tower module to initialise (modules: {sorted(abstract_params)})")

  def provided(tree, new):
    if isinstance(tree, dict):
      return {k: provided(v, new.get(k) if isinstance(new, dict) else None) for k, v in tree.items()}
    return new is not None

  draw = {name: jax.tree.map(lambda _: True, sub) for name, sub in abstract_params.items()}
  for name in towers:
    draw[name] = jax.tree.map(lambda given: not given, provided(abstract_params[name], loaded))
  params = fresh(draw)

  def merge(fresh, new, sh, path):
    if isinstance(fresh, dict):
      return {k: merge(v, new.get(k) if isinstance(new, dict) else None, sh[k], f"{path}/{k}")
              for k, v in fresh.items()}
    if new is None:
      return fresh
    if tuple(np.shape(new)) != tuple(fresh.shape):
      raise ValueError(f"{spec}: {path} has shape {tuple(np.shape(new))} in the checkpoint but "
                       f"{tuple(fresh.shape)} in this model")
    return jax.device_put(np.asarray(new, fresh.dtype), sh)

  out = dict(params)
  for name in towers:
    out[name] = merge(params[name], loaded, shardings[name], name)
  return out


def _describe(fields: dict) -> str:
  return (f"image {fields['image_width']}w x {fields['image_depth']} layers, patch {fields['patch_size']}, "
          f"text {fields['text_width']}w x {fields['text_depth']}, embed {fields['embed_dim']}")


def apply_to_config(config, model_config) -> None:
  """Write an imported architecture and its preprocessing into a (unlocked) run config."""
  for key, value in model_config.items():
    if key == "preprocess":
      continue
    if key in config.model:
      config.model[key] = value
  pre = model_config.preprocess
  config.input.normalization = pre.normalization
  config.input.resize = pre.resize


@dataclasses.dataclass
class PretrainedModel:
  """An imported model bound to its parameters: encode_image(NHWC float32 preprocessed) / encode_text(tokens)."""
  module: object
  params: dict
  config: ml_collections.ConfigDict

  def __post_init__(self):
    import jax
    from flax import nnx
    graphdef, _ = nnx.split(self.module, nnx.Param)
    self._graphdef = graphdef
    merge = lambda p: nnx.merge(graphdef, p)
    self._encode_image = jax.jit(lambda p, x: merge(p).encode_image(x))
    self._encode_text = jax.jit(lambda p, t: merge(p).encode_text(t))

  def encode_image(self, images):
    return self._encode_image(self.params, np.asarray(images, np.float32))

  def encode_text(self, tokens):
    return self._encode_text(self.params, np.asarray(tokens, np.int32))

  def score(self, image_emb, text_emb):
    from flax import nnx
    return nnx.merge(self._graphdef, self.params).score(image_emb, text_emb)


def load_model(spec: str, *, attention: str = "auto", dtype: str = "float32"):
  """(model, preprocess, tokenizer), like open_clip's create_model_and_transforms. `attention` / `dtype`: the
  model's `model.attention` and compute dtype (parameters stay float32): 'cudnn' with dtype='bfloat16' runs
  cuDNN's fused attention.

  model.encode_image takes preprocessed NHWC float32 images, model.encode_text the tokenizer's ids; both return
  embeddings in the model's geometry. preprocess(PIL image or uint8 array) -> (H, W, 3) float32 with the model's
  resolution, resize and normalisation. tokenizer(texts) -> int32 (n, context_length)."""
  import jax
  from ncjax import models
  from ncjax.data import preprocess as pp
  from ncjax import tokenizers
  model_config, params = load(spec)
  cfg = ml_collections.ConfigDict(dict(_config_defaults(), **{k: v for k, v in model_config.items()
                                                             if k != "preprocess"}))
  cfg.attention, cfg.dtype = attention, dtype
  if cfg.tokenizer == "clip_bpe":
    tokenizer = tokenizers.ClipBpeTokenizer(context_length=cfg.context_length)
  else:   # big_vision: the SentencePiece model beside the checkpoint
    tokenizer = tokenizers.build_tokenizer([], context_length=cfg.context_length, kind=cfg.tokenizer)
  from flax import nnx
  # built abstractly, then given the checkpoint's weights: a random initialisation would be thrown away (for the
  # tiny test models, its eager ops cost ~2 s per load; for ViT-B/32, 150M random numbers)
  abstract = nnx.eval_shape(lambda: models.build_two_tower(models.ModelSpec.from_config(cfg),
                                                           vocab_size=cfg.vocab_size, eot_id=tokenizer.eot_id))
  params = jax.tree.map(np.asarray, params)
  module = nnx.merge(nnx.split(abstract, nnx.Param)[0], params)
  bound = PretrainedModel(module, params, cfg)
  pre = model_config.preprocess

  def preprocess(image):
    return pp.eval_transform(image, pre.image_size, pre.normalization, resize=pre.resize)

  return bound, preprocess, tokenizer
