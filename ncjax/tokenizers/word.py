"""`WordTokenizer`: a word-level tokenizer whose vocabulary is built from the training captions (what the digits
demo and the region-feature retrieval models use). Its vocabulary serialises into every checkpoint."""

from __future__ import annotations

import collections
import hashlib
import json
import re
from typing import Iterable, Sequence

import numpy as np

_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def split_words(text: str) -> list[str]:
  """Lower-case word split (letters/digits, keeping simple apostrophes)."""
  return _WORD_RE.findall(text.lower())


class WordTokenizer:
  """Word-level tokenizer. Special ids: <pad>=0, <unk>=1, <sot>=2, <eot>=3."""

  kind = "word"
  SPECIALS = ("<pad>", "<unk>", "<sot>", "<eot>")

  def __init__(self, vocab: Sequence[str], context_length: int):
    if tuple(vocab[:4]) != self.SPECIALS:
      raise ValueError(f"a word vocabulary must start with the special tokens {self.SPECIALS}")
    if context_length < 3:
      raise ValueError(f"context_length must be at least 3 (SOT, one word, EOT), got {context_length}")
    self.vocab = list(vocab)
    self.index = {w: i for i, w in enumerate(self.vocab)}
    if len(self.index) != len(self.vocab):
      raise ValueError("the vocabulary has duplicate entries")
    self.context_length = context_length
    self.pad_id, self.unk_id, self.sot_id, self.eot_id = 0, 1, 2, 3

  @classmethod
  def build(cls, captions: Iterable[str], context_length: int, min_count: int = 1,
            max_size: int | None = None) -> "WordTokenizer":
    """Vocabulary = words of the captions with count >= min_count, by decreasing count then alphabetically."""
    counts = collections.Counter(w for c in captions for w in split_words(c))
    words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
    if max_size is not None:
      words = words[:max(0, max_size - len(cls.SPECIALS))]
    return cls(list(cls.SPECIALS) + words, context_length)

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def encode(self, texts: Sequence[str], context_length: int | None = None) -> np.ndarray:
    if isinstance(texts, str):
      texts = [texts]
    length = context_length or self.context_length
    out = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
      ids = [self.index.get(w, self.unk_id) for w in split_words(text)][: length - 2]
      ids = [self.sot_id] + ids + [self.eot_id]
      out[row, : len(ids)] = ids
    return out

  def decode(self, tokens: Sequence[int]) -> str:
    words = [self.vocab[t] for t in tokens if t not in (self.pad_id, self.sot_id, self.eot_id)]
    return " ".join(words)

  __call__ = encode

  def to_json(self) -> dict:
    return dict(kind=self.kind, context_length=self.context_length, vocab=self.vocab)

  @classmethod
  def from_json(cls, spec: dict) -> "WordTokenizer":
    return cls(spec["vocab"], spec["context_length"])

  def fingerprint(self) -> str:
    return hashlib.sha256(json.dumps(self.to_json()).encode()).hexdigest()[:16]
