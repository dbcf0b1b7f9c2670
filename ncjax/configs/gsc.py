"""GSC (geometrical structure consistency) and GSC+ (co-teaching) on two-tower models.

  python -m ncjax.main --config=configs/gsc.py:noise=0.4 --workdir=/tmp/gsc --cpu_devices=8
  python -m ncjax.main --config=configs/gsc.py:noise=0.4,coteach=true --workdir=/tmp/gscplus --cpu_devices=8
  python -m ncjax.main --config=configs/gsc.py:setting=paper,data=tfds:karpathy/flickr30k,noise=0.4,coteach=true \\
      --config.input.data_dir=/data/tfds --workdir=/runs/gscplus_f30k
On SGRAF's region backbone, the published setting (the public code's S = sigmoid(SGR), image-image and
caption-caption structures through the shared head):
  python -m ncjax.main --config=configs/gsc.py:backbone=sgraf,noise=0.4 --workdir=/tmp/gsc_sgraf --cpu_devices=8
  python -m ncjax.main --config=configs/gsc.py:backbone=sgraf,setting=paper,noise=0.4,coteach=true \
      --config.input.data_dir=/data/tfds --workdir=/runs/gscplus_f30k_precomp
Public-code defaults (methods.md §2.5): tau1 = 0.07, tau2 = 1, beta = 0.7 for both EMAs, gamma = 0.01 (F30K;
0.05 for GSC+ on COCO, 0.02 on CC152K), labels start at 1, no warm-up. Presets: 'paper' is the public code's
optimiser (Adam, lr 2e-4, gradient clipping at 2 per network, lr x0.2 every 15 epochs, 60 epochs, batch 128);
'digits' the embedded data's recipe, 'scenes' the same with the public code's softmax indicator (the default on
data=scenes); 'data' — the default on any other data (a user's table, web shards, Flickr30K, ...) — digits'
optimiser with the public code's method settings (no warm-up) and the indicator chosen from the data
(indicator=auto, logged at start-up); on the region backbone (backbone=sgraf) any data but the embedded
precomp_synthetic gets 'paper', the public code's whole recipe. Arguments left out take the preset's value.

indicator: y_CM, the cross-modal half of the soft label. 'softmax' is the public code's softmax diagonal (the
paper preset); digits uses 'max_ratio' (the diagonal relative to its row's best match): ten classes put ~25
same-class captions in every batch of 256, which caps a clean pair's softmax diagonal near 1/25: the labels collapse
towards 0 and a clean pair's weight reflects its batch's class counts more than its cleanness (ncjax.losses.gsc).
'auto' measures that property on the training captions (how many other pairs of a batch have a pair's exact
caption, on average: embedded digits 0.90 at batch 256, scenes and web-like captions 0.00) and takes 'max_ratio'
from 0.5, else the public code's 'softmax' (ncjax.methods.gsc); the choice is logged at start-up.

warmup: epochs trained with every label at 1 before the first label update. The public code has none: its first
update runs at the end of epoch 0 (warmup=0); warmup=k runs it at the end of epoch k, so labels first weight the
loss in epoch k + 1. Digits defaults to half the run (an epoch of digits is 5 steps, too few to learn anything
before labels are estimated; an epoch of F30K is ~1,100 steps); scenes, data and paper use the public code's 0: on
scenes half a run of unweighted training memorises the noisy captions before the first label exists, and a user's
data is no different (issue 46: 3,000 scenes as a user's table, 40% noise: zero-shot 25.8 -> 32.1, rsum 199 -> 242
with the public code's recipe).
"""

from ncjax import config_lib
from ncjax.config_lib import optional

PRESETS = {
    "paper": dict(model="ViT-B/32", data="tfds:karpathy/flickr30k", batch=128, epochs=60, lr=2e-4, optimizer="adam",
                  weight_decay=0.0, grad_clip=2.0, schedule="step", decay_every=15, decay_factor=0.2, warmup=0,
                  warmup_steps=0, indicator="softmax"),
    "digits": dict(model="tiny", data="digits", batch=256, epochs=40, lr=1e-3, optimizer="adamw", weight_decay=0.1,
                   grad_clip=1.0, schedule="cosine", decay_every=0, decay_factor=0.1, warmup=None, warmup_steps=20,
                   indicator="max_ratio"),
    # The embedded scenes: digits' optimiser with the public code's softmax indicator — a scenes caption fits only
    # its own image, so no batch holds equivalent pairs to cap the diagonal — and the public code's warm-up (none):
    # labels held at 1 for half the run let the model memorise the noisy captions first (docs/notes/
    # scenes_diagnosis_cpu.md: noise AUC 0.64 with warmup=30 of 60 epochs, 0.97 with warmup=0).
    "scenes": dict(model="tiny_scenes", data="scenes", batch=256, epochs=40, lr=1e-3, optimizer="adamw",
                   weight_decay=0.1, grad_clip=1.0, schedule="cosine", decay_every=0, decay_factor=0.1, warmup=0,
                   warmup_steps=20, indicator="softmax"),
    # Any other data (a user's table, web shards, a tfds dataset): digits' optimiser, the public code's method
    # settings, and the one setting that exists for a property of data chosen from that property, on this data.
    "data": dict(model="tiny", data="digits", batch=256, epochs=40, lr=1e-3, optimizer="adamw", weight_decay=0.1,
                 grad_clip=1.0, schedule="cosine", decay_every=0, decay_factor=0.1, warmup=0, warmup_steps=20,
                 indicator="auto"),
}



