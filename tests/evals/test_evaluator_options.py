"""Evaluators are constructed with their options as keyword arguments: a misspelt option is an error."""

import ml_collections
import pytest

from helpers import tiny_clip_config
from ncjax import evals, experiment
from ncjax.models import ModelSpec


def _context():
  cfg = tiny_clip_config()
  return evals.EvalContext(experiment.input_spec(cfg.input), tokenizer=None, mesh=None,
                           model=ModelSpec.from_config(cfg.model))


def test_options_reach_the_evaluator_and_generic_keys_are_stripped():
  cfg = ml_collections.ConfigDict(dict(
      zs=dict(type="zeroshot", templates="imagenet7", every_steps=5),
      ret=dict(type="retrieval", folds=5, split="test"),
      unl=dict(type="unlearning", forget_classes=["three"], average="macro")))
  built = evals.build_evaluators(cfg, _context())
  assert isinstance(built["zs"], evals.ZeroShot) and built["zs"].templates == "imagenet7"
  assert built["ret"].folds == 5 and built["ret"].split == "test"
  assert built["unl"].forget_classes == ["three"] and built["unl"].average == "macro"


def test_misspelt_option_names_the_evaluator_and_its_accepted_options():
  cfg = ml_collections.ConfigDict(dict(zeroshot=dict(type="zeroshot", templtes="digits")))
  with pytest.raises(ValueError, match=r"evals.zeroshot: evaluator 'zeroshot' has no option 'templtes'; "
                                       r"it accepts \['classnames', 'data_dir', 'dataset', 'split', 'templates'\]"):
    evals.build_evaluators(cfg, _context())


def test_missing_required_option_and_unknown_type_are_errors():
  with pytest.raises(ValueError, match=r"evals.u: evaluator 'unlearning'.*forget_classes"):
    evals.build_evaluators(ml_collections.ConfigDict(dict(u=dict(type="unlearning"))), _context())
  with pytest.raises(ValueError, match=r"evals.x: unknown evaluator type 'zeroshoot'; registered: \["):
    evals.build_evaluators(ml_collections.ConfigDict(dict(x=dict(type="zeroshoot"))), _context())


def test_accepted_options_include_the_shared_ones():
  assert evals.accepted_options(evals.LinearProbe) == ["data_dir", "dataset", "protocol", "split", "train_split",
                                                       "val_fraction"]


def test_evaluators_that_cannot_run_fail_before_training_with_the_fix():
  # The default zero-shot evaluator on region features (no class labels), a split that was never built, and a
  # forget class the data lacks: all reported at once, before any step, each with how to fix or switch it off.
  from helpers import load_config
  from ncjax import evaluation
  from ncjax.experiment import build_experiment
  cfg = load_config("clip", "noise=0.4,batch=64")
  exp = build_experiment(cfg)
  evaluation.check(cfg, exp)   # the defaults run on digits
  with cfg.unlocked():
    cfg.evals.retrieval.split = "validation"
    cfg.evals.unl = dict(type="unlearning", forget_classes=["thirteen"])
  with pytest.raises(evals.EvaluatorConfigError) as err:
    evaluation.check(cfg, exp)
  msg = str(err.value)
  assert "evals.retrieval:" in msg and "'validation'" in msg and "--config.evals.retrieval.enabled=False" in msg
  assert "evals.unl: forget classes ['thirteen'] are not classes of digits" in msg
  region = load_config("clip", "noise=0.4,batch=64,data=precomp_synthetic")
  with pytest.raises(evals.EvaluatorConfigError, match=r"evals.zeroshot: precomp_synthetic/test has no class labels"):
    evaluation.check(region, exp)


def test_undefined_metrics_are_written_as_null_not_nan():
  import json
  import math
  out = evals.finite_or_none(dict(noise_detection=dict(auc=math.nan, noise_rate=0.0), r=[1.0, math.inf]))
  assert out == dict(noise_detection=dict(auc=None, noise_rate=0.0), r=[1.0, None])
  json.dumps(out, allow_nan=False)
