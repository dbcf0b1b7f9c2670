"""Hugging Face transformers `CLIPModel` directories (config.json + safetensors / pytorch_model.bin)."""

from __future__ import annotations

import json
import os

import numpy as np

from ncjax.pretrained.core import (OPENAI_NORMALIZATION, KeyMap, PretrainedSpec, UnsupportedArchitecture,
                                    conv_to_flax, find_weights, layer_norm, linear, model_fields, normalization_name,
                                    one, preprocess_fields, transpose)
from ncjax.pretrained.weights_io import read_tensors


def _fused_qkv(prefix: str, dst: str) -> list[KeyMap]:
  """Hugging Face's separate q/k/v projections <-> the fused kernel (rows [q; k; v] as torch's in_proj)."""
  srcs_w = tuple(f"{prefix}.{p}_proj.weight" for p in "qkv")
  srcs_b = tuple(f"{prefix}.{p}_proj.bias" for p in "qkv")
  return [KeyMap(srcs_w, f"{dst}/kernel", lambda q, k, v: transpose(np.concatenate([q, k, v], 0)),
                 lambda w: tuple(np.split(transpose(w), 3, axis=0))),
          KeyMap(srcs_b, f"{dst}/bias", lambda q, k, v: np.concatenate([q, k, v], 0),
                 lambda b: tuple(np.split(b, 3, axis=0)))]


def keys(vision_depth: int, text_depth: int) -> list[KeyMap]:
  maps = [one("vision_model.embeddings.patch_embedding.weight", "img/patch_embed/kernel", conv_to_flax),
          one("vision_model.embeddings.class_embedding", "img/cls_token"),
          one("vision_model.embeddings.position_embedding.weight", "img/pos_embedding"),
          one("visual_projection.weight", "img/proj", transpose)]
  maps += layer_norm("vision_model.pre_layrnorm", "img/ln_pre")
  maps += layer_norm("vision_model.post_layernorm", "img/ln_post")
  maps += [one("text_model.embeddings.token_embedding.weight", "txt/token_embedding/embedding"),
           one("text_model.embeddings.position_embedding.weight", "txt/pos_embedding"),
           one("text_projection.weight", "txt/proj", transpose), one("logit_scale", "logit_scale")]
  maps += layer_norm("text_model.final_layer_norm", "txt/ln_final")
  for tower, depth, dst in (("vision_model", vision_depth, "img"), ("text_model", text_depth, "txt")):
    for i in range(depth):
      src, d = f"{tower}.encoder.layers.{i}", f"{dst}/transformer/block_{i}"
      maps += (layer_norm(f"{src}.layer_norm1", f"{d}/ln_1") + layer_norm(f"{src}.layer_norm2", f"{d}/ln_2")
               + _fused_qkv(f"{src}.self_attn", f"{d}/attn/qkv") + linear(f"{src}.self_attn.out_proj", f"{d}/attn/out")
               + linear(f"{src}.mlp.fc1", f"{d}/mlp/fc") + linear(f"{src}.mlp.fc2", f"{d}/mlp/proj"))
  return maps


def _read_files(spec: PretrainedSpec):
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
    weights = find_weights(d, ("model.safetensors", "pytorch_model.bin"))
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


def _config(cfg: dict, pre: dict) -> tuple[dict, dict]:
  if cfg.get("model_type") not in (None, "clip"):
    raise UnsupportedArchitecture(f"hf model_type {cfg.get('model_type')!r}: ncjax imports transformers CLIPModel")
  v, t = cfg["vision_config"], cfg["text_config"]
  acts = {v.get("hidden_act", "quick_gelu"), t.get("hidden_act", "quick_gelu")}
  if len(acts) != 1 or not acts <= {"quick_gelu", "gelu"}:
    raise UnsupportedArchitecture(f"hidden_act {sorted(acts)}: ncjax supports one of quick_gelu / gelu for both towers")
  eps = {v.get("layer_norm_eps", 1e-5), t.get("layer_norm_eps", 1e-5)}
  if len(eps) != 1:
    raise UnsupportedArchitecture(f"different layer_norm_eps per tower: {sorted(eps)}")
  fields = model_fields(
      embed_dim=int(cfg.get("projection_dim", 512)), image_size=int(v["image_size"]), patch_size=int(v["patch_size"]),
      channels=int(v.get("num_channels", 3)), image_width=int(v["hidden_size"]),
      image_depth=int(v["num_hidden_layers"]), image_heads=int(v["num_attention_heads"]),
      image_mlp_dim=int(v["intermediate_size"]), text_width=int(t["hidden_size"]),
      text_depth=int(t["num_hidden_layers"]), text_heads=int(t["num_attention_heads"]),
      text_mlp_dim=int(t["intermediate_size"]), context_length=int(t.get("max_position_embeddings", 77)),
      vocab_size=int(t.get("vocab_size", 49408)), act=acts.pop(), ln_eps=float(eps.pop()))
  mean, std = pre.get("image_mean", OPENAI_NORMALIZATION[0]), pre.get("image_std", OPENAI_NORMALIZATION[1])
  return fields, preprocess_fields(fields["image_size"], normalization_name(mean, std))


def read(spec: PretrainedSpec):
  sd, cfg, pre_json = _read_files(spec)
  fields, pre = _config(cfg, pre_json)
  return sd, fields, pre, keys(fields["image_depth"], fields["text_depth"])
