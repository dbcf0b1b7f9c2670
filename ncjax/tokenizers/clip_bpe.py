"""CLIP's byte-level BPE tokenizer (Radford et al. 2021), producing the same ids as `open_clip.tokenize`.

Per caption: ftfy's `fix_text`, HTML-unescape twice, strip; collapse whitespace (`str.split`); lower-case; split
with CLIP's pattern (contractions, letter runs, single digits, runs of other non-space symbols); map each piece's
UTF-8 bytes to CLIP's printable byte alphabet; apply the 48,894 merges of OpenAI's vocabulary (lowest rank first,
all occurrences left to right, '</w>' marking a word end); wrap in <start_of_text> (49406) / <end_of_text> (49407);
pad with 0 to the context length, or truncate and put <end_of_text> in the last slot.

Speed: each distinct piece is merged once (cached ids), bytes are mapped with `str.translate`, and captions made only
of printable ASCII skip ftfy and HTML unescaping (both are the identity on such text: ftfy only touches non-ASCII,
control characters, terminal escapes and '&' entities) and split with an equivalent ASCII pattern. Parity with
open_clip on a large varied corpus is a test (tests/test_tokenizers.py); throughput is in benchmarks/tokenizer.py.

The vocabulary (`bpe_simple_vocab_16e6.txt.gz`) is OpenAI's, MIT-licensed (LICENSE.openai-clip beside it).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import html
import os
import re as std_re
from typing import Sequence

import numpy as np

VOCAB_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bpe_simple_vocab_16e6.txt.gz")
NUM_MERGES = 49152 - 256 - 2
SOT, EOT = "<start_of_text>", "<end_of_text>"
DEFAULT_CONTEXT_LENGTH = 77

# Printable ASCII plus the ASCII whitespace that the cleaning collapses anyway.
_PLAIN_ASCII = std_re.compile(r"[\x20-\x25\x27-\x7e\t\n\r]*")   # no '&' (HTML entities go through html.unescape)
_ASCII_PIECES = std_re.compile(
    SOT + "|" + EOT + r"|'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^\sa-z0-9]+")


def byte_alphabet() -> dict[int, str]:
  """CLIP's reversible byte -> printable character map: the 188 printable Latin-1 bytes map to themselves, the
  other 68 bytes to U+0100 onwards in byte order. The dict's order (printable bytes first, then the others) is the
  order of the first 256 vocabulary entries."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
  table = {b: chr(b) for b in keep}
  others = [b for b in range(256) if b not in table]
  table.update({b: chr(256 + k) for k, b in enumerate(others)})
  return table


@functools.lru_cache(maxsize=2)
def _load_vocab(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"CLIP BPE vocabulary not found at {path}; it ships with ncjax "
                            f"(ncjax/tokenizers/bpe_simple_vocab_16e6.txt.gz): reinstall the package")
  with gzip.open(path, "rt", encoding="utf-8") as f:
    lines = f.read().split("\n")
  merges = [tuple(line.split()) for line in lines[1:NUM_MERGES + 1]]
  if len(merges) != NUM_MERGES or any(len(m) != 2 for m in merges):
    raise ValueError(f"{path} is not CLIP's BPE vocabulary: expected {NUM_MERGES} merge lines")
  alphabet = list(byte_alphabet().values())
  vocab = alphabet + [c + "</w>" for c in alphabet] + ["".join(m) for m in merges] + [SOT, EOT]
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  return merges, vocab, digest


def _clean(text: str) -> str:
  """open_clip's 'lower' cleaning: ftfy, double HTML unescape, whitespace collapse, lower-case."""
  import ftfy
  text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
  return " ".join(text.split()).strip().lower()


