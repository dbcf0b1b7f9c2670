"""NCU: noisy-correspondence unlearning of a pretrained CLIP (Han et al., ICCV 2025), and the gradient-ascent
baseline of its Sec. 5.3.

One run, one config, two stages (resumable in either):
  * 'prompt' (method.epochs_prompt epochs): learn the hardest-negative prompt on the retained pairs of each global
    batch (ncjax.losses.ncu.prompt_loss). The image tower is frozen; the text tower, token embedding, projection and
    logit_scale train at lr_text as in the public code (method.train_text_in_prompt=False freezes them, as the paper
    states); the prompt trains at lr_prompt.
  * 'unlearn' (the remaining epochs): the masked-OT unlearning loss (ncjax.losses.ncu.unlearning_loss). The prompt,
    the first `frozen_text_blocks` text blocks (5 of 12 in the code) and the text positional embedding are frozen;
    everything else trains at lr_unlearn; logit_scale is clamped to [0, ln 100] after every step.
The forget set is re-selected on every global batch from the current model (stop-gradient). Per-sample state keeps
each example's last clean confidence and whether it was forgotten, for noise-detection metrics.
The model starts from a CLIP checkpoint produced by ncjax (`method.init_from`).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ncjax.losses import contrastive, ncu as ncu_loss
from ncjax.methods.base import ParamGroup, Stage, Update
from ncjax.methods.registry import register
from ncjax.contract import chain_post_updates, latest_clean_scores
from ncjax.methods.two_tower import SingleModelMethod, TwoTowerMethod, clamp_logit_scale, stored_clamps
from ncjax.models.prompt import NegativePrompt, encode_negative_text
from ncjax.numerics import MAX_LOGIT_SCALE

# The public code clamps logit_scale to [0, ln 100] after every unlearning step (not in the prompt stage).
UNLEARN_CLAMP = clamp_logit_scale(0.0, MAX_LOGIT_SCALE)


FORGET_FROM = ("batch", "scores")


class _ForgetStateMixin:
  """Per-sample confidence and forget flags, keyed by example id (last time each example was seen), and where the
  forget set comes from (`method.forget_from`):
    'batch'  (NCU): the floor(P·N) pairs of each global batch with the lowest clean confidence of the current model;
    'scores' (composition): the same rule over per-sample clean scores another method estimated — GSC's soft
             labels, Bayesian CL's positive probabilities — read once from `method.forget_scores` (a
             `*_clean_scores.npz` the noise-detection evaluator wrote, or a run directory: its latest one; empty:
             the run named by `method.init_from`); `method.forget_threshold` >= 0 forgets every pair below it
             instead of a fixed fraction."""

  def init_state(self, capacity):
    state = dict(confidence=jnp.ones((capacity,), jnp.float32), forgotten=jnp.zeros((capacity,), bool))
    if self.forget_from == "scores":
      state["prior_score"] = jnp.asarray(self.prior_scores(capacity))
    return state

  @property
  def forget_from(self) -> str:
    mode = self.config.method.get("forget_from", "batch")
    if mode not in FORGET_FROM:
      raise ValueError(f"method.forget_from={mode!r}; expected one of {FORGET_FROM}")
    return mode

  def prior_scores(self, capacity: int) -> np.ndarray:
    """float32[capacity]: the other method's clean score per example id (the padding beyond the data: +inf,
    never forgotten)."""
    m = self.config.method
    source = m.get("forget_scores", "") or m.init_from
    scores = load_clean_scores(source, self.num_examples, self.noise_sha256)
    out = np.full((capacity,), np.inf, np.float32)
    out[:len(scores)] = scores
    return out

  def forget_mask(self, state, batch, confidence):
    """bool[N]: this global batch's forget set (see the class docstring)."""
    m = self.config.method
    if self.forget_from == "batch":
      return ncu_loss.lowest_fraction(confidence, m.forget_ratio)
    threshold = m.get("forget_threshold", -1.0)
    return ncu_loss.select_forget_by_score(state["prior_score"][batch["id"]], m.forget_ratio,
                                           threshold if threshold >= 0 else None)

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

  def __init__(self, config, **kw):
    super().__init__(config, **kw)
    self.prompt_options = ncu_loss.PromptOptions.from_config(config.loss)
    self.unlearning_options = ncu_loss.UnlearningOptions.from_config(config.loss)

  def create_modules(self):
    mods = super().create_modules()
    width = mods["model"].txt.width
    mods["prompt"] = NegativePrompt(self.config.method.n_ctx, width, rngs=nnx.Rngs(self.config.seed + 1))
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
    m = self.config.method
    model, img, txt, neg = self._embed(params, batch)
    scale = model.get_logit_scale()
    conf = jax.lax.stop_gradient(ncu_loss.clean_confidence(img, txt, scale, m.forget_score,
                                                           self.config.loss.get("chunk_rows", 0)))
    return img, txt, neg, scale, self.forget_mask(state, batch, conf), conf

  def prompt_stage_loss(self, params, state, batch, rng):
    del rng
    img, txt, neg, scale, forget, conf = self._embed_and_select(params, state, batch)
    out = ncu_loss.prompt(img, txt, neg, scale, forget, self.prompt_options)
    metrics = dict(out.scalars, forget_fraction=jnp.mean(forget.astype(jnp.float32)))
    return out.loss, (metrics, self.record(state, batch["id"], conf, forget))

  def unlearn_stage_loss(self, params, state, batch, rng):
    del rng
    img, txt, neg, scale, forget, conf = self._embed_and_select(params, state, batch)
    out = ncu_loss.unlearning(img, txt, neg, scale, forget, self.unlearning_options)
    metrics = dict(out.scalars, logit_scale=jnp.exp(scale))
    return out.loss, (metrics, self.record(state, batch["id"], conf, forget))

  # --- schedule ------------------------------------------------------------------------------------------------------
  def stages(self):
    m, optim = self.config.method, self.config.optim
    frozen = [ParamGroup(optim.freeze, None, name="frozen")] if optim.freeze else []
    text_groups = ([ParamGroup(r"model/txt/.*|model/logit_scale", m.lr_text, optim.weight_decay, name="text")]
                   if m.train_text_in_prompt else [])
    prompt_stage = Stage("prompt", m.epochs_prompt, (Update("prompt", self.prompt_stage_loss, tuple(
        frozen + [ParamGroup(r"prompt/.*", m.lr_prompt, m.weight_decay_prompt, name="prompt")] + text_groups
        + [ParamGroup(".*", None, name="frozen_rest")])),), post_update=stored_clamps(self.config))
    blocks = "|".join(str(i) for i in range(m.frozen_text_blocks))
    frozen_text = (rf"model/txt/(transformer/block_({blocks})/.*|pos_embedding)" if blocks
                   else r"model/txt/pos_embedding")
    unlearn_stage = Stage("unlearn", self.config.num_epochs - m.epochs_prompt, (Update(
        "unlearn", self.unlearn_stage_loss, tuple(
            frozen + [ParamGroup(r"prompt/.*", None, name="prompt_frozen"),
                      ParamGroup(frozen_text, None, name="text_frozen"),
                      ParamGroup(".*", m.lr_unlearn, optim.weight_decay, name="unlearn")])),),
                          post_update=chain_post_updates(stored_clamps(self.config), UNLEARN_CLAMP))
    if self.config.num_epochs <= m.epochs_prompt:
      raise ValueError(f"num_epochs={self.config.num_epochs} leaves no unlearning epochs after "
                       f"method.epochs_prompt={m.epochs_prompt}")
    return (prompt_stage, unlearn_stage)


