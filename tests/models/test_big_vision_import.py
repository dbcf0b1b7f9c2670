"""big_vision (SigLIP) two-tower checkpoints: a randomly initialised model written in big_vision's exact .npz layout
(unrolled image blocks, scanned text blocks, MAP heads, head biases, t and b), embedded by ncjax and by an
independent numpy restatement of big_vision's forward pass (vit.py, text_transformer.py, two_towers.py); its
SentencePiece tokenizer trained here offline; a SigLIP step fine-tuning it; and the refusals."""

import io
import math
import os
import zipfile

import numpy as np
import pytest
import sentencepiece as spm

from ncjax import pretrained

SENTENCES = ["a photo of a cat", "a photo of a dog", "the digit seven written by hand", "a small red car",
             "two dogs play in the park", "a handwritten number three", "the quick brown fox jumps"] * 4
IMG = dict(size=16, patch=4, width=32, depth=2, heads=2, mlp=48)
TXT = dict(width=32, depth=2, heads=4, mlp=40, context=8)
EMBED = 24
T, B = math.log(10.0) + 0.3, -7.5


def _spm_model(path):
  """A tiny SentencePiece model (c4_en's special ids: pad 0, eos 1, unk 2, no bos), trained on a few sentences."""
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_writer=out, vocab_size=48,
                                 model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 hard_vocab_limit=False, minloglevel=2)
  with open(path, "wb") as f:
    f.write(out.getvalue())
  proc = spm.SentencePieceProcessor()
  proc.LoadFromSerializedProto(out.getvalue())
  return proc


def _dense(rng, n_in, n_out, scale=None):
  s = scale or n_in ** -0.5
  return {"kernel": rng.normal(0, s, (n_in, n_out)).astype(np.float32),
          "bias": rng.normal(0, 0.1, (n_out,)).astype(np.float32)}


def _ln(rng, w):
  return {"scale": (1 + 0.1 * rng.normal(size=w)).astype(np.float32), "bias": (0.1 * rng.normal(size=w)).astype(np.float32)}


def _mha(rng, w, heads):
  d = w // heads
  p = {n: {"kernel": rng.normal(0, w ** -0.5, (w, heads, d)).astype(np.float32),
           "bias": rng.normal(0, 0.1, (heads, d)).astype(np.float32)} for n in ("query", "key", "value")}
  p["out"] = {"kernel": rng.normal(0, w ** -0.5, (heads, d, w)).astype(np.float32),
              "bias": rng.normal(0, 0.1, (w,)).astype(np.float32)}
  return p


def _block(rng, w, heads, mlp):
  return {"LayerNorm_0": _ln(rng, w), "LayerNorm_1": _ln(rng, w), "MultiHeadDotProductAttention_0": _mha(rng, w, heads),
          "MlpBlock_0": {"Dense_0": _dense(rng, w, mlp), "Dense_1": _dense(rng, mlp, w)}}


def _map_head(rng, w, heads, mlp):
  return {"probe": rng.normal(0, 1, (1, 1, w)).astype(np.float32), "MultiHeadDotProductAttention_0": _mha(rng, w, heads),
          "LayerNorm_0": _ln(rng, w), "MlpBlock_0": {"Dense_0": _dense(rng, w, mlp), "Dense_1": _dense(rng, mlp, w)}}


def _params(vocab, *, text_map=False):
  rng = np.random.default_rng(0)
  grid = IMG["size"] // IMG["patch"]
  img = {"embedding": {"kernel": rng.normal(0, 0.2, (IMG["patch"], IMG["patch"], 3, IMG["width"])).astype(np.float32),
                       "bias": rng.normal(0, 0.1, (IMG["width"],)).astype(np.float32)},
         "pos_embedding": rng.normal(0, IMG["width"] ** -0.5, (1, grid * grid, IMG["width"])).astype(np.float32),
         "Transformer": {**{f"encoderblock_{i}": _block(rng, IMG["width"], IMG["heads"], IMG["mlp"])
                            for i in range(IMG["depth"])}, "encoder_norm": _ln(rng, IMG["width"])},
         "MAPHead_0": _map_head(rng, IMG["width"], IMG["heads"], IMG["mlp"]),
         "head": _dense(rng, IMG["width"], EMBED)}
  blocks = [_block(rng, TXT["width"], TXT["heads"], TXT["mlp"]) for _ in range(TXT["depth"])]
  txt = {"Embed_0": {"embedding": rng.normal(0, 0.5, (vocab, TXT["width"])).astype(np.float32)},
         "pos_embedding": rng.normal(0, TXT["width"] ** -0.5, (1, TXT["context"], TXT["width"])).astype(np.float32),
         # scanned blocks (big_vision's scan=True): one 'encoderblock' whose leaves stack the blocks on axis 0
         "Encoder_0": {"encoderblock": _stack(blocks), "encoder_norm": _ln(rng, TXT["width"])},
         "head": _dense(rng, TXT["width"], EMBED)}
  if text_map:
    txt["MAPHead_0"] = _map_head(rng, TXT["width"], TXT["heads"], TXT["mlp"])
  return {"img": img, "txt": txt, "t": np.full((1,), T, np.float32), "b": np.full((1,), B, np.float32)}


