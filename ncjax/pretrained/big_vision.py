"""google-research/big_vision two-tower .npz checkpoints (SigLIP), with the SentencePiece model beside them."""

from __future__ import annotations

import functools
import os
import re
import zipfile

import numpy as np

from ncjax.pretrained.core import (KeyMap, PretrainedSpec, UnsupportedArchitecture, count_indices, model_fields,
                                    one, preprocess_fields)
from ncjax.pretrained.weights_io import CheckpointFormatError


def _bv_dense(src: str, dst: str) -> list[KeyMap]:
  """A flax Dense (kernel (in, out) as ncjax's, bias)."""
  return [one(f"{src}/kernel", f"{dst}/kernel"), one(f"{src}/bias", f"{dst}/bias")]


def _bv_ln(src: str, dst: str) -> list[KeyMap]:
  return [one(f"{src}/scale", f"{dst}/scale"), one(f"{src}/bias", f"{dst}/bias")]


# flax MultiHeadDotProductAttention's (in, heads, head_dim) kernels / (heads, head_dim) biases <-> fused columns
def _heads_flat(*parts):
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
          one(f"{src}/bias", f"{dst}/bias")]


def _bv_block(src: str, dst: str, heads: int) -> list[KeyMap]:
  return (_bv_ln(f"{src}/LayerNorm_0", f"{dst}/ln_1") + _bv_ln(f"{src}/LayerNorm_1", f"{dst}/ln_2")
          + _bv_attention(f"{src}/MultiHeadDotProductAttention_0", f"{dst}/attn", heads)
          + _bv_dense(f"{src}/MlpBlock_0/Dense_0", f"{dst}/mlp/fc")
          + _bv_dense(f"{src}/MlpBlock_0/Dense_1", f"{dst}/mlp/proj"))


def _bv_map_head(src: str, dst: str, heads: int) -> list[KeyMap]:
  att = f"{src}/MultiHeadDotProductAttention_0"
  out = [one(f"{src}/probe", f"{dst}/probe")]
  out += [KeyMap((f"{att}/query/{leaf}",), f"{dst}/q/{leaf}", _heads_flat,
                 functools.partial(_heads_split, n=1, heads=heads)) for leaf in ("kernel", "bias")]
  out += [KeyMap((f"{att}/key/{leaf}", f"{att}/value/{leaf}"), f"{dst}/kv/{leaf}", _heads_flat,
                 functools.partial(_heads_split, n=2, heads=heads)) for leaf in ("kernel", "bias")]
  out += _bv_attention_out(f"{att}/out", f"{dst}/out", heads)
  out += _bv_ln(f"{src}/LayerNorm_0", f"{dst}/ln")
  out += _bv_dense(f"{src}/MlpBlock_0/Dense_0", f"{dst}/mlp/fc")
  out += _bv_dense(f"{src}/MlpBlock_0/Dense_1", f"{dst}/mlp/proj")
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


def keys(fields: dict) -> list[KeyMap]:
  """big_vision's two-tower layout (without the `params/` prefix) for the architecture `fields` describe."""
  ih, th = fields["image_heads"], fields["text_heads"]
  maps = [one("img/embedding/kernel", "img/patch_embed/kernel"), one("img/embedding/bias", "img/patch_embed/bias"),
          one("img/head/kernel", "img/proj"), one("img/head/bias", "img/proj_bias"),
          one("txt/Embed_0/embedding", "txt/token_embedding/embedding"),
          KeyMap(("txt/pos_embedding",), "txt/pos_embedding", _squeeze_lead, _add_lead),
          one("txt/head/kernel", "txt/proj"), one("txt/head/bias", "txt/proj_bias"),
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


def _config(sd, spec: PretrainedSpec) -> tuple[dict, dict]:
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
  fields = model_fields(
      embed_dim=int(sd["img/head/kernel"].shape[1]), image_size=image_size, patch_size=patch, channels=channels,
      image_width=width, image_depth=count_indices(sd, r"img/Transformer/encoderblock_(\d+)/"),
      image_heads=int(sd["img/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"].shape[1]),
      image_mlp_dim=int(sd["img/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape[1]),
      text_width=int(emb.shape[1]), text_depth=count_indices(sd, r"txt/Encoder_0/encoderblock_(\d+)/"),
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
  return fields, preprocess_fields(image_size, "siglip", "squash")


def read(spec: PretrainedSpec):
  sd = read_big_vision(spec.path)
  fields, pre = _config(sd, spec)
  return sd, fields, pre, keys(fields)
