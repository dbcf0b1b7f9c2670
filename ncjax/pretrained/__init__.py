"""Pretrained models in and out: OpenAI CLIP, open_clip, Hugging Face `CLIPModel` and MERU checkpoints.

Nothing is downloaded: a spec names a file or directory the user already has.

  openai:PATH                 OpenAI's released .pt (a TorchScript archive) or an OpenAI-layout state dict;
                              QuickGELU, as OpenAI trained them
  open_clip:PATH              an open_clip state dict (.pt / .bin / .safetensors) or an open_clip folder
  open_clip:NAME:PATH         (open_clip_config.json + weights, what `local-dir:` reads); the architecture comes from
                              the folder's config, else from the tensor shapes with OpenAI's head width 64, or from
                              NAME (e.g. ViT-H-14: head width 80); the activation is open_clip's default GELU unless
                              the config or NAME says quick_gelu (`ViT-B-32-quickgelu`)
  hf:DIR                      a transformers `CLIPModel` directory (config.json + model.safetensors, sharded
                              safetensors, or pytorch_model.bin)
  meru:PATH                   a facebookresearch/meru checkpoint (.pth with 'model'): timm ViT + MERU's text
                              encoder; Lorentz geometry with its curvature and scaling alphas (or, for MERU's CLIP
                              baseline checkpoints, the sphere)
  big_vision:PATH             a google-research/big_vision two-tower .npz (SigLIP): `params/img/...` (ViT with
  big_vision:SIZE:PATH        patch bias, learned position embedding or fixed 'sincos2d' — then SIZE, the image
                              resolution, is needed — 'map' (MAPHead_0), 'gap' or 'tok' pooling, a head with a
                              bias), `params/txt/...` (text transformer without causal mask, pooled at the final
                              position or by a MAP head), `params/t` (log temperature -> logit_scale) and `params/b`
                              (-> logit_bias); unrolled (`encoderblock_N`) or scanned (`encoderblock`) blocks; the
                              SentencePiece `.model` beside the file is its tokenizer

`load(spec) -> (model_config, params)`: `model_config` holds the `config.model` fields of the architecture
(`size='custom'`, widths, depths, heads, activation, ...) and `preprocess` (image size, mean/std, resize);
`params` is the nested dict of the TwoTower's parameters, float32. `load_model(spec) -> (model, preprocess,
tokenizer)` mirrors open_clip's `create_model_and_transforms`. `export(...)` writes an ncjax model back as an
open_clip folder or a Hugging Face directory. The same key tables serve both directions; every source key is
either mapped or explicitly ignored, and a shape mismatch names the key and both shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import zipfile
from typing import Callable

import ml_collections
import numpy as np

from ncjax import errors
from ncjax.pretrained.weights_io import CheckpointFormatError, read_tensors, write_safetensors

FORMATS = ("openai", "open_clip", "hf", "meru", "big_vision")
CLIP_EOT_ID, CLIP_SOT_ID = 49407, 49406

# Vision head widths of open_clip architectures whose heads are not 64 wide (open_clip's model configs).
OPEN_CLIP_HEAD_WIDTHS = {"ViT-H-14": 80, "ViT-H-16": 80, "ViT-g-14": 88, "ViT-bigG-14": 104, "ViT-e-14": 112}
OPENAI_NORMALIZATION = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
IMAGENET_NORMALIZATION = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class UnsupportedArchitecture(errors.CheckpointError):
  """A checkpoint whose architecture ncjax's towers cannot represent (ResNet, timm or HF text towers, ...)."""


# ---------------------------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PretrainedSpec:
  format: str
  path: str
  arch: str | None = None

  def __str__(self):
    return f"{self.format}:{self.arch + ':' if self.arch else ''}{self.path}"


def is_pretrained_spec(spec: str) -> bool:
  return bool(spec) and spec.split(":", 1)[0] in FORMATS and ":" in spec


def parse_spec(spec: str) -> PretrainedSpec:
  fmt, sep, rest = spec.partition(":")
  if not sep or fmt not in FORMATS:
    raise ValueError(f"{spec!r} is not a pretrained-model spec; expected one of "
                     f"{', '.join(f + ':PATH' for f in FORMATS)} (or open_clip:NAME:PATH)")
  arch = None
  if fmt in ("open_clip", "big_vision"):
    head, sep2, tail = rest.partition(":")
    if sep2 and "/" not in head and not os.path.exists(rest) and (fmt == "open_clip" or head.isdigit()):
      arch, rest = head, tail
  if not rest:
    raise ValueError(f"{spec!r}: no path after '{fmt}:'")
  return PretrainedSpec(fmt, os.path.expanduser(rest), arch)


# ---------------------------------------------------------------------------------------------------------------
# Key tables: source key(s) <-> ncjax parameter path, with the array transforms both ways
# ---------------------------------------------------------------------------------------------------------------
def _ident(x):
  return x


def _t(x):
  return np.ascontiguousarray(x.T)


def _conv_in(x):    # torch (O, I, H, W) -> flax (H, W, I, O)
  return np.ascontiguousarray(np.transpose(x, (2, 3, 1, 0)))


def _conv_out(x):
  return np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1)))


@dataclasses.dataclass(frozen=True)
class KeyMap:
  sources: tuple[str, ...]          # external key(s)
  target: str                       # '/'-joined path in the TwoTower's params
  to_ncjax: Callable = _ident       # (*source arrays) -> ncjax array
  to_source: Callable = None        # ncjax array -> tuple of source arrays (None: the inverse of a 1:1 transform)

  def inverse(self, value):
    if self.to_source is not None:
      return self.to_source(value)
    inv = {_ident: _ident, _t: _t, _conv_in: _conv_out}[self.to_ncjax]
    return (inv(value),)


def _one(src, target, fn=_ident):
  return KeyMap((src,), target, fn)


def _ln(src, target):
  return [_one(f"{src}.weight", f"{target}/scale"), _one(f"{src}.bias", f"{target}/bias")]


def _linear(src, target, bias=True):
  out = [_one(f"{src}.weight", f"{target}/kernel", _t)]
  return out + ([_one(f"{src}.bias", f"{target}/bias")] if bias else [])


