"""Importing OpenAI / open_clip / Hugging Face / MERU checkpoints with embedding parity, exporting back, and the
errors a wrong file gets. Reference models are random-initialised locally (tests/reference_models.py)."""

import json
import os
import types

import numpy as np
import pytest
# torch is a test dependency (setup.cfg's `test` extra): missing, this module fails to import and `make test` fails,
# instead of skipping these parity tests and passing.
import torch

import reference_models as rm
from ncjax import pretrained
from ncjax.pretrained.weights_io import CheckpointFormatError, read_tensors
TOL = 1e-4


def _open_clip_embeddings(model, images, tokens):
  with torch.no_grad():
    return (rm.normalise(model.encode_image(rm.torch_nchw(images)).numpy()),
            rm.normalise(model.encode_text(torch.from_numpy(tokens.astype(np.int64))).numpy()))


def _hf_embeddings(model, images, tokens):
  with torch.no_grad():
    i = model.get_image_features(pixel_values=rm.torch_nchw(images))
    t = model.get_text_features(input_ids=torch.from_numpy(tokens.astype(np.int64)))
  i = i if isinstance(i, torch.Tensor) else i.pooler_output
  t = t if isinstance(t, torch.Tensor) else t.pooler_output
  return rm.normalise(i.numpy()), rm.normalise(t.numpy())


def _ours(spec, images, tokens):
  model, preprocess, tokenizer = pretrained.load_model(spec)
  return np.asarray(model.encode_image(images)), np.asarray(model.encode_text(tokens)), model, preprocess, tokenizer


def _assert_close(ours, ref, tol=TOL):
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a, b, atol=tol, rtol=0)


@pytest.fixture(scope="module")
def quick_gelu_clip(tmp_path_factory):
  """The tiny quick-GELU open_clip model most tests import, built once: the model, its plain state dict saved as
  a .pt file (one path, so pretrained.load's cache reads it once), the inputs and open_clip's embeddings of them.
  The tests only read it."""
  ref = rm.make_open_clip(rm.tiny_open_clip_cfg(True))
  path = str(tmp_path_factory.mktemp("quick_gelu_clip") / "m.pt")
  torch.save(ref.state_dict(), path)
  images, tokens = rm.images_and_tokens()
  return types.SimpleNamespace(ref=ref, path=path, images=images, tokens=tokens,
                               embeddings=_open_clip_embeddings(ref, images, tokens))


