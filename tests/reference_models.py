"""Reference models for parity tests, built locally with random weights (nothing is downloaded)."""

import json
import os

import numpy as np

from ncjax.testing import import_open_clip  # noqa: F401  (re-exported for the tests)


def tiny_open_clip_cfg(quick_gelu: bool, image_size=32, patch=8, vw=128, vlayers=2, tw=128, tlayers=2, heads=2,
                       embed=32, context=77):
  return dict(embed_dim=embed, quick_gelu=quick_gelu,
              vision_cfg=dict(image_size=image_size, layers=vlayers, width=vw, patch_size=patch, head_width=vw // heads),
              text_cfg=dict(context_length=context, vocab_size=49408, width=tw, heads=heads, layers=tlayers))


def make_open_clip(cfg: dict, seed: int = 0):
  """A randomly initialised open_clip CLIP of the given model config (eval mode, float32)."""
  import torch
  oc = import_open_clip()
  name = f"ncjax-test-{abs(hash(json.dumps(cfg, sort_keys=True)))}"
  from open_clip import factory
  factory._MODEL_CONFIGS[name] = cfg
  torch.manual_seed(seed)
  model = oc.create_model(name, pretrained=None)
  with torch.no_grad():   # random, non-trivial values everywhere (open_clip zero-initialises some)
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
    model.logit_scale.fill_(np.log(1 / 0.07))
  return model.eval()


def make_hf_clip(seed: int = 0, act: str = "quick_gelu", eos_token_id: int = 49407):
  import torch
  from transformers import CLIPConfig, CLIPModel
  torch.manual_seed(seed)
  cfg = CLIPConfig(
      text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=77, vocab_size=49408, hidden_act=act, eos_token_id=eos_token_id,
                       bos_token_id=49406, pad_token_id=1),
      vision_config=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
                         image_size=32, patch_size=8, hidden_act=act),
      projection_dim=32)
  model = CLIPModel(cfg)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
  return model.eval()


