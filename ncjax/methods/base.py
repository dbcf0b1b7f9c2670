"""What a method is, as the trainer sees it.

A method is a small object built once from resolved, typed inputs (`ncjax.experiment` builds them from the config):
a `MethodSetup` (the model spec, the main stage's epochs, the default optimiser group, the seed, the tokenizer, the
id space of per-sample state, per-sample prior scores when the method reads another run's) and its own `Options`
(a frozen dataclass, `ncjax.options`). It owns
  * its modules (`create_modules`: a dict of NNX modules, e.g. {'model': TwoTower} or two networks for
    co-teaching, or an encoder plus a discriminator),
  * its method state (`init_state`: a pytree of per-sample arrays keyed by stable sample id, possibly empty),
  * its schedule (`stages`: a sequence of Stage, each running for some epochs, each made of one or more Updates;
    an Update is a pure loss over (params, method_state, batch, rng) with its own trainable parameter groups and
    learning rates, so alternating updates — a discriminator, then the encoders — are two Updates of one stage;
    a Stage or Update carries its own `post_update`, e.g. clamps on stored parameters),
  * optional hooks, detected by overriding: `end_of_epoch` (dataset-wide per-sample state updates, run jitted
    once per epoch), `clean_scores` (noise detection), `model_for_eval` (how evaluators encode and score),
  * what NC-bench needs to run it (`bench`: its entries, each with a description, its config, and the runs of the
    same cell it starts from or reads scores of).
Parameters are plain nested dicts of arrays ({module name: {...}}), merged back into modules with `self.bind`.
The trainer knows nothing else about a method. The types of the contract live in `ncjax.contract`.

`num_epochs` means the same for every method: the epochs of its main stage. Preparatory stages that some methods
run first — NCU's prompt stage (`method.epochs_prompt`), DisNCL's warm-up (`method.warmup_epochs`), SGRAF's
all-negatives start (`loss.all_negatives_epochs`) — are counted by their own settings and come before it.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from ncjax.contract import (DIAGNOSTIC_KEYS, EvalModel, ParamGroup, ParamsFunctions, PyTree, Stage, Update,
                            combined_eval_model, flat_paths, group_labels, param_path, scalar_metrics,
                            strip_diagnostics)
from ncjax.models import ModelSpec
from ncjax.options import NoOptions, Options

__all__ = ["Method", "MethodSetup", "BenchEntry", "ParamGroup", "Update", "Stage", "EvalModel", "DIAGNOSTIC_KEYS",
           "param_path", "flat_paths", "group_labels", "strip_diagnostics", "scalar_metrics"]


@dataclasses.dataclass(frozen=True)
class MethodSetup:
  """What every method is built from besides its own options, resolved once from the config by ncjax.experiment.

  num_epochs: the epochs of the method's main stage. lr / weight_decay / freeze: the optimiser's default group
  (`optim.lr`, `optim.weight_decay`, `optim.freeze` — a regex of parameters to freeze). num_examples: the id space
  of the training examples (per-sample state is indexed by id). prior_scores: float32[num_examples], another run's
  per-sample clean scores, when the method's options name them (`Method.prior_scores_source`)."""
  model: ModelSpec
  tokenizer: Any
  num_examples: int
  num_epochs: int = 1
  num_steps: int | None = None   # the main stage's length in steps instead of num_epochs (MERU's 120k iterations)
  seed: int = 0
  lr: float = 1e-3
  weight_decay: float = 0.0
  freeze: str = ""
  micro_batches: int = 1   # optim.micro_batches: encoders over device-local micro-batches (ncjax.models.microbatch)
  prior_scores: np.ndarray | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class BenchEntry:
  """A row NC-bench can run: `name` (what `methods=` lists), one line of `description`, the method's `config`
  (a name under configs/ or a path to a config file) with extra `args`, the method whose run of the same cell it
  starts from (`start`: passed as `init=`) and the method whose per-sample clean scores it reads (`scores`: passed
  as `forget_scores=`), and the kind of model it trains ('two_tower' takes the bench's `model=` size; 'region'
  keeps its config's).

  Every config an entry names accepts the arguments NC-bench passes (ncjax.config_lib.BENCH_ARGUMENTS): `data`,
  `noise`, `epochs` (the main stage's), `batch`, `model` (two-tower entries), `init` (entries with `start`) and
  `forget_scores` (entries with `scores`)."""
  name: str
  description: str
  config: str
  args: str = ""
  start: str | None = None
  scores: str | None = None
  model_kind: str = "two_tower"

  @property
  def needs(self) -> tuple[str, ...]:
    return tuple(m for m in (self.start, self.scores) if m)