@pytest.mark.parametrize("quick_gelu,fmt", [(True, "openai"), (False, "open_clip")])
def test_open_clip_state_dict_parity(tmp_path, quick_gelu, fmt, quick_gelu_clip):
  ref = quick_gelu_clip.ref if quick_gelu else rm.make_open_clip(rm.tiny_open_clip_cfg(False))
  path = str(tmp_path / "model.pt")
  torch.save({"state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}, "epoch": 3}, path)  # DDP ckpt
  images, tokens = rm.images_and_tokens()
  oi, ot, model, _, tok = _ours(f"{fmt}:{path}", images, tokens)
  _assert_close((oi, ot), _open_clip_embeddings(ref, images, tokens))
  assert model.config.act == ("quick_gelu" if quick_gelu else "gelu") and tok.kind == "clip_bpe"


def test_openai_torchscript_archive(tmp_path, quick_gelu_clip):
  ref, images, tokens = quick_gelu_clip.ref, quick_gelu_clip.images, quick_gelu_clip.tokens

  class Visual(torch.nn.Module):   # an archive with OpenAI's module names (visual.*, transformer.*, ...)
    def __init__(self, m):
      super().__init__()
      for name in ("visual", "transformer", "token_embedding", "ln_final"):
        setattr(self, name, getattr(m, name))
      self.positional_embedding, self.text_projection, self.logit_scale = \
          m.positional_embedding, m.text_projection, m.logit_scale

    def forward(self, x):
      return self.visual(x)

  path = str(tmp_path / "ViT-tiny.pt")
  torch.jit.trace(Visual(ref), (rm.torch_nchw(images),), check_trace=False).save(path)
  _assert_close(_ours(f"openai:{path}", images, tokens)[:2], quick_gelu_clip.embeddings)


def test_open_clip_folder_with_config_head_width_and_safetensors(tmp_path):
  cfg = rm.tiny_open_clip_cfg(False, vw=96, heads=2)   # 48-wide heads: only the config can say so
  ref = rm.make_open_clip(cfg)
  folder = tmp_path / "oc"
  folder.mkdir()
  from safetensors.torch import save_file
  save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
  (folder / "open_clip_config.json").write_text(json.dumps(dict(
      model_cfg=cfg, preprocess_cfg=dict(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], resize_mode="squash"))))
  images, tokens = rm.images_and_tokens()
  oi, ot, model, preprocess, _ = _ours(f"open_clip:{folder}", images, tokens)
  _assert_close((oi, ot), _open_clip_embeddings(ref, images, tokens))
  conf, _ = pretrained.load(f"open_clip:{folder}")
  assert conf.image_heads == 2 and conf.preprocess.normalization == "siglip" and conf.preprocess.resize == "squash"
  assert preprocess(np.zeros((40, 60, 3), np.uint8)).shape == (32, 32, 3)


def test_open_clip_name_in_the_spec_sets_activation_and_head_width(tmp_path, quick_gelu_clip):
  path = str(tmp_path / "w.bin")
  torch.save(quick_gelu_clip.ref.state_dict(), path)
  _assert_close(_ours(f"open_clip:ViT-B-32-quickgelu:{path}", quick_gelu_clip.images, quick_gelu_clip.tokens)[:2],
                quick_gelu_clip.embeddings)
  gelu, _ = pretrained.load(f"open_clip:{path}")   # open_clip's default activation without the name
  assert gelu.act == "gelu"


@pytest.mark.parametrize("act", ["quick_gelu", "gelu"])
def test_hugging_face_clip_model_parity(tmp_path, act):
  ref = rm.make_hf_clip(act=act)
  ref.save_pretrained(str(tmp_path / "hf"))
  images, tokens = rm.images_and_tokens()
  oi, ot, model, _, _ = _ours(f"hf:{tmp_path / 'hf'}", images, tokens)
  _assert_close((oi, ot), _hf_embeddings(ref, images, tokens))
  assert model.config.image_heads == 3 and model.config.image_mlp_dim == 96   # from config.json, not 64-wide


def _meru_sincos_table(grid: int, width: int) -> np.ndarray:
  """MERU's `build_timm_vit(use_sincos2d_pos=True)` position table, restated in torch as its code writes it
  (MoCo v3's): meshgrid(grid_w, grid_h) with torch's default 'ij' indexing, omega = 1 / 10000 ** (arange(d) / d)
  for d = width / 4, [sin(out_w), cos(out_w), sin(out_h), cos(out_h)], a zero row for the class token first."""
  grid_w = torch.arange(grid, dtype=torch.float32)
  grid_h = torch.arange(grid, dtype=torch.float32)
  grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing="ij")
  pos_dim = width // 4
  omega = 1.0 / (10000.0 ** (torch.arange(pos_dim, dtype=torch.float32) / pos_dim))
  out_w = torch.einsum("m,d->md", grid_w.flatten(), omega)
  out_h = torch.einsum("m,d->md", grid_h.flatten(), omega)
  table = torch.cat([torch.sin(out_w), torch.cos(out_w), torch.sin(out_h), torch.cos(out_h)], dim=1)
  return torch.cat([torch.zeros(1, width), table], dim=0)[None].numpy()


