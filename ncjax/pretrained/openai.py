"""OpenAI's CLIP layout: its released .pt files and OpenAI-layout state dicts (open_clip's `CLIP` uses it too)."""

from __future__ import annotations

import re

from ncjax.pretrained.core import (KeyMap, PretrainedSpec, UnsupportedArchitecture, clip_block, conv_to_flax,
                                    count_indices, layer_norm, model_fields, one, preprocess_fields)
from ncjax.pretrained.weights_io import read_tensors


def keys(vision_depth: int, text_depth: int, text_prefix: str = "") -> list[KeyMap]:
  """OpenAI's CLIP layout (open_clip's `CLIP`; `CustomTextCLIP` puts the text tower under 'text.')."""
  t = text_prefix
  maps = [one("visual.conv1.weight", "img/patch_embed/kernel", conv_to_flax),
          one("visual.class_embedding", "img/cls_token"), one("visual.positional_embedding", "img/pos_embedding")]
  maps += layer_norm("visual.ln_pre", "img/ln_pre") + layer_norm("visual.ln_post", "img/ln_post")
  maps.append(one("visual.proj", "img/proj"))
  for i in range(vision_depth):
    maps += clip_block(f"visual.transformer.resblocks.{i}", f"img/transformer/block_{i}")
  maps += [one(f"{t}token_embedding.weight", "txt/token_embedding/embedding"),
           one(f"{t}positional_embedding", "txt/pos_embedding"), one(f"{t}text_projection", "txt/proj")]
  maps += layer_norm(f"{t}ln_final", "txt/ln_final")
  for i in range(text_depth):
    maps += clip_block(f"{t}transformer.resblocks.{i}", f"txt/transformer/block_{i}")
  maps.append(one("logit_scale", "logit_scale"))
  return maps


def layout_config(sd, *, act: str, vision_head_width: int = 64, text_heads: int | None = None,
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
  return model_fields(
      embed_dim=int(sd["visual.proj"].shape[1]), image_size=int(patch * grid), patch_size=int(patch),
      channels=int(channels), image_width=int(width),
      image_depth=count_indices(sd, r"visual\.transformer\.resblocks\.(\d+)\."),
      image_heads=int(width // vision_head_width),
      image_mlp_dim=int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
      text_width=int(tw), text_depth=count_indices(sd, re.escape(t) + r"transformer\.resblocks\.(\d+)\."),
      text_heads=int(text_heads or tw // 64),
      text_mlp_dim=int(sd[f"{t}transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
      context_length=int(sd[f"{t}positional_embedding"].shape[0]),
      vocab_size=int(sd[f"{t}token_embedding.weight"].shape[0]), act=act,
      ln_pre="visual.ln_pre.weight" in sd)


def read(spec: PretrainedSpec):
  sd = read_tensors(spec.path)
  fields = layout_config(sd, act="quick_gelu")
  pre = preprocess_fields(fields["image_size"], "openai")
  return sd, fields, pre, keys(fields["image_depth"], fields["text_depth"])
