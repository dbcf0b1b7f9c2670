"""Models: towers, geometries (sphere, MERU's Lorentz) and the two-tower model, built from a config."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from flax import nnx

from ncjax.models.geometry import GEOMETRIES, l2_normalize
from ncjax.models.layers import ATTENTION_KINDS, resolve_attention
from ncjax.models.sizes import SIZES, get_size
from ncjax.models.two_tower import (IMAGE_TOWERS, TEXT_TOWERS, TwoTower, clamp_stored, register_image_tower,
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


def _towers_of(cfg) -> dict:
  """A named size, then the config's explicit per-field overrides; the vocabulary stays None unless the size or
  the config fixes it."""
  spec = get_size(cfg.size)
  for key, (tower, field) in _OVERRIDES.items():
    if _get(cfg, key) is not None:
      spec[tower][field] = _get(cfg, key)
  if _get(cfg, "embed_dim") is not None:
    spec["embed_dim"] = _get(cfg, "embed_dim")
  missing = [f"{tower}.{k}" for tower in ("image", "text") for k, v in spec[tower].items()
             if v is None and k != "vocab_size"]
  if spec["embed_dim"] is None:
    missing.append("embed_dim")
  if missing:
    raise ValueError(f"model size {cfg.size!r} leaves {missing} unset; set them (model.image_width, ...) or use "
                     f"a named size: {sorted(SIZES)}")
  return spec


def _with_vocab(towers: dict, size: str, vocab_size: int | None) -> dict:
  spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in towers.items()}
  fixed = spec["text"].get("vocab_size")
  if vocab_size is not None:
    if fixed is not None and fixed != vocab_size:
      raise ValueError(f"model {size!r} has a vocabulary of {fixed} tokens but the tokenizer has {vocab_size}; "
                       f"use model.tokenizer='clip_bpe' (or 'auto') for CLIP-sized models")
    spec["text"]["vocab_size"] = vocab_size
  if spec["text"].get("vocab_size") is None:
    raise ValueError(f"model size {size!r} takes its vocabulary size from the tokenizer; none was given")
  return spec


def resolve_model_spec(cfg, *, vocab_size: int | None = None) -> dict:
  """The tower hyper-parameters a config asks for: a named size, then explicit per-field overrides.

  `vocab_size` (the tokenizer's) must agree with a vocabulary the size or the config fixes."""
  return _with_vocab(_towers_of(cfg), cfg.size, vocab_size)


def _tokenizer_kind(cfg) -> str:
  kind = _get(cfg, "tokenizer", "auto")
  if kind != "auto":
    return kind
  fixed = get_size(cfg.size)["text"].get("vocab_size") or _get(cfg, "vocab_size")
  return "clip_bpe" if fixed == CLIP_VOCAB_SIZE else "word"


REGION_IMAGE_TYPE = "regions"
MODEL_KINDS = ("two_tower", "region")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """`config.model` resolved once (by `ncjax.experiment`): what kind of model, its named size laid under the
  explicit overrides (`towers`, without the vocabulary, which comes from the tokenizer), and every option the model
  builders read. Layers below the experiment take this object, never the raw config.

  kind: 'two_tower' (image and text towers over a geometry) or 'region' (SGRAF's region-feature retrieval model,
  `image_type='regions'`). tokenizer_kind: 'clip_bpe', 'word' or 'sentencepiece:PATH' (big_vision's SigLIP
  tokenisation; `model.tokenizer='auto'`: CLIP's BPE when the size fixes CLIP's vocabulary). image_size /
  context_length: what the data pipeline resizes to and the tokenizer pads to."""
  kind: str
  size: str
  towers: dict
  image_size: int
  context_length: int
  tokenizer_kind: str
  image_type: str = "vit"
  text_type: str = "transformer"
  pool: str = "tok"
  ln_pre: bool = True
  patch_bias: bool = False
  ln_eps: float = 1e-5
  act: str = "quick_gelu"
  text_pool: str = "eot"
  text_causal: bool = True     # False: bidirectional text attention (big_vision / SigLIP)
  posemb: str = "learn"        # the image tower's position embedding: 'learn', or fixed: 'sincos2d' (big_vision's)
                               # or 'sincos2d_moco' (MoCo v3's, MERU's)
  proj_bias: bool = False      # a bias on both towers' projections (big_vision's heads)
  dtype: str = "float32"
  remat: bool = False
  attention: str = "auto"      # 'auto' | 'einsum' | 'recompute' | 'fused' | 'xla' | 'cudnn' (layers.MultiHeadAttention)
  grad_reduce: str = "bf16"    # optim.grad_reduce: the dtype the blocks' weight gradients are summed in
  geometry: str = "sphere"
  curv_init: float = 1.0
  logit_scale_init: float = math.log(1 / 0.07)
  logit_bias_init: float | None = None
  pretrained: str = ""
  region: dict | None = None    # region models: feature_dim, embed_dim, word_dim, sim_dim, head, steps, ...

  @classmethod
  def from_config(cls, cfg) -> "ModelSpec":
    towers = _towers_of(cfg)
    kind = "region" if _get(cfg, "image_type") == REGION_IMAGE_TYPE else "two_tower"
    fields = {f.name for f in dataclasses.fields(cls)} - {"kind", "towers", "image_size", "context_length",
                                                         "tokenizer_kind", "region"}
    options = {k: _get(cfg, k) for k in fields if _get(cfg, k) is not None}
    region = None
    if kind == "region":
      if _get(cfg, "text_type") != "bigru":
        raise ValueError(f"model.image_type='regions' pairs with model.text_type='bigru', not {cfg.text_type!r}")
      r = cfg.region
      region = dict(feature_dim=int(r.feature_dim), embed_dim=int(towers["embed_dim"]), word_dim=int(r.word_dim),
                    sim_dim=int(r.sim_dim), head=r.head, steps=int(r.steps), smooth=float(r.smooth),
                    word_dropout=float(r.word_dropout), pairs_per_step=int(r.pairs_per_step),
                    text_structure=str(r.text_structure), pool_dropout=float(r.pool_dropout),
                    init=str(r.get("init", "public")))
    return cls(kind=kind, towers=towers, image_size=towers["image"]["image_size"],
               context_length=towers["text"]["context_length"], tokenizer_kind=_tokenizer_kind(cfg),
               region=region, **options)

  @property
  def is_region(self) -> bool:
    return self.kind == "region"

  def clamp_stored(self, params: dict) -> dict:
    """One model's parameters with its stored scalars clamped into range after an optimiser update (a two-tower
    model's logit scale, MERU's curvature and alphas); a region model stores none."""
    if self.is_region:
      return params
    return clamp_stored(params, geometry=self.geometry, curv_init=self.curv_init)


# The keys of config.model besides the towers' fields that change a model's parameters or its function (dtype,
# remat, attention and the initial values of stored scalars do not); the region keys likewise for region models.
ARCHITECTURE_KEYS = ("image_type", "text_type", "pool", "ln_pre", "patch_bias", "ln_eps", "act", "text_pool",
                     "text_causal", "posemb", "proj_bias", "geometry")
REGION_ARCHITECTURE_KEYS = ("feature_dim", "word_dim", "sim_dim", "head", "steps")


def architecture_of(cfg) -> dict:
  """The architecture a config.model section builds, by config key ('text_depth', 'act', 'region.head', ...), every
  value effective (a named size's fields resolved; the tokenizer's kind, 'auto' resolved): two sections build the
  same model where these agree."""
  spec = ModelSpec.from_config(cfg)
  out = {key: spec.towers[tower].get(field) for key, (tower, field) in _OVERRIDES.items()}
  out["embed_dim"] = spec.towers["embed_dim"]
  out.update({key: getattr(spec, key) for key in ARCHITECTURE_KEYS})
  out["tokenizer"] = spec.tokenizer_kind
  if spec.region is not None:
    out.update({f"region.{key}": spec.region[key] for key in REGION_ARCHITECTURE_KEYS})
  return out


def build_two_tower(spec: ModelSpec, *, vocab_size: int | None, eot_id: int, pad_id: int = 0,
                    seed: int = 0, micro_batches: int = 1) -> TwoTower:
  """Instantiate a TwoTower from a ModelSpec (call under `nnx.eval_shape` for abstract shapes). `micro_batches`:
  the towers encode each batch in that many device-local micro-batches (ncjax.models.microbatch)."""
  if spec.dtype not in DTYPES:
    raise ValueError(f"unknown model.dtype {spec.dtype!r}; expected one of {sorted(DTYPES)}")
  if spec.geometry not in GEOMETRIES:
    raise ValueError(f"unknown model.geometry {spec.geometry!r}; expected one of {sorted(GEOMETRIES)}")
  for kind, name, registry in (("image", spec.image_type, IMAGE_TOWERS), ("text", spec.text_type, TEXT_TOWERS)):
    if name not in registry:
      raise ValueError(f"unknown model.{kind}_type {name!r}; registered: {sorted(registry)}")
  dtype = DTYPES[spec.dtype]
  towers = with_vocabulary(spec, vocab_size)
  rngs = nnx.Rngs(seed)
  embed_dim = towers["embed_dim"]
  attention = attention_kinds(spec)
  image = IMAGE_TOWERS[spec.image_type](
      **towers["image"], embed_dim=embed_dim, pool=spec.pool, ln_pre=spec.ln_pre, act=spec.act, dtype=dtype,
      remat=spec.remat, patch_bias=spec.patch_bias, ln_eps=spec.ln_eps, rngs=rngs,
      **_non_default(spec, image_posemb="posemb", image_proj_bias="proj_bias"),
      **({} if attention["image"] == "einsum" else {"attention": attention["image"]}),
      **({} if spec.grad_reduce == "bf16" else {"grad_reduce": spec.grad_reduce}))
  text = TEXT_TOWERS[spec.text_type](
      **towers["text"], embed_dim=embed_dim, eot_id=eot_id, pad_id=pad_id, pool=spec.text_pool, act=spec.act,
      dtype=dtype, remat=spec.remat, ln_eps=spec.ln_eps, rngs=rngs,
      **_non_default(spec, text_causal="causal", text_proj_bias="proj_bias"),
      **({} if attention["text"] == "einsum" else {"attention": attention["text"]}),
      **({} if spec.grad_reduce == "bf16" else {"grad_reduce": spec.grad_reduce}))
  geo_kwargs = dict(embed_dim=embed_dim)
  if spec.geometry == "lorentz":
    geo_kwargs["curv_init"] = spec.curv_init
  geometry = GEOMETRIES[spec.geometry](**geo_kwargs, rngs=rngs)
  return TwoTower(image, text, geometry, logit_scale_init=spec.logit_scale_init,
                  logit_bias_init=spec.logit_bias_init, micro_batches=micro_batches)


def attention_kinds(spec: ModelSpec, platform: str | None = None) -> dict[str, str]:
  """The attention implementation each tower's blocks run (`model.attention` resolved for their head sizes and the
  compute dtype on `platform`, JAX's default backend by default): {'image': ..., 'text': ...}. A tower that computes
  with the einsum path is built without the keyword, so towers registered before the option keep working."""
  if spec.is_region:
    return {}
  dtype = DTYPES[spec.dtype]
  return {tower: resolve_attention(spec.attention, dtype=dtype, platform=platform,
                                   head_dim=spec.towers[tower]["width"] // spec.towers[tower]["heads"])
          for tower in ("image", "text")}


_TOWER_OPTIONS = {"image_posemb": ("posemb", "learn"), "image_proj_bias": ("proj_bias", False),
                  "text_causal": ("text_causal", True), "text_proj_bias": ("proj_bias", False)}


def _non_default(spec: ModelSpec, **names) -> dict:
  """The tower keyword arguments of options that differ from their defaults (so that registered towers which
  predate them keep working with configs that leave them alone)."""
  out = {}
  for option, kwarg in names.items():
    field, default = _TOWER_OPTIONS[option]
    value = getattr(spec, field)
    if value != default:
      out[kwarg] = value
  return out


def with_vocabulary(spec: ModelSpec, vocab_size: int | None) -> dict:
  """The spec's towers with the tokenizer's vocabulary, which must agree with one the size fixes."""
  return _with_vocab(spec.towers, spec.size, vocab_size)


def build_model(spec: ModelSpec, *, vocab_size: int, eot_id: int, pad_id: int = 0, seed: int = 0,
                micro_batches: int = 1) -> nnx.Module:
  """The model a ModelSpec describes: a TwoTower, or SGRAF's region retrieval model (ncjax.models.sgraf). Both
  expose encode_image / encode_text / similarity / score / image_structure / text_structure and `eval_model()`
  (the region model also pair_score: the score of aligned pairs)."""
  if spec.is_region:
    if micro_batches > 1:
      raise ValueError(REGION_MICRO_BATCHES)
    from ncjax.models.sgraf import build_region_model
    return build_region_model(spec.region, vocab_size=vocab_size, pad_id=pad_id, seed=seed)
  return build_two_tower(spec, vocab_size=vocab_size, eot_id=eot_id, pad_id=pad_id, seed=seed,
                         micro_batches=micro_batches)


REGION_MICRO_BATCHES = (
    "optim.micro_batches > 1 is not available for the region-feature models (SGRAF, GSC on SGRAF, DisNCL): their "
    "similarity is a learned B x B head over every image's regions and every caption's words of the batch, not a "
    "function of per-sample embeddings, so the batch cannot be encoded in independent micro-batches; use "
    "optim.micro_batches=1 (a smaller global batch, or model.region.pairs_per_step to bound the head's memory)")


__all__ = ["TwoTower", "ModelSpec", "build_two_tower", "build_model", "resolve_model_spec", "with_vocabulary",
           "MODEL_KINDS", "CLIP_VOCAB_SIZE", "register_image_tower", "register_text_tower",
           "SIZES", "DTYPES", "l2_normalize", "ATTENTION_KINDS", "attention_kinds"]