@pytest.mark.parametrize("hyperbolic", [True, False])
def test_a_meru_checkpoint_with_meru_s_fixed_position_table_imports_into_meru_s_own_network(tmp_path, hyperbolic):
  """MERU's network as MERU builds it: a checkpoint whose ViT position table is MERU's fixed sin-cos one (its
  default) loads into towers with `posemb='sincos2d_moco'` — the table computed, not a parameter — exact GELU, a
  patch bias and no pre-norm, and both embeddings equal a torch restatement of MERU's forward pass with the table
  restated from its code; configs/meru.py's paper preset builds the same network (no position parameter either)."""
  sd = rm.make_meru_state_dict(hyperbolic=hyperbolic, width=64, patch=8, image_size=32)
  sd["visual.pos_embed"] = _meru_sincos_table(4, 64)
  path = rm.save_torch(sd, str(tmp_path / "meru.pth"), wrap="model")
  images, tokens = rm.images_and_tokens()
  oi, ot, model, _, _ = _ours(f"meru:{path}", images, tokens)
  _assert_close((oi, ot), rm.meru_reference_embeddings(sd, images, tokens))
  conf, params = pretrained.load(f"meru:{path}")
  assert (conf.posemb, conf.act, conf.patch_bias, conf.ln_pre) == ("sincos2d_moco", "gelu", True, False)
  assert "pos_embedding" not in params["img"]
  # big_vision's table differs (column first, another frequency exponent): the MERU one is not a relabelling of it
  from ncjax.models.vit import posemb_sincos_2d
  assert not np.allclose(posemb_sincos_2d(4, 4, 64), sd["visual.pos_embed"][0, 1:], atol=1e-3)
  from helpers import load_config
  from ncjax.models import ModelSpec, build_model
  from flax import nnx
  cfg = load_config("meru", "setting=paper,model=tiny")
  spec = ModelSpec.from_config(cfg.model)
  assert (spec.posemb, spec.act, spec.patch_bias, spec.ln_pre) == ("sincos2d_moco", "gelu", True, False)
  state = nnx.state(nnx.eval_shape(lambda: build_model(spec, vocab_size=64, eot_id=63)))
  assert not any("pos_embedding" in "/".join(map(str, p)) and "img" in "/".join(map(str, p))
                 for p, _ in state.flat_state())


@pytest.mark.parametrize("hyperbolic", [True, False])
def test_meru_checkpoint_mapping_and_geometry(tmp_path, hyperbolic):
  sd = rm.make_meru_state_dict(hyperbolic=hyperbolic)
  path = rm.save_torch(sd, str(tmp_path / "meru.pth"), wrap="model")
  images, tokens = rm.images_and_tokens()
  oi, ot, model, _, _ = _ours(f"meru:{path}", images, tokens)
  ref_i, ref_t = rm.meru_reference_embeddings(sd, images, tokens)
  _assert_close((oi, ot), (ref_i, ref_t))
  conf, params = pretrained.load(f"meru:{path}")
  assert (conf.act, conf.patch_bias, conf.ln_pre, conf.preprocess.normalization) == ("gelu", True, False, "imagenet")
  if hyperbolic:
    assert conf.geometry == "lorentz"
    for name in ("curv", "visual_alpha", "textual_alpha"):
      assert float(params["geometry"][name]) == pytest.approx(float(sd[name]))
    from ncjax.models import lorentz
    c = np.exp(float(sd["curv"]))
    # Scores are the Lorentzian inner product, as MERU's evaluators rank.
    np.testing.assert_allclose(np.asarray(model.score(oi, ot)), np.asarray(lorentz.pairwise_inner(ref_i, ref_t, c)),
                               rtol=1e-4, atol=1e-4)
  else:
    assert conf.geometry == "sphere" and "geometry" not in params


