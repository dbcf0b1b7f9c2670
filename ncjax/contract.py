"""The contract between a method and the trainer: parameter groups, updates, stages and the evaluation model.

A leaf module (it imports nothing from ncjax) so that `ncjax.optim`, `ncjax.methods`, `ncjax.evals` and the trainer
all speak the same types without importing each other.

  ParamGroup  which parameters (regex over '/'-joined paths) train at which rate, or are frozen (lr=None)
  Update      one optimiser update inside a step: a pure loss over (params, method_state, batch, rng)
  Stage       a phase of training: its epochs, its updates, and what runs on the parameters after each update
  EvalModel   what evaluators need: encoders into the model's geometry, the score they rank by, and the method's
              per-sample clean scores of the training pairs when it keeps them
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

PyTree = Any

# Batch entries a method's loss must never see: ground truth kept for diagnostics only.
DIAGNOSTIC_KEYS = ("clean", "label")


@dataclasses.dataclass(frozen=True)
class ParamGroup:
  """Parameters whose '/'-joined path matches `pattern` (re.fullmatch; first matching group wins).

  lr=None freezes them. Weight decay applies only to matrices (ndim >= 2): never to norms, biases or scalars.
  """
  pattern: str
  lr: float | None
  weight_decay: float = 0.0
  name: str = ""

  @property
  def label(self) -> str:
    return self.name or self.pattern


LossFn = Callable[..., tuple[jax.Array, tuple[dict, PyTree]]]
PostUpdate = Callable[[PyTree], PyTree]


@dataclasses.dataclass(frozen=True)
class Update:
  """One optimiser update inside a train step: loss_fn(params, method_state, batch, rng) -> (loss, (metrics, state)).

  `post_update(params) -> params` runs on the parameters this update produced (e.g. clamping stored values into
  their valid range); it overrides the stage's for this update when given.
  """
  name: str
  loss_fn: LossFn
  param_groups: tuple[ParamGroup, ...]
  post_update: PostUpdate | None = None


@dataclasses.dataclass(frozen=True)
class Stage:
  """A phase of training with its own frozen sets, learning rates and optimiser state.

  `post_update(params) -> params` runs after every update of the stage (clamps on stored parameters: NCU's
  logit-scale range in its unlearning stage, MERU's curvature and alphas). None: nothing.
  """
  name: str
  epochs: int
  updates: tuple[Update, ...]
  post_update: PostUpdate | None = None
  steps: int | None = None   # the stage's length in steps instead of epochs (a paper that states iterations)

  def post_update_of(self, update: Update) -> PostUpdate | None:
    return update.post_update if update.post_update is not None else self.post_update


def chain_post_updates(*fns: PostUpdate | None) -> PostUpdate | None:
  """One post-update running `fns` in order (None entries skipped); None if there are none."""
  fns = tuple(f for f in fns if f is not None)
  if not fns:
    return None
  if len(fns) == 1:
    return fns[0]

  def run(params):
    for f in fns:
      params = f(params)
    return params
  return run


class ParamsFunctions:
  """A model's evaluation functions as functions of its parameters — `build(params)` is its EvalModel — each jitted
  once per (function name, output sharding) with the parameters an argument.

  Jitting `EvalModel.encode_image` itself would close over the parameters, and XLA embeds closed-over arrays in the
  program as constants: every evaluation would trace and compile its encoders anew, into a program carrying the
  whole model as literals."""

  def __init__(self, build: Callable[[Any], "EvalModel"]):
    self._build = build
    self._jitted: dict = {}

  def jitted(self, name: str, out_shardings=None) -> Callable:
    """jit((params, *args) -> build(params).<name>(*args)), built on the first call for (name, out_shardings)."""
    key = (name, out_shardings)
    if key not in self._jitted:
      def apply(params, *args):
        return getattr(self._build(params), name)(*args)
      apply.__name__ = apply.__qualname__ = name
      self._jitted[key] = (jax.jit(apply) if out_shardings is None else
                           jax.jit(apply, out_shardings=out_shardings))
    return self._jitted[key]


@dataclasses.dataclass
class EvalModel:
  """What evaluators need: encoders into the model's geometry and the score they rank by. Each model kind builds
  its own (`TwoTower.eval_model()`, the region models'); a method attaches its per-sample `clean_scores`, its
  parameters and its `ParamsFunctions` (what `jitted` compiles once per model instead of once per evaluation)."""
  encode_image: Callable[[jax.Array], jax.Array]
  encode_text: Callable[[jax.Array], jax.Array]
  score: Callable[[jax.Array, jax.Array], jax.Array]
  image_features: Callable[[jax.Array], jax.Array] | None = None  # pre-projection features (linear probe)
  ensemble: Callable[[jax.Array], jax.Array] | None = None        # prompt ensemble (C, T, D) -> (C, D)
  norm: Callable[[jax.Array], jax.Array] | None = None            # an embedding's distance from the origin (MERU)
  pair_score: Callable[[jax.Array, jax.Array], jax.Array] | None = None  # score of aligned pairs (n,), cheaper
                                                                  # than a matrix's diagonal (learned similarities)
  # The method's per-sample clean scores of the training pairs, indexed by example id (capacity-long, higher =
  # cleaner), and the set it flags as noisy (or None); None when the method keeps none (evaluators then score
  # each training pair with `score` / `pair_score`).
  clean_scores: tuple[jax.Array, jax.Array | None] | None = None
  params: Any = None
  functions: ParamsFunctions | None = None

  def jitted(self, name: str, out_shardings=None) -> Callable:
    """The function `name` (encode_image, score, ...) jitted: through `functions` with the parameters an argument
    where the model carries them, else the function itself (its closure then part of the program)."""
    if self.functions is not None and self.params is not None:
      fn = self.functions.jitted(name, out_shardings)
      return lambda *args: fn(self.params, *args)
    own = getattr(self, name)
    return jax.jit(own) if out_shardings is None else jax.jit(own, out_shardings=out_shardings)


def combined_eval_model(parts: Sequence[EvalModel]) -> EvalModel:
  """Several networks evaluated as one (GSC+'s co-teaching pair): embeddings concatenated along the last axis,
  scores (and pair scores, prompt ensembles, pre-projection features) computed per network on its own part and
  averaged — the public code averages the two networks' similarities."""
  k = len(parts)
  if k == 1:
    return parts[0]

  def split(x):
    return jnp.split(x, k, axis=-1)

  def concat(fns):
    return lambda x: jnp.concatenate([f(x) for f in fns], axis=-1)

  def average(fns):
    return lambda a, b: sum(f(pa, pb) for f, pa, pb in zip(fns, split(a), split(b))) / k

  def each(fns):
    return lambda x: jnp.concatenate([f(part) for f, part in zip(fns, split(x))], axis=-1)

  def all_of(name):
    fns = [getattr(p, name) for p in parts]
    return fns if all(f is not None for f in fns) else None

  pair, features, ensembles = all_of("pair_score"), all_of("image_features"), all_of("ensemble")
  return EvalModel(encode_image=concat([p.encode_image for p in parts]),
                   encode_text=concat([p.encode_text for p in parts]),
                   score=average([p.score for p in parts]),
                   pair_score=average(pair) if pair else None,
                   image_features=concat(features) if features else None,
                   ensemble=each(ensembles) if ensembles else None)


def param_path(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def flat_paths(params: PyTree) -> list[str]:
  return [param_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def group_labels(params: PyTree, groups: Sequence[ParamGroup]) -> PyTree:
  """A pytree of group labels (or 'frozen') with the structure of params; unmatched parameters are an error."""
  compiled = [(re.compile(g.pattern), g) for g in groups]

  def label(path, _):
    name = param_path(path)
    for rx, g in compiled:
      if rx.fullmatch(name):
        return "frozen" if g.lr is None else g.label
    raise ValueError(f"parameter {name!r} matches no parameter group; patterns: {[g.pattern for g in groups]}")

  return jax.tree_util.tree_map_with_path(label, params)


def strip_diagnostics(batch: dict) -> dict:
  return {k: v for k, v in batch.items() if k not in DIAGNOSTIC_KEYS}


def scalar_metrics(metrics: dict) -> dict:
  """Keep scalars only (per-sample outputs go into method state, not into logs)."""
  return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items() if jnp.ndim(v) == 0}