class Method(abc.ABC):
  """Base class. Subclasses set `Options`, implement create_modules and stages, and may declare `bench` rows."""

  name: str = ""
  Options: type[Options] = NoOptions
  # The embedding geometries (model.geometry) whose similarity this method's losses use. A method whose losses
  # are cosine-based refuses MERU's Lorentz model at build time instead of computing dot products of hyperboloid
  # points.
  supported_geometries: tuple[str, ...] = ("sphere",)
  # The model kinds (ncjax.models.MODEL_KINDS) the method trains.
  model_kinds: tuple[str, ...] = ("two_tower",)
  # NC-bench's rows for this method (see BenchEntry); none: NC-bench does not offer it.
  bench: tuple[BenchEntry, ...] = ()
  # True: every global batch holds N retain and N forget pairs with the batch's `forget` flags (AC / HAC; the
  # experiment checks `concept.train_on='forget_retain'`).
  needs_forget_retain_batches: bool = False
  # What the method changes, when it changes a trained model (unlearning); the trainer then refuses to start it from
  # random weights unless the config says init=random (ncjax.experiment.Resolved.check_start). '' for the others.
  needs_trained_start: str = ""

  def __init__(self, setup: MethodSetup, options: Options | None = None):
    spec = setup.model
    if spec.kind not in self.model_kinds:
      raise ValueError(f"method {self.name!r} trains {' or '.join(self.model_kinds)} models, not a {spec.kind} "
                       "model" + (": set model.image_type='regions' and model.text_type='bigru' (its config does)"
                                  if "region" in self.model_kinds else
                                  ": it needs image and text towers (model.image_type='vit')"))
    if spec.geometry not in self.supported_geometries:
      raise ValueError(f"method {self.name!r} supports model.geometry in {self.supported_geometries}, not "
                       f"{spec.geometry!r}: its losses are written for that geometry's similarity"
                       + (" (cosine); for MERU models use method 'meru', 'clip', 'siglip' or 'hac'"
                          if spec.geometry == "lorentz" else ""))
    self.setup = setup
    self.model_spec = spec
    self.tokenizer = setup.tokenizer
    self.num_examples = setup.num_examples
    self.options = options if options is not None else self.Options()
    self._graphdef = None

  @classmethod
  def prior_scores_source(cls, options: Options, init_from: str) -> str | None:
    """Where this method's per-sample prior scores come from (a run directory or a *_clean_scores.npz), when its
    options ask for them; the experiment reads them (ncjax.data.scores) into `setup.prior_scores`. Default none."""
    del options, init_from
    return None

  # --- modules and parameters -------------------------------------------------------------------------------
  @abc.abstractmethod
  def create_modules(self) -> dict[str, nnx.Module]:
    """The method's NNX modules by name (initialised from the setup's seed)."""

  def _container(self):
    modules = self.create_modules()
    box = nnx.Module()
    for k, m in modules.items():
      setattr(box, k, m)
    return box

  def init_params(self) -> PyTree:
    """Concrete initial parameters (a nested dict); the seed comes from the setup."""
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

  def model_for_eval(self, params: PyTree) -> EvalModel:
    """The evaluators' view of the trained model: by default the 'model' module's own (each model kind builds its
    EvalModel); several networks (`eval_modules`) are combined by `contract.combined_eval_model`."""
    mods = self.bind(params)
    return combined_eval_model([getattr(mods, name).eval_model() for name in self.eval_modules])

  @property
  def eval_modules(self) -> tuple[str, ...]:
    """The modules evaluated (default: 'model')."""
    return ("model",)

  @functools.cached_property
  def _eval_functions(self) -> ParamsFunctions:
    """`model_for_eval` as a function of the parameters, jitted once per method (not once per evaluation)."""
    return ParamsFunctions(self.model_for_eval)

  def eval_model(self, params: PyTree, state: PyTree | None = None) -> EvalModel:
    """What every evaluator receives: `model_for_eval(params)` with the method's per-sample clean scores of the
    training pairs attached when the state is given and the method keeps them."""
    model = dataclasses.replace(self.model_for_eval(params), params=params, functions=self._eval_functions)
    if state is not None:
      model = dataclasses.replace(model, clean_scores=self.clean_scores(params, state))
    return model

  # --- helpers for subclasses ---------------------------------------------------------------------------------
  def main_stage(self, name: str, updates: Sequence[Update], post_update=None) -> Stage:
    """The method's main stage: `num_epochs` epochs, or `num_steps` steps when the config sets them."""
    return Stage(name, self.setup.num_epochs, tuple(updates), post_update=post_update, steps=self.setup.num_steps)

  def frozen_groups(self) -> list[ParamGroup]:
    """The parameters `optim.freeze` freezes (first, before a method's own groups)."""
    return [ParamGroup(self.setup.freeze, None, name="frozen")] if self.setup.freeze else []

  def default_param_groups(self, lr: float | None = None, weight_decay: float | None = None,
                           extra: Sequence[ParamGroup] = ()) -> tuple[ParamGroup, ...]:
    """Config-frozen parameters first, then `extra`, then everything else at the optimiser's lr/weight decay."""
    setup = self.setup
    return tuple(self.frozen_groups() + list(extra) + [ParamGroup(
        ".*", setup.lr if lr is None else lr, setup.weight_decay if weight_decay is None else weight_decay,
        name="default")])