def test_bf16_compute_stays_within_tolerance(quick_gelu_clip):
  images, tokens = quick_gelu_clip.images, quick_gelu_clip.tokens
  conf, params = pretrained.load(f"openai:{quick_gelu_clip.path}")
  import jax
  import ml_collections
  from flax import nnx
  from ncjax import models
  cfg = ml_collections.ConfigDict(dict(pretrained.loading._config_defaults(), **{k: v for k, v in conf.items()
                                                                        if k != "preprocess"}))
  cfg.dtype = "bfloat16"
  # built abstractly: only its structure is used, the checkpoint's parameters go in (a random init costs ~4 s)
  module = nnx.eval_shape(lambda: models.build_two_tower(models.ModelSpec.from_config(cfg), vocab_size=cfg.vocab_size,
                                                         eot_id=49407))
  gd, _ = nnx.split(module, nnx.Param)
  img = np.asarray(jax.jit(lambda p, x: nnx.merge(gd, p).encode_image(x))(params, images))
  txt = np.asarray(jax.jit(lambda p, t: nnx.merge(gd, p).encode_text(t))(params, tokens))
  ri, rt = quick_gelu_clip.embeddings
  assert img.dtype == np.float32
  # bf16 towers: embeddings within 1e-2 of open_clip's float32 (measured 1.7e-3 / 3.1e-3), cosines above 0.9999 —
  # and not equal to them to float32 rounding (the float32 import is within 1e-4, measured ~3e-7): bf16 was used
  for ours, ref_emb in ((img, ri), (txt, rt)):
    assert 1e-4 < np.abs(ours - ref_emb).max() < 1e-2
    assert np.min(np.sum(ours * ref_emb, -1)) > 0.9999


@pytest.mark.parametrize("fmt", ["open_clip", "hf"])
def test_export_round_trips_through_open_clip_and_transformers(tmp_path, fmt, quick_gelu_clip):
  path, images, tokens = quick_gelu_clip.path, quick_gelu_clip.images, quick_gelu_clip.tokens
  conf, params = pretrained.load(f"openai:{path}")
  out = str(tmp_path / f"export_{fmt}")
  pretrained.export(params, conf, out, fmt)
  if fmt == "open_clip":
    back = rm.import_open_clip().create_model(f"local-dir:{out}").eval()
    got = _open_clip_embeddings(back, images, tokens)
  else:
    from transformers import CLIPModel
    back = CLIPModel.from_pretrained(out).eval()
    got = _hf_embeddings(back, images, tokens)
  _assert_close(_ours(f"openai:{path}", images, tokens)[:2], got)
  assert float(back.logit_scale) == pytest.approx(float(params["logit_scale"]), rel=1e-6)
  again, params2 = pretrained.load(f"{fmt}:{out}")   # and ncjax reads its own export
  np.testing.assert_array_equal(params2["img"]["proj"], params["img"]["proj"])


def test_exporting_a_lorentz_or_word_tokenized_model_is_refused(tmp_path):
  path = rm.save_torch(rm.make_meru_state_dict(), str(tmp_path / "meru.pth"), wrap="model")
  conf, params = pretrained.load(f"meru:{path}")
  with pytest.raises(pretrained.UnsupportedArchitecture, match="Lorentz"):
    pretrained.export(params, conf, str(tmp_path / "x"), "open_clip")
  with pytest.raises(pretrained.UnsupportedArchitecture, match="'word' tokenizer"):
    pretrained.export(params, dict(conf, geometry="sphere", patch_bias=False, ln_pre=True), str(tmp_path / "y"),
                      "hf", tokenizer_kind="word")


