"""Test-only methods exercising what the seed methods need from the trainer, without method-specific code in it."""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ncjax.losses import contrastive
from ncjax.methods import ParamGroup, Stage, Update, register
from ncjax.methods.two_tower import SingleModelMethod
from ncjax.options import Options, method_option


@register("test_two_stage")
class TwoStage(SingleModelMethod):
  """Stage 'a' trains only the text tower, stage 'b' only the image tower (as NCU's prompt/unlearning stages)."""

  def model_loss(self, model, batch, rng, state=None):
    return contrastive.infonce(model.encode_image(batch["image"]), model.encode_text(batch["tokens"]),
                               model.get_logit_scale())

  def stages(self):
    lr = self.setup.lr
    return (
        Stage("a", 1, (Update("main", self.loss_fn, (ParamGroup(r"model/txt/.*", lr, name="text"),
                                                     ParamGroup(".*", None))),)),
        Stage("b", 1, (Update("main", self.loss_fn, (ParamGroup(r"model/img/.*", 10 * lr, name="image"),
                                                     ParamGroup(".*", None))),)),
    )


@register("test_epoch_state")
class EpochState(SingleModelMethod):
  """Per-sample state keyed by id: a per-step 'last seen' mark and a dataset-wide update once per epoch."""


  def init_state(self, capacity):
    return dict(seen=jnp.zeros((capacity,), jnp.int32), epochs=jnp.zeros((), jnp.int32),
                score=jnp.zeros((capacity,), jnp.float32))

  def model_loss(self, model, batch, rng, state=None):
    return contrastive.infonce(model.encode_image(batch["image"]), model.encode_text(batch["tokens"]),
                               model.get_logit_scale())

  def loss_fn(self, params, state, batch, rng):
    # The ground truth travels with the batch for diagnostics but must never reach a method's loss.
    assert "clean" not in batch and "label" not in batch, sorted(batch)
    loss, metrics = self.model_loss(self.bind(params).model, batch, rng)
    ids = batch["id"]
    state = dict(state, seen=state["seen"].at[ids].add(1),
                 score=state["score"].at[ids].set(jax.lax.stop_gradient(metrics["per_pair_loss"])))
    return loss, (metrics, state)

  def end_of_epoch(self, params, state, epoch):
    del params
    return dict(state, epochs=state["epochs"] + 1 + 0 * epoch)


class Discriminator(nnx.Module):
  def __init__(self, dim, rngs):
    self.w = nnx.Linear(2 * dim, 1, rngs=rngs)

  def __call__(self, a, b):
    return self.w(jnp.concatenate([a, b], axis=-1))[:, 0]


@dataclasses.dataclass(frozen=True)
class AlternatingOptions(Options):
  freeze_encoder_in_enc_update: bool = method_option(False)
  enc_update_trains: str = method_option(r"model/.*")   # the encoder update's trainable group (a regex)


@register("test_alternating")
class Alternating(SingleModelMethod):
  """A discriminator update, then an encoder update, in every step (as DisNCL's adversarial MI terms)."""

  Options = AlternatingOptions

  def create_modules(self):
    mods = super().create_modules()
    mods["disc"] = Discriminator(64, nnx.Rngs(1))
    return mods

  def model_loss(self, model, batch, rng, state=None):
    return contrastive.infonce(model.encode_image(batch["image"]), model.encode_text(batch["tokens"]),
                               model.get_logit_scale())

  def _disc_scores(self, params, batch):
    mods = self.bind(params)
    img = mods.model.encode_image(batch["image"])
    txt = mods.model.encode_text(batch["tokens"])
    pos = mods.disc(img, txt)
    neg = mods.disc(img, jnp.roll(txt, 1, axis=0))
    return pos, neg

  def disc_loss(self, params, state, batch, rng):
    pos, neg = self._disc_scores(params, batch)
    loss = jnp.mean(jax.nn.softplus(-pos)) + jnp.mean(jax.nn.softplus(neg))
    return loss, ({}, state)

  def enc_loss(self, params, state, batch, rng):
    pos, neg = self._disc_scores(params, batch)
    clip_loss, metrics = self.model_loss(self.bind(params).model, batch, rng)
    return clip_loss - 0.1 * (jnp.mean(jax.nn.softplus(-pos)) + jnp.mean(jax.nn.softplus(neg))), (metrics, state)

  def stages(self):
    lr = self.setup.lr
    enc_lr = None if self.options.freeze_encoder_in_enc_update else lr
    return (Stage("train", self.setup.num_epochs, (
        Update("disc", self.disc_loss, (ParamGroup(r"disc/.*", lr, name="disc"), ParamGroup(".*", None))),
        Update("enc", self.enc_loss, (ParamGroup(self.options.enc_update_trains, enc_lr, name="enc"),
                                      ParamGroup(".*", None))),
    )),)