def _clip_block(src: str, dst: str) -> list[KeyMap]:
  """An OpenAI/open_clip residual block (also MERU's text blocks): fused in_proj, c_fc/c_proj."""
  return (_ln(f"{src}.ln_1", f"{dst}/ln_1") + _ln(f"{src}.ln_2", f"{dst}/ln_2")
          + [_one(f"{src}.attn.in_proj_weight", f"{dst}/attn/qkv/kernel", _t),
             _one(f"{src}.attn.in_proj_bias", f"{dst}/attn/qkv/bias")]
          + _linear(f"{src}.attn.out_proj", f"{dst}/attn/out") + _linear(f"{src}.mlp.c_fc", f"{dst}/mlp/fc")
          + _linear(f"{src}.mlp.c_proj", f"{dst}/mlp/proj"))


def _fused_qkv(prefix: str, dst: str) -> list[KeyMap]:
  """Hugging Face's separate q/k/v projections <-> the fused kernel (rows [q; k; v] as torch's in_proj)."""
  srcs_w = tuple(f"{prefix}.{p}_proj.weight" for p in "qkv")
  srcs_b = tuple(f"{prefix}.{p}_proj.bias" for p in "qkv")
  return [KeyMap(srcs_w, f"{dst}/kernel", lambda q, k, v: _t(np.concatenate([q, k, v], 0)),
                 lambda w: tuple(np.split(_t(w), 3, axis=0))),
          KeyMap(srcs_b, f"{dst}/bias", lambda q, k, v: np.concatenate([q, k, v], 0),
                 lambda b: tuple(np.split(b, 3, axis=0)))]


def openai_keys(vision_depth: int, text_depth: int, text_prefix: str = "") -> list[KeyMap]:
  """OpenAI's CLIP layout (open_clip's `CLIP`; `CustomTextCLIP` puts the text tower under 'text.')."""
  t = text_prefix
  maps = [_one("visual.conv1.weight", "img/patch_embed/kernel", _conv_in),
          _one("visual.class_embedding", "img/cls_token"), _one("visual.positional_embedding", "img/pos_embedding")]
  maps += _ln("visual.ln_pre", "img/ln_pre") + _ln("visual.ln_post", "img/ln_post")
  maps.append(_one("visual.proj", "img/proj"))
  for i in range(vision_depth):
    maps += _clip_block(f"visual.transformer.resblocks.{i}", f"img/transformer/block_{i}")
  maps += [_one(f"{t}token_embedding.weight", "txt/token_embedding/embedding"),
           _one(f"{t}positional_embedding", "txt/pos_embedding"), _one(f"{t}text_projection", "txt/proj")]
  maps += _ln(f"{t}ln_final", "txt/ln_final")
  for i in range(text_depth):
    maps += _clip_block(f"{t}transformer.resblocks.{i}", f"txt/transformer/block_{i}")
  maps.append(_one("logit_scale", "logit_scale"))
  return maps


def hf_keys(vision_depth: int, text_depth: int) -> list[KeyMap]:
  maps = [_one("vision_model.embeddings.patch_embedding.weight", "img/patch_embed/kernel", _conv_in),
          _one("vision_model.embeddings.class_embedding", "img/cls_token"),
          _one("vision_model.embeddings.position_embedding.weight", "img/pos_embedding"),
          _one("visual_projection.weight", "img/proj", _t)]
  maps += _ln("vision_model.pre_layrnorm", "img/ln_pre") + _ln("vision_model.post_layernorm", "img/ln_post")
  maps += [_one("text_model.embeddings.token_embedding.weight", "txt/token_embedding/embedding"),
           _one("text_model.embeddings.position_embedding.weight", "txt/pos_embedding"),
           _one("text_projection.weight", "txt/proj", _t), _one("logit_scale", "logit_scale")]
  maps += _ln("text_model.final_layer_norm", "txt/ln_final")
  for tower, depth, dst in (("vision_model", vision_depth, "img"), ("text_model", text_depth, "txt")):
    for i in range(depth):
      src, d = f"{tower}.encoder.layers.{i}", f"{dst}/transformer/block_{i}"
      maps += (_ln(f"{src}.layer_norm1", f"{d}/ln_1") + _ln(f"{src}.layer_norm2", f"{d}/ln_2")
               + _fused_qkv(f"{src}.self_attn", f"{d}/attn/qkv") + _linear(f"{src}.self_attn.out_proj", f"{d}/attn/out")
               + _linear(f"{src}.mlp.fc1", f"{d}/mlp/fc") + _linear(f"{src}.mlp.fc2", f"{d}/mlp/proj"))
  return maps


def meru_keys(vision_depth: int, text_depth: int, hyperbolic: bool) -> list[KeyMap]:
  maps = [_one("visual.patch_embed.proj.weight", "img/patch_embed/kernel", _conv_in),
          _one("visual.patch_embed.proj.bias", "img/patch_embed/bias"),
          KeyMap(("visual.cls_token",), "img/cls_token", lambda x: x.reshape(-1), lambda x: (x.reshape(1, 1, -1),)),
          KeyMap(("visual.pos_embed",), "img/pos_embedding", lambda x: x.reshape(x.shape[-2:]),
                 lambda x: (x[None],)),
          _one("visual_proj.weight", "img/proj", _t), _one("textual_proj.weight", "txt/proj", _t),
          _one("textual.token_embed.weight", "txt/token_embedding/embedding"),
          _one("textual.posit_embed", "txt/pos_embedding"), _one("logit_scale", "logit_scale")]
  maps += _ln("visual.norm", "img/ln_post") + _ln("textual.ln_final", "txt/ln_final")
  for i in range(vision_depth):
    src, d = f"visual.blocks.{i}", f"img/transformer/block_{i}"
    maps += (_ln(f"{src}.norm1", f"{d}/ln_1") + _ln(f"{src}.norm2", f"{d}/ln_2")
             + _linear(f"{src}.attn.qkv", f"{d}/attn/qkv") + _linear(f"{src}.attn.proj", f"{d}/attn/out")
             + _linear(f"{src}.mlp.fc1", f"{d}/mlp/fc") + _linear(f"{src}.mlp.fc2", f"{d}/mlp/proj"))
  for i in range(text_depth):
    maps += _clip_block(f"textual.resblocks.{i}", f"txt/transformer/block_{i}")
  if hyperbolic:
    maps += [_one("curv", "geometry/curv"), _one("visual_alpha", "geometry/visual_alpha"),
             _one("textual_alpha", "geometry/textual_alpha")]
  return maps


