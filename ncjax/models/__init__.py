"""Models: towers, geometries (sphere, MERU's Lorentz) and the two-tower model, built from a config."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ncjax.models.geometry import GEOMETRIES, l2_normalize
from ncjax.models.sizes import SIZES, get_size
from ncjax.models.two_tower import (IMAGE_TOWERS, TEXT_TOWERS, TwoTower, register_image_tower,
                                    register_text_tower)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _get(cfg, key, default=None):
  value = cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)
  return default if value is None else value


# config field -> (tower, spec key) for the explicit overrides of a named size.
_OVERRIDES = {
    "image_size": ("image", "image_size"), "patch_size": ("image", "patch_size"), "channels": ("image", "channels"),
    "image_width": ("image", "width"), "image_depth": ("image", "depth"), "image_heads": ("image", "heads"),
    "image_mlp_dim": ("image", "mlp_dim"),
    "context_length": ("text", "context_length"), "text_width": ("text", "width"), "text_depth": ("text", "depth"),
    "text_heads": ("text", "heads"), "text_mlp_dim": ("text", "mlp_dim"), "vocab_size": ("text", "vocab_size"),
}
CLIP_VOCAB_SIZE = 49408


def resolve_model_spec(cfg, *, vocab_size: int | None = None) -> dict:
  """The tower hyper-parameters a config asks for: a named size, then explicit per-field overrides.

  `vocab_size` (the tokenizer's) must agree with a vocabulary the size or the config fixes."""
  spec = get_size(cfg.size)
  for key, (tower, field) in _OVERRIDES.items():
    if _get(cfg, key) is not None:
      spec[tower][field] = _get(cfg, key)
  if _get(cfg, "embed_dim") is not None:
    spec["embed_dim"] = _get(cfg, "embed_dim")
  if vocab_size is not None:
    fixed = spec["text"].get("vocab_size")
    if fixed is not None and fixed != vocab_size and vocab_size != 1:
      raise ValueError(f"model {cfg.size!r} has a vocabulary of {fixed} tokens but the tokenizer has {vocab_size}; "
                       f"use model.tokenizer='clip_bpe' (or 'auto') for CLIP-sized models")
    spec["text"]["vocab_size"] = vocab_size if fixed is None or vocab_size != 1 else fixed
  if spec["text"].get("vocab_size") is None:
    raise ValueError(f"model size {cfg.size!r} takes its vocabulary size from the tokenizer; none was given")
  missing = [f"{tower}.{k}" for tower in ("image", "text") for k, v in spec[tower].items() if v is None]
  if spec["embed_dim"] is None:
    missing.append("embed_dim")
  if missing:
    raise ValueError(f"model size {cfg.size!r} leaves {missing} unset; set them (model.image_width, ...) or use "
                     f"a named size: {sorted(SIZES)}")
  return spec


def tokenizer_kind_of(cfg) -> str:
  """'clip_bpe' or 'word': model.tokenizer, with 'auto' meaning CLIP's BPE when the size fixes CLIP's vocabulary."""
  kind = _get(cfg, "tokenizer", "auto")
  if kind != "auto":
    return kind
  fixed = get_size(cfg.size)["text"].get("vocab_size") or _get(cfg, "vocab_size")
  return "clip_bpe" if fixed == CLIP_VOCAB_SIZE else "word"


def image_size_of(model_config) -> int:
  """The input resolution the model's image tower expects (what the data pipeline resizes to)."""
  return resolve_model_spec(model_config, vocab_size=1)["image"]["image_size"]


def context_length_of(model_config) -> int:
  """The text tower's context length (what the tokenizer pads / truncates to)."""
  return resolve_model_spec(model_config, vocab_size=1)["text"]["context_length"]


def build_two_tower(cfg, *, vocab_size: int | None, eot_id: int, pad_id: int = 0, seed: int = 0) -> TwoTower:
  """Instantiate a TwoTower from `config.model` (call under `nnx.eval_shape` for abstract shapes)."""
  if cfg.dtype not in DTYPES:
    raise ValueError(f"unknown model.dtype {cfg.dtype!r}; expected one of {sorted(DTYPES)}")
  if cfg.geometry not in GEOMETRIES:
    raise ValueError(f"unknown model.geometry {cfg.geometry!r}; expected one of {sorted(GEOMETRIES)}")
  for kind, name, registry in (("image", cfg.image_type, IMAGE_TOWERS), ("text", cfg.text_type, TEXT_TOWERS)):
    if name not in registry:
      raise ValueError(f"unknown model.{kind}_type {name!r}; registered: {sorted(registry)}")
  dtype = DTYPES[cfg.dtype]
  spec = resolve_model_spec(cfg, vocab_size=vocab_size)
  rngs = nnx.Rngs(seed)
  embed_dim = spec["embed_dim"]
  ln_eps = _get(cfg, "ln_eps", 1e-5)
  image = IMAGE_TOWERS[cfg.image_type](
      **spec["image"], embed_dim=embed_dim, pool=cfg.pool, ln_pre=cfg.ln_pre, act=cfg.act, dtype=dtype,
      remat=cfg.remat, patch_bias=_get(cfg, "patch_bias", False), ln_eps=ln_eps, rngs=rngs)
  text = TEXT_TOWERS[cfg.text_type](
      **spec["text"], embed_dim=embed_dim, eot_id=eot_id, pad_id=pad_id, pool=cfg.text_pool, act=cfg.act,
      dtype=dtype, remat=cfg.remat, ln_eps=ln_eps, rngs=rngs)
  geo_kwargs = dict(embed_dim=embed_dim)
  if cfg.geometry == "lorentz":
    geo_kwargs["curv_init"] = cfg.curv_init
  geometry = GEOMETRIES[cfg.geometry](**geo_kwargs, rngs=rngs)
  return TwoTower(image, text, geometry, logit_scale_init=cfg.logit_scale_init,
                  logit_bias_init=cfg.get("logit_bias_init", None))


REGION_IMAGE_TYPE = "regions"


def is_region_model(cfg) -> bool:
  """Whether `config.model` describes a region-feature retrieval model (SGRAF) rather than a two-tower model."""
  return _get(cfg, "image_type") == REGION_IMAGE_TYPE


def region_spec(model_config) -> dict:
  """The region model's hyper-parameters from `config.model` (its `region` block and the named size)."""
  spec = resolve_model_spec(model_config, vocab_size=1)
  region = model_config.region
  return dict(feature_dim=int(region.feature_dim), embed_dim=int(spec["embed_dim"]),
              word_dim=int(region.word_dim), sim_dim=int(region.sim_dim), head=region.head,
              steps=int(region.steps), smooth=float(region.smooth),
              word_dropout=float(region.word_dropout), pairs_per_step=int(region.pairs_per_step))


def build_model(cfg, *, vocab_size: int, eot_id: int, pad_id: int = 0, seed: int = 0) -> nnx.Module:
  """The model `config.model` asks for: a TwoTower, or (image_type 'regions', text_type 'bigru') SGRAF's region
  retrieval model (ncjax.models.sgraf). Both expose encode_image / encode_text / similarity / score /
  image_structure / text_structure (and the region model pair_score: the score of aligned pairs)."""
  if is_region_model(cfg):
    if _get(cfg, "text_type") != "bigru":
      raise ValueError(f"model.image_type='regions' pairs with model.text_type='bigru', not {cfg.text_type!r}")
    from ncjax.models.sgraf import build_region_model
    return build_region_model(region_spec(cfg), vocab_size=vocab_size, pad_id=pad_id, seed=seed)
  return build_two_tower(cfg, vocab_size=vocab_size, eot_id=eot_id, pad_id=pad_id, seed=seed)


__all__ = ["TwoTower", "build_two_tower", "build_model", "is_region_model", "region_spec", "resolve_model_spec",
           "image_size_of", "context_length_of",
           "tokenizer_kind_of", "CLIP_VOCAB_SIZE", "register_image_tower", "register_text_tower",
           "SIZES", "DTYPES", "l2_normalize"]
