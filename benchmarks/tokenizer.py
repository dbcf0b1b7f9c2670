"""CLIP BPE tokenizer throughput: ncjax's tokenizer against open_clip's on the same captions (ids checked equal).

Two corpora: web-style English captions (mostly plain ASCII, the common case at web scale) and captions with
accented letters, other scripts and emoji (every caption through ftfy). Reported: captions/s of each and the ratio.
"""

from __future__ import annotations

import random
import time

import numpy as np

from benchmarks import common

_WORDS = ("a photo of the dog cat sitting on red blue green house car street beach sunset mountain people walking "
          "running with its little big old new beautiful view from window at night woman man child playing "
          "soccer field city skyline coffee table kitchen 2019 wedding party birthday cake flowers garden "
          "vintage poster illustration vector stock image close-up portrait").split()
_EXTRA = ("café", "naïve", "Zürich", "東京", "🙂", "❄️", "señor", "Ελλάδα", "москва", "“quoted”")


def corpus(n: int, unicode: bool, seed: int = 0) -> list[str]:
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 25))]
    if unicode:
      words.insert(rng.randrange(len(words)), rng.choice(_EXTRA))
    text = " ".join(words).capitalize() + rng.choice([".", "!", "", " #photo", ", 2021."])
    out.append(text)
  return out


def _rate(fn, texts) -> tuple[float, object]:
  t0 = time.perf_counter()
  ids = fn(texts)
  return len(texts) / (time.perf_counter() - t0), ids


def run(quick: bool = False) -> dict:
  from ncjax.testing import import_open_clip
  from ncjax.tokenizers import ClipBpeTokenizer
  try:
    open_clip = import_open_clip()
  except ImportError as e:   # benchmarks run without the [test] extra too
    print(f"open_clip not installed ({e}); tokenizer benchmark skipped")
    return {}
  n = 5_000 if quick else 50_000
  rows = []
  for name, unicode in (("web captions (ASCII)", False), ("with unicode / emoji", True)):
    texts = corpus(n if not unicode else n // 5, unicode)
    ours_tok = ClipBpeTokenizer()   # fresh caches for both
    from open_clip.tokenizer import SimpleTokenizer
    ref_tok = SimpleTokenizer()
    ref_rate, ref_ids = _rate(lambda t: ref_tok(t, context_length=77).numpy(), texts)
    our_rate, our_ids = _rate(lambda t: ours_tok(t, context_length=77), texts)
    rows.append(dict(corpus=name, captions=len(texts), open_clip=ref_rate, ncjax=our_rate,
                     ratio=our_rate / ref_rate, equal=bool(np.array_equal(ref_ids, our_ids))))
  print("\nCLIP BPE tokenizer, captions/s (one process, ids compared with open_clip's)")
  print(common.table(rows, [("corpus", "corpus", "s"), ("captions", "captions", ",d"), ("open_clip", "open_clip/s", ",.0f"),
                            ("ncjax", "ncjax/s", ",.0f"), ("ratio", "ncjax/open_clip", ".1f"), ("equal", "ids equal", "")]))
  payload = dict(rows=rows, open_clip_version=open_clip.__version__)
  common.write("tokenizer", payload)
  return payload
