"""facebookresearch/meru checkpoints: a timm ViT, MERU's text encoder and, for MERU itself, the Lorentz
curvature and scaling alphas."""

from __future__ import annotations

import numpy as np

from ncjax.pretrained.core import (IMAGENET_NORMALIZATION, KeyMap, PretrainedSpec, UnsupportedArchitecture,
                                    clip_block, conv_to_flax, count_indices, layer_norm, linear, model_fields,
                                    normalization_name, one, preprocess_fields, transpose)
from ncjax.pretrained.weights_io import read_tensors


def keys(vision_depth: int, text_depth: int, hyperbolic: bool) -> list[KeyMap]:
  maps = [one("visual.patch_embed.proj.weight", "img/patch_embed/kernel", conv_to_flax),
          one("visual.patch_embed.proj.bias", "img/patch_embed/bias"),
          KeyMap(("visual.cls_token",), "img/cls_token", lambda x: x.reshape(-1), lambda x: (x.reshape(1, 1, -1),)),
          KeyMap(("visual.pos_embed",), "img/pos_embedding", lambda x: x.reshape(x.shape[-2:]),
                 lambda x: (x[None],)),
          one("visual_proj.weight", "img/proj", transpose), one("textual_proj.weight", "txt/proj", transpose),
          one("textual.token_embed.weight", "txt/token_embedding/embedding"),
          one("textual.posit_embed", "txt/pos_embedding"), one("logit_scale", "logit_scale")]
  maps += layer_norm("visual.norm", "img/ln_post") + layer_norm("textual.ln_final", "txt/ln_final")
  for i in range(vision_depth):
    src, d = f"visual.blocks.{i}", f"img/transformer/block_{i}"
    maps += (layer_norm(f"{src}.norm1", f"{d}/ln_1") + layer_norm(f"{src}.norm2", f"{d}/ln_2")
             + linear(f"{src}.attn.qkv", f"{d}/attn/qkv") + linear(f"{src}.attn.proj", f"{d}/attn/out")
             + linear(f"{src}.mlp.fc1", f"{d}/mlp/fc") + linear(f"{src}.mlp.fc2", f"{d}/mlp/proj"))
  for i in range(text_depth):
    maps += clip_block(f"textual.resblocks.{i}", f"txt/transformer/block_{i}")
  if hyperbolic:
    maps += [one("curv", "geometry/curv"), one("visual_alpha", "geometry/visual_alpha"),
             one("textual_alpha", "geometry/textual_alpha")]
  return maps


def _posemb(pos_embed, grid: int, width: int) -> str:
  """'sincos2d_moco' when a MERU checkpoint's position table is MoCo v3's fixed one (MERU's default,
  use_sincos2d_pos=True: a zero row for the class token, then the sin-cos rows), else 'learn' (a MERU trained with
  learned positions)."""
  from ncjax.models.vit import posemb_sincos_2d_moco
  table = np.asarray(pos_embed, np.float32).reshape(-1, width)
  fixed = np.concatenate([np.zeros((1, width), np.float32), posemb_sincos_2d_moco(grid, grid, width)])
  return "sincos2d_moco" if table.shape == fixed.shape and np.allclose(table, fixed, atol=1e-5) else "learn"


def _config(sd) -> tuple[dict, dict]:
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
  fields = model_fields(
      embed_dim=int(sd["visual_proj.weight"].shape[0]), image_size=int(patch * grid), patch_size=int(patch),
      channels=int(conv.shape[1]), image_width=int(width), image_depth=count_indices(sd, r"visual\.blocks\.(\d+)\."),
      image_heads=int(heads), image_mlp_dim=int(sd["visual.blocks.0.mlp.fc1.weight"].shape[0]),
      text_width=int(tw), text_depth=count_indices(sd, r"textual\.resblocks\.(\d+)\."), text_heads=int(tw // 64),
      text_mlp_dim=int(sd["textual.resblocks.0.mlp.c_fc.weight"].shape[0]),
      context_length=int(sd["textual.posit_embed"].shape[0]), vocab_size=int(sd["textual.token_embed.weight"].shape[0]),
      act="gelu", ln_pre=False, patch_bias=True, geometry="lorentz" if hyperbolic else "sphere",
      posemb=_posemb(sd["visual.pos_embed"], grid, int(width)))
  mean = np.asarray(sd.get("pixel_mean", np.asarray(IMAGENET_NORMALIZATION[0]))).reshape(-1)
  std = np.asarray(sd.get("pixel_std", np.asarray(IMAGENET_NORMALIZATION[1]))).reshape(-1)
  return fields, preprocess_fields(fields["image_size"], normalization_name(mean, std))


def read(spec: PretrainedSpec):
  sd = read_tensors(spec.path)
  fields, pre = _config(sd)
  if fields["posemb"] != "learn":   # the fixed table, checked equal by _posemb: the tower computes it
    sd = {k: v for k, v in sd.items() if k != "visual.pos_embed"}
  return sd, fields, pre, keys(fields["image_depth"], fields["text_depth"], fields["geometry"] == "lorentz")
