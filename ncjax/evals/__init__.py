"""Evaluators: plug-ins named in `config.evals.<name>.type`, each `run(eval_model) -> dict`.

Built in: zeroshot, retrieval, linear_probe, noise_detection, unlearning — each beside its maths in this package.
Register more with `@register(name)` (ncjax.evals.base). An evaluator's config entry may set `every_steps`
(periodic evaluation during training; 0 = only at the end / in `ncjax eval`), `dataset` and `split` (default: the
training dataset's 'test' split) and its own options, passed as keyword arguments: an unknown option is an error.
"""

from __future__ import annotations

from ncjax.evals import common, linear_probe, noise, plots, retrieval, unlearning, zeroshot
from ncjax.evals.base import (EVALUATORS, EvalContext, Evaluator, EvaluatorConfigError, accepted_options,
                              build_evaluator, build_evaluators, check_evaluators, clip_benchmark_records,
                              every_steps, finite_or_none, is_enabled, register, run_evaluators)
from ncjax.evals.linear_probe import LinearProbe
from ncjax.evals.noise import NoiseDetection, pair_scores
from ncjax.evals.retrieval import Retrieval
from ncjax.evals.unlearning import Unlearning
from ncjax.evals.zeroshot import ZeroShot

__all__ = ["EVALUATORS", "EvalContext", "Evaluator", "build_evaluator", "build_evaluators", "run_evaluators",
           "check_evaluators", "EvaluatorConfigError", "finite_or_none",
           "register", "accepted_options", "clip_benchmark_records", "pair_scores", "every_steps", "is_enabled",
           "ZeroShot", "Retrieval", "LinearProbe", "NoiseDetection", "Unlearning", "common", "linear_probe", "noise",
           "plots", "retrieval", "unlearning", "zeroshot"]
