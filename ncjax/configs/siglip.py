"""SigLIP (pairwise sigmoid loss with a learnable bias; Zhai et al., 2023).

  python -m ncjax.main --config=configs/siglip.py:model=tiny,noise=0.4 --workdir=/tmp/siglip
The paper's initialisation: logit_scale = log(10), bias = -10.
"""

import math

from ncjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model=config_lib.optional(str), data="digits", noise=0.0, batch=256, epochs=40,
                           bf16=False, lr=1e-3, init="")
  c = config_lib.base_config()
  c.method.name = "siglip"
  config_lib.apply_common(c, model=config_lib.size_of(a.model, "tiny", a.init), data=a.data, batch=a.batch,
                          epochs=a.epochs, noise=a.noise, lr=a.lr, init=a.init)
  c.model.dtype = "bfloat16" if a.bf16 else "float32"
  c.model.logit_scale_init = math.log(10.0)
  c.model.logit_bias_init = -10.0
  config_lib.add_default_evals(c)
  return config_lib.lock(c)
