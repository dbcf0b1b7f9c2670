"""CLIP (symmetric InfoNCE) pretraining.

  python -m ncjax.main --config=configs/clip.py:model=tiny,data=digits,noise=0.4 --workdir=/tmp/clip
Arguments: model (size name; default tiny, or the model of the ncjax checkpoint `init` names), data (dataset), noise
(NCR caption-shuffle ratio), batch (global batch), epochs, bf16 (tower compute dtype), train_on (all | clean: only
the pairs the noise left intact, with all pairs' step budget — the perfect-filter reference, NC-bench's `oracle`
row).
"""

from ncjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model=config_lib.optional(str), data="digits", noise=0.0, batch=256, epochs=40,
                           bf16=False, lr=1e-3, init="", train_on="all")
  c = config_lib.base_config()
  c.method.name = "clip"
  config_lib.apply_common(c, model=config_lib.size_of(a.model, "tiny", a.init), data=a.data, batch=a.batch,
                          epochs=a.epochs, noise=a.noise, lr=a.lr, init=a.init)
  c.model.dtype = "bfloat16" if a.bf16 else "float32"
  c.noise.train_on = a.train_on
  # > 0: InfoNCE without any N x N array (ncjax/losses/chunked.py), for very large global batches.
  c.loss.chunk_rows = 0
  config_lib.add_default_evals(c)
  return config_lib.lock(c)