def _stack(trees):
  if isinstance(trees[0], dict):
    return {k: _stack([t[k] for t in trees]) for k in trees[0]}
  return np.stack(trees)


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    name = f"{prefix}/{k}" if prefix else k
    out.update(_flatten(v, name) if isinstance(v, dict) else {name: v})
  return out


def _save(path, params):
  np.savez(path, **_flatten({"params": params}))


# --- big_vision's forward pass restated in numpy -------------------------------------------------------------------
def _layer_norm(x, p):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-6) * p["scale"] + p["bias"]   # flax nn.LayerNorm: epsilon 1e-6


def _gelu(x):   # flax nn.gelu: the tanh approximation
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _attention(q_in, kv_in, p):
  q = np.einsum("bqw,whd->bqhd", q_in, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("bkw,whd->bkhd", kv_in, p["key"]["kernel"]) + p["key"]["bias"]
  v = np.einsum("bkw,whd->bkhd", kv_in, p["value"]["kernel"]) + p["value"]["bias"]
  logits = np.einsum("bqhd,bkhd->bhqk", q / np.sqrt(q.shape[-1]), k)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  y = np.einsum("bhqk,bkhd->bqhd", w, v)
  return np.einsum("bqhd,hdw->bqw", y, p["out"]["kernel"]) + p["out"]["bias"]


def _mlp(x, p):
  h = _gelu(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
  return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


def _encoder(x, blocks, norm):
  for p in blocks:   # pre-LN blocks, no attention mask
    y = _layer_norm(x, p["LayerNorm_0"])
    x = x + _attention(y, y, p["MultiHeadDotProductAttention_0"])
    x = x + _mlp(_layer_norm(x, p["LayerNorm_1"]), p["MlpBlock_0"])
  return _layer_norm(x, norm)


def _map(x, p):
  probe = np.broadcast_to(p["probe"], (x.shape[0], 1, x.shape[-1]))
  y = _attention(probe, x, p["MultiHeadDotProductAttention_0"])
  return (y + _mlp(_layer_norm(y, p["LayerNorm_0"]), p["MlpBlock_0"]))[:, 0]


def _normalise(z):
  return z / (np.linalg.norm(z, axis=1, keepdims=True) + 1e-8)   # two_towers.py


def ref_image(params, images):
  p = params["img"]
  n, s = images.shape[0], IMG["patch"]
  g = images.shape[1] // s
  patches = images.reshape(n, g, s, g, s, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, g * g, s * s * 3)
  x = patches @ p["embedding"]["kernel"].reshape(s * s * 3, -1) + p["embedding"]["bias"]   # the stride-s conv
  x = x + (p["pos_embedding"] if "pos_embedding" in p else _sincos2d(g, g, x.shape[-1]))
  blocks = [p["Transformer"][f"encoderblock_{i}"] for i in range(IMG["depth"])]
  x = _encoder(x, blocks, p["Transformer"]["encoder_norm"])
  x = _map(x, p["MAPHead_0"]) if "MAPHead_0" in p else x.mean(axis=1)   # pool_type 'map' / 'gap'
  return _normalise(x @ p["head"]["kernel"] + p["head"]["bias"])


def _sincos2d(h, w, width, temperature=10_000.0):   # vit.py's posemb_sincos_2d (MoCo v3)
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
  ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  x, y = np.outer(xs.ravel(), omega), np.outer(ys.ravel(), omega)
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None]


def ref_text(params, tokens):
  p = params["txt"]
  x = p["Embed_0"]["embedding"][tokens] + p["pos_embedding"]
  scanned = p["Encoder_0"]["encoderblock"]
  blocks = [_flatten_index(scanned, i) for i in range(TXT["depth"])]
  x = _encoder(x, blocks, p["Encoder_0"]["encoder_norm"])
  x = _map(x, p["MAPHead_0"]) if "MAPHead_0" in p else x[:, -1]   # pool_type 'last': the final position
  return _normalise(x @ p["head"]["kernel"] + p["head"]["bias"])


def _flatten_index(tree, i):
  return {k: _flatten_index(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]


# --- fixtures -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  d = tmp_path_factory.mktemp("big_vision")
  sp = _spm_model(str(d / "tokenizer.model"))
  params = _params(sp.get_piece_size())
  path = str(d / "siglip_tiny.npz")
  _save(path, params)
  return path, params, sp


def _images(n=3):
  return np.random.default_rng(1).normal(size=(n, IMG["size"], IMG["size"], 3)).astype(np.float32)


def test_embeddings_equal_a_numpy_restatement_of_big_vision(checkpoint):
  path, params, sp = checkpoint
  model, _, tok = pretrained.load_model(f"big_vision:{path}")
  texts = ["a photo of a cat", "two dogs", "the quick brown fox jumps over the lazy dog again and again"]
  tokens = tok(texts)
  images = _images()
  img_diff = np.abs(np.asarray(model.encode_image(images)) - ref_image(params, images)).max()
  txt_diff = np.abs(np.asarray(model.encode_text(tokens)) - ref_text(params, tokens)).max()
  print(f"big_vision parity: image {img_diff:.2e}, text {txt_diff:.2e}")
  assert img_diff < 2e-6 and txt_diff < 2e-6, (img_diff, txt_diff)
  assert float(np.asarray(model.params["logit_scale"])) == pytest.approx(T)   # t: log temperature
  assert float(np.asarray(model.params["logit_bias"])) == pytest.approx(B)
  cfg = model.config
  assert (cfg.pool, cfg.text_pool, cfg.text_causal, cfg.act, cfg.ln_eps, cfg.image_mlp_dim, cfg.text_heads) == \
      ("map", "final", False, "gelu_tanh", 1e-6, IMG["mlp"], TXT["heads"])


def test_sentencepiece_tokens_are_big_visions_sticky_eos(checkpoint):
  path, _, sp = checkpoint
  _, _, tok = pretrained.load_model(f"big_vision:{path}")
  short, long = "A Dog", "the quick brown fox jumps over the lazy dog again and again"
  got = tok([short, long])
  ids = sp.encode(short.lower())                      # lower-cased, EOS appended, padded with EOS (pad_value=1)
  assert 0 < len(ids) < TXT["context"] - 1 and got[0].tolist() == ids + [1] * (TXT["context"] - len(ids))
  ids = sp.encode(long)
  assert len(ids) >= TXT["context"] and got[1].tolist() == ids[:TXT["context"] - 1] + [1]   # cut, EOS kept last
  from ncjax import tokenizers
  again = tokenizers.tokenizer_from_json(tok.to_json())   # travels in a run's checkpoint
  np.testing.assert_array_equal(again([short, long]), got)


def test_text_map_head_and_a_scanned_prefixless_layout(tmp_path):
  sp = _spm_model(str(tmp_path / "tokenizer.model"))
  params = _params(sp.get_piece_size(), text_map=True)
  path = str(tmp_path / "bv.npz")
  np.savez(path, **_flatten(params))   # no 'params/' prefix (a shared params-only file)
  model, _, tok = pretrained.load_model(f"big_vision:{path}")
  tokens = tok(["a small red car", "a dog"])
  diff = np.abs(np.asarray(model.encode_text(tokens)) - ref_text(params, tokens)).max()
  assert diff < 2e-6 and model.config.text_pool == "map"


def test_gap_pooling_and_a_fixed_sincos2d_position_embedding(checkpoint, tmp_path):
  path, params, _ = checkpoint
  params = dict(params, img={k: v for k, v in params["img"].items() if k not in ("MAPHead_0", "pos_embedding")})
  (tmp_path / "tokenizer.model").write_bytes(open(os.path.join(os.path.dirname(path), "tokenizer.model"), "rb").read())
  _save(str(tmp_path / "gap.npz"), params)
  model, _, _ = pretrained.load_model(f"big_vision:{IMG['size']}:{tmp_path / 'gap.npz'}")
  assert (model.config.pool, model.config.posemb) == ("gap", "sincos2d")
  images = _images()
  diff = np.abs(np.asarray(model.encode_image(images)) - ref_image(params, images)).max()
  assert diff < 2e-6, diff


def test_siglip_config_fine_tunes_a_big_vision_checkpoint(checkpoint, tmp_path):
  from helpers import leaves, make_config
  from ncjax import train
  path, _, _ = checkpoint
  # (no checkpoint at the end: nothing here reads one)
  cfg = make_config("siglip", f"init=big_vision:{path},data=digits,batch=32,epochs=1", total_steps=1,
                    **{"optim.warmup_steps": 0, "ckpt.save_at_end": False})
  trainer = train.Trainer(cfg, str(tmp_path / "run"))
  # The parameters the run starts from, fetched as the run creates them (before its step donates them): a second
  # initialisation to look at would run the random draws and the overlay again.
  init, create = {}, trainer.init_params
  trainer.init_params = lambda: _fetched(create(), into=init)
  result = trainer.run()
  assert init, "the run did not create its parameters through Trainer.init_params"
  _, loaded = pretrained.load(f"big_vision:{path}")
  for key, value in leaves(loaded).items():   # every tower parameter, t and b start from the checkpoint
    np.testing.assert_array_equal(init[f"model/{key}"], value, err_msg=key)
  assert np.isfinite(result.metrics["loss"])
  after = leaves(result.params)
  for key in ("img/map_head/probe", "img/proj_bias", "txt/proj_bias", "logit_bias"):   # the step reaches them
    assert not np.array_equal(after[f"model/{key}"], init[f"model/{key}"]), key


def _fetched(params, into: dict):
  from helpers import leaves
  into.update(leaves(params))
  return params


def test_refusals(checkpoint, tmp_path):
  path, params, _ = checkpoint
  cfg, loaded = pretrained.load(f"big_vision:{path}")
  for fmt in pretrained.EXPORT_FORMATS:   # neither CLIP layout can hold the MAP head
    with pytest.raises(pretrained.UnsupportedArchitecture, match=r"^cannot export to .*'map' attention-pool head"):
      pretrained.export(loaded, cfg, str(tmp_path / fmt), fmt, tokenizer_kind="sentencepiece",
                        normalization="siglip")
  with pytest.raises(pretrained.UnsupportedArchitecture, match="CLIP's causal one"):
    pretrained.export(loaded, dict(cfg.to_dict(), pool="tok"), str(tmp_path / "x"), "hf")
  # a representation layer ncjax's tower cannot express
  odd = tmp_path / "odd"
  odd.mkdir()
  (odd / "tok.model").write_bytes(open(os.path.join(os.path.dirname(path), "tokenizer.model"), "rb").read())
  flat = _flatten({"params": params})
  flat["params/img/pre_logits/kernel"] = np.zeros((IMG["width"], IMG["width"]), np.float32)
  np.savez(odd / "a.npz", **flat)
  with pytest.raises(pretrained.UnsupportedArchitecture, match="pre_logits"):
    pretrained.load(f"big_vision:{odd / 'a.npz'}")
  # a fixed sincos2d position embedding: the resolution must be given
  flat = _flatten({"params": params})
  del flat["params/img/pos_embedding"]
  np.savez(odd / "b.npz", **flat)
  with pytest.raises(ValueError, match=r"big_vision:SIZE:PATH"):
    pretrained.load(f"big_vision:{odd / 'b.npz'}")
  model_cfg, _ = pretrained.load(f"big_vision:16:{odd / 'b.npz'}")
  assert model_cfg.posemb == "sincos2d" and model_cfg.image_size == 16
  # no tokenizer beside the checkpoint
  lone = tmp_path / "lone"
  lone.mkdir()
  _save(str(lone / "c.npz"), params)
  with pytest.raises(FileNotFoundError, match=r"no SentencePiece tokenizer \(\*\.model\)"):
    pretrained.load(f"big_vision:{lone / 'c.npz'}")
  with zipfile.ZipFile(lone / "d.npz", "w") as z:
    z.writestr("x.txt", "not arrays")
  (lone / "e.npz").write_text("plain text")
  with pytest.raises(Exception, match="not a big_vision .npz"):
    pretrained.load(f"big_vision:{lone / 'e.npz'}")