# Source keys that carry no parameters (buffers, metadata).
IGNORED = re.compile(r"(input_resolution|context_length|vocab_size|.*attn_mask|.*position_ids|pixel_mean|pixel_std)$")


def _count(sd, pattern: str) -> int:
  rx = re.compile(pattern)
  return len({m.group(1) for k in sd for m in [rx.match(k)] if m})


# ---------------------------------------------------------------------------------------------------------------
# Architecture inference
# ---------------------------------------------------------------------------------------------------------------
def _model_fields(**kw) -> dict:
  base = dict(size="custom", image_type="vit", text_type="transformer", channels=3, pool="tok", ln_pre=True,
              patch_bias=False, ln_eps=1e-5, text_pool="eot", tokenizer="clip_bpe", geometry="sphere", curv_init=1.0)
  base.update(kw)
  return base


def _normalization_name(mean, std) -> str:
  mean, std = tuple(round(float(x), 6) for x in mean), tuple(round(float(x), 6) for x in std)
  for name, (m, s) in (("openai", OPENAI_NORMALIZATION), ("imagenet", IMAGENET_NORMALIZATION),
                       ("siglip", ((0.5,) * 3, (0.5,) * 3))):
    if np.allclose(mean, m, atol=1e-6) and np.allclose(std, s, atol=1e-6):
      return name
  return "custom:" + ",".join(map(str, mean)) + "/" + ",".join(map(str, std))


def _preprocess(image_size: int, normalization: str, resize: str = "shortest") -> dict:
  return dict(image_size=image_size, normalization=normalization, resize=resize, interpolation="bicubic")


