"""What a method is, as the trainer sees it.

A method is a small object built from the config. It owns
  * its modules (`create_modules`: a dict of NNX modules, e.g. {'model': TwoTower} or two networks for
    co-teaching, or an encoder plus a discriminator),
  * its method state (`init_state`: a pytree of per-sample arrays keyed by stable sample id, possibly empty),
  * its schedule (`stages`: a sequence of Stage, each running for some epochs, each made of one or more Updates;
    an Update is a pure loss over (params, method_state, batch, rng) with its own trainable parameter groups and
    learning rates, so alternating updates — a discriminator, then the encoders — are two Updates of one stage),
  * optional hooks: `post_update` (e.g. clamps), `end_of_epoch` (dataset-wide per-sample state updates, run jitted
    once per epoch), `eval_model` (how evaluators encode and score).
Parameters are plain nested dicts of arrays ({module name: {...}}), merged back into modules with `self.bind`.
The trainer knows nothing else about a method.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

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


@dataclasses.dataclass(frozen=True)
class Update:
  """One optimiser update inside a train step: loss_fn(params, method_state, batch, rng) -> (loss, (metrics, state))."""
  name: str
  loss_fn: Callable[..., tuple[jax.Array, tuple[dict, PyTree]]]
  param_groups: tuple[ParamGroup, ...]


@dataclasses.dataclass(frozen=True)
class Stage:
  """A phase of training with its own frozen sets, learning rates and optimiser state."""
  name: str
  epochs: int
  updates: tuple[Update, ...]


@dataclasses.dataclass
class EvalModel:
  """What evaluators need: encoders into the model's geometry and the score they rank by."""
  encode_image: Callable[[jax.Array], jax.Array]
  encode_text: Callable[[jax.Array], jax.Array]
  score: Callable[[jax.Array, jax.Array], jax.Array]
  image_features: Callable[[jax.Array], jax.Array] | None = None  # pre-projection features (linear probe)
  ensemble: Callable[[jax.Array], jax.Array] | None = None        # prompt ensemble (C, T, D) -> (C, D)


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


class Method(abc.ABC):
  """Base class. Subclasses set `name` and implement create_modules and stages."""

  name: str = ""

  def __init__(self, config, *, tokenizer, num_examples: int):
    self.config = config
    self.tokenizer = tokenizer
    self.num_examples = num_examples
    self._graphdef = None

  # --- modules and parameters -------------------------------------------------------------------------------
  @abc.abstractmethod
  def create_modules(self) -> dict[str, nnx.Module]:
    """The method's NNX modules by name (initialised from the config's seed)."""

  def _container(self):
    modules = self.create_modules()
    box = nnx.Module()
    for k, m in modules.items():
      setattr(box, k, m)
    return box

  def init_params(self) -> PyTree:
    """Concrete initial parameters (a nested dict); the seed comes from the config."""
    graphdef, state = nnx.split(self._container(), nnx.Param)
    self._graphdef = graphdef
    return nnx.to_pure_dict(state)

  def abstract_params(self) -> PyTree:
    graphdef, state = nnx.split(nnx.eval_shape(self._container), nnx.Param)
    self._graphdef = graphdef
    return nnx.to_pure_dict(state)

  def bind(self, params: PyTree):
    """The method's modules with `params` merged in (cheap: happens at trace time)."""
    if self._graphdef is None:
      self.abstract_params()
    return nnx.merge(self._graphdef, params)

  # --- state, schedule, hooks --------------------------------------------------------------------------------
  def init_state(self, capacity: int) -> PyTree:
    """Per-sample/method state; arrays with leading dimension `capacity` are indexed by sample id and sharded."""
    del capacity
    return {}

  @abc.abstractmethod
  def stages(self) -> Sequence[Stage]:
    """The training schedule."""

  def post_update(self, params: PyTree, stage: Stage) -> PyTree:
    del stage
    return params

  def end_of_epoch(self, params: PyTree, state: PyTree, epoch: jax.Array) -> PyTree:
    """Dataset-wide state update run once after every epoch (jitted by the trainer). Default: none."""
    del params, epoch
    return state

  has_end_of_epoch = False  # set True by methods that override end_of_epoch (saves a compile otherwise)

  def clean_scores(self, params: PyTree, state: PyTree):
    """Optional per-example clean scores (capacity-long, higher = cleaner) and the flagged-as-noisy set, for
    noise-detection metrics: (scores, flagged or None). Default None: evaluators use the pair similarity."""
    del params, state
    return None

  def eval_model(self, params: PyTree) -> EvalModel:
    model = self.bind(params).model
    return EvalModel(encode_image=model.encode_image, encode_text=model.encode_text, score=model.score,
                     image_features=lambda x: model.encode_image(x, return_features=True)[1],
                     ensemble=model.geometry.ensemble)

  # --- helpers for subclasses ---------------------------------------------------------------------------------
  def default_param_groups(self, lr: float | None = None, weight_decay: float | None = None,
                           extra: Sequence[ParamGroup] = ()) -> tuple[ParamGroup, ...]:
    """Config-frozen parameters first, then `extra`, then everything else at the optimiser's lr/weight decay."""
    optim = self.config.optim
    groups = []
    if optim.freeze:
      groups.append(ParamGroup(optim.freeze, None, name="frozen"))
    groups.extend(extra)
    groups.append(ParamGroup(".*", optim.lr if lr is None else lr,
                             optim.weight_decay if weight_decay is None else weight_decay, name="default"))
    return tuple(groups)


def strip_diagnostics(batch: dict) -> dict:
  return {k: v for k, v in batch.items() if k not in DIAGNOSTIC_KEYS}


def scalar_metrics(metrics: dict) -> dict:
  """Keep scalars only (per-sample outputs go into method state, not into logs)."""
  return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items() if jnp.ndim(v) == 0}
