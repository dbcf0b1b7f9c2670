"""What every format shares: specs, the key-map vocabulary (source key(s) <-> ncjax parameter path, with
the array transforms both ways) and the model fields an import fills in."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable

import numpy as np

from ncjax import errors

FORMATS = ("openai", "open_clip", "hf", "meru", "big_vision")
CLIP_EOT_ID, CLIP_SOT_ID = 49407, 49406

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
def identity(x):
  return x


def transpose(x):
  return np.ascontiguousarray(x.T)


def conv_to_flax(x):    # torch (O, I, H, W) -> flax (H, W, I, O)
  return np.ascontiguousarray(np.transpose(x, (2, 3, 1, 0)))


def conv_to_torch(x):
  return np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1)))


@dataclasses.dataclass(frozen=True)
class KeyMap:
  sources: tuple[str, ...]          # external key(s)
  target: str                       # '/'-joined path in the TwoTower's params
  to_ncjax: Callable = identity       # (*source arrays) -> ncjax array
  to_source: Callable = None        # ncjax array -> tuple of source arrays (None: the inverse of a 1:1 transform)

  def inverse(self, value):
    if self.to_source is not None:
      return self.to_source(value)
    inv = {identity: identity, transpose: transpose, conv_to_flax: conv_to_torch}[self.to_ncjax]
    return (inv(value),)


def one(src, target, fn=identity):
  return KeyMap((src,), target, fn)


def layer_norm(src, target):
  return [one(f"{src}.weight", f"{target}/scale"), one(f"{src}.bias", f"{target}/bias")]


def linear(src, target, bias=True):
  out = [one(f"{src}.weight", f"{target}/kernel", transpose)]
  return out + ([one(f"{src}.bias", f"{target}/bias")] if bias else [])


def clip_block(src: str, dst: str) -> list[KeyMap]:
  """An OpenAI/open_clip residual block (also MERU's text blocks): fused in_proj, c_fc/c_proj."""
  return (layer_norm(f"{src}.ln_1", f"{dst}/ln_1") + layer_norm(f"{src}.ln_2", f"{dst}/ln_2")
          + [one(f"{src}.attn.in_proj_weight", f"{dst}/attn/qkv/kernel", transpose),
             one(f"{src}.attn.in_proj_bias", f"{dst}/attn/qkv/bias")]
          + linear(f"{src}.attn.out_proj", f"{dst}/attn/out") + linear(f"{src}.mlp.c_fc", f"{dst}/mlp/fc")
          + linear(f"{src}.mlp.c_proj", f"{dst}/mlp/proj"))


# Source keys that carry no parameters (buffers, metadata).
IGNORED = re.compile(r"(input_resolution|context_length|vocab_size|.*attn_mask|.*position_ids|pixel_mean|pixel_std)$")


def count_indices(sd, pattern: str) -> int:
  rx = re.compile(pattern)
  return len({m.group(1) for k in sd for m in [rx.match(k)] if m})


# ---------------------------------------------------------------------------------------------------------------
# Architecture inference
# ---------------------------------------------------------------------------------------------------------------
def model_fields(**kw) -> dict:
  base = dict(size="custom", image_type="vit", text_type="transformer", channels=3, pool="tok", ln_pre=True,
              patch_bias=False, ln_eps=1e-5, text_pool="eot", tokenizer="clip_bpe", geometry="sphere", curv_init=1.0)
  base.update(kw)
  return base


def normalization_name(mean, std) -> str:
  mean, std = tuple(round(float(x), 6) for x in mean), tuple(round(float(x), 6) for x in std)
  for name, (m, s) in (("openai", OPENAI_NORMALIZATION), ("imagenet", IMAGENET_NORMALIZATION),
                       ("siglip", ((0.5,) * 3, (0.5,) * 3))):
    if np.allclose(mean, m, atol=1e-6) and np.allclose(std, s, atol=1e-6):
      return name
  return "custom:" + ",".join(map(str, mean)) + "/" + ",".join(map(str, std))


def preprocess_fields(image_size: int, normalization: str, resize: str = "shortest") -> dict:
  return dict(image_size=image_size, normalization=normalization, resize=resize, interpolation="bicubic")


def find_weights(directory: str, names) -> str | None:
  for name in names:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  return None


def set_path(tree: dict, path: str, value):
  node = tree
  *parents, leaf = path.split("/")
  for p in parents:
    node = node.setdefault(p, {})
  node[leaf] = value


def get_path(tree: dict, path: str):
  node = tree
  for p in path.split("/"):
    node = node[p]
  return node
