"""CLIP's BPE tokenizer: ids equal open_clip.tokenize on a large varied corpus; truncation; serialisation."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from reference_models import import_open_clip
from ncjax.tokenizers import ClipBpeTokenizer, WordTokenizer, get_tokenizer, tokenizer_from_json

SCRIPTS = ["naïve café résumé", "Ünïcödé ÅÄÖ ß straße", "Ελληνικά κείμενο", "русский текст", "日本語のテキスト",
           "中文字符测试", "한국어 문장", "العربية نص", "עברית", "हिन्दी", "🙂🐱❄️👩‍👩‍👧 emoji", "ﬁne ﬂow ligatures",
           "ＦＵＬＬ width", "e\u0301 combining", "zero\u200bwidth", "non\u00a0breaking\u2003space", "cafÃ© mojibake",
           "&amp; &lt;b&gt; &quot;entities&quot; &#39;x&#39; &amp;amp;", "\x1b[31mred\x1b[0m", "ctrl\x00\x07char",
           "a\x1cb\x1fc", "tab\there\nnew\r\nline", "<start_of_text> special <end_of_text>", "“curly” ‘quotes’ — dash",
           "it's they're we've I'm you'll he'd", "3.14159 $5 #tag @user http://x.co/a?b=c&d=e", "ALL CAPS Mixed Case"]


def corpus(n=2000, seed=0):
  """Captions from real-looking words, punctuation, digits, many scripts, symbols, control characters, HTML,
  empty and very long strings."""
  rng = random.Random(seed)
  words = ("a photo of the dog cat sitting on red blue house car street beach sunset mountain people walking with "
           "its little big old new view from window at night two three 2021 covid-19 e-mail don't U.S.A.").split()
  out = ["", " ", "   \t\n ", "x" * 400, " ".join(["word"] * 100), "a" * 77, "!!!???..."] + SCRIPTS
  while len(out) < n:
    parts = []
    for _ in range(rng.randint(1, 25)):
      r = rng.random()
      if r < 0.6:
        w = rng.choice(words)
        parts.append(w.capitalize() if rng.random() < 0.2 else w)
      elif r < 0.75:
        parts.append(rng.choice(",.;:!?-()[]\"'/&%$#@*+="))
      elif r < 0.85:
        parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
      else:
        parts.append(rng.choice(SCRIPTS))
    out.append(rng.choice([" ", "", "  "]).join(parts))
  return out


@pytest.fixture(scope="module")
def reference():
  return import_open_clip().tokenize


def test_ids_equal_open_clip_on_a_large_varied_corpus(reference):
  texts = corpus()
  ours = get_tokenizer("clip_bpe")(texts, context_length=77)
  ref = reference(texts, context_length=77).numpy()
  assert ours.dtype == np.int32 and ours.shape == (len(texts), 77)
  bad = [i for i in range(len(texts)) if not np.array_equal(ours[i], ref[i])]
  assert not bad, f"{len(bad)} captions differ, e.g. {texts[bad[0]]!r}: {ours[bad[0]][:12]} vs {ref[bad[0]][:12]}"


# One tokenizer for every example, as a run keeps one (building one, its 49,408-entry tables, cost ~30 ms an example)
_CLIP_BPE = get_tokenizer("clip_bpe")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_ids_equal_open_clip_on_arbitrary_unicode(text):
  ref = import_open_clip().tokenize([text], context_length=77).numpy()
  np.testing.assert_array_equal(_CLIP_BPE([text]), ref)


def test_truncation_keeps_eot_last_and_context_length_is_respected(reference):
  tok = ClipBpeTokenizer()
  long = "a very long caption " * 50
  ids = tok([long, "short"], context_length=16)
  assert ids.shape == (2, 16)
  assert ids[0, 0] == tok.sot_id and ids[0, -1] == tok.eot_id
  assert list(ids[1, :3]) == [tok.sot_id, tok.encoder["short</w>"], tok.eot_id] and (ids[1, 3:] == 0).all()
  np.testing.assert_array_equal(ids, reference([long, "short"], context_length=16).numpy())


def test_decode_and_serialisation():
  tok = ClipBpeTokenizer(context_length=32)
  ids = tok(["A photo of two dogs, playing!"])
  assert ids.shape == (1, 32)   # its own context length (the call used to pad to 77 whatever the tokenizer's)
  assert tok.decode(ids[0]) == "a photo of two dogs , playing !"
  again = tokenizer_from_json(tok.to_json())
  assert isinstance(again, ClipBpeTokenizer) and again.context_length == 32 and again.vocab_size == 49408
  np.testing.assert_array_equal(again(["x"], context_length=32), tok(["x"], context_length=32))
  with pytest.raises(ValueError, match="vocabulary .* differs"):
    tokenizer_from_json(dict(tok.to_json(), vocab_sha256="0" * 64))
  word = WordTokenizer.build(["a cat", "a dog"], context_length=8)
  assert isinstance(tokenizer_from_json(word.to_json()), WordTokenizer)
  with pytest.raises(ValueError, match="built from captions"):
    get_tokenizer("word")
