"""CLIP (symmetric InfoNCE) pretraining.

  python -m ncjax.main --config=configs/clip.py:model=tiny,data=digits,noise=0.4 --workdir=/tmp/clip
Arguments: model (size name), data (dataset), noise (NCR caption-shuffle ratio), batch (global batch), epochs,
bf16 (tower compute dtype).
"""

from ncjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model="tiny", data="digits", noise=0.0, batch=256, epochs=40, bf16=False,
                           lr=1e-3)
  c = config_lib.base_config()
  c.method.name = "clip"
  c.model.size = a.model
  c.model.dtype = "bfloat16" if a.bf16 else "float32"
  c.input.dataset = a.data
  c.input.global_batch_size = a.batch
  c.num_epochs = a.epochs
  if a.noise > 0:
    c.noise.kind, c.noise.ratio = "caption_shuffle", a.noise
  c.optim.lr = a.lr
  c.optim.weight_decay = 0.1
  c.optim.warmup_steps = 20
  c.log.every_steps = 10
  c.evals.zeroshot = dict(type="zeroshot", split="test", templates="digits", every_steps=0)
  c.evals.retrieval = dict(type="retrieval", split="test", every_steps=0)
  c.evals.noise_detection = dict(type="noise_detection", every_steps=0)
  return config_lib.lock(c)
