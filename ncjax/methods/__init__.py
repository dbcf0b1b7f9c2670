"""Methods: step builders composed from ncjax.losses. Importing this package registers the built-in methods."""

from ncjax.methods import ac, bayes, clip, disncl, gsc, ncu, sgraf, siglip  # noqa: F401  (registration)
from ncjax.methods.base import (DIAGNOSTIC_KEYS, EvalModel, Method, ParamGroup, Stage, Update, group_labels,
                                param_path)
from ncjax.methods.registry import METHODS, register


def build_method(config, *, tokenizer, num_examples: int, noise_sha256: str | None = None) -> Method:
  """The registered method `config.method.name`, built from the config (`noise_sha256`: the training pairs' noise
  index, for methods that read another run's per-sample state and must check it scored the same pairs)."""
  return METHODS.get(config.method.name)(config, tokenizer=tokenizer, num_examples=num_examples,
                                         noise_sha256=noise_sha256)


__all__ = ["Method", "ParamGroup", "Stage", "Update", "EvalModel", "METHODS", "build_method", "register",
           "group_labels", "param_path", "DIAGNOSTIC_KEYS"]
