"""The one Registry behind methods, evaluators, towers, geometries, datasets, tokenizers and Sinkhorn solvers."""

import pytest

from ncjax.registry import Registry


def test_registry_refuses_duplicates_and_names_known_entries():
  reg = Registry("widget")

  @reg.register("a")
  class A:
    pass

  assert reg.get("a") is A and "a" in reg and reg.names() == ["a"]
  reg.add("a", A)   # the same object again (a module reload) is fine

  class Other:
    pass

  with pytest.raises(ValueError, match=r"widget 'a' is registered twice"):
    reg.add("a", Other)
  with pytest.raises(ValueError, match=r"unknown widget 'b'; registered: \['a'\]"):
    reg.get("b")


def test_each_kind_of_named_component_has_a_populated_registry_that_refuses_duplicates():
  """Methods, evaluators, towers, geometries, datasets, tokenizers and Sinkhorn solvers each live in one Registry
  (named as such: that every lookup by name in ncjax goes through one is a convention, not checked here)."""
  from ncjax import data, evals, methods, models, ot, tokenizers
  from ncjax.models import geometry, two_tower
  for reg in (methods.METHODS, evals.EVALUATORS, two_tower.IMAGE_TOWERS, two_tower.TEXT_TOWERS,
              geometry.GEOMETRIES, data.DATASETS, tokenizers.TOKENIZERS, ot.SOLVERS):
    assert isinstance(reg, Registry) and len(reg) > 0
  with pytest.raises(ValueError, match="unknown method 'clipp'"):
    methods.METHODS.get("clipp")
  with pytest.raises(ValueError, match="evaluator 'zeroshot' is registered twice"):
    evals.register("zeroshot")(type("Impostor", (evals.Evaluator,), {"run": lambda self, m, s=None: {}}))
