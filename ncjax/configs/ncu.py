"""NCU unlearning (and its gradient-ascent baseline) starting from an ncjax CLIP checkpoint.

Paper setting (CC3M/CC12M/YFCC15M-R, ViT-B/16 or B/32, global batch 2048, 2 + 8 epochs, the public script's rates),
from OpenAI's weights (the checkpoint sets the architecture) or from an ncjax CLIP run:
  python -m ncjax.main --config=configs/ncu.py:setting=paper,init=openai:/models/ViT-B-32.pt \\
      --config.input.data_dir=/data/tfds --workdir=/runs/ncu_b32
Digits demo (from a CLIP trained on 40%-noisy digits):
  python -m ncjax.main --config=configs/ncu.py:init=/tmp/clip --workdir=/tmp/ncu --cpu_devices=8
On your own data (a table, web shards, any tfds dataset) the 'data' preset applies: the public script's forget ratio
0.1 and text blocks frozen (5 of 12, scaled to the model's text depth), the prompt stage its 2 epochs or 80 steps,
whichever is longer on this data (logged as a data-derived setting); from init=openai:/open_clip:/hf: also the
public script's rates and schedule:
  python -m ncjax.main --config=configs/ncu.py:data=tfds:web_pairs/custom_table,init=/runs/clip_mine \
      --config.input.data_dir=/data/tfds --workdir=/runs/ncu_mine
Arguments: setting (a preset: paper | digits | scenes | data; default: the embedded data's own preset, 'data' on any
other data), method (ncu | ncu_ga), model (default: the init checkpoint's), data, init (an ncjax CLIP workdir,
or openai:PATH / open_clip:PATH / hf:DIR), batch, noise, epochs (the unlearning stage's: every method's `epochs` is
its main stage's), epochs_prompt (the prompt stage before it), ratio (the per-batch forget fraction P), forget_from
(batch | scores), forget_scores, forget_threshold. An argument left out takes the preset's value.

Composition: the forget set from another method's per-sample clean scores instead of the current model's softmax
diagonal — GSC's soft labels or Bayesian CL's positive probabilities, as its noise-detection evaluator saved them:
  python -m ncjax.main --config=configs/ncu.py:init=/tmp/clip,forget_from=scores,forget_scores=/tmp/gsc \
      --workdir=/tmp/ncu_gsc_forget --cpu_devices=8
(forget_scores: a run directory — its latest eval/step_N_clean_scores.npz — or that file; empty: the init run.
The lowest `ratio` of each global batch is forgotten, or with forget_threshold >= 0 every pair scoring below it.)
"""

from ncjax import config_lib
from ncjax.config_lib import optional

