"""SentencePiece tokenizer as big_vision tokenises SigLIP's captions (`tokenize(eos='sticky', pad_value=1)`).

A caption is lower-cased (big_vision's default `lower=True`), encoded with the SentencePiece model, followed by EOS;
one longer than the context is cut to `context_length - 1` pieces and keeps its EOS in the last slot ('sticky'
EOS), a shorter one is padded with `pad_id` (the EOS id by default, as SigLIP's released models were trained:
then the final position always holds an EOS, which big_vision's 'last' text pooling reads). No BOS.

`model.tokenizer='sentencepiece:PATH'` (PATH: a SentencePiece `.model` file; `big_vision:PATH` imports set it from
the `.model` file beside the checkpoint). The model's bytes travel in `to_json`, so a run's checkpoint carries its
vocabulary. Needs the `sentencepiece` package (`pip install sentencepiece`).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Sequence

import numpy as np

KIND = "sentencepiece"


def _processor(proto: bytes):
  try:
    import sentencepiece as spm
  except ImportError:
    raise ImportError("a SentencePiece tokenizer (SigLIP / big_vision models) needs the sentencepiece package: "
                      "pip install sentencepiece") from None
  sp = spm.SentencePieceProcessor()
  sp.LoadFromSerializedProto(proto)
  return sp


class SentencePieceTokenizer:
  """`tok(texts)` -> int32 (len(texts), context_length): [ids..., EOS, pad...] (sticky EOS, see the module)."""

  kind = KIND

  def __init__(self, context_length: int, model_path: str | None = None, *, model_proto: bytes | None = None,
               lower: bool = True, pad_id: int | None = None):
    if (model_path is None) == (model_proto is None):
      raise ValueError("SentencePieceTokenizer takes a model file (model_path) or its bytes (model_proto)")
    if context_length < 1:
      raise ValueError(f"context_length must be at least 1 (the EOS), got {context_length}")
    if model_proto is None:
      with open(model_path, "rb") as f:
        model_proto = f.read()
    self.model_proto = model_proto
    self.sp = _processor(model_proto)
    self.context_length, self.lower = int(context_length), bool(lower)
    self.eot_id = int(self.sp.eos_id())
    if self.eot_id < 0:
      raise ValueError(f"{model_path or 'this SentencePiece model'} defines no EOS piece; big_vision's sticky-EOS "
                       f"tokenisation needs one")
    self.sot_id = int(self.sp.bos_id())   # unused: big_vision adds no BOS (-1 when the model has none)
    self.pad_id = self.eot_id if pad_id is None else int(pad_id)
    self.sha256 = hashlib.sha256(model_proto).hexdigest()

  @property
  def vocab_size(self) -> int:
    return int(self.sp.get_piece_size())

  def encode(self, texts: Sequence[str] | str, context_length: int | None = None) -> np.ndarray:
    if isinstance(texts, str):
      texts = [texts]
    length = context_length or self.context_length
    out = np.full((len(texts), length), self.pad_id, np.int32)
    for row, ids in enumerate(self.sp.encode([t.lower() if self.lower else t for t in texts])):
      ids = list(ids) + [self.eot_id]
      if len(ids) > length:
        ids = ids[:length - 1] + [self.eot_id]
      out[row, :len(ids)] = ids
    return out

  def __call__(self, texts, context_length: int | None = None) -> np.ndarray:
    return self.encode(texts, context_length)

  def decode(self, tokens) -> str:
    return self.sp.decode([int(t) for t in tokens if int(t) not in (self.pad_id, self.eot_id)])

  def to_json(self) -> dict:
    return dict(kind=self.kind, context_length=self.context_length, lower=self.lower, pad_id=self.pad_id,
                sha256=self.sha256, model_proto=base64.b64encode(self.model_proto).decode("ascii"))

  @classmethod
  def from_json(cls, spec: dict) -> "SentencePieceTokenizer":
    return cls(int(spec["context_length"]), model_proto=base64.b64decode(spec["model_proto"]),
               lower=bool(spec.get("lower", True)), pad_id=spec.get("pad_id"))
