"""GSC (geometrical structure consistency) and GSC+ (co-teaching) on two-tower models.

  python -m ncjax.main --config=configs/gsc.py:noise=0.4 --workdir=/tmp/gsc --cpu_devices=8
  python -m ncjax.main --config=configs/gsc.py:noise=0.4,coteach=true --workdir=/tmp/gscplus --cpu_devices=8
Public-code defaults (methods.md §2.5): tau1 = 0.07, tau2 = 1, beta = 0.7 for both EMAs, gamma = 0.01 (F30K;
0.05 for GSC+ on COCO, 0.02 on CC152K), labels start at 1, no warm-up.
"""

from ncjax import config_lib
from ncjax.config_lib import optional


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model="tiny", data="digits", noise=0.4, batch=256, epochs=40, coteach=False,
                           gamma=0.01, lr=1e-3, init="", temperature="fixed", warmup=optional(int))
  c = config_lib.base_config()
  c.method.name = "gsc"
  c.method.co_teaching = a.coteach
  c.method.beta = 0.7
  # Epochs before the first label update. The public code has none by default (an epoch of F30K is ~1,100 steps);
  # an epoch of digits is 5 steps, too few to learn anything before labels are estimated.
  c.method.warmup_epochs = a.warmup if a.warmup is not None else (a.epochs // 2 if a.data == "digits" else 0)
  config_lib.apply_common(c, model=a.model, data=a.data, batch=a.batch, epochs=a.epochs, noise=a.noise, lr=a.lr,
                          init=a.init)
  c.loss.tau1 = 0.07
  c.loss.tau2 = 1.0
  c.loss.gamma = a.gamma
  # 'fixed': S / tau1 as the paper; 'model': the two-tower's learned logit scale replaces 1 / tau1.
  c.loss.temperature = a.temperature
  config_lib.add_default_evals(c)
  return config_lib.lock(c)
