"""NCU: noisy-correspondence unlearning of a pretrained CLIP (Han et al., ICCV 2025), and the gradient-ascent
baseline of its Sec. 5.3.

One run, one config, two stages (resumable in either):
  * 'prompt' (method.epochs_prompt epochs): learn the hardest-negative prompt on the retained pairs of each global
    batch (ncjax.losses.ncu.prompt). The image tower is frozen; the text tower, token embedding, projection and
    logit_scale train at lr_text as in the public code (method.train_text_in_prompt=False freezes them, as the paper
    states); the prompt trains at lr_prompt.
  * 'unlearn' (num_epochs epochs: the main stage): the masked-OT unlearning loss (ncjax.losses.ncu.unlearning). The
    prompt, the first `frozen_text_blocks` text blocks (5 of 12 in the code; -1 scales that share to the model's
    text depth) and the text positional embedding are frozen; everything else trains at lr_unlearn; logit_scale is
    clamped to [0, ln 100] after every step.
The forget set is re-selected on every global batch from the current model (stop-gradient). Per-sample state keeps
each example's last clean confidence and whether it was forgotten, for noise-detection metrics.
The model starts from a CLIP checkpoint (`method.init_from`: an ncjax run or a pretrained spec).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ncjax.contract import chain_post_updates
from ncjax.losses import ncu as ncu_loss
from ncjax.methods.base import BenchEntry, ParamGroup, Stage, Update
from ncjax.methods.registry import register
from ncjax.methods.two_tower import SingleModelMethod, TwoTowerMethod, clamp_logit_scale, stored_clamps
from ncjax.models.prompt import NegativePrompt, encode_negative_text
from ncjax.numerics import MAX_LOGIT_SCALE
from ncjax.options import Options, loss_option, method_option, nested_options

# The public code clamps logit_scale to [0, ln 100] after every unlearning step (not in the prompt stage).
UNLEARN_CLAMP = clamp_logit_scale(0.0, MAX_LOGIT_SCALE)

FORGET_FROM = ("batch", "scores")


@dataclasses.dataclass(frozen=True)
class ForgetOptions(Options):
  """Where each global batch's forget set comes from (`forget_from`):
    'batch'  (NCU): the floor(ratio N) pairs of the global batch with the lowest clean confidence of the current
             model (`forget_score`: 'row', the public code's image->text softmax diagonal, or 'mean', Eq. 2);
    'scores' (composition): the same rule over per-sample clean scores another method estimated — GSC's soft
             labels, Bayesian CL's positive probabilities — read once from `forget_scores` (a `*_clean_scores.npz`
             the noise-detection evaluator wrote, or a run directory: its latest one; empty: the run named by
             `method.init_from`); `forget_threshold` >= 0 forgets every pair below it instead of a fixed fraction."""
  forget_ratio: float = method_option(0.1)
  forget_score: str = method_option("row")
  forget_from: str = method_option("batch")
  forget_scores: str = method_option("")
  forget_threshold: float = method_option(-1.0)

  def __post_init__(self):
    if self.forget_from not in FORGET_FROM:
      raise ValueError(f"method.forget_from={self.forget_from!r}; expected one of {FORGET_FROM}")
    if self.forget_score not in ("row", "mean"):
      raise ValueError(f"unknown method.forget_score {self.forget_score!r}; expected 'row' (public code) or "
                       "'mean' (paper Eq. 2)")


@dataclasses.dataclass(frozen=True)
class NCUOptions(ForgetOptions):
  """The public script's settings (methods.md §1.2); `prompt` and `unlearning` are the two stages' loss options
  (ncjax.losses.ncu), read from `config.loss`."""
  n_ctx: int = method_option(8)
  epochs_prompt: int = method_option(2)
  lr_prompt: float = method_option(3e-4)
  lr_text: float = method_option(1e-4)
  lr_unlearn: float = method_option(5e-5)
  weight_decay_prompt: float = method_option(0.2)
  train_text_in_prompt: bool = method_option(True)
  # -1: the public code's 5 of 12 scaled to the model's text depth (ViT-B: 5; tiny's 2 blocks: 1): text_blocks_frozen
  frozen_text_blocks: int = method_option(5)
  # > 0: the prompt stage lasts at least this many steps — epochs_prompt is raised to cover them on this data
  # (from_data). The public code's 2 epochs are ~2,900 steps of CC3M but 2 steps of a 1,000-pair table; a prompt
  # trained for 20 steps left the negative prompt's cosine to its caption at +0.5..0.7, far from L_sep's
  # [-0.7, -0.2] band, and 84 steps reached it (configs/ncu.py, the scenes preset).
  prompt_min_steps: int = method_option(0)
  prompt: ncu_loss.PromptOptions = nested_options(ncu_loss.PromptOptions, section="loss")
  unlearning: ncu_loss.UnlearningOptions = nested_options(ncu_loss.UnlearningOptions, section="loss")

  PUBLIC_FROZEN_TEXT_BLOCKS = (5, 12)   # the code freezes resblocks 0-4 of CLIP's 12 (methods.md §1.1)

  def __post_init__(self):
    super().__post_init__()
    if self.frozen_text_blocks < -1:
      raise ValueError(f"method.frozen_text_blocks={self.frozen_text_blocks}; expected a count >= 0, or -1 (the "
                       f"public code's 5 of 12 scaled to the model's text depth)")
    if self.epochs_prompt < 0 or self.prompt_min_steps < 0:
      raise ValueError(f"method.epochs_prompt={self.epochs_prompt}, method.prompt_min_steps="
                       f"{self.prompt_min_steps}: expected counts >= 0")

  def text_blocks_frozen(self, text_depth: int | None) -> int:
    """How many leading text blocks the unlearning stage freezes: `frozen_text_blocks`, or with -1 the public
    code's share of a 12-block text tower (5/12, rounded half up) of `text_depth`."""
    if self.frozen_text_blocks >= 0:
      return self.frozen_text_blocks
    if not text_depth:
      raise ValueError("method.frozen_text_blocks=-1 scales the public code's 5 of 12 to the text tower's depth, "
                       "and this model's text tower states none: set method.frozen_text_blocks to a count")
    frozen, of = self.PUBLIC_FROZEN_TEXT_BLOCKS
    return int(frozen * text_depth / of + 0.5)

  def wants_data_profile(self) -> bool:
    return self.prompt_min_steps > 0

  def from_data(self, profile):
    if self.prompt_min_steps <= 0:
      return self, []
    per_epoch = max(int(profile.steps_per_epoch), 1)
    epochs = max(self.epochs_prompt, -(-self.prompt_min_steps // per_epoch))
    note = (f"NCU method.epochs_prompt={self.epochs_prompt} -> {epochs}: the prompt stage lasts at least "
            f"method.prompt_min_steps={self.prompt_min_steps} steps, and an epoch of this data is {per_epoch} "
            f"step(s) of {profile.global_batch_size}")
    return dataclasses.replace(self, epochs_prompt=epochs), [note]


@dataclasses.dataclass(frozen=True)
class GradientAscentOptions(ForgetOptions):
  label_smoothing: float = loss_option(0.1)
  ga_weight: float = loss_option(1.0)


class _ForgetStateMixin:
  """Per-sample confidence and forget flags, keyed by example id (last time each example was seen), and the
  forget set of each global batch (ForgetOptions)."""

  @classmethod
  def prior_scores_source(cls, options: ForgetOptions, init_from: str) -> str | None:
    return (options.forget_scores or init_from) if options.forget_from == "scores" else None

  def init_state(self, capacity):
    state = dict(confidence=jnp.ones((capacity,), jnp.float32), forgotten=jnp.zeros((capacity,), bool))
    if self.options.forget_from == "scores":
      state["prior_score"] = jnp.asarray(self.prior_scores(capacity))
    return state

  def prior_scores(self, capacity: int):
    """float32[capacity]: the other method's clean score per example id (the padding beyond the data: +inf,
    never forgotten)."""
    scores = self.setup.prior_scores
    if scores is None:
      raise ValueError("method.forget_from='scores' but no prior scores were read: build the method through "
                       "ncjax.experiment (it reads method.forget_scores)")
    out = np.full((capacity,), np.inf, np.float32)
    out[:len(scores)] = scores
    return out

  def forget_mask(self, state, batch, confidence):
    """bool[N]: this global batch's forget set (see ForgetOptions)."""
    o = self.options
    if o.forget_from == "batch":
      return ncu_loss.lowest_fraction(confidence, o.forget_ratio)
    return ncu_loss.select_forget_by_score(state["prior_score"][batch["id"]], o.forget_ratio,
                                           o.forget_threshold if o.forget_threshold >= 0 else None)

  @staticmethod
  def record(state, ids, confidence, forget_mask):
    return dict(state, confidence=state["confidence"].at[ids].set(jax.lax.stop_gradient(confidence)),
                forgotten=state["forgotten"].at[ids].set(forget_mask))

  def update_state(self, state, batch, metrics):
    return self.record(state, batch["id"], metrics["confidence"], metrics["forget_mask"])

  def clean_scores(self, params, state):
    del params
    return state["confidence"], state["forgotten"]


@register("ncu")
class NCU(_ForgetStateMixin, TwoTowerMethod):
  needs_trained_start = "unlearns the noisy pairs a trained CLIP memorised"

  Options = NCUOptions
  bench = (
      BenchEntry("ncu", "NCU: unlearning the CLIP run of its cell (forget set: each batch's least confident pairs)",
                 "ncu", start="clip"),
      # Compositions: NCU's unlearning applied after another method's run of the same cell, or its forget set
      # taken from another method's per-sample clean scores instead of the current model's softmax diagonal.
      BenchEntry("gsc_then_ncu", "composition: NCU unlearning the GSC run of its cell", "ncu", start="gsc"),
      BenchEntry("bayes_then_ncu", "composition: NCU unlearning the Bayesian CL run of its cell", "ncu",
                 start="bayes"),
      BenchEntry("ncu_gsc_forget", "composition: NCU unlearning the CLIP run, forget set = lowest GSC soft labels "
                 "per batch", "ncu", "forget_from=scores", start="clip", scores="gsc"),
      BenchEntry("ncu_bayes_forget", "composition: NCU unlearning the CLIP run, forget set = lowest Bayesian CL "
                 "probabilities", "ncu", "forget_from=scores", start="clip", scores="bayes"),
  )

  def create_modules(self):
    mods = super().create_modules()
    width = mods["model"].txt.width
    mods["prompt"] = NegativePrompt(self.options.n_ctx, width, rngs=nnx.Rngs(self.setup.seed + 1))
    return mods

  # --- losses ------------------------------------------------------------------------------------------------------
  def _embed(self, params, batch):
    mods = self.bind(params)
    model = mods.model
    img = model.encode_image(batch["image"])
    txt = model.encode_text(batch["tokens"])
    neg = encode_negative_text(model, mods.prompt, batch["tokens"], getattr(self.tokenizer, "unk_id", 1))
    return model, img, txt, neg

  def _embed_and_select(self, params, state, batch):
    """Embeddings of the global batch and its forget set (no gradient): from the current model's confidence, or
    from the prior scores of `forget_from='scores'`."""
    o = self.options
    model, img, txt, neg = self._embed(params, batch)
    scale = model.get_logit_scale()
    conf = jax.lax.stop_gradient(ncu_loss.clean_confidence(img, txt, scale, o.forget_score,
                                                           o.unlearning.chunk_rows))
    return img, txt, neg, scale, self.forget_mask(state, batch, conf), conf

  def prompt_stage_loss(self, params, state, batch, rng):
    del rng
    img, txt, neg, scale, forget, conf = self._embed_and_select(params, state, batch)
    out = ncu_loss.prompt(img, txt, neg, scale, forget, self.options.prompt)
    metrics = dict(out.scalars, forget_fraction=jnp.mean(forget.astype(jnp.float32)))
    return out.loss, (metrics, self.record(state, batch["id"], conf, forget))

  def unlearn_stage_loss(self, params, state, batch, rng):
    del rng
    img, txt, neg, scale, forget, conf = self._embed_and_select(params, state, batch)
    out = ncu_loss.unlearning(img, txt, neg, scale, forget, self.options.unlearning)
    metrics = dict(out.scalars, logit_scale=jnp.exp(scale))
    return out.loss, (metrics, self.record(state, batch["id"], conf, forget))

  # --- schedule ------------------------------------------------------------------------------------------------------
  def stages(self):
    o, setup = self.options, self.setup
    frozen = self.frozen_groups()
    text_groups = ([ParamGroup(r"model/txt/.*|model/logit_scale", o.lr_text, setup.weight_decay, name="text")]
                   if o.train_text_in_prompt else [])
    prompt_stage = Stage("prompt", o.epochs_prompt, (Update("prompt", self.prompt_stage_loss, tuple(
        frozen + [ParamGroup(r"prompt/.*", o.lr_prompt, o.weight_decay_prompt, name="prompt")] + text_groups
        + [ParamGroup(".*", None, name="frozen_rest")])),), post_update=stored_clamps(self.model_spec))
    blocks = "|".join(str(i) for i in range(o.text_blocks_frozen(self.model_spec.towers["text"].get("depth"))))
    frozen_text = (rf"model/txt/(transformer/block_({blocks})/.*|pos_embedding)" if blocks
                   else r"model/txt/pos_embedding")
    unlearn_stage = self.main_stage("unlearn", (Update(
        "unlearn", self.unlearn_stage_loss, tuple(
            frozen + [ParamGroup(r"prompt/.*", None, name="prompt_frozen"),
                      ParamGroup(frozen_text, None, name="text_frozen"),
                      ParamGroup(".*", o.lr_unlearn, setup.weight_decay, name="unlearn")])),),
        post_update=chain_post_updates(stored_clamps(self.model_spec), UNLEARN_CLAMP))
    if setup.num_steps is None and setup.num_epochs < 1:
      raise ValueError(f"num_epochs={setup.num_epochs}: NCU's unlearning stage needs at least one epoch (the "
                       f"prompt stage's {o.epochs_prompt} come before it)")
    return (prompt_stage, unlearn_stage)


@register("ncu_ga")
class GradientAscent(_ForgetStateMixin, SingleModelMethod):
  """NCU paper Sec. 5.3's gradient-ascent baseline (ncjax.losses.ncu.gradient_ascent) on the per-batch forget set,
  selected as NCU does."""
  needs_trained_start = "unlearns the noisy pairs of a trained CLIP by gradient ascent"

  Options = GradientAscentOptions
  bench = (BenchEntry("ncu_ga", "gradient-ascent unlearning of the CLIP run (NCU paper's baseline)", "ncu",
                      "method=ncu_ga", start="clip"),)

  def model_loss(self, model, batch, rng, state):
    del rng
    o = self.options
    img, txt = model.encode_image(batch["image"]), model.encode_text(batch["tokens"])
    scale = model.get_logit_scale()
    conf = jax.lax.stop_gradient(ncu_loss.clean_confidence(img, txt, scale, o.forget_score))
    forget = self.forget_mask(state, batch, conf)
    loss, metrics = ncu_loss.gradient_ascent(img, txt, scale, forget, label_smoothing=o.label_smoothing,
                                             ga_weight=o.ga_weight)
    return loss, dict(metrics, logit_scale=jnp.exp(scale), confidence=conf, forget_mask=forget)

  def post_update(self):
    return chain_post_updates(stored_clamps(self.model_spec), UNLEARN_CLAMP)
