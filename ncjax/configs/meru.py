"""MERU (Desai et al., 2023): CLIP in the Lorentz model, contrastive loss on -s d_L plus the entailment term.

  python -m ncjax.main --config=configs/meru.py --workdir=/tmp/meru --cpu_devices=8            # digits
  python -m ncjax.main --config=configs/meru.py:setting=paper,data=tfds:web_pairs/redcaps \\
      --config.input.data_dir=/data/tfds --workdir=/runs/meru_vit_b
MERU's public configs (methods.md §4.1): entailment weight 0.2, curvature initialised at 1 and learned in
[0.1, 10], alphas log(1/sqrt(512)) clamped <= 0, logit scale log(1/0.07) clamped <= ln 100 (all on the stored
values, after every step), AdamW lr 5e-4, betas (0.9, 0.98), eps 1e-8, wd 0.2 (0 for norms, biases, scalars),
no gradient clipping, batch 2048 for 120k iterations (4k of warm-up), random resized crops of scale (0.5, 1),
ImageNet normalisation. The paper preset builds MERU's own network (`towers=meru`): its image encoder is a timm ViT
(a bias on the patch embedding, no pre-norm, exact GELU, MoCo v3's fixed 2-D sin-cos position table with a zero
entry for the class token) and its text encoder CLIP's with exact GELU, so a MERU checkpoint imports into it as it
is; the digits preset keeps CLIP's towers (`towers=clip`: quick GELU, ln_pre, learned positions). Arguments:
setting (paper | digits), model, data, batch, epochs, steps (the main stage in iterations instead of epochs; paper:
120000), lr, entail_weight, towers (meru | clip), init.
"""

from ncjax import config_lib
from ncjax.config_lib import optional

PRESETS = {
    "paper": dict(model="ViT-B/16", data="tfds:web_pairs/redcaps", batch=2048, epochs=10, steps=120000, lr=5e-4,
                  warmup=4000, normalization="imagenet", bf16=True, evals=False, grad_clip=0.0, eps=1e-8,
                  crop_scale=(0.5, 1.0), towers="meru"),
    "digits": dict(model="tiny", data="digits", batch=256, epochs=40, steps=None, lr=1e-3, warmup=20,
                   normalization="openai", bf16=False, evals=True, grad_clip=1.0, eps=1e-6, crop_scale=(0.9, 1.0),
                   towers="clip"),
}

TOWERS = ("meru", "clip")


def meru_towers(c) -> None:
  """MERU's network (`build_timm_vit` and its text encoder): see the module docstring."""
  c.model.patch_bias, c.model.ln_pre, c.model.act, c.model.posemb = True, False, "gelu", "sincos2d_moco"


def get_config(arg=None):
  args = config_lib.parse_arg(arg, setting="digits", model=optional(str), data=optional(str), batch=optional(int),
                              epochs=optional(int), steps=optional(int), lr=optional(float), noise=0.0,
                              entail_weight=0.2, towers=optional(str), init="")
  a = config_lib.with_preset(args, PRESETS, args.setting)
  c = config_lib.base_config()
  c.method.name = "meru"
  config_lib.apply_common(c, model=config_lib.size_of(args.model, a.model, a.init), data=a.data, batch=a.batch,
                          epochs=a.epochs, noise=a.noise, lr=a.lr, weight_decay=0.2, warmup_steps=a.warmup, init=a.init)
  c.model.geometry = "lorentz"
  c.model.curv_init = 1.0
  if a.towers not in TOWERS:
    raise config_lib.ConfigError(f"meru: towers={a.towers!r}; expected one of {TOWERS}")
  if a.towers == "meru":
    meru_towers(c)
  c.model.dtype = "bfloat16" if a.bf16 else "float32"
  c.input.normalization = a.normalization
  c.input.crop_scale = tuple(a.crop_scale)
  c.num_steps = a.steps
  c.optim.grad_clip_norm = a.grad_clip
  c.optim.eps = a.eps
  c.loss.entail_weight = a.entail_weight
  c.loss.min_radius = 0.1
  if a.evals:
    config_lib.add_default_evals(c)
  return config_lib.lock(c)
