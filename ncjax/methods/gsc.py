"""GSC and GSC+ (co-teaching) on two-tower models (ncjax.losses.gsc; methods.md §2).

Per step, for each network: S = the model's similarity of images and captions, A = image-image and Bc = text-text
cosine structures, y = the current soft labels of the batch (the *peer's* under co-teaching), then
gsc.batch_loss; the batch's y_CM and S_IM are written into per-sample state by example id. Once per epoch,
`end_of_epoch` runs the dataset-wide update (min-max normalisation, GMM, EMA with beta, y = min) for each network,
jitted over the sharded state. All labels start at 1 (epoch 0 is plain InfoNCE + gamma L_IM, as in the code).
Evaluation averages the two networks' similarities under co-teaching.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ncjax import models
from ncjax.losses import gsc
from ncjax.methods.base import EvalModel, Method, Stage, Update
from ncjax.methods.registry import register
from ncjax.methods.two_tower import stored_clamps

_STATE_KEYS = ("pred", "topo", "pred_target", "topo_target", "y", "clean_prob")


@register("gsc")
class GSC(Method):

  @property
  def nets(self) -> tuple[str, ...]:
    return ("net_a", "net_b") if self.config.method.co_teaching else ("model",)

  def create_modules(self):
    tok = self.tokenizer
    return {name: models.build_two_tower(self.config.model, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                         pad_id=tok.pad_id, seed=self.config.seed + k)
            for k, name in enumerate(self.nets)}

  def init_state(self, capacity):
    return {name: {k: jnp.ones((capacity,), jnp.float32) for k in _STATE_KEYS} for name in self.nets}

  def _net_loss(self, model, batch, y):
    lc = self.config.loss
    img = model.encode_image(batch["image"])
    txt = model.encode_text(batch["tokens"])
    sim = model.similarity(img, txt)
    if lc.temperature == "model":  # CLIP towers: use the learned logit scale instead of a fixed tau1
      sim = sim * jnp.exp(model.get_logit_scale()) * lc.tau1
    return gsc.batch_loss(sim, img @ img.T, txt @ txt.T, y, lc.tau1, lc.tau2, lc.gamma)

  def loss_fn(self, params, state, batch, rng):
    del rng
    mods = self.bind(params)
    ids = batch["id"]
    total, metrics, new_state = 0.0, {}, dict(state)
    for k, name in enumerate(self.nets):
      peer = self.nets[(k + 1) % len(self.nets)]   # co-teaching: weight with the peer's labels
      y = jax.lax.stop_gradient(state[peer]["y"][ids])
      loss, m = self._net_loss(getattr(mods, name), batch, y)
      total = total + loss
      st = dict(new_state[name])
      st["pred"] = st["pred"].at[ids].set(m["y_cm"])
      st["topo"] = st["topo"].at[ids].set(m["s_im"])
      new_state[name] = st
      prefix = "" if len(self.nets) == 1 else f"{name}/"
      metrics.update({prefix + key: v for key, v in m.items()})
    return total, (metrics, new_state)

  def end_of_epoch(self, params, state, epoch):
    """The dataset-wide label update; skipped during `method.warmup_epochs` (labels stay 1, as the public code's
    optional warm-up, off by default there: its epoch 0 is ~1,100 steps on F30K, long enough to learn first)."""
    del params
    capacity = next(iter(state.values()))["y"].shape[0]
    valid = jnp.arange(capacity) < self.num_examples
    updated = {name: gsc.update_labels(state[name], valid, self.config.method.beta) for name in self.nets}
    active = epoch + 1 >= self.config.method.warmup_epochs
    return jax.tree.map(lambda new, old: jnp.where(active, new, old), updated, state)

  def stages(self):
    groups = self.default_param_groups()
    return (Stage("train", self.config.num_epochs, (Update("main", self.loss_fn, groups),),
                  post_update=stored_clamps(self.config, self.nets)),)

  def clean_scores(self, params, state):
    del params
    y = sum(state[name]["y"] for name in self.nets) / len(self.nets)
    return y, None

  def eval_model(self, params):
    mods = self.bind(params)
    nets = [getattr(mods, name) for name in self.nets]
    if len(nets) == 1:
      return super().eval_model(params)
    k = len(nets)

    def split(x):
      return jnp.split(x, k, axis=-1)

    def ensemble(emb):  # per network: normalise, mean over templates, renormalise
      return jnp.concatenate([nets[i].geometry.ensemble(part) for i, part in enumerate(split(emb))], axis=-1)

    return EvalModel(
        encode_image=lambda x: jnp.concatenate([n.encode_image(x) for n in nets], axis=-1),
        encode_text=lambda t: jnp.concatenate([n.encode_text(t) for n in nets], axis=-1),
        score=lambda a, b: sum(n.score(pa, pb) for n, pa, pb in zip(nets, split(a), split(b))) / k,
        image_features=lambda x: jnp.concatenate([n.encode_image(x, return_features=True)[1] for n in nets], -1),
        ensemble=ensemble)
