"""Alignment calibration (AC) on CLIP: forget a concept, keep the rest (slides' eq. 1-6; ncjax/losses/ac.py).

  python -m ncjax.main --config=configs/clip.py --workdir=/tmp/clip                     # the model to unlearn from
  python -m ncjax.main --config=configs/ac.py:init=/tmp/clip,classes=three --workdir=/tmp/ac
  python -m ncjax.main --config=configs/ac.py:init=/tmp/clip,classes=three,variant=retain --workdir=/tmp/fcr
Variants, all from the same starting checkpoint (`init`: an ncjax workdir or openai:PATH / open_clip:PATH / hf:DIR):
  calibrate  AC on batches of N retain + N forget pairs (global batch 2N)
  retain     f-C-R: CLIP fine-tuned on the retain pairs only
  all        f-C:   CLIP fine-tuned on all pairs
  original   O-C:   the starting model, evaluated as it is
The concept: classes (label names, '+'-separated), keywords (caption words), subreddits (RedCaps; names or groups
such as dogs / cats / food; on digits classes is three unless a concept is named, on other data one is required);
eval_forget: the classes of the evaluation data scored as forgotten (default: classes).
Weights: AC's best row of the slides (carried into their Table 5), alpha = gamma = 0.75, beta = 0.5,
epsilon = 0.1 (alpha = gamma = 0.5 is HAC's best row, configs/hac.py). R-acc / F-acc use the slides' prompt
"a picture of a [CLASS]".
"""

from ncjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, init="", variant="calibrate", classes=config_lib.optional(str), keywords="",
                           subreddits="", eval_forget="", model=config_lib.optional(str), data="digits", batch=128,
                           epochs=5, lr=2e-4, alpha=0.75, beta=0.5, gamma=0.75, epsilon=0.1)
  c = config_lib.base_config()
  config_lib.concept_unlearning(c, a, geometry="sphere")
  return config_lib.lock(c)
