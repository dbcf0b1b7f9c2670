"""Tokenizers: captions -> fixed-length int32 token arrays [SOT, tokens..., EOT, PAD...].

  word      `WordTokenizer`, a vocabulary built from the training captions (the embedded data, region features)
  clip_bpe  `ClipBpeTokenizer`, CLIP's byte-level BPE (ids equal `open_clip.tokenize`), for CLIP-sized and
            imported pretrained models
  sentencepiece:PATH  `SentencePieceTokenizer`, a SentencePiece model file tokenised as big_vision's SigLIP
            (sticky EOS); `big_vision:PATH` imports select it

Every tokenizer serialises to JSON (`to_json` / `tokenizer_from_json`) so it travels inside the checkpoint with the
weights: a model is never evaluated with another vocabulary than the one it was trained with. `model.tokenizer`
selects the kind ('auto': clip_bpe for the CLIP-sized models, word otherwise).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Protocol, Sequence

import numpy as np

from ncjax.registry import Registry
from ncjax.tokenizers.clip_bpe import ClipBpeTokenizer
from ncjax.tokenizers.sentencepiece import SentencePieceTokenizer
from ncjax.tokenizers.word import WordTokenizer, split_words


class Tokenizer(Protocol):
  kind: str
  vocab_size: int
  context_length: int
  pad_id: int
  sot_id: int
  eot_id: int

  def encode(self, texts: Sequence[str], context_length: int | None = None) -> np.ndarray: ...

  def to_json(self) -> dict: ...


TOKENIZERS: Registry = Registry("tokenizer")
TOKENIZERS.add("word", WordTokenizer)
TOKENIZERS.add("clip_bpe", ClipBpeTokenizer)
TOKENIZERS.add("sentencepiece", SentencePieceTokenizer)


def get_tokenizer(kind: str = "clip_bpe", **kwargs):
  """A fixed-vocabulary tokenizer by name: `get_tokenizer("clip_bpe")(texts, context_length=77)`."""
  if kind == "word":
    raise ValueError("a 'word' tokenizer is built from captions: use build_tokenizer(captions, kind='word', ...)")
  return TOKENIZERS.get(kind)(**kwargs)


def build_tokenizer(captions: Iterable[str], *, context_length: int, min_count: int = 1, kind: str = "word"):
  """The tokenizer of a new run: a word vocabulary over the training captions, or a fixed vocabulary."""
  if kind == "word":
    return WordTokenizer.build(captions, context_length=context_length, min_count=min_count)
  if kind.split(":", 1)[0] == "sentencepiece":
    path = kind.partition(":")[2]
    if not path:
      raise ValueError("model.tokenizer='sentencepiece:PATH' needs the path of a SentencePiece .model file")
    return SentencePieceTokenizer(context_length, path)
  return TOKENIZERS.get(kind)(context_length=context_length)


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
  """A run's tokenizer as `ncjax.experiment.resolve` settles it: the kind (model.tokenizer with 'auto' resolved),
  the model's context length and, for a word vocabulary, the minimum count of a kept word (input.min_word_count)."""
  kind: str
  context_length: int
  min_word_count: int = 1

  def build(self, captions: Iterable[str] = (), *, saved: dict | None = None, vocabulary=None):
    """The tokenizer a run saved in its checkpoint (`saved`); else, for a word tokenizer, the dataset's own
    vocabulary when it has one (NCR's precomp vocabulary: its words, in its order, after ncjax's special tokens);
    else one built from `captions`."""
    if saved is not None:
      return tokenizer_from_json(saved)
    if self.kind == "word" and vocabulary:
      ncr_specials = {"<pad>", "<start>", "<end>", "<unk>"}
      specials = ncr_specials | set(WordTokenizer.SPECIALS)
      words = [w for w in dict.fromkeys(vocabulary) if w not in specials]
      return WordTokenizer(list(WordTokenizer.SPECIALS) + words, self.context_length)
    return build_tokenizer(captions, context_length=self.context_length, min_count=self.min_word_count,
                           kind=self.kind)


def tokenizer_from_json(spec: dict) -> Tokenizer:
  kind = spec.get("kind")
  if kind not in TOKENIZERS:
    raise ValueError(f"unknown tokenizer kind {kind!r}; known: {TOKENIZERS.names()}")
  return TOKENIZERS[kind].from_json(spec)


__all__ = ["Tokenizer", "WordTokenizer", "ClipBpeTokenizer", "SentencePieceTokenizer", "TOKENIZERS", "get_tokenizer",
           "build_tokenizer", "TokenizerSpec", "tokenizer_from_json", "split_words"]
