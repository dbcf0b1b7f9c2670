"""Methods: step builders composed from ncjax.losses. Importing this package registers the built-in methods."""

from ncjax.methods import bayes, clip, gsc, ncu, siglip  # noqa: F401
from ncjax.methods.base import (DIAGNOSTIC_KEYS, EvalModel, Method, ParamGroup, Stage, Update, group_labels,
                                param_path)
from ncjax.methods.registry import METHODS, build_method, register

__all__ = ["Method", "ParamGroup", "Stage", "Update", "EvalModel", "METHODS", "build_method", "register",
           "group_labels", "param_path", "DIAGNOSTIC_KEYS"]