def label_smoothed_infonce_terms(logits, smoothing: float):
  """Per-pair symmetric CLIP loss with label smoothing (targets (1 - eps) on the diagonal, eps spread uniformly)."""
  n = logits.shape[0]
  targets = (1.0 - smoothing) * jnp.eye(n, dtype=jnp.float32) + smoothing / n
  i2t = -jnp.sum(targets * jax.nn.log_softmax(logits, axis=1), axis=1)
  t2i = -jnp.sum(targets * jax.nn.log_softmax(logits, axis=0), axis=0)
  return 0.5 * (i2t + t2i)


@register("ncu_ga")
class GradientAscent(_ForgetStateMixin, SingleModelMethod):
  """NCU paper Sec. 5.3's gradient-ascent baseline: -L_CLIP on the per-batch forget set (selected as NCU does) plus
  label-smoothed L_CLIP on the retained set; both over the global batch's logits."""

  loss_reads_state = True   # the forget set may come from the per-sample prior scores in `state`

  def model_loss(self, model, batch, rng, state):
    del rng
    m, lc = self.config.method, self.config.loss
    img, txt = model.encode_image(batch["image"]), model.encode_text(batch["tokens"])
    scale = model.get_logit_scale()
    conf = jax.lax.stop_gradient(ncu_loss.clean_confidence(img, txt, scale, m.forget_score))
    forget = self.forget_mask(state, batch, conf)
    logits = contrastive.cosine_logits(img, txt, scale)
    _, base = contrastive.infonce_from_logits(logits)
    smoothed = label_smoothed_infonce_terms(logits, lc.label_smoothing)
    f = forget.astype(jnp.float32)
    n_f, n_r = jnp.maximum(f.sum(), 1.0), jnp.maximum((1 - f).sum(), 1.0)
    ascent = -jnp.sum(f * base["per_pair_loss"]) / n_f
    retain = jnp.sum((1 - f) * smoothed) / n_r
    loss = lc.ga_weight * ascent + retain
    return loss, dict(loss_ascent=ascent, loss_retain=retain, logit_scale=jnp.exp(scale), confidence=conf,
                      forget_mask=forget)

  def post_update(self):
    return chain_post_updates(stored_clamps(self.config), UNLEARN_CLAMP)


