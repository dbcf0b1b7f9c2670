"""Evaluators are constructed with their options as keyword arguments: a misspelt option is an error."""

import ml_collections
import pytest

from helpers import tiny_clip_config
from ncjax import evals


def _context():
  cfg = tiny_clip_config()
  return evals.EvalContext(cfg, tokenizer=None, mesh=None)


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
                                       r"it accepts \['dataset', 'split', 'templates'\]"):
    evals.build_evaluators(cfg, _context())


def test_missing_required_option_and_unknown_type_are_errors():
  with pytest.raises(ValueError, match=r"evals.u: evaluator 'unlearning'.*forget_classes"):
    evals.build_evaluators(ml_collections.ConfigDict(dict(u=dict(type="unlearning"))), _context())
  with pytest.raises(ValueError, match=r"evals.x: unknown evaluator type 'zeroshoot'; registered: \["):
    evals.build_evaluators(ml_collections.ConfigDict(dict(x=dict(type="zeroshoot"))), _context())


def test_accepted_options_include_the_shared_ones():
  assert evals.accepted_options(evals.LinearProbe) == ["dataset", "protocol", "split", "train_split", "val_fraction"]
