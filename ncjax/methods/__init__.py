"""Methods: step builders composed from ncjax.losses. Importing this package registers the built-in methods."""

from ncjax.methods import ac, bayes, clip, disncl, gsc, ncu, sgraf, siglip  # noqa: F401  (registration)
from ncjax.methods.base import (DIAGNOSTIC_KEYS, BenchEntry, EvalModel, Method, MethodSetup, ParamGroup, Stage,
                                Update, group_labels, param_path)
from ncjax.methods.registry import METHODS, bench_entries, method_class, register


def build_method(name: str, setup: MethodSetup, options=None) -> Method:
  """The registered method `name` built from its setup and options (its `Options()` defaults when None).
  `ncjax.experiment.method_from_config` builds both from a config."""
  return method_class(name)(setup, options)


__all__ = ["Method", "MethodSetup", "BenchEntry", "ParamGroup", "Stage", "Update", "EvalModel", "METHODS",
           "build_method", "method_class", "bench_entries", "register", "group_labels", "param_path",
           "DIAGNOSTIC_KEYS"]