def load_clean_scores(source: str, num_examples: int, noise_sha256: str | None = None) -> np.ndarray:
  """Per-example clean scores (example-id order) from a `*_clean_scores.npz` the noise-detection evaluator wrote,
  or from a run directory (the one of its latest evaluation). Checks they score this run's training pairs: the
  same number of examples and, when both are recorded, the same noise index."""
  if not source:
    raise ValueError("method.forget_from='scores' needs method.forget_scores (a *_clean_scores.npz or a run "
                     "directory) or method.init_from naming the run whose scores to use")
  path = source
  if os.path.isdir(source):
    path = latest_clean_scores(source)
    if path is None:
      raise FileNotFoundError(
          f"{source} has no eval/step_<N>_clean_scores.npz: the run's noise_detection evaluator writes it at its "
          "final evaluation (evals.noise_detection with plot=True); run `ncjax eval --checkpoints=" + source
          + "` to write it")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"method.forget_scores: no such file {path!r} (expected a *_clean_scores.npz)")
  with np.load(path) as data:
    if "scores" not in data:
      raise ValueError(f"{path} has no 'scores' array (keys: {sorted(data)})")
    scores = np.asarray(data["scores"], np.float32)
    theirs = str(data["noise_sha256"]) if "noise_sha256" in data else ""
  if num_examples and scores.shape != (num_examples,):
    raise ValueError(f"{path} scores {scores.shape} examples, this run trains on {num_examples}: the scores must "
                     "come from a run on the same training pairs")
  if noise_sha256 and theirs and theirs != noise_sha256:
    raise ValueError(f"{path} was computed on other noisy pairs (noise index sha256 {theirs[:12]}..., this run "
                     f"{noise_sha256[:12]}...): use the same data, noise ratio and noise seed")
  if not np.all(np.isfinite(scores)):
    raise ValueError(f"{path} holds {int(np.sum(~np.isfinite(scores)))} non-finite scores")
  return scores