# Per-group rates and schedule of the public script (methods.md §1.2); digits uses larger rates for a tiny model.
PRESETS = {
    "paper": dict(
        model="ViT-B/16", data="tfds:web_pairs/cc3m", batch=2048, epochs=8, epochs_prompt=2, ratio=0.1,
        prompt_min_steps=0,
        noise=0.0,                 # CC3M's noise is real
        frozen_text_blocks=5,      # the code freezes 5 of 12 text blocks
        lr_prompt=3e-4, lr_text=1e-4, lr_unlearn=5e-5, lr_ga=5e-5, warmup_steps=100,
        # One cosine over both stages' steps, counted from epoch 1 as the public code does (its 100-step warm-up
        # then never applies; on CC3M the multiplier runs 0.98 -> 0.80 in stage 1 and continues from there).
        schedule_scope="run", schedule_offset_epochs=1,
        grad_clip_norm=0.0,        # the public code does not clip
        bf16=True,
        evals=False,               # web-scale data has no labelled test split: add your own benchmark evaluators
        ckpt_every=1000, log_every=50),
    "digits": dict(
        model="tiny", data="digits", batch=256, epochs=16, epochs_prompt=4, ratio=0.4, prompt_min_steps=0,
        noise=0.4,                 # digits gets NCR caption-shuffle noise
        frozen_text_blocks=1,      # tiny has 2 text blocks
        lr_prompt=2e-3, lr_text=2e-4, lr_unlearn=2e-4,
        # The gradient-ascent baseline's ascent term is unbounded: on digits 2e-4 and 2e-5 collapse the model
        # (zero-shot 16% / 24%); 5e-6 was the best of the three tried.
        lr_ga=5e-6, warmup_steps=5, schedule_scope="stage", schedule_offset_epochs=0, grad_clip_norm=1.0,
        bf16=False, evals=True, ckpt_every=0, log_every=10),
    # The embedded scenes (web data's regime: a mismatched caption fits no other image) with the public script's
    # forget ratio 0.1; a prompt stage of 12 epochs (84 steps: 20 left the negative prompt's cosine to its caption
    # at +0.5-0.7 on digits, far from the [-0.7, -0.2] band); tiny_scenes' context of 40 keeps the end-of-text token
    # of every prompted caption (8 prompt tokens + at most 30 words).
    "scenes": dict(
        model="tiny_scenes", data="scenes", batch=256, epochs=16, epochs_prompt=12, ratio=0.1, noise=0.4,
        prompt_min_steps=0, frozen_text_blocks=1, lr_prompt=2e-3, lr_text=2e-4, lr_unlearn=2e-4, lr_ga=5e-6,
        warmup_steps=5, schedule_scope="stage", schedule_offset_epochs=0, grad_clip_norm=1.0, bf16=False, evals=True,
        ckpt_every=0, log_every=10),
    # Any other data (a user's table, web shards, a tfds dataset): the public script's method settings — forget
    # ratio 0.1, 5 of 12 text blocks frozen (scaled to the model's text depth: -1) — with the small models'
    # optimiser of the embedded presets, and the one setting whose meaning depends on the data's size chosen on it:
    # the prompt stage lasts the public code's 2 epochs or 80 steps, whichever is longer (logged at start-up).
    # From an imported pretrained CLIP (init=openai:/open_clip:/hf:) the public script's rates and schedule apply.
    "data": dict(
        model="tiny", data="digits", batch=256, epochs=16, epochs_prompt=2, prompt_min_steps=80, ratio=0.1,
        noise=0.0, frozen_text_blocks=-1, lr_prompt=2e-3, lr_text=2e-4, lr_unlearn=2e-4, lr_ga=5e-6,
        warmup_steps=5, schedule_scope="stage", schedule_offset_epochs=0, grad_clip_norm=1.0, bf16=False,
        evals=True, ckpt_every=0, log_every=10),
}
# What `data` takes from `paper` when the run starts from an imported pretrained CLIP (the public script's start).
PRETRAINED_IMPORT = ("openai:", "open_clip:", "hf:")
PUBLIC_OPTIMISER = ("epochs", "lr_prompt", "lr_text", "lr_unlearn", "lr_ga", "warmup_steps", "schedule_scope",
                    "schedule_offset_epochs", "grad_clip_norm", "ckpt_every", "log_every")


def data_preset(data) -> str:
  """The preset of the data a config is given: the embedded datasets' own, 'data' for anything else."""
  if data == "scenes":
    return "scenes"
  return "digits" if data is None or data in config_lib.EMBEDDED_DATASETS else "data"