def test_bad_files_get_errors_naming_the_problem(tmp_path, quick_gelu_clip):
  sd = {k: v.clone() for k, v in quick_gelu_clip.ref.state_dict().items()}
  good = str(tmp_path / "good.safetensors")
  from safetensors.torch import save_file
  save_file({k: v.contiguous() for k, v in sd.items()}, good)
  truncated = str(tmp_path / "cut.safetensors")
  with open(good, "rb") as f, open(truncated, "wb") as g:
    g.write(f.read()[:-1000])
  with pytest.raises(CheckpointFormatError, match="truncated"):
    pretrained.load(f"open_clip:{truncated}")
  junk = str(tmp_path / "junk.pt")
  with open(junk, "wb") as f:
    f.write(b"not a checkpoint")
  with pytest.raises(CheckpointFormatError, match="not a readable PyTorch checkpoint"):
    pretrained.load(f"openai:{junk}")
  with pytest.raises(FileNotFoundError, match="no such file"):
    pretrained.load("openai:/nonexistent/ViT-B-32.pt")
  with pytest.raises(ValueError, match="not a pretrained-model spec"):
    pretrained.parse_spec("timm:vit")
  # A shape mismatch names the key and both shapes.
  sd_bad = dict(sd)
  sd_bad["visual.transformer.resblocks.1.mlp.c_fc.weight"] = torch.zeros(100, 128)
  bad = str(tmp_path / "bad.pt")
  torch.save(sd_bad, bad)
  with pytest.raises(CheckpointFormatError, match=r"'visual.transformer.resblocks.1.mlp.c_fc.weight' has shape "
                                                  r"\(100, 128\).*expects \(128, 512\)"):
    pretrained.load(f"openai:{bad}")
  # Unknown architectures: a ResNet CLIP, extra keys.
  resnet = str(tmp_path / "rn.pt")
  torch.save(dict(sd, **{"visual.layer1.0.conv1.weight": torch.zeros(1)}), resnet)
  with pytest.raises(pretrained.UnsupportedArchitecture, match="ResNet"):
    pretrained.load(f"openai:{resnet}")
  extra = str(tmp_path / "extra.pt")
  torch.save(dict(sd, **{"visual.attn_pool.query": torch.zeros(4)}), extra)
  with pytest.raises(pretrained.UnsupportedArchitecture, match="visual.attn_pool.query"):
    pretrained.load(f"openai:{extra}")


def test_bf16_safetensors_read_without_torch(tmp_path):
  import ml_dtypes
  from ncjax.pretrained.weights_io import write_safetensors
  from safetensors.numpy import save_file
  x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
  path = str(tmp_path / "bf.safetensors")
  save_file({"w": x.astype(ml_dtypes.bfloat16)}, path)
  got = read_tensors(path)["w"]
  assert got.dtype == np.float32 and np.abs(got - x).max() < 1e-2
  write_safetensors(str(tmp_path / "s.safetensors"), {"scalar": np.float32(2.5), "v": x})
  back = read_tensors(str(tmp_path / "s.safetensors"))
  assert back["scalar"].shape == () and float(back["scalar"]) == 2.5


def test_a_pytorch_checkpoint_without_torch_is_a_missing_dependency(tmp_path, monkeypatch):
  """On a host without torch (a Python 3.12 environment here has none), a .pt file is one line with exit status 7
  naming the extra, not an ImportError's traceback and status 1."""
  from ncjax import errors
  path = tmp_path / "model.pt"
  path.write_bytes(b"PK")
  monkeypatch.setitem(__import__("sys").modules, "torch", None)    # `import torch` raises ImportError
  with pytest.raises(errors.MissingDependency, match=r"needs torch: pip install 'ncjax\[torch\]'") as e:
    read_tensors(str(path))
  assert e.value.status == 7


@pytest.mark.slow
def test_vit_b32_parity_open_clip_and_openai_layout(tmp_path):
  ref = rm.import_open_clip().create_model("ViT-B-32", pretrained=None).eval()
  path = str(tmp_path / "b32.pt")
  torch.save(ref.state_dict(), path)
  rng = np.random.default_rng(0)
  images = rng.standard_normal((2, 224, 224, 3)).astype(np.float32)
  _, tokens = rm.images_and_tokens(n=2)
  oi, ot, model, _, _ = _ours(f"open_clip:{path}", images, tokens)
  _assert_close((oi, ot), _open_clip_embeddings(ref, images, tokens))
  assert (model.config.image_width, model.config.image_depth, model.config.image_heads) == (768, 12, 12)
