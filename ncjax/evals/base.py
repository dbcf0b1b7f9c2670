"""Evaluator plumbing: the shared context, the base class, the registry, and construction from `config.evals`.

An evaluator is configured as `config.evals.<name> = dict(type=<registered type>, every_steps=N, **options)`.
`type` and `every_steps` are read by the caller; every other key is passed to the evaluator's constructor as a
keyword argument, so a misspelt option is an error naming the evaluator and the options it accepts (never
silently ignored). Each evaluator's class lives beside its maths (`zeroshot.py`, `retrieval.py`, ...).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import math
import os
from typing import Any

from ncjax import errors
from ncjax import data as data_lib
from ncjax.data.pipeline import TrainingPairs
from ncjax.data.specs import InputSpec
from ncjax.models import ModelSpec
from ncjax.registry import Registry

EVALUATORS: Registry = Registry("evaluator")
GENERIC_KEYS = ("type", "every_steps", "enabled")


def register(name: str):
  """Class decorator registering an Evaluator under `name` (the `type` of its config entry)."""
  return EVALUATORS.register(name)


@dataclasses.dataclass
class EvalContext:
  """What evaluators share: the input spec (where evaluation data lives and how it is preprocessed: the dataset,
  data_dir, eval_batch_size, normalization, resize, eval_workers, eval_decode), the model spec (the input
  resolution), the tokenizer the model was trained with, the mesh, cached splits, the run's training pairs when it
  has them (noise detection), the method's name, and where plots go."""
  input: InputSpec
  tokenizer: Any
  mesh: Any
  model: ModelSpec
  pairs: TrainingPairs | None = None
  method_name: str = ""
  plot_dir: str | None = None
  tag: str = ""

  @functools.lru_cache(maxsize=8)
  def split(self, dataset: str, split: str, data_dir: str = ""):
    return data_lib.load_split(self.input.on(dataset, data_dir), split, self.model.image_size)

  def __hash__(self):
    return id(self)

  def plot_path(self, name: str) -> str | None:
    if not self.plot_dir:
      return None
    return os.path.join(self.plot_dir, f"{self.tag + '_' if self.tag else ''}{name}.png")


class Evaluator(abc.ABC):
  """Base class. Subclasses take their options as keyword-only constructor arguments.

  Args (shared by every evaluator):
    dataset: the dataset to evaluate on (default: the training dataset).
    split: its split (default 'test').
    data_dir: where that dataset is built (default: input.data_dir), so a second built dataset can be evaluated.
  """
  task = ""  # CLIP_benchmark task name

  def __init__(self, context: EvalContext, *, dataset: str = "", split: str = "test", data_dir: str = ""):
    self.context = context
    self.dataset = dataset
    self.split = split
    self.data_dir = data_dir

  @property
  def batch_size(self) -> int:
    return self.context.input.eval_batch_size

  @property
  def dataset_name(self) -> str:
    """The dataset this evaluator reads: its own `dataset` option, else the training dataset."""
    return self.dataset or self.context.input.dataset

  def data(self, split: str | None = None):
    return self.context.split(self.dataset_name, split or self.split, self.data_dir)

  def images(self, split):
    inp = self.context.input
    return data_lib.eval_images(split, self.context.model.image_size, inp.normalization, inp.resize,
                                workers=inp.eval_workers, decode=inp.eval_decode)

  @abc.abstractmethod
  def run(self, eval_model) -> dict:
    """Evaluate the EvalModel (with the method's clean scores attached, when it keeps them) and return flat
    metrics."""

  def check(self) -> None:
    """Raise now, with the reason, if this evaluator cannot run at the end of training (its dataset, split,
    labels or templates missing). Default: the split loads."""
    self.data()


class EvaluatorConfigError(errors.ConfigurationError):
  """An evaluator of config.evals cannot run on the data it names (found before training starts)."""


def check_evaluators(evaluators: dict[str, Evaluator]) -> None:
  """Run every evaluator's start-up check; one error listing every evaluator that cannot run, and how to fix it."""
  problems = []
  for name, ev in evaluators.items():
    try:
      ev.check()
    except (ValueError, FileNotFoundError, KeyError) as e:
      problems.append(f"evals.{name}: {e}; fix its dataset/split (--config.evals.{name}.dataset=..., "
                      f"--config.evals.{name}.split=...) or switch it off with --config.evals.{name}.enabled=False")
  if problems:
    raise EvaluatorConfigError("an evaluator cannot run, checked before training:\n  " + "\n  ".join(problems))


def accepted_options(cls) -> list[str]:
  """The keyword options an evaluator class accepts (its constructor's keyword arguments, through its bases)."""
  names = []
  for klass in cls.__mro__:
    init = klass.__dict__.get("__init__")
    if init is None:
      continue
    for p in inspect.signature(init).parameters.values():
      if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "context"):
        names.append(p.name)
  return sorted(set(names))


def build_evaluator(name: str, cfg, context: EvalContext) -> Evaluator:
  kind = cfg.type if "type" in cfg else name
  if kind not in EVALUATORS:
    raise ValueError(f"evals.{name}: unknown evaluator type {kind!r}; registered: {EVALUATORS.names()}")
  cls = EVALUATORS.get(kind)
  options = {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in cfg.items() if k not in GENERIC_KEYS}
  accepted = accepted_options(cls)
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise ValueError(f"evals.{name}: evaluator {kind!r} has no option {', '.join(map(repr, unknown))}; "
                     f"it accepts {accepted} (plus {list(GENERIC_KEYS)})")
  try:
    return cls(context, **options)
  except TypeError as e:  # a required option missing
    raise ValueError(f"evals.{name}: evaluator {kind!r}: {e}; it accepts {accepted}") from None


def build_evaluators(evals_config, context: EvalContext) -> dict[str, Evaluator]:
  """Every evaluator of `config.evals` except those switched off with `--config.evals.NAME.enabled=False`."""
  return {name: build_evaluator(name, cfg, context) for name, cfg in evals_config.items() if is_enabled(cfg)}


def is_enabled(cfg) -> bool:
  """An evaluator runs unless its entry says `enabled=False`."""
  return bool(cfg["enabled"]) if "enabled" in cfg else True


def every_steps(cfg) -> int:
  """How often an evaluator runs during training (0: only at the end and in `ncjax eval`)."""
  return int(cfg["every_steps"]) if "every_steps" in cfg else 0


def finite_or_none(value):
  """A result made JSON-safe: NaN / inf (a metric undefined on this data, e.g. noise AUC without noisy pairs)
  become null, never a bare NaN token that strict JSON readers reject."""
  if isinstance(value, dict):
    return {k: finite_or_none(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite_or_none(v) for v in value]
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def run_evaluators(evaluators: dict[str, Evaluator], eval_model) -> dict[str, dict]:
  return {name: ev.run(eval_model) for name, ev in evaluators.items()}


def clip_benchmark_records(results: dict[str, dict], evaluators: dict[str, Evaluator], model: str,
                           dataset: str) -> list[dict]:
  """CLIP_benchmark-style result records: {dataset, model, task, metrics}."""
  return [dict(dataset=evaluators[name].dataset or dataset, model=model,
               task=evaluators[name].task or name, evaluator=name, metrics=metrics)
          for name, metrics in results.items()]