def get_config(arg=None):
  args = config_lib.parse_arg(arg, setting=optional(str), method="ncu", init="", model=optional(str),
                              data=optional(str), batch=optional(int), noise=optional(float), epochs=optional(int),
                              epochs_prompt=optional(int), ratio=optional(float), forget_from="batch",
                              forget_scores="", forget_threshold=-1.0)
  setting = args.setting or data_preset(args.data)   # the data's own preset by default
  presets = PRESETS
  if setting == "data" and args.init.startswith(PRETRAINED_IMPORT):
    presets = dict(PRESETS, data=dict(PRESETS["data"], **{k: PRESETS["paper"][k] for k in PUBLIC_OPTIMISER}))
  a = config_lib.with_preset(args, presets, setting)
  c = config_lib.base_config()
  c.method.name = a.method
  c.method.init_from = a.init
  c.model.size = config_lib.size_of(args.model, a.model, a.init)
  c.input.dataset = a.data
  c.input.global_batch_size = a.batch
  noise = config_lib.noise_for(a.data, args.noise, a.noise)   # the preset's noise on digits, else 0 unless given
  if noise > 0:
    c.noise.kind, c.noise.ratio = "caption_shuffle", noise
  c.method.epochs_prompt = a.epochs_prompt
  c.num_epochs = a.epochs
  c.method.forget_ratio = a.ratio
  c.method.forget_score = "row"        # public code; 'mean' = the paper's Eq. 2
  c.method.forget_from = a.forget_from  # 'batch' (NCU) | 'scores' (another method's per-sample clean scores)
  c.method.forget_scores = a.forget_scores
  c.method.forget_threshold = a.forget_threshold
  c.method.n_ctx = 8
  c.method.train_text_in_prompt = True  # public code; False = the paper's "only the visual encoder frozen" reading
  c.method.frozen_text_blocks = a.frozen_text_blocks   # -1: the public code's 5 of 12, scaled to the text depth
  c.method.prompt_min_steps = a.prompt_min_steps       # > 0: epochs_prompt raised to cover it on this data (logged)
  c.method.lr_prompt = a.lr_prompt
  c.method.lr_text = a.lr_text
  c.method.lr_unlearn = a.lr_unlearn
  c.method.weight_decay_prompt = 0.2
  c.optim.weight_decay = 0.2
  c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.98, 1e-8
  c.optim.warmup_steps = a.warmup_steps
  c.optim.schedule_scope = a.schedule_scope
  c.optim.schedule_offset_epochs = a.schedule_offset_epochs
  c.optim.grad_clip_norm = a.grad_clip_norm
  # The gradient-ascent baseline trains one group at optim.lr.
  c.optim.lr = a.lr_ga if a.method == "ncu_ga" else a.lr_unlearn
  c.model.dtype = "bfloat16" if a.bf16 else "float32"
  # Loss options: public-code defaults, the paper's variants by name (see ncjax/losses/ncu.py).
  c.loss.kappa = 0.7
  c.loss.epsilon = 0.03
  c.loss.sinkhorn_iterations = 100
  c.loss.sinkhorn_threshold = 1e-4
  # 'kernel': the public loop's iterates in scaling form (two mat-vecs per iteration), one solve per side as the code;
  # share_plan=True solves once and transposes (faster, but ~3e-3 off the code's unconverged plans at N = 2048).
  # 'ott' (ott-jax, log domain) and 'reference' (the public loop itself) for parity checks.
  c.loss.solver = "kernel"
  c.loss.share_plan = False
  c.loss.sinkhorn_dtype = "float32"   # 'bfloat16' stores the kernel in bf16 (half the mat-vec traffic)
  # > 0: the memory-lean loss (ncjax/losses/chunked.py) for global batches of 16k-32k and more: only the transport
  # kernel is N x (N+1), split over the devices; logits recomputed per chunk of this many rows in the backward pass.
  c.loss.chunk_rows = 0
  c.loss.normalize_text_targets = False
  c.loss.combine = "mean"
  c.loss.lambda_sep = 1.0
  c.loss.sep_scope = "all"
  c.loss.lambda_rel = 10.0
  c.loss.lambda_sep_prompt = 10.0
  c.loss.rel = "code"
  c.loss.use_itm = True
  c.loss.use_neg_itm = True
  c.loss.use_rel = True
  c.loss.use_sep = True
  c.loss.label_smoothing = 0.1   # gradient-ascent baseline
  c.loss.ga_weight = 1.0
  if a.evals:
    config_lib.add_default_evals(c)
  c.ckpt.every_steps = a.ckpt_every
  c.log.every_steps = a.log_every
  return config_lib.lock(c)
