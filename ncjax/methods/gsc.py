"""GSC and GSC+ (co-teaching) on two-tower models (ncjax.losses.gsc; methods.md §2).

Per step, for each network: S = the model's similarity of images and captions, A = image-image and Bc = text-text
cosine structures, y = the current soft labels of the batch (the *peer's* under co-teaching), then
gsc.batch_loss; the batch's y_CM and S_IM are written into per-sample state by example id. Once per epoch,
`end_of_epoch` runs the dataset-wide update (min-max normalisation, GMM, EMA with beta, y = min) for each network,
jitted over the sharded state. All labels start at 1 (epoch 0 is plain InfoNCE + gamma L_IM, as in the code).
Evaluation averages the two networks' similarities under co-teaching.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ncjax import models
from ncjax.losses import gsc
from ncjax.methods.base import BenchEntry, Method, ParamGroup, Update
from ncjax.methods.registry import register
from ncjax.methods.two_tower import stored_clamps
from ncjax.options import Options, loss_option, method_option

_STATE_KEYS = ("pred", "topo", "pred_target", "topo_target", "y", "clean_prob")


@dataclasses.dataclass(frozen=True)
class GSCOptions(Options):
  """Public-code defaults (methods.md §2.5)."""
  co_teaching: bool = method_option(False)   # GSC+: two networks, each weighted by its peer's labels
  beta: float = method_option(0.7)           # EMA of the label update
  warmup_epochs: int = method_option(0)      # epochs with every label at 1 before the first update
  tau1: float = loss_option(0.07)
  tau2: float = loss_option(1.0)
  gamma: float = loss_option(0.01)
  temperature: str = loss_option("fixed")    # 'fixed': S / tau1; 'model': the two-tower's learned scale
  indicator: str = loss_option("softmax")    # y_CM: 'softmax' (public code) | 'max_ratio' | 'auto' (from the data)

  # 'auto' picks max_ratio when a batch holds this many other pairs with a pair's exact caption, on average: a pair
  # with k such twins has its softmax diagonal capped near 1 / (1 + k), so from about half the pairs meeting one the
  # labels reflect the batch's duplicates as much as cleanness (embedded digits: 0.90 at batch 256 — and ten
  # classes' worth of equivalent captions besides; scenes and web-like captions: 0.00)
  SHARED_CAPTIONS_FOR_MAX_RATIO = 0.5

  def __post_init__(self):
    if self.temperature not in ("fixed", "model"):
      raise ValueError(f"unknown loss.temperature {self.temperature!r}; expected 'fixed' or 'model'")
    if self.indicator not in gsc.INDICATORS + ("auto",):
      raise ValueError(f"GSC indicator {self.indicator!r}; expected one of {gsc.INDICATORS + ('auto',)}")

  def wants_data_profile(self) -> bool:
    return self.indicator == "auto"

  def from_data(self, profile):
    if self.indicator != "auto":
      return self, []
    shared = profile.shared_captions_per_batch
    chosen = "max_ratio" if shared >= self.SHARED_CAPTIONS_FOR_MAX_RATIO else "softmax"
    note = (f"GSC loss.indicator=auto -> {chosen!r}: a global batch of {profile.global_batch_size} holds "
            f"{shared:.2f} other pairs with a pair's caption on average (counted over {profile.captions} captions; "
            f"'max_ratio' from {self.SHARED_CAPTIONS_FOR_MAX_RATIO:g}, the public code's 'softmax' below)")
    return dataclasses.replace(self, indicator=chosen), [note]


@register("gsc")
class GSC(Method):

  Options = GSCOptions
  model_kinds = ("two_tower", "region")
  bench = (
      BenchEntry("gsc", "GSC: soft correspondence labels from cross-/intra-modal structure, GMM per epoch", "gsc"),
      BenchEntry("gsc_plus", "GSC+: GSC with two co-teaching networks", "gsc", "coteach=true"),
      BenchEntry("gsc_sgraf", "GSC on SGRAF's region backbone", "gsc", "backbone=sgraf", model_kind="region"),
  )

  @property
  def nets(self) -> tuple[str, ...]:
    return ("net_a", "net_b") if self.options.co_teaching else ("model",)

  @property
  def eval_modules(self) -> tuple[str, ...]:
    return self.nets   # GSC+: both networks' scores averaged, as the public code evaluates

  def create_modules(self):
    tok = self.tokenizer
    return {name: models.build_model(self.model_spec, vocab_size=tok.vocab_size, eot_id=tok.eot_id,
                                     pad_id=tok.pad_id, seed=self.setup.seed + k,
                                     micro_batches=self.setup.micro_batches)
            for k, name in enumerate(self.nets)}

  def init_state(self, capacity):
    state = {name: {k: jnp.ones((capacity,), jnp.float32) for k in _STATE_KEYS} for name in self.nets}
    # The epoch each example was last seen in (-1: never), and the current epoch: the label update uses only the
    # examples seen in the epoch it closes (an epoch drops its last partial batch, so some are not).
    state["last_seen"] = jnp.full((capacity,), -1, jnp.int32)
    state["epoch"] = jnp.zeros((), jnp.int32)
    return state

  def _net_loss(self, model, batch, y, rng):
    o = self.options
    # the region backbone's dropout (SGRAF's word and pooling dropout) draws from these; two towers have none
    k_txt, k_sim, k_img, k_cap = jax.random.split(rng, 4)
    img = model.encode_image(batch["image"])
    txt = model.encode_text(batch["tokens"], k_txt)
    # CLIP towers: use the learned logit scale instead of a fixed tau1
    scale = jnp.exp(model.get_logit_scale()) * o.tau1 if o.temperature == "model" else None
    # Two-tower models (GSC takes the sphere: S is the embeddings' cosines): cosine structures, the embeddings' Gram
    # matrices, in their D x D form, S computed beside them (nothing N x N is built or gathered); SGRAF
    # (configs/gsc.py:backbone=sgraf): sigmoid(SGR) of image-image and caption-caption pairs through the shared
    # similarity head, as the public code.
    if getattr(model, "gram_structures", False):
      return gsc.batch_loss_gram(None, img, txt, y, o.tau1, o.tau2, o.gamma, o.indicator, sim_scale=scale)
    sim = model.similarity(img, txt, k_sim)
    if scale is not None:
      sim = sim * scale
    return gsc.batch_loss(sim, model.image_structure(img, k_img), model.text_structure(txt, k_cap), y, o.tau1, o.tau2,
                          o.gamma, o.indicator)
  def net_loss_fn(self, name: str):
    """The loss of network `name`, weighted by its peer's labels under co-teaching (its own otherwise)."""
    k = self.nets.index(name)
    peer = self.nets[(k + 1) % len(self.nets)]

    def loss_fn(params, state, batch, rng):
      ids = batch["id"]
      y = jax.lax.stop_gradient(state[peer]["y"][ids])
      loss, m = self._net_loss(getattr(self.bind(params), name), batch, y, jax.random.fold_in(rng, k))
      st = dict(state[name])
      st["pred"] = st["pred"].at[ids].set(m["y_cm"])
      st["topo"] = st["topo"].at[ids].set(m["s_im"])
      new = dict(state, **{name: st}, last_seen=state["last_seen"].at[ids].set(state["epoch"]))
      return loss, (m, new)
    return loss_fn

  def loss_fn(self, params, state, batch, rng):
    """Every network's loss summed (one update; tests and tools that want the whole objective)."""
    total, metrics = 0.0, {}
    for name in self.nets:
      loss, (m, state) = self.net_loss_fn(name)(params, state, batch, rng)
      total = total + loss
      prefix = "" if len(self.nets) == 1 else f"{name}/"
      metrics.update({prefix + key: v for key, v in m.items()})
    return total, (metrics, state)

  def end_of_epoch(self, params, state, epoch):
    """The dataset-wide label update over the examples seen in this epoch (their y_CM and S_IM are this epoch's;
    the others keep their labels). With method.warmup_epochs = k the first update runs at the end of epoch k (the
    public code: k = 0, the end of the first epoch); before that every label stays 1."""
    del params
    capacity = state["last_seen"].shape[0]
    valid = (jnp.arange(capacity) < self.num_examples) & (state["last_seen"] == state["epoch"])
    updated = {name: gsc.update_labels(state[name], valid, self.options.beta) for name in self.nets}
    active = epoch >= self.options.warmup_epochs
    nets = {name: jax.tree.map(lambda new, old: jnp.where(active, new, old), updated[name], state[name])
            for name in self.nets}
    return dict(state, **nets, epoch=state["epoch"] + 1)

  def stages(self):
    """One update per network (GSC+: each with its own optimiser state and gradient clipping, as the public code's
    two Adam optimisers), each training only its own parameters."""
    if len(self.nets) == 1:
      updates = (Update("main", self.net_loss_fn("model"), self.default_param_groups()),)
    else:
      setup = self.setup
      updates = tuple(Update(name, self.net_loss_fn(name), tuple(
          self.frozen_groups() + [ParamGroup(rf"{name}/.*", setup.lr, setup.weight_decay, name=name),
                                  ParamGroup(".*", None)]))
          for name in self.nets)
    return (self.main_stage("train", updates, post_update=stored_clamps(self.model_spec, self.nets)),)

  def clean_scores(self, params, state):
    del params
    y = sum(state[name]["y"] for name in self.nets) / len(self.nets)
    return y, None
