"""Hyperbolic alignment calibration (HAC, HAC-reg) on MERU: AC with sim = -d_L, entailment calibration and a
Lorentz-norm regulariser (slides' eq. 7-11; ncjax/losses/ac.py documents the readings of eq. 9 and 11).

  python -m ncjax.main --config=configs/meru.py --workdir=/tmp/meru                     # the model to unlearn from
  python -m ncjax.main --config=configs/hac.py:init=/tmp/meru,classes=three --workdir=/tmp/hac
  python -m ncjax.main --config=configs/hac.py:init=meru:/models/meru_vit_b.pth,data=tfds:web_pairs/redcaps,\\
      subreddits=dogs,eval_forget=dog --config.input.data_dir=/data/tfds --workdir=/runs/hac_dogs
Variants (same starting checkpoint): calibrate (HAC; lam > 0 makes it HAC-reg), retain (f-M-R), all (f-M),
original (O-M). Defaults: the slides' best rows, alpha = gamma = 0.5, beta = 0.5, epsilon = 0.1, omega_r = 0.2,
omega_f = 1.0, lam = 0.5 (HAC-reg, Table 4; lam=0 is HAC). f_ent_on: 'forget' (the text's reading of eq. 9) or
'retain' (as printed); norm_reg: 'toward_origin' (eq. 11 as printed) or 'away'. towers: 'clip' (the digits MERU
run's towers) or 'meru' (MERU's own network, configs/meru.py's paper preset: set it when unlearning from such a run;
a `meru:PATH` checkpoint sets its architecture itself).
"""

from ncjax import config_lib
from ncjax.configs import meru as meru_config


def get_config(arg=None):
  a = config_lib.parse_arg(arg, init="", variant="calibrate", classes=config_lib.optional(str), keywords="",
                           subreddits="", eval_forget="", model=config_lib.optional(str), data="digits", batch=128,
                           epochs=5, lr=2e-4, alpha=0.5, beta=0.5, gamma=0.5, epsilon=0.1, omega_r=0.2, omega_f=1.0,
                           lam=0.5, f_ent_on="forget", norm_reg="toward_origin", entail_weight=0.2, towers="clip")
  c = config_lib.base_config()
  config_lib.concept_unlearning(c, a, geometry="lorentz")
  c.loss.omega_r, c.loss.omega_f, c.loss.lam = a.omega_r, a.omega_f, a.lam
  c.loss.f_ent_on, c.loss.norm_reg = a.f_ent_on, a.norm_reg
  c.loss.min_radius = 0.1
  c.loss.entail_weight = a.entail_weight   # the f-M / f-M-R baselines train MERU's own loss
  if a.towers not in meru_config.TOWERS:
    raise config_lib.ConfigError(f"hac: towers={a.towers!r}; expected one of {meru_config.TOWERS}")
  if a.towers == "meru":
    meru_config.meru_towers(c)
  return config_lib.lock(c)