class ClipBpeTokenizer:
  """CLIP's BPE tokenizer. `tok(texts)` -> int32 (len(texts), tok.context_length); `tok(texts, context_length=n)`
  pads or truncates to n instead."""

  kind = "clip_bpe"
  pad_id = 0

  def __init__(self, context_length: int = DEFAULT_CONTEXT_LENGTH, vocab_path: str = VOCAB_FILE):
    if context_length < 2:
      raise ValueError(f"context_length must be at least 2 (SOT and EOT), got {context_length}")
    import regex
    merges, vocab, self.vocab_sha256 = _load_vocab(vocab_path)
    self.context_length = context_length
    self.vocab = vocab
    self.encoder = {t: i for i, t in enumerate(vocab)}
    self.ranks = {m: i for i, m in enumerate(merges)}
    self.sot_id, self.eot_id = self.encoder[SOT], self.encoder[EOT]
    self.unk_id = self.encoder["x</w>"]   # a neutral placeholder token (no <unk> in a byte-level vocabulary)
    alphabet = byte_alphabet()
    self._byte_table = {b: alphabet[b] for b in range(256)}   # str.translate over latin-1 decoded bytes
    self._decoder_bytes = {c: b for b, c in alphabet.items()}
    self._pieces = regex.compile(SOT + "|" + EOT + r"|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+",
                                 regex.IGNORECASE)
    self._cache: dict[str, tuple[int, ...]] = {SOT: (self.sot_id,), EOT: (self.eot_id,)}

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  # --- BPE --------------------------------------------------------------------------------------------------------
  def _merge(self, piece: str) -> tuple[int, ...]:
    """Ids of one byte-mapped piece: repeatedly merge the adjacent pair of lowest rank (all its occurrences)."""
    symbols = list(piece[:-1]) + [piece[-1] + "</w>"]
    ranks = self.ranks
    while len(symbols) > 1:
      best, best_rank = None, None
      for pair in zip(symbols, symbols[1:]):
        r = ranks.get(pair)
        if r is not None and (best_rank is None or r < best_rank):
          best, best_rank = pair, r
      if best is None:
        break
      first, second = best
      merged, i, n = [], 0, len(symbols)
      while i < n:
        if i + 1 < n and symbols[i] == first and symbols[i + 1] == second:
          merged.append(first + second)
          i += 2
        else:
          merged.append(symbols[i])
          i += 1
      symbols = merged
    return tuple(self.encoder[s] for s in symbols)

  def _piece_ids(self, piece: str) -> tuple[int, ...]:
    ids = self._cache.get(piece)
    if ids is None:
      mapped = piece.encode("utf-8").decode("latin-1").translate(self._byte_table)
      ids = self._merge(mapped)
      self._cache[piece] = ids
    return ids

  def encode_ids(self, text: str) -> list[int]:
    """Token ids of one caption, without SOT / EOT."""
    if _PLAIN_ASCII.fullmatch(text):
      pieces = _ASCII_PIECES.findall(" ".join(text.split()).lower())
    else:
      pieces = self._pieces.findall(_clean(text))
    out = []
    for piece in pieces:
      out.extend(self._piece_ids(piece))
    return out

  # --- batches ----------------------------------------------------------------------------------------------------
  def encode(self, texts: Sequence[str] | str, context_length: int | None = None) -> np.ndarray:
    """[SOT, ids..., EOT, 0...] per caption; longer captions are cut and end with EOT (as open_clip)."""
    if isinstance(texts, str):
      texts = [texts]
    length = context_length or self.context_length
    out = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
      ids = [self.sot_id] + self.encode_ids(text) + [self.eot_id]
      if len(ids) > length:
        ids = ids[:length]
        ids[-1] = self.eot_id
      out[row, :len(ids)] = ids
    return out

  def __call__(self, texts, context_length: int | None = None) -> np.ndarray:
    """As `encode`: padded to this tokenizer's own context length unless one is given (it defaulted to 77 until
    2026-11-23, so `load_model`'s tokenizer of a model with a shorter context gave tokens the model refused)."""
    return self.encode(texts, context_length)

  def decode(self, tokens) -> str:
    text = "".join(self.vocab[int(t)] for t in tokens if int(t) not in (self.pad_id, self.sot_id, self.eot_id))
    raw = bytes(self._decoder_bytes[c] for c in text)
    return raw.decode("utf-8", errors="replace").replace("</w>", " ").strip()

  # --- serialisation ----------------------------------------------------------------------------------------------
  def to_json(self) -> dict:
    return dict(kind=self.kind, context_length=self.context_length, vocab_sha256=self.vocab_sha256)

  @classmethod
  def from_json(cls, spec: dict) -> "ClipBpeTokenizer":
    tok = cls(spec.get("context_length", DEFAULT_CONTEXT_LENGTH))
    if spec.get("vocab_sha256") not in (None, tok.vocab_sha256):
      raise ValueError(f"this checkpoint's CLIP BPE vocabulary (sha256 {spec['vocab_sha256'][:12]}...) differs from "
                       f"the one ncjax ships ({tok.vocab_sha256[:12]}...)")
    return tok
