"""NC-bench: every listed method on the same noise, data, seeds and budget (ncjax/cli/ncbench.py).

  ncjax ncbench --config=configs/ncbench.py:noise=0.2+0.4+0.6,seeds=3,methods=clip+ncu+gsc+bayes \\
      --workdir=/runs/ncbench --cpu_devices=8
  ncjax ncbench --config=configs/ncbench.py:data=tfds:web_pairs/custom_table,noise=0+0.2+0.4,methods=clip+gsc \\
      --config.bench.data_dir=/data/tfds --workdir=/runs/ncbench_mine
  ncjax ncbench --config=configs/ncbench.py:data=precomp_synthetic,methods=sgraf+gsc_sgraf+disncl --workdir=...
Arguments: data (any dataset the data layer reads), noise (levels joined by '+'), seeds, methods (joined by '+':
clip, siglip, ncu, ncu_ga, gsc, gsc_plus, bayes, sgraf, gsc_sgraf, disncl, and the compositions gsc_then_ncu and
bayes_then_ncu — NCU unlearning the GSC / Bayesian CL model — and ncu_gsc_forget and ncu_bayes_forget — NCU unlearning
the CLIP model with its forget set taken from GSC's soft labels / Bayesian CL's positive probabilities), epochs and batch (the same budget for every method; NCU: its unlearning epochs; default: each
method's own config), reference (a method trained on clean captions once per seed — noise 0 — whose drop to its
noisy runs the table's 'recovered' column measures each method against; default 'clip' on the embedded datasets,
none on a user's data, whose noise is real), model (the two-tower size every method trains; default 'tiny_deep' on
digits — tiny with a 4-block image tower, see ncjax/models/sizes.py —, 'tiny_scenes' on scenes, else each method's
own config).
"""

import ml_collections

from ncjax import config_lib
from ncjax.config_lib import optional


# The two-tower size every method trains on the embedded image datasets (elsewhere: each method's own config).
DEFAULT_MODELS = {"digits": "tiny_deep", "scenes": "tiny_scenes"}


def get_config(arg=None):
  a = config_lib.parse_arg(arg, data="digits", data_dir="", noise="0.2+0.4+0.6", seeds=1,
                           methods="clip+ncu+gsc+bayes", epochs=optional(int), batch=optional(int),
                           reference=optional(str), model=optional(str))
  c = ml_collections.ConfigDict()
  c.bench = ml_collections.ConfigDict(dict(
      data=a.data, data_dir=a.data_dir, noise=tuple(float(x) for x in config_lib.plus_list(a.noise)),
      seeds=int(a.seeds), methods=config_lib.plus_list(a.methods), epochs=a.epochs or 0, batch=a.batch or 0,
      reference=a.reference if a.reference is not None else
      ("clip" if a.data in config_lib.EMBEDDED_DATASETS else ""),
      model=a.model if a.model is not None else DEFAULT_MODELS.get(a.data, "")))
  return config_lib.lock(c)
