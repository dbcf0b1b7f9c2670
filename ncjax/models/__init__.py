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


def resolve_model_spec(cfg, *, vocab_size: int | None = None) -> dict:
  """The tower hyper-parameters a config asks for: a named size, then explicit per-field overrides."""
  spec = get_size(cfg.size)
  for key in ("image_size", "patch_size", "channels"):
    if _get(cfg, key) is not None:
      spec["image"][key] = _get(cfg, key)
  if _get(cfg, "context_length") is not None:
    spec["text"]["context_length"] = _get(cfg, "context_length")
  if vocab_size is not None:
    spec["text"]["vocab_size"] = vocab_size
  if spec["text"].get("vocab_size") is None:
    raise ValueError(f"model size {cfg.size!r} takes its vocabulary size from the tokenizer; none was given")
  return spec


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
  image = IMAGE_TOWERS[cfg.image_type](
      **spec["image"], embed_dim=embed_dim, pool=cfg.pool, ln_pre=cfg.ln_pre, act=cfg.act, dtype=dtype,
      remat=cfg.remat, rngs=rngs)
  text = TEXT_TOWERS[cfg.text_type](
      **spec["text"], embed_dim=embed_dim, eot_id=eot_id, pad_id=pad_id, pool=cfg.text_pool, act=cfg.act,
      dtype=dtype, remat=cfg.remat, rngs=rngs)
  geo_kwargs = dict(embed_dim=embed_dim)
  if cfg.geometry == "lorentz":
    geo_kwargs["curv_init"] = cfg.curv_init
  geometry = GEOMETRIES[cfg.geometry](**geo_kwargs, rngs=rngs)
  return TwoTower(image, text, geometry, logit_scale_init=cfg.logit_scale_init,
                  logit_bias_init=cfg.get("logit_bias_init", None))


__all__ = ["TwoTower", "build_two_tower", "resolve_model_spec", "register_image_tower", "register_text_tower",
           "SIZES", "DTYPES", "l2_normalize"]
