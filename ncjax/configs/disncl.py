"""DisNCL (Dang et al., TIP 2025) on SGRAF's region backbone (ncjax.methods.disncl; methods.md §5).

  python -m ncjax.main --config=configs/disncl.py:noise=0.4 --workdir=/tmp/disncl --cpu_devices=8
  python -m ncjax.main --config=configs/disncl.py:setting=paper,noise=0.4 --config.input.data_dir=/data/tfds \\
      --workdir=/runs/disncl_f30k
The paper's settings: warm-up 5 epochs of L_align with the constant margin 0.2, then 50 epochs of the full
objective, Adam 2e-4 x0.1 after 25 epochs, batch 128, subspaces of 512, MLPs with 256 hidden units and
LeakyReLU(0.2), gamma = 0.5, beta1 = beta2 = 0.1, beta3 = 0.5, margin base m = 10.
setting: 'synthetic' (the embedded precomp_synthetic's small model, the default there) or 'paper' (the default on any
other data: your precomp features; another feature size: --config.model.region.feature_dim=D).
Reconstructed pieces (no public code; each an option, see README "DisNCL"): loss.margin_kind (default 'exponential':
NCR / BiCro's alpha (m^y - 1) / (m - 1) with m = loss.margin_base), the clean confidence y (diagonal softmax of
H / loss.temperature), L_soft's targets (bootstrapped with beta3), critics on mean-pooled regions / words.
"""

from ncjax import config_lib
from ncjax.config_lib import optional


def get_config(arg=None):
  args = config_lib.parse_arg(arg, setting=optional(str), model=optional(str), data=optional(str),
                              noise=optional(float),
                              noise_file="", batch=optional(int), epochs=optional(int), warmup=optional(int),
                              lr=optional(float), head=optional(str), feature_dim=optional(int),
                              word_dim=optional(int), sim_dim=optional(int), margin_kind="exponential",
                              subspace=optional(int))
  args.setting = args.setting or config_lib.region_preset(args.data)
  a = config_lib.with_preset(args, config_lib.REGION_PRESETS, args.setting)
  paper = args.setting == "paper"
  c = config_lib.base_config()
  c.method.name = "disncl"
  config_lib.region_model(c, a)
  c.num_epochs = a.epochs or (50 if paper else 8)
  if paper:   # the stage after warm-up: lr x0.1 after 25 of its 50 epochs
    c.optim.schedule, c.optim.decay_every_epochs, c.optim.decay_factor = "step", 25, 0.1
  config_lib.region_noise(c, config_lib.noise_for(a.data, a.noise, 0.4), a.noise_file)
  c.method.warmup_epochs = a.warmup if a.warmup is not None else (5 if paper else 4)
  c.method.subspace_dim = a.subspace or (512 if paper else 64)
  c.method.hidden = 256 if paper else 64
  c.method.gamma, c.method.beta1, c.method.beta2, c.method.beta3 = 0.5, 0.1, 0.1, 0.5
  c.method.filtration = True
  c.method.critic_pool = "mean"        # how regions / words become the critics' vectors ('mean' | 'max')
  c.loss.margin_kind = a.margin_kind
  c.loss.margin_base = 10.0
  c.loss.temperature = 0.1   # L_soft's and the confidence's tau (L2RM's Soft_InfoNCE uses 0.1)
  # L_soft: 'bootstrap' (beta3 I + (1 - beta3) sg(softmax(H / tau)) targets) or L2RM's 'soft_infonce' on the labels
  # beta3 I + (1 - beta3) sg(H).
  c.loss.soft_target = "bootstrap"
  c.loss.w_dis, c.loss.w_align, c.loss.w_soft = 1.0, 1.0, 1.0
  return config_lib.lock(c)
