"""Bayesian contrastive learning with Gamma pair weights (stochastic-EM weighted InfoNCE).

  python -m ncjax.main --config=configs/bayes.py:noise=0.4 --workdir=/tmp/bayes --cpu_devices=8
  python -m ncjax.main --config=configs/bayes.py:weights=paper --workdir=/tmp/bayes_paper   # the paper's b = 0
The paper's hyper-parameters: a_u = 1, b_u = 0, a_+ = 5, a_- = 10, b_+ = b_- = 0, 2 Gibbs sweeps from w = 1;
`weights` selects how the rates / normalisation are set (see ncjax/methods/bayes.py and the README).
"""

from ncjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model="tiny", data="digits", noise=0.4, batch=256, epochs=40, lr=1e-3,
                           weights="unit_prior", u_momentum=0.0, protocol="ncr")
  c = config_lib.base_config()
  c.method.name = "bayes"
  c.model.size = a.model
  c.input.dataset = a.data
  c.input.global_batch_size = a.batch
  c.num_epochs = a.epochs
  if a.noise > 0:
    # 'ncr': a fixed caption-shuffle index (comparable with the other rows); 'in_batch': the paper's protocol.
    c.noise.kind = "caption_shuffle" if a.protocol == "ncr" else "in_batch_resample"
    c.noise.ratio = a.noise
  c.loss.a_u, c.loss.b_u = 1.0, 0.0
  c.loss.a_pos, c.loss.b_pos = 5.0, 0.0
  c.loss.a_neg, c.loss.b_neg = 10.0, 0.0
  c.loss.n_sweeps = 2
  c.loss.w_init = 1.0
  c.loss.weights = a.weights
  c.loss.u_momentum = a.u_momentum
  c.optim.lr = a.lr
  c.optim.weight_decay = 0.1
  c.optim.warmup_steps = 20
  c.evals.zeroshot = dict(type="zeroshot", split="test", templates="digits", every_steps=0)
  c.evals.retrieval = dict(type="retrieval", split="test", every_steps=0)
  c.evals.noise_detection = dict(type="noise_detection", every_steps=0)
  return config_lib.lock(c)
