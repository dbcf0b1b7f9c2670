"""Writing an ncjax TwoTower back as an open_clip folder or a transformers directory, through the same key
tables the imports use."""

from __future__ import annotations

import json
import os

import numpy as np

from ncjax.pretrained import hf, openai
from ncjax.pretrained.core import CLIP_EOT_ID, CLIP_SOT_ID, UnsupportedArchitecture, get_path
from ncjax.pretrained.weights_io import write_safetensors

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
  vocab_size = int(get_path(model_params, "txt/token_embedding/embedding").shape[0])
  spec = models.resolve_model_spec(model_cfg, vocab_size=vocab_size)
  img, txt = spec["image"], spec["text"]
  flat = _flat(model_params)
  keys = openai.keys(img["depth"], txt["depth"]) if fmt == "open_clip" else hf.keys(img["depth"], txt["depth"])
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
        text_config=dict(model_type="clip_text_model", hidden_size=txt["width"],
                         intermediate_size=int(mlp_t * txt["width"]),
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