def data_preset(data, backbone: str = "two_tower") -> str:
  """The preset of the data a config is given: the embedded datasets' own, 'data' for anything else — on SGRAF's
  region backbone 'paper', the public code's whole recipe (a user's precomp data is F30K's kind)."""
  if data == "scenes":
    return "scenes"
  if data is None or data in config_lib.EMBEDDED_DATASETS:
    return "digits"
  return "paper" if backbone == "sgraf" else "data"


def get_config(arg=None):
  args = config_lib.parse_arg(arg, setting=optional(str), model=optional(str), data=optional(str),
                              noise=optional(float),
                              batch=optional(int), epochs=optional(int), coteach=False, gamma=0.01,
                              lr=optional(float), init="", temperature="fixed", warmup=optional(int),
                              backbone="two_tower", head=optional(str), indicator=optional(str))
  args.setting = args.setting or data_preset(args.data, args.backbone)
  a = config_lib.with_preset(args, PRESETS, args.setting)
  c = config_lib.base_config()
  c.method.name = "gsc"
  c.method.co_teaching = a.coteach
  c.method.beta = 0.7
  c.method.warmup_epochs = a.warmup if a.warmup is not None else a.epochs // 2
  config_lib.apply_common(c, model=config_lib.size_of(args.model, a.model, a.init), data=a.data, batch=a.batch,
                          epochs=a.epochs, noise=config_lib.noise_for(a.data, a.noise, 0.4), lr=a.lr,
                          weight_decay=a.weight_decay, warmup_steps=a.warmup_steps, init=a.init)
  c.optim.name = a.optimizer
  c.optim.grad_clip_norm = a.grad_clip
  c.optim.schedule = a.schedule
  c.optim.decay_every_epochs = a.decay_every
  c.optim.decay_factor = a.decay_factor
  c.loss.tau1 = 0.07
  c.loss.tau2 = 1.0
  c.loss.gamma = a.gamma
  # 'fixed': S / tau1 as the paper; 'model': the two-tower's learned logit scale replaces 1 / tau1.
  c.loss.temperature = a.temperature
  # y_CM: 'softmax' (the public code's softmax diagonal) | 'max_ratio' (relative to the row's best match; see
  # ncjax.losses.gsc.cross_modal_indicator: batches with many equivalent pairs cap 'softmax' at 1/duplicates)
  c.loss.indicator = a.indicator
  if a.backbone == "sgraf":   # region features: the SGRAF preset's model and data, GSC's optimiser and schedule
    given = dict(model=args.model, data=args.data, batch=args.batch, lr=args.lr, head=args.head)
    region = dict(config_lib.REGION_PRESETS["paper" if args.setting == "paper" else "synthetic"],
                  **{k: v for k, v in given.items() if v is not None})
    region_args = config_lib.ml_collections.ConfigDict(region)
    config_lib.region_model(c, region_args)
    # the caption-caption structure as each public code builds it: SCAN attention between the two captions' words
    # in GSC's single-network code, position-aligned word differences in GSC+'s
    c.model.region.text_structure = "aligned" if a.coteach else "attention"
    c.optim.name, c.optim.grad_clip_norm, c.optim.weight_decay = a.optimizer, 2.0, 0.0
    if args.setting != "paper":
      c.num_epochs = args.epochs or 12
      c.method.warmup_epochs = a.warmup if a.warmup is not None else c.num_epochs // 2
      c.optim.lr = region_args.lr
    return config_lib.lock(c)
  if a.backbone != "two_tower":
    raise ValueError(f"unknown backbone {a.backbone!r}; expected 'two_tower' or 'sgraf'")
  config_lib.add_default_evals(c)
  return config_lib.lock(c)