def _openai_layout_config(sd, *, act: str, vision_head_width: int = 64, text_heads: int | None = None,
                          text_prefix: str = "") -> dict:
  if "visual.layer1.0.conv1.weight" in sd or "visual.attnpool.c_proj.weight" in sd:
    raise UnsupportedArchitecture("this is a ResNet (ModifiedResNet) CLIP; ncjax's image tower is a ViT")
  if any(k.startswith("visual.trunk.") for k in sd):
    raise UnsupportedArchitecture("this open_clip model has a timm image tower (visual.trunk.*); ncjax imports "
                                  "CLIP-style ViTs")
  if any(k.startswith("text.transformer.") and "resblocks" not in k for k in sd) or "text.proj.0.weight" in sd:
    raise UnsupportedArchitecture("this open_clip model has a Hugging Face text tower (text.transformer.*)")
  t = text_prefix
  conv = sd["visual.conv1.weight"]
  width, channels, patch = conv.shape[0], conv.shape[1], conv.shape[2]
  grid = int(round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5))
  tw = sd[f"{t}token_embedding.weight"].shape[1]
  return _model_fields(
      embed_dim=int(sd["visual.proj"].shape[1]), image_size=int(patch * grid), patch_size=int(patch),
      channels=int(channels), image_width=int(width),
      image_depth=_count(sd, r"visual\.transformer\.resblocks\.(\d+)\."),
      image_heads=int(width // vision_head_width), image_mlp_dim=int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
      text_width=int(tw), text_depth=_count(sd, re.escape(t) + r"transformer\.resblocks\.(\d+)\."),
      text_heads=int(text_heads or tw // 64),
      text_mlp_dim=int(sd[f"{t}transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
      context_length=int(sd[f"{t}positional_embedding"].shape[0]),
      vocab_size=int(sd[f"{t}token_embedding.weight"].shape[0]), act=act,
      ln_pre="visual.ln_pre.weight" in sd)


def _find_weights(directory: str, names) -> str | None:
  for name in names:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  return None


def _read_open_clip(spec: PretrainedSpec):
  path, cfg_json = spec.path, None
  if os.path.isdir(path):
    cfg_path = os.path.join(path, "open_clip_config.json")
    if os.path.isfile(cfg_path):
      with open(cfg_path, encoding="utf-8") as f:
        cfg_json = json.load(f)
    weights = _find_weights(path, ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                                   "open_clip_pytorch_model.bin", "model.safetensors", "pytorch_model.bin"))
    if weights is None:
      raise FileNotFoundError(f"{path}: no open_clip weights (expected open_clip_model.safetensors or "
                              f"open_clip_pytorch_model.bin); found {sorted(os.listdir(path))}")
    path = weights
  elif os.path.isfile(os.path.join(os.path.dirname(path), "open_clip_config.json")):
    with open(os.path.join(os.path.dirname(path), "open_clip_config.json"), encoding="utf-8") as f:
      cfg_json = json.load(f)
  return read_tensors(path), cfg_json


def _open_clip_config(sd, spec: PretrainedSpec, cfg_json) -> tuple[dict, dict]:
  text_prefix = "text." if "text.token_embedding.weight" in sd else ""
  name = spec.arch or ""
  if "CLIPA" in name or name.startswith(("coca", "RN", "EVA", "convnext", "ViT-SO", "nllb", "xlm", "roberta", "mt5")):
    raise UnsupportedArchitecture(f"open_clip architecture {name!r} is not a CLIP-style ViT + text transformer")
  model_cfg = (cfg_json or {}).get("model_cfg", cfg_json or {})
  quick = bool(model_cfg.get("quick_gelu", False)) or "quickgelu" in name
  vcfg, tcfg = model_cfg.get("vision_cfg", {}), model_cfg.get("text_cfg", {})
  head_width = vcfg.get("head_width") or next((w for k, w in OPEN_CLIP_HEAD_WIDTHS.items() if name.startswith(k)), 64)
  fields = _openai_layout_config(sd, act="quick_gelu" if quick else "gelu", vision_head_width=head_width,
                                 text_heads=tcfg.get("heads"), text_prefix=text_prefix)
  pre = (cfg_json or {}).get("preprocess_cfg", {})
  mean, std = pre.get("mean", OPENAI_NORMALIZATION[0]), pre.get("std", OPENAI_NORMALIZATION[1])
  resize = "squash" if pre.get("resize_mode") == "squash" else "shortest"
  return fields, _preprocess(fields["image_size"], _normalization_name(mean, std), resize)


def _read_hf(spec: PretrainedSpec):
  d = spec.path
  if not os.path.isdir(d) or not os.path.isfile(os.path.join(d, "config.json")):
    raise FileNotFoundError(f"hf:{d} must be a transformers CLIPModel directory with config.json and weights "
                            f"(model.safetensors, model.safetensors.index.json shards or pytorch_model.bin); "
                            f"found {sorted(os.listdir(d)) if os.path.isdir(d) else 'no such directory'}")
  with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
    cfg = json.load(f)
  index = os.path.join(d, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    sd = {}
    for name in files:
      sd.update(read_tensors(os.path.join(d, name)))
  else:
    weights = _find_weights(d, ("model.safetensors", "pytorch_model.bin"))
    if weights is None:
      raise FileNotFoundError(f"{d}: no weights (model.safetensors, model.safetensors.index.json or "
                              f"pytorch_model.bin); found {sorted(os.listdir(d))}")
    sd = read_tensors(weights)
  pre = {}
  pre_path = os.path.join(d, "preprocessor_config.json")
  if os.path.isfile(pre_path):
    with open(pre_path, encoding="utf-8") as f:
      pre = json.load(f)
  return sd, cfg, pre


def _hf_config(cfg: dict, pre: dict) -> tuple[dict, dict]:
  if cfg.get("model_type") not in (None, "clip"):
    raise UnsupportedArchitecture(f"hf model_type {cfg.get('model_type')!r}: ncjax imports transformers CLIPModel")
  v, t = cfg["vision_config"], cfg["text_config"]
  acts = {v.get("hidden_act", "quick_gelu"), t.get("hidden_act", "quick_gelu")}
  if len(acts) != 1 or not acts <= {"quick_gelu", "gelu"}:
    raise UnsupportedArchitecture(f"hidden_act {sorted(acts)}: ncjax supports one of quick_gelu / gelu for both towers")
  eps = {v.get("layer_norm_eps", 1e-5), t.get("layer_norm_eps", 1e-5)}
  if len(eps) != 1:
    raise UnsupportedArchitecture(f"different layer_norm_eps per tower: {sorted(eps)}")
  fields = _model_fields(
      embed_dim=int(cfg.get("projection_dim", 512)), image_size=int(v["image_size"]), patch_size=int(v["patch_size"]),
      channels=int(v.get("num_channels", 3)), image_width=int(v["hidden_size"]),
      image_depth=int(v["num_hidden_layers"]), image_heads=int(v["num_attention_heads"]),
      image_mlp_dim=int(v["intermediate_size"]), text_width=int(t["hidden_size"]),
      text_depth=int(t["num_hidden_layers"]), text_heads=int(t["num_attention_heads"]),
      text_mlp_dim=int(t["intermediate_size"]), context_length=int(t.get("max_position_embeddings", 77)),
      vocab_size=int(t.get("vocab_size", 49408)), act=acts.pop(), ln_eps=float(eps.pop()))
  mean, std = pre.get("image_mean", OPENAI_NORMALIZATION[0]), pre.get("image_std", OPENAI_NORMALIZATION[1])
  return fields, _preprocess(fields["image_size"], _normalization_name(mean, std))


def _meru_posemb(pos_embed, grid: int, width: int) -> str:
  """'sincos2d_moco' when a MERU checkpoint's position table is MoCo v3's fixed one (MERU's default,
  use_sincos2d_pos=True: a zero row for the class token, then the sin-cos rows), else 'learn' (a MERU trained with
  learned positions)."""
  from ncjax.models.vit import posemb_sincos_2d_moco
  table = np.asarray(pos_embed, np.float32).reshape(-1, width)
  fixed = np.concatenate([np.zeros((1, width), np.float32), posemb_sincos_2d_moco(grid, grid, width)])
  return "sincos2d_moco" if table.shape == fixed.shape and np.allclose(table, fixed, atol=1e-5) else "learn"


def _meru_config(sd) -> tuple[dict, dict]:
  if "visual.patch_embed.proj.weight" not in sd or "textual.token_embed.weight" not in sd:
    raise UnsupportedArchitecture("not a MERU checkpoint: expected visual.patch_embed.* (timm ViT) and "
                                  "textual.token_embed.*")
  conv = sd["visual.patch_embed.proj.weight"]
  width, patch = conv.shape[0], conv.shape[2]
  n_pos = sd["visual.pos_embed"].shape[-2]
  grid = int(round((n_pos - 1) ** 0.5))
  # MERU's ViT-S is MoCo-v3's small ViT: 384 wide with 12 heads (32 per head); B and L use 64-wide heads.
  heads = 12 if width == 384 else width // 64
  tw = sd["textual.token_embed.weight"].shape[1]
  hyperbolic = "curv" in sd
  fields = _model_fields(
      embed_dim=int(sd["visual_proj.weight"].shape[0]), image_size=int(patch * grid), patch_size=int(patch),
      channels=int(conv.shape[1]), image_width=int(width), image_depth=_count(sd, r"visual\.blocks\.(\d+)\."),
      image_heads=int(heads), image_mlp_dim=int(sd["visual.blocks.0.mlp.fc1.weight"].shape[0]),
      text_width=int(tw), text_depth=_count(sd, r"textual\.resblocks\.(\d+)\."), text_heads=int(tw // 64),
      text_mlp_dim=int(sd["textual.resblocks.0.mlp.c_fc.weight"].shape[0]),
      context_length=int(sd["textual.posit_embed"].shape[0]), vocab_size=int(sd["textual.token_embed.weight"].shape[0]),
      act="gelu", ln_pre=False, patch_bias=True, geometry="lorentz" if hyperbolic else "sphere",
      posemb=_meru_posemb(sd["visual.pos_embed"], grid, int(width)))
  mean = np.asarray(sd.get("pixel_mean", np.asarray(IMAGENET_NORMALIZATION[0]))).reshape(-1)
  std = np.asarray(sd.get("pixel_std", np.asarray(IMAGENET_NORMALIZATION[1]))).reshape(-1)
  return fields, _preprocess(fields["image_size"], _normalization_name(mean, std))


# ---------------------------------------------------------------------------------------------------------------
# big_vision (SigLIP) two-tower .npz
# ---------------------------------------------------------------------------------------------------------------
def _bv_dense(src: str, dst: str) -> list[KeyMap]:
  """A flax Dense (kernel (in, out) as ncjax's, bias)."""
  return [_one(f"{src}/kernel", f"{dst}/kernel"), _one(f"{src}/bias", f"{dst}/bias")]


def _bv_ln(src: str, dst: str) -> list[KeyMap]:
  return [_one(f"{src}/scale", f"{dst}/scale"), _one(f"{src}/bias", f"{dst}/bias")]


def _heads_flat(*parts):   # flax MultiHeadDotProductAttention's (in, heads, head_dim) kernels / (heads, head_dim) biases
  return np.concatenate([p.reshape(p.shape[0], -1) if p.ndim == 3 else p.reshape(-1) for p in parts], axis=-1)


def _heads_split(value, n: int, heads: int):
  parts = np.split(value, n, axis=-1)
  return tuple(p.reshape(p.shape[0], heads, -1) if p.ndim == 2 else p.reshape(heads, -1) for p in parts)


def _bv_attention(src: str, dst: str, heads: int) -> list[KeyMap]:
  """flax's separate query/key/value (in, heads, head_dim) <-> the fused qkv kernel (columns [q; k; v])."""
  out = []
  for leaf in ("kernel", "bias"):
    out.append(KeyMap(tuple(f"{src}/{p}/{leaf}" for p in ("query", "key", "value")), f"{dst}/qkv/{leaf}",
                      _heads_flat, functools.partial(_heads_split, n=3, heads=heads)))
  return out + _bv_attention_out(f"{src}/out", f"{dst}/out", heads)


def _bv_attention_out(src: str, dst: str, heads: int) -> list[KeyMap]:
  """flax's attention output projection, kernel (heads, head_dim, out) <-> (width, out)."""
  return [KeyMap((f"{src}/kernel",), f"{dst}/kernel", lambda x: x.reshape(-1, x.shape[-1]),
                 lambda x, h=heads: (x.reshape(h, -1, x.shape[-1]),)),
          _one(f"{src}/bias", f"{dst}/bias")]


def _bv_block(src: str, dst: str, heads: int) -> list[KeyMap]:
  return (_bv_ln(f"{src}/LayerNorm_0", f"{dst}/ln_1") + _bv_ln(f"{src}/LayerNorm_1", f"{dst}/ln_2")
          + _bv_attention(f"{src}/MultiHeadDotProductAttention_0", f"{dst}/attn", heads)
          + _bv_dense(f"{src}/MlpBlock_0/Dense_0", f"{dst}/mlp/fc") + _bv_dense(f"{src}/MlpBlock_0/Dense_1", f"{dst}/mlp/proj"))


def _bv_map_head(src: str, dst: str, heads: int) -> list[KeyMap]:
  att = f"{src}/MultiHeadDotProductAttention_0"
  out = [_one(f"{src}/probe", f"{dst}/probe")]
  out += [KeyMap((f"{att}/query/{leaf}",), f"{dst}/q/{leaf}", _heads_flat,
                 functools.partial(_heads_split, n=1, heads=heads)) for leaf in ("kernel", "bias")]
  out += [KeyMap((f"{att}/key/{leaf}", f"{att}/value/{leaf}"), f"{dst}/kv/{leaf}", _heads_flat,
                 functools.partial(_heads_split, n=2, heads=heads)) for leaf in ("kernel", "bias")]
  out += _bv_attention_out(f"{att}/out", f"{dst}/out", heads)
  out += _bv_ln(f"{src}/LayerNorm_0", f"{dst}/ln")
  out += _bv_dense(f"{src}/MlpBlock_0/Dense_0", f"{dst}/mlp/fc") + _bv_dense(f"{src}/MlpBlock_0/Dense_1", f"{dst}/mlp/proj")
  return out


def _squeeze_lead(x):
  return x.reshape(x.shape[1:])


def _add_lead(x):
  return (x[None],)


def _scalar(x):
  return np.asarray(x, np.float32).reshape(())


def _bv_tok_posemb(x):   # big_vision adds its posemb before the class token: the token's row is zero here
  x = x.reshape(x.shape[-2:])
  return np.concatenate([np.zeros((1, x.shape[-1]), x.dtype), x], axis=0)


def big_vision_keys(fields: dict) -> list[KeyMap]:
  """big_vision's two-tower layout (without the `params/` prefix) for the architecture `fields` describe."""
  ih, th = fields["image_heads"], fields["text_heads"]
  maps = [_one("img/embedding/kernel", "img/patch_embed/kernel"), _one("img/embedding/bias", "img/patch_embed/bias"),
          _one("img/head/kernel", "img/proj"), _one("img/head/bias", "img/proj_bias"),
          _one("txt/Embed_0/embedding", "txt/token_embedding/embedding"),
          KeyMap(("txt/pos_embedding",), "txt/pos_embedding", _squeeze_lead, _add_lead),
          _one("txt/head/kernel", "txt/proj"), _one("txt/head/bias", "txt/proj_bias"),
          KeyMap(("t",), "logit_scale", _scalar, lambda x: (np.reshape(x, (1,)),))]
  if fields["posemb"] == "learn":
    if fields["pool"] == "tok":
      maps.append(KeyMap(("img/pos_embedding",), "img/pos_embedding", _bv_tok_posemb, lambda x: (x[None, 1:],)))
    else:
      maps.append(KeyMap(("img/pos_embedding",), "img/pos_embedding", _squeeze_lead, _add_lead))
  if fields["pool"] == "tok":
    maps.append(KeyMap(("img/cls",), "img/cls_token", lambda x: x.reshape(-1), lambda x: (x.reshape(1, 1, -1),)))
  if fields["pool"] == "map":
    maps += _bv_map_head("img/MAPHead_0", "img/map_head", ih)
  if fields["text_pool"] == "map":
    maps += _bv_map_head("txt/MAPHead_0", "txt/map_head", th)
  maps += _bv_ln("img/Transformer/encoder_norm", "img/ln_post") + _bv_ln("txt/Encoder_0/encoder_norm", "txt/ln_final")
  for i in range(fields["image_depth"]):
    maps += _bv_block(f"img/Transformer/encoderblock_{i}", f"img/transformer/block_{i}", ih)
  for i in range(fields["text_depth"]):
    maps += _bv_block(f"txt/Encoder_0/encoderblock_{i}", f"txt/transformer/block_{i}", th)
  if "logit_bias_init" in fields:
    maps.append(KeyMap(("b",), "logit_bias", _scalar, lambda x: (np.reshape(x, (1,)),)))
  return maps


def _npz_array(value: np.ndarray) -> np.ndarray:
  if value.dtype.kind == "V" and value.dtype.itemsize == 2:   # bfloat16 saved as raw 2-byte records
    import ml_dtypes
    value = value.view(ml_dtypes.bfloat16)
  return np.asarray(value, np.float32) if value.dtype.kind in "fV" or value.dtype.name == "bfloat16" else value


def read_big_vision(path: str) -> dict[str, np.ndarray]:
  """The flat {name: array} of a big_vision .npz, names as its two-tower model's params (`img/...`, `txt/...`,
  `t`, `b`): the `params/` prefix (or a whole training checkpoint's `opt/target/`) dropped, scanned blocks
  (`encoderblock` with a leading depth axis) unrolled into `encoderblock_N`, and an old checkpoint's duplicated
  text posemb (`txt/Encoder_0/pos_embedding`) added into `txt/pos_embedding`, as big_vision's loader does."""
  if os.path.isdir(path) or not zipfile.is_zipfile(path):
    raise CheckpointFormatError(f"{path}: not a big_vision .npz (a zip of arrays named like "
                                f"'params/img/embedding/kernel')")
  with np.load(path, allow_pickle=False) as z:
    raw = {k: _npz_array(z[k]) for k in z.files}
  for prefix in ("params/", "opt/target/"):
    if any(k.startswith(prefix) for k in raw):
      raw = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
      break
  sd = {}
  for k, v in raw.items():
    m = re.match(r"^(img/Transformer|txt/Encoder_0)/encoderblock/(.*)$", k)
    if m:
      for i in range(v.shape[0]):
        sd[f"{m.group(1)}/encoderblock_{i}/{m.group(2)}"] = v[i]
    else:
      sd[k] = v
  extra = sd.pop("txt/Encoder_0/pos_embedding", None)
  if extra is not None and "txt/pos_embedding" in sd:
    sd["txt/pos_embedding"] = sd["txt/pos_embedding"] + extra
  return sd


def _big_vision_tokenizer(path: str) -> str:
  """The SentencePiece model beside a big_vision checkpoint: PATH with .model for .npz, else the one *.model in
  its directory."""
  directory = os.path.dirname(os.path.abspath(path))
  same = os.path.splitext(os.path.abspath(path))[0] + ".model"
  if os.path.isfile(same):
    return same
  found = sorted(f for f in os.listdir(directory) if f.endswith(".model"))
  if len(found) == 1:
    return os.path.join(directory, found[0])
  raise FileNotFoundError(
      f"big_vision:{path}: {'no' if not found else 'more than one'} SentencePiece tokenizer (*.model) beside the "
      f"checkpoint in {directory}{' ' + str(found) if found else ''}; put the model the checkpoint was trained with "
      f"there (SigLIP English: big_vision's c4_en, gs://t5-data/vocabs/cc_en.32000/sentencepiece.model), named "
      f"{os.path.basename(same)!r} when several are present")


def _big_vision_config(sd, spec: PretrainedSpec) -> tuple[dict, dict]:
  if not any(k.startswith("img/") for k in sd) or not any(k.startswith("txt/") for k in sd):
    raise UnsupportedArchitecture(f"big_vision:{spec.path} is not a two-tower checkpoint: expected params under "
                                  f"img/ and txt/, found top-level {sorted({k.split('/')[0] for k in sd})}")
  for key, why in (("img/pre_logits/kernel", "a ViT representation layer ('pre_logits', rep_size)"),
                   ("img/head/kernel", None), ("txt/head/kernel", None)):
    if why and key in sd:
      raise UnsupportedArchitecture(f"big_vision:{spec.path}: {why} has no place in ncjax's image tower")
    if not why and key not in sd:
      raise UnsupportedArchitecture(f"big_vision:{spec.path}: no {key!r}; ncjax's towers end in a projection "
                                    f"(big_vision's head, out_dim)")
  if "img/embedding/kernel" not in sd or "txt/Embed_0/embedding" not in sd:
    raise UnsupportedArchitecture(f"big_vision:{spec.path}: expected a ViT image tower (img/embedding/kernel) and "
                                  f"big_vision's text transformer (txt/Embed_0/embedding)")
  conv = sd["img/embedding/kernel"]
  patch, channels, width = int(conv.shape[0]), int(conv.shape[2]), int(conv.shape[3])
  pool = "map" if "img/MAPHead_0/probe" in sd else "tok" if "img/cls" in sd else "gap"
  if "img/pos_embedding" in sd:
    posemb, n = "learn", int(sd["img/pos_embedding"].shape[-2])
    grid = int(round(n ** 0.5))
    if grid * grid != n:
      raise UnsupportedArchitecture(f"big_vision:{spec.path}: {n} position embeddings are not a square grid")
    image_size = patch * grid
    if spec.arch and int(spec.arch) != image_size:
      raise ValueError(f"{spec}: the checkpoint's learned position embedding is for {image_size} px images, not "
                       f"{spec.arch} (resampling it is not supported)")
  else:
    posemb = "sincos2d"
    if not spec.arch:
      raise ValueError(f"big_vision:{spec.path} has a fixed 'sincos2d' position embedding, so its image resolution "
                       f"is not in the file: give it as big_vision:SIZE:PATH (e.g. big_vision:224:{spec.path})")
    image_size = int(spec.arch)
  text_pool = "map" if "txt/MAPHead_0/probe" in sd else "final"
  emb = sd["txt/Embed_0/embedding"]
  fields = _model_fields(
      embed_dim=int(sd["img/head/kernel"].shape[1]), image_size=image_size, patch_size=patch, channels=channels,
      image_width=width, image_depth=_count(sd, r"img/Transformer/encoderblock_(\d+)/"),
      image_heads=int(sd["img/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"].shape[1]),
      image_mlp_dim=int(sd["img/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape[1]),
      text_width=int(emb.shape[1]), text_depth=_count(sd, r"txt/Encoder_0/encoderblock_(\d+)/"),
      text_heads=int(sd["txt/Encoder_0/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"].shape[1]),
      text_mlp_dim=int(sd["txt/Encoder_0/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape[1]),
      context_length=int(sd["txt/pos_embedding"].shape[-2]), vocab_size=int(emb.shape[0]),
      # flax's nn.gelu is the tanh approximation; nn.LayerNorm's epsilon 1e-6
      act="gelu_tanh", ln_eps=1e-6, ln_pre=False, patch_bias=True, pool=pool, posemb=posemb, proj_bias=True,
      text_pool=text_pool, text_causal=False, tokenizer="sentencepiece:" + _big_vision_tokenizer(spec.path))
  if int(sd["img/head/kernel"].shape[1]) != int(sd["txt/head/kernel"].shape[1]):
    raise UnsupportedArchitecture(f"big_vision:{spec.path}: image and text heads differ in width "
                                  f"({sd['img/head/kernel'].shape[1]} vs {sd['txt/head/kernel'].shape[1]})")
  if "b" in sd:
    fields["logit_bias_init"] = float(np.asarray(sd["b"]).reshape(()))
  if "t" in sd:
    fields["logit_scale_init"] = float(np.asarray(sd["t"]).reshape(()))
  # big_vision's SigLIP input: resized to size x size (no crop), values scaled to [-1, 1] (mean = std = 0.5)
  return fields, _preprocess(image_size, "siglip", "squash")


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------
def _read(spec: PretrainedSpec):
  """(state dict, model fields, preprocess, key table) of a spec."""
  if spec.format == "openai":
    sd = read_tensors(spec.path)
    fields = _openai_layout_config(sd, act="quick_gelu")
    pre = _preprocess(fields["image_size"], "openai")
    keys = openai_keys(fields["image_depth"], fields["text_depth"])
  elif spec.format == "open_clip":
    sd, cfg_json = _read_open_clip(spec)
    fields, pre = _open_clip_config(sd, spec, cfg_json)
    keys = openai_keys(fields["image_depth"], fields["text_depth"],
                       "text." if "text.token_embedding.weight" in sd else "")
    if "logit_bias" in sd:
      keys.append(_one("logit_bias", "logit_bias"))
      fields["logit_bias_init"] = float(np.asarray(sd["logit_bias"]).reshape(()))
  elif spec.format == "hf":
    sd, cfg, pre_json = _read_hf(spec)
    fields, pre = _hf_config(cfg, pre_json)
    keys = hf_keys(fields["image_depth"], fields["text_depth"])
  elif spec.format == "big_vision":
    sd = read_big_vision(spec.path)
    fields, pre = _big_vision_config(sd, spec)
    keys = big_vision_keys(fields)
  else:
    sd = read_tensors(spec.path)
    fields, pre = _meru_config(sd)
    keys = meru_keys(fields["image_depth"], fields["text_depth"], fields["geometry"] == "lorentz")
  if not fields.get("ln_pre", True):
    keys = [k for k in keys if not k.target.startswith("img/ln_pre/")]
  if fields.get("posemb", "learn") != "learn":   # a fixed table: nothing to load (the tower computes it)
    keys = [k for k in keys if k.target != "img/pos_embedding"]
    if spec.format == "meru":
      sd = {k: v for k, v in sd.items() if k != "visual.pos_embed"}   # checked equal to the table (_meru_posemb)
  fields["pretrained"] = str(spec)
  return sd, fields, pre, keys


def _set(tree: dict, path: str, value):
  node = tree
  *parents, leaf = path.split("/")
  for p in parents:
    node = node.setdefault(p, {})
  node[leaf] = value


def _get(tree: dict, path: str):
  node = tree
  for p in path.split("/"):
    node = node[p]
  return node


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
    _set(params, km.target, value)
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


def overlay(params: dict, spec: str, shardings: dict) -> dict:
  """Initialise every two-tower module of a method's parameters ('model', or 'net_a' / 'net_b' under
  co-teaching) from a pretrained checkpoint, placed with `shardings`. Parameters the checkpoint lacks (a SigLIP
  bias, NCU's prompt, a discriminator) keep their fresh initialisation."""
  import jax
  _, loaded = load(spec)
  out = dict(params)
  towers = [name for name, sub in params.items() if isinstance(sub, dict) and "img" in sub and "txt" in sub]
  if not towers:
    raise ValueError(f"{spec}: this method has no two-tower module to initialise (modules: {sorted(params)})")

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


def load_model(spec: str):
  """(model, preprocess, tokenizer), like open_clip's create_model_and_transforms.

  model.encode_image takes preprocessed NHWC float32 images, model.encode_text the tokenizer's ids; both return
  embeddings in the model's geometry. preprocess(PIL image or uint8 array) -> (H, W, 3) float32 with the model's
  resolution, resize and normalisation. tokenizer(texts) -> int32 (n, context_length)."""
  import jax
  from flax import nnx
  from ncjax import models
  from ncjax.data import preprocess as pp
  from ncjax import tokenizers
  model_config, params = load(spec)
  cfg = ml_collections.ConfigDict(dict(_config_defaults(), **{k: v for k, v in model_config.items()
                                                             if k != "preprocess"}))
  if cfg.tokenizer == "clip_bpe":
    tokenizer = tokenizers.ClipBpeTokenizer(context_length=cfg.context_length)
  else:   # big_vision: the SentencePiece model beside the checkpoint
    tokenizer = tokenizers.build_tokenizer([], context_length=cfg.context_length, kind=cfg.tokenizer)
  module = models.build_two_tower(models.ModelSpec.from_config(cfg), vocab_size=cfg.vocab_size,
                                  eot_id=tokenizer.eot_id)
  bound = PretrainedModel(module, jax.tree.map(np.asarray, params), cfg)
  pre = model_config.preprocess

  def preprocess(image):
    return pp.eval_transform(image, pre.image_size, pre.normalization, resize=pre.resize)

  return bound, preprocess, tokenizer


# ---------------------------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------------------------
EXPORT_FORMATS = ("open_clip", "hf")


def _flat(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for k, v in params.items():
    path = f"{prefix}/{k}" if prefix else k
    if isinstance(v, dict):
      out.update(_flat(v, path))
    else:
      out[path] = np.asarray(v, np.float32)
  return out


def _check_exportable(model_cfg, fmt: str, tokenizer_kind: str):
  problems = []
  if model_cfg.get("geometry", "sphere") != "sphere":
    problems.append("a Lorentz (MERU) model has no open_clip / transformers counterpart")
  if model_cfg.get("patch_bias", False) or not model_cfg.get("ln_pre", True):
    problems.append("patch bias / no ln_pre (a timm-style ViT) is not CLIP's layout")
  if model_cfg.get("act") not in ("quick_gelu", "gelu"):
    problems.append(f"activation {model_cfg.get('act')!r}")
  if model_cfg.get("pool", "tok") == "map":
    problems.append("the image tower's 'map' attention-pool head (SigLIP's MAPHead) has no counterpart in "
                    "open_clip's CLIP / transformers' CLIPModel, which pool the class token")
  elif model_cfg.get("pool", "tok") != "tok" or model_cfg.get("image_type", "vit") != "vit":
    problems.append("only class-token ViTs export")
  if model_cfg.get("posemb", "learn") != "learn":
    problems.append(f"a fixed {model_cfg.get('posemb')!r} position embedding is not CLIP's learned one")
  if model_cfg.get("proj_bias", False):
    problems.append("projection biases (big_vision's heads) are not in CLIP's layout")
  if not model_cfg.get("text_causal", True) or model_cfg.get("text_pool", "eot") not in ("eot", "argmax"):
    problems.append(f"a bidirectional text tower pooled at {model_cfg.get('text_pool')!r} (big_vision's) is not "
                    f"CLIP's causal one pooled at the end-of-text token")
  if tokenizer_kind != "clip_bpe":
    problems.append(f"the model was trained with a {tokenizer_kind!r} tokenizer, which open_clip / transformers "
                    f"would not reproduce (train with model.tokenizer=clip_bpe)")
  if problems:
    raise UnsupportedArchitecture(f"cannot export to {fmt}: " + "; ".join(problems))


def export(model_params: dict, model_cfg, output: str, fmt: str, *, tokenizer_kind: str = "clip_bpe",
           normalization: str = "openai") -> list[str]:
  """Write a TwoTower's parameters (`params['model']`) as an open_clip folder (open_clip_config.json +
  open_clip_model.safetensors, loadable with `open_clip.create_model('local-dir:OUTPUT')`) or a transformers
  directory (config.json + model.safetensors, `CLIPModel.from_pretrained(OUTPUT)`). Returns the written files."""
  from ncjax import models
  if fmt not in EXPORT_FORMATS:
    raise ValueError(f"unknown export format {fmt!r}; expected one of {EXPORT_FORMATS}")
  _check_exportable(model_cfg, fmt, tokenizer_kind)
  spec = models.resolve_model_spec(model_cfg, vocab_size=int(_get(model_params, "txt/token_embedding/embedding").shape[0]))
  img, txt = spec["image"], spec["text"]
  flat = _flat(model_params)
  keys = openai_keys(img["depth"], txt["depth"]) if fmt == "open_clip" else hf_keys(img["depth"], txt["depth"])
  tensors = {}
  for km in keys:
    for name, value in zip(km.sources, km.inverse(flat[km.target])):
      tensors[name] = np.asarray(value, np.float32)
  mean, std = _normalization_values(normalization)
  os.makedirs(output, exist_ok=True)
  quick = model_cfg.get("act") == "quick_gelu"
  mlp_v = (img.get("mlp_dim") or 4 * img["width"]) / img["width"]
  mlp_t = (txt.get("mlp_dim") or 4 * txt["width"]) / txt["width"]
  if fmt == "open_clip":
    cfg = dict(model_cfg=dict(
        embed_dim=spec["embed_dim"], quick_gelu=quick,
        vision_cfg=dict(image_size=img["image_size"], layers=img["depth"], width=img["width"],
                        patch_size=img["patch_size"], head_width=img["width"] // img["heads"], mlp_ratio=mlp_v),
        text_cfg=dict(context_length=txt["context_length"], vocab_size=txt["vocab_size"], width=txt["width"],
                      heads=txt["heads"], layers=txt["depth"], mlp_ratio=mlp_t)),
        preprocess_cfg=dict(size=img["image_size"], mean=list(mean), std=list(std), interpolation="bicubic",
                            resize_mode="shortest"))
    files = [os.path.join(output, "open_clip_config.json"), os.path.join(output, "open_clip_model.safetensors")]
    with open(files[0], "w", encoding="utf-8") as f:
      json.dump(cfg, f, indent=2)
    write_safetensors(files[1], tensors, metadata=dict(format="pt"))
  else:
    act = "quick_gelu" if quick else "gelu"
    eps = float(model_cfg.get("ln_eps", 1e-5))
    cfg = dict(
        architectures=["CLIPModel"], model_type="clip", projection_dim=spec["embed_dim"],
        logit_scale_init_value=float(np.asarray(flat["logit_scale"])), initializer_factor=1.0,
        text_config=dict(model_type="clip_text_model", hidden_size=txt["width"], intermediate_size=int(mlp_t * txt["width"]),
                         num_hidden_layers=txt["depth"], num_attention_heads=txt["heads"],
                         max_position_embeddings=txt["context_length"], vocab_size=txt["vocab_size"],
                         hidden_act=act, layer_norm_eps=eps, bos_token_id=CLIP_SOT_ID, eos_token_id=CLIP_EOT_ID,
                         pad_token_id=1, projection_dim=spec["embed_dim"]),
        vision_config=dict(model_type="clip_vision_model", hidden_size=img["width"],
                           intermediate_size=int(mlp_v * img["width"]), num_hidden_layers=img["depth"],
                           num_attention_heads=img["heads"], image_size=img["image_size"],
                           patch_size=img["patch_size"], num_channels=img.get("channels", 3), hidden_act=act,
                           layer_norm_eps=eps, projection_dim=spec["embed_dim"]))
    pre = dict(crop_size=dict(height=img["image_size"], width=img["image_size"]), do_center_crop=True,
               do_normalize=True, do_resize=True, image_mean=list(mean), image_std=list(std), resample=3,
               size=dict(shortest_edge=img["image_size"]), image_processor_type="CLIPImageProcessor")
    files = [os.path.join(output, "config.json"), os.path.join(output, "model.safetensors"),
             os.path.join(output, "preprocessor_config.json")]
    with open(files[0], "w", encoding="utf-8") as f:
      json.dump(cfg, f, indent=2)
    write_safetensors(files[1], tensors, metadata=dict(format="pt"))
    with open(files[2], "w", encoding="utf-8") as f:
      json.dump(pre, f, indent=2)
  return files


def _normalization_values(name: str):
  from ncjax.data.preprocess import normalization_constants
  return normalization_constants(name)


__all__ = ["load", "load_model", "export", "overlay", "parse_spec", "is_pretrained_spec", "apply_to_config", "PretrainedSpec",
           "UnsupportedArchitecture", "CheckpointFormatError", "FORMATS", "EXPORT_FORMATS"]
