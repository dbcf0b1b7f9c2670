"""A method added from outside ncjax, as a user would (tests/cli/test_adding_a_method.py): its loss, its Method and
its config (`toy_config.py` beside this file) — the three pieces of docs/architecture.md's "Adding a method", and
no edit anywhere in ncjax. Loaded with `ncjax train --plugins=tests/plugins/toy_plugin.py ...`.

The method, "toy_hinge": CLIP's towers trained with a symmetric max-margin hinge over the global batch's cosine
logits — every negative's violation of the positive by `margin`, averaged (VSE's sum-of-hinges, Faghri et al.
2018, Eq. 2, as a mean). Its per-sample state records each pair's last hinge, so noise detection scores pairs by
the method's own clean score (minus the hinge).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from ncjax.methods import BenchEntry, register
from ncjax.methods.two_tower import SingleModelMethod
from ncjax.numerics import diagonal, f32
from ncjax.options import Options, loss_option

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_config.py")


# --- 1. the loss: a pure function over the global batch ---------------------------------------------------------
def symmetric_hinge(image_emb, text_emb, margin: float):
  """(loss, per-pair hinge): mean over i, j != i of [m - s_ii + s_ij]_+ + [m - s_ii + s_ji]_+ on cosines s."""
  s = f32(image_emb) @ f32(text_emb).T
  n = s.shape[0]
  pos = diagonal(s)
  off = 1.0 - jnp.eye(n, dtype=jnp.float32)
  per = (jnp.sum(jax.nn.relu(margin - pos[:, None] + s) * off, axis=1)
         + jnp.sum(jax.nn.relu(margin - pos[None, :] + s) * off, axis=0)) / max(n - 1, 1)
  return jnp.mean(per), per


# --- 2. the Method: options, modules (inherited), loss, state -----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ToyOptions(Options):
  margin: float = loss_option(0.2)


@register("toy_hinge")
class ToyHinge(SingleModelMethod):

  Options = ToyOptions
  bench = (BenchEntry("toy_hinge", "a method added from a plugin: CLIP towers with a symmetric hinge", CONFIG),)

  def init_state(self, capacity):
    return dict(hinge=jnp.zeros((capacity,), jnp.float32))

  def model_loss(self, model, batch, rng, state):
    del rng, state
    loss, per = symmetric_hinge(model.encode_image(batch["image"]), model.encode_text(batch["tokens"]),
                                self.options.margin)
    return loss, dict(per_pair_hinge=jax.lax.stop_gradient(per))

  def update_state(self, state, batch, metrics):
    return dict(state, hinge=state["hinge"].at[batch["id"]].set(metrics["per_pair_hinge"]))

  def clean_scores(self, params, state):
    del params
    return -state["hinge"], None