def make_meru_state_dict(seed: int = 0, hyperbolic: bool = True, width=64, depth=2, patch=8, image_size=32,
                         tw=64, tdepth=2, embed=32):
  """A state dict with facebookresearch/meru's key names and shapes (timm ViT 'visual.*', MERU's text encoder
  'textual.*', projections, logit scale, log-curvature, log-alphas, pixel statistics)."""
  rng = np.random.default_rng(seed)
  r = lambda *s: (0.05 * rng.standard_normal(s)).astype(np.float32)
  n = (image_size // patch) ** 2 + 1
  sd = {"visual.cls_token": r(1, 1, width), "visual.pos_embed": r(1, n, width),
        "visual.patch_embed.proj.weight": r(width, 3, patch, patch), "visual.patch_embed.proj.bias": r(width),
        "visual.norm.weight": 1 + r(width), "visual.norm.bias": r(width),
        "textual.token_embed.weight": r(49408, tw), "textual.posit_embed": r(77, tw),
        "textual.ln_final.weight": 1 + r(tw), "textual.ln_final.bias": r(tw),
        "textual.attn_mask": np.triu(np.ones((77, 77), bool), 1),
        "visual_proj.weight": r(embed, width), "textual_proj.weight": r(embed, tw),
        "logit_scale": np.asarray(np.log(1 / 0.07), np.float32),
        "pixel_mean": np.asarray([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1),
        "pixel_std": np.asarray([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)}
  for i in range(depth):
    p = f"visual.blocks.{i}"
    sd.update({f"{p}.norm1.weight": 1 + r(width), f"{p}.norm1.bias": r(width), f"{p}.attn.qkv.weight": r(3 * width, width),
               f"{p}.attn.qkv.bias": r(3 * width), f"{p}.attn.proj.weight": r(width, width),
               f"{p}.attn.proj.bias": r(width), f"{p}.norm2.weight": 1 + r(width), f"{p}.norm2.bias": r(width),
               f"{p}.mlp.fc1.weight": r(4 * width, width), f"{p}.mlp.fc1.bias": r(4 * width),
               f"{p}.mlp.fc2.weight": r(width, 4 * width), f"{p}.mlp.fc2.bias": r(width)})
  for i in range(tdepth):
    p = f"textual.resblocks.{i}"
    sd.update({f"{p}.ln_1.weight": 1 + r(tw), f"{p}.ln_1.bias": r(tw), f"{p}.attn.in_proj_weight": r(3 * tw, tw),
               f"{p}.attn.in_proj_bias": r(3 * tw), f"{p}.attn.out_proj.weight": r(tw, tw),
               f"{p}.attn.out_proj.bias": r(tw), f"{p}.ln_2.weight": 1 + r(tw), f"{p}.ln_2.bias": r(tw),
               f"{p}.mlp.c_fc.weight": r(4 * tw, tw), f"{p}.mlp.c_fc.bias": r(4 * tw),
               f"{p}.mlp.c_proj.weight": r(tw, 4 * tw), f"{p}.mlp.c_proj.bias": r(tw)})
  if hyperbolic:
    sd.update(curv=np.asarray(np.log(0.7), np.float32), visual_alpha=np.asarray(np.log(0.3), np.float32),
              textual_alpha=np.asarray(np.log(0.2), np.float32))
  return sd


def save_torch(state_dict: dict, path: str, wrap: str | None = None):
  import torch
  sd = {k: torch.as_tensor(np.asarray(v)) for k, v in state_dict.items()}
  torch.save({wrap: sd, "iteration": 10} if wrap else sd, path)
  return path


def images_and_tokens(n=4, size=32, seed=0):
  """Preprocessed NHWC float32 images and CLIP BPE tokens of a few varied captions."""
  from ncjax.tokenizers import get_tokenizer
  rng = np.random.default_rng(seed)
  images = rng.standard_normal((n, size, size, 3)).astype(np.float32)
  texts = ["a photo of a cat", "two dogs playing in the snow, ❄️", "", "naïve café"][:n]
  return images, get_tokenizer("clip_bpe")(texts)


def torch_nchw(images):
  import torch
  return torch.from_numpy(np.ascontiguousarray(np.transpose(images, (0, 3, 1, 2))))


def normalise(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def meru_reference_embeddings(sd: dict, images, tokens):
  """MERU's forward pass restated in torch from its public architecture (facebookresearch/meru): a timm ViT
  (patch conv with bias, class token + fixed position table, pre-norm blocks with fused qkv, GELU, LayerNorm eps
  1e-5, final norm, class-token pooling), MERU's text encoder (nn.MultiheadAttention blocks, causal mask, GELU,
  ln_final, features at the argmax token), bias-free projections, then x * exp(alpha) and exp_map0 with the
  curvature exp(curv). Returns (image space components, text space components)."""
  import torch
  import torch.nn.functional as F
  t = {k: torch.as_tensor(np.asarray(v, np.float32)) for k, v in sd.items() if np.asarray(v).dtype != bool}
  ln = lambda x, p: F.layer_norm(x, x.shape[-1:], t[f"{p}.weight"], t[f"{p}.bias"], 1e-5)
  lin = lambda x, p: F.linear(x, t[f"{p}.weight"], t.get(f"{p}.bias"))

  def attention(x, qkv_w, qkv_b, out_w, out_b, heads, causal):
    b, n, w = x.shape
    q, k, v = F.linear(x, qkv_w, qkv_b).reshape(b, n, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.linear(y.transpose(1, 2).reshape(b, n, w), out_w, out_b)

  with torch.no_grad():
    x = torch.as_tensor(np.ascontiguousarray(np.transpose(images, (0, 3, 1, 2))))
    x = F.conv2d(x, t["visual.patch_embed.proj.weight"], t["visual.patch_embed.proj.bias"],
                 stride=t["visual.patch_embed.proj.weight"].shape[-1])
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([t["visual.cls_token"].expand(x.shape[0], -1, -1), x], 1) + t["visual.pos_embed"]
    width = x.shape[-1]
    heads = 12 if width == 384 else width // 64
    i = 0
    while f"visual.blocks.{i}.norm1.weight" in t:
      p = f"visual.blocks.{i}"
      x = x + attention(ln(x, f"{p}.norm1"), t[f"{p}.attn.qkv.weight"], t[f"{p}.attn.qkv.bias"],
                        t[f"{p}.attn.proj.weight"], t[f"{p}.attn.proj.bias"], heads, False)
      x = x + lin(F.gelu(lin(ln(x, f"{p}.norm2"), f"{p}.mlp.fc1")), f"{p}.mlp.fc2")
      i += 1
    img = F.linear(ln(x, "visual.norm")[:, 0], t["visual_proj.weight"])

    tok = torch.as_tensor(np.asarray(tokens, np.int64))
    y = t["textual.token_embed.weight"][tok] + t["textual.posit_embed"][:tok.shape[1]]
    tw = y.shape[-1]
    i = 0
    while f"textual.resblocks.{i}.ln_1.weight" in t:
      p = f"textual.resblocks.{i}"
      y = y + attention(ln(y, f"{p}.ln_1"), t[f"{p}.attn.in_proj_weight"], t[f"{p}.attn.in_proj_bias"],
                        t[f"{p}.attn.out_proj.weight"], t[f"{p}.attn.out_proj.bias"], tw // 64, True)
      y = y + lin(F.gelu(lin(ln(y, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
      i += 1
    y = ln(y, "textual.ln_final")
    txt = F.linear(y[torch.arange(y.shape[0]), tok.argmax(-1)], t["textual_proj.weight"])
    if "curv" not in t:
      return F.normalize(img, dim=-1).numpy(), F.normalize(txt, dim=-1).numpy()
    curv = t["curv"].exp()

    def exp_map0(v):
      r = curv.sqrt() * v.norm(dim=-1, keepdim=True)
      return torch.sinh(torch.clamp(r, 1e-8, float(np.arcsinh(2 ** 15)))) * v / torch.clamp(r, min=1e-8)

    return (exp_map0(img * t["visual_alpha"].exp()).numpy(), exp_map0(txt * t["textual_alpha"].exp()).numpy())
