"""What a method is, as the trainer sees it.

A method is a small object built from the config. It owns
  * its modules (`create_modules`: a dict of NNX modules, e.g. {'model': TwoTower} or two networks for
    co-teaching, or an encoder plus a discriminator),
  * its method state (`init_state`: a pytree of per-sample arrays keyed by stable sample id, possibly empty),
  * its schedule (`stages`: a sequence of Stage, each running for some epochs, each made of one or more Updates;
    an Update is a pure loss over (params, method_state, batch, rng) with its own trainable parameter groups and
    learning rates, so alternating updates — a discriminator, then the encoders — are two Updates of one stage;
    a Stage or Update carries its own `post_update`, e.g. clamps on stored parameters),
  * optional hooks, detected by overriding: `end_of_epoch` (dataset-wide per-sample state updates, run jitted
    once per epoch), `clean_scores` (noise detection), `eval_model` (how evaluators encode and score).
Parameters are plain nested dicts of arrays ({module name: {...}}), merged back into modules with `self.bind`.
The trainer knows nothing else about a method. The types of the contract live in `ncjax.contract`.
"""

from __future__ import annotations

import abc
from typing import Sequence

import jax
from flax import nnx

from ncjax.contract import (DIAGNOSTIC_KEYS, EvalModel, ParamGroup, PyTree, Stage, Update, flat_paths,
                            group_labels, param_path, scalar_metrics, strip_diagnostics)

__all__ = ["Method", "ParamGroup", "Update", "Stage", "EvalModel", "DIAGNOSTIC_KEYS", "param_path", "flat_paths",
           "group_labels", "strip_diagnostics", "scalar_metrics"]


class Method(abc.ABC):
  """Base class. Subclasses set `name` and implement create_modules and stages."""

  name: str = ""
  # The embedding geometries (config.model.geometry) whose similarity this method's losses use. A method whose
  # losses are cosine-based refuses MERU's Lorentz model at build time instead of computing dot products of
  # hyperboloid points.
  supported_geometries: tuple[str, ...] = ("sphere",)

  def __init__(self, config, *, tokenizer, num_examples: int, noise_sha256: str | None = None):
    geometry = config.model.get("geometry", "sphere")
    if geometry not in self.supported_geometries:
      raise ValueError(f"method {self.name!r} supports model.geometry in {self.supported_geometries}, not "
                       f"{geometry!r}: its losses are written for that geometry's similarity"
                       + (" (cosine); for MERU models use method 'meru', 'clip', 'siglip' or 'hac'"
                          if geometry == "lorentz" else ""))
    self.config = config
    self.tokenizer = tokenizer
    self.num_examples = num_examples
    self.noise_sha256 = noise_sha256
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

  def end_of_epoch(self, params: PyTree, state: PyTree, epoch: jax.Array) -> PyTree:
    """Dataset-wide state update run once after every epoch (jitted by the trainer). Default: none."""
    del params, epoch
    return state

  @property
  def has_end_of_epoch(self) -> bool:
    """Whether this method overrides `end_of_epoch` (the trainer then runs it; otherwise it saves a compile)."""
    return type(self).end_of_epoch is not Method.end_of_epoch

  def clean_scores(self, params: PyTree, state: PyTree):
    """Optional per-example clean scores (capacity-long, higher = cleaner) and the flagged-as-noisy set, for
    noise-detection metrics: (scores, flagged or None). Default None: evaluators use the pair similarity."""
    del params, state
    return None

  def eval_model(self, params: PyTree) -> EvalModel:
    model = self.bind(params).model
    return EvalModel(encode_image=model.encode_image, encode_text=model.encode_text, score=model.score,
                     image_features=lambda x: model.encode_image(x, return_features=True)[1],
                     ensemble=model.geometry.ensemble, norm=getattr(model.geometry, "norm", None))

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
