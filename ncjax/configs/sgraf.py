"""SGRAF's hinge baseline on region features (max-violation triplet loss, margin 0.2): the reference point of the
noisy-correspondence retrieval methods (NCR, GSC, DisNCL) on the same backbone.

  python -m ncjax.main --config=configs/sgraf.py:noise=0.4 --workdir=/tmp/sgraf --cpu_devices=8
  python -m ncjax.main --config=configs/sgraf.py:setting=paper,noise=0.4 --config.input.data_dir=/data/tfds \\
      --workdir=/runs/sgraf_f30k
Presets (ncjax.config_lib.REGION_PRESETS): 'synthetic' (the default on the embedded precomp_synthetic data, a
small model) and 'paper' (F30K precomp, 36 x 2048 regions, the SGRAF sizes, 40 epochs, lr x0.1 after 30 as NCR: the
default on any other data — your precomp features; another feature size: --config.model.region.feature_dim=D).
Arguments: setting, data, noise (NCR caption shuffle), noise_file (a shared NCR / DECL noise file: per-caption int64
image index), batch, epochs, lr, head ('sgr' | 'saf').
"""

from ncjax import config_lib
from ncjax.config_lib import optional


def get_config(arg=None):
  args = config_lib.parse_arg(arg, setting=optional(str), model=optional(str), data=optional(str),
                              noise=optional(float),
                              noise_file="", batch=optional(int), epochs=optional(int), lr=optional(float),
                              head=optional(str), feature_dim=optional(int), word_dim=optional(int),
                              sim_dim=optional(int))
  args.setting = args.setting or config_lib.region_preset(args.data)
  a = config_lib.with_preset(args, config_lib.REGION_PRESETS, args.setting)
  c = config_lib.base_config()
  c.method.name = "sgraf"
  config_lib.region_model(c, a)
  paper = args.setting == "paper"
  # synthetic: 3 epochs over all negatives + 9 of max violation = 12, the budget of the other region demo rows
  c.num_epochs = a.epochs or (40 if paper else 9)
  if paper:
    c.optim.schedule, c.optim.decay_every_epochs, c.optim.decay_factor = "step", 30, 0.1
  config_lib.region_noise(c, config_lib.noise_for(a.data, a.noise, 0.4), a.noise_file)
  return config_lib.lock(c)
