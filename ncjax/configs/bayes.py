"""Bayesian contrastive learning with Gamma pair weights (stochastic-EM weighted InfoNCE).

  python -m ncjax.main --config=configs/bayes.py:noise=0.4 --workdir=/tmp/bayes --cpu_devices=8
  python -m ncjax.main --config=configs/bayes.py:weights=paper --workdir=/tmp/bayes_paper   # the paper's b = 0
The paper's hyper-parameters: a_u = 1, b_u = 0, a_+ = 5, a_- = 10, b_+ = b_- = 0, 2 Gibbs sweeps from w = 1;
`weights` selects how the rates / normalisation are set (see ncjax/methods/bayes.py and docs/methods.md); `tau`
fixes the temperature of s = exp(cos / tau) (0: the model's learned one; the paper's sim = e^{cos} is tau=1);
protocol=in_batch with per_device=true corrupts each device's part of the batch on its own, as the paper's 128 pairs
per GPU.
"""

from ncjax import config_lib
from ncjax.config_lib import optional


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model=optional(str), data="digits", noise=optional(float), batch=256, epochs=40,
                           lr=1e-3, init="", weights="unit_prior", u_momentum=0.0, protocol="ncr", tau=0.0,
                           per_device=False)
  c = config_lib.base_config()
  c.method.name = "bayes"
  # protocol 'ncr': a fixed caption-shuffle index (comparable with the other rows); 'in_batch': the paper's.
  config_lib.apply_common(c, model=config_lib.size_of(a.model, "tiny", a.init), data=a.data, batch=a.batch,
                          epochs=a.epochs, noise=config_lib.noise_for(a.data, a.noise, 0.4), lr=a.lr, init=a.init,
                          noise_kind="caption_shuffle" if a.protocol == "ncr" else "in_batch_resample")
  c.loss.a_u, c.loss.b_u = 1.0, 0.0
  c.loss.a_pos, c.loss.b_pos = 5.0, 0.0
  c.loss.a_neg, c.loss.b_neg = 10.0, 0.0
  c.loss.n_sweeps = 2
  c.loss.w_init = 1.0
  c.loss.weights = a.weights
  c.loss.u_momentum = a.u_momentum
  # s = exp(cos / tau) with the model's learned temperature (0) or a fixed tau (the paper's sim = e^{cos}: tau=1).
  c.loss.tau = a.tau
  # protocol 'in_batch': resample within each device's batch (the paper's 128 per GPU) instead of the global batch.
  c.noise.per_device = a.per_device
  config_lib.add_default_evals(c)
  return config_lib.lock(c)
