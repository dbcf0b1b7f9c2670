"""open_clip state dicts and folders (open_clip_config.json + weights): OpenAI's layout, the architecture from the
folder's config, the shapes or the model name."""

from __future__ import annotations

import json
import os

import numpy as np

from ncjax.pretrained import openai
from ncjax.pretrained.core import (OPENAI_NORMALIZATION, PretrainedSpec, UnsupportedArchitecture, find_weights,
                                    normalization_name, one, preprocess_fields)
from ncjax.pretrained.weights_io import read_tensors

# Vision head widths of open_clip architectures whose heads are not 64 wide (open_clip's model configs).
HEAD_WIDTHS = {"ViT-H-14": 80, "ViT-H-16": 80, "ViT-g-14": 88, "ViT-bigG-14": 104, "ViT-e-14": 112}


def _read_files(spec: PretrainedSpec):
  path, cfg_json = spec.path, None
  if os.path.isdir(path):
    cfg_path = os.path.join(path, "open_clip_config.json")
    if os.path.isfile(cfg_path):
      with open(cfg_path, encoding="utf-8") as f:
        cfg_json = json.load(f)
    weights = find_weights(path, ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                                   "open_clip_pytorch_model.bin", "model.safetensors", "pytorch_model.bin"))
    if weights is None:
      raise FileNotFoundError(f"{path}: no open_clip weights (expected open_clip_model.safetensors or "
                              f"open_clip_pytorch_model.bin); found {sorted(os.listdir(path))}")
    path = weights
  elif os.path.isfile(os.path.join(os.path.dirname(path), "open_clip_config.json")):
    with open(os.path.join(os.path.dirname(path), "open_clip_config.json"), encoding="utf-8") as f:
      cfg_json = json.load(f)
  return read_tensors(path), cfg_json


def _config(sd, spec: PretrainedSpec, cfg_json) -> tuple[dict, dict]:
  text_prefix = "text." if "text.token_embedding.weight" in sd else ""
  name = spec.arch or ""
  if "CLIPA" in name or name.startswith(("coca", "RN", "EVA", "convnext", "ViT-SO", "nllb", "xlm", "roberta", "mt5")):
    raise UnsupportedArchitecture(f"open_clip architecture {name!r} is not a CLIP-style ViT + text transformer")
  model_cfg = (cfg_json or {}).get("model_cfg", cfg_json or {})
  quick = bool(model_cfg.get("quick_gelu", False)) or "quickgelu" in name
  vcfg, tcfg = model_cfg.get("vision_cfg", {}), model_cfg.get("text_cfg", {})
  head_width = vcfg.get("head_width") or next((w for k, w in HEAD_WIDTHS.items() if name.startswith(k)), 64)
  fields = openai.layout_config(sd, act="quick_gelu" if quick else "gelu", vision_head_width=head_width,
                                 text_heads=tcfg.get("heads"), text_prefix=text_prefix)
  pre = (cfg_json or {}).get("preprocess_cfg", {})
  mean, std = pre.get("mean", OPENAI_NORMALIZATION[0]), pre.get("std", OPENAI_NORMALIZATION[1])
  resize = "squash" if pre.get("resize_mode") == "squash" else "shortest"
  return fields, preprocess_fields(fields["image_size"], normalization_name(mean, std), resize)


def read(spec: PretrainedSpec):
  sd, cfg_json = _read_files(spec)
  fields, pre = _config(sd, spec, cfg_json)
  text_prefix = "text." if "text.token_embedding.weight" in sd else ""
  keys = openai.keys(fields["image_depth"], fields["text_depth"], text_prefix)
  if "logit_bias" in sd:   # SigLIP trained with open_clip
    keys.append(one("logit_bias", "logit_bias"))
    fields["logit_bias_init"] = float(np.asarray(sd["logit_bias"]).reshape(()))
  return sd, fields, pre, keys
