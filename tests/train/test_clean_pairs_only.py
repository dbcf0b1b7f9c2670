"""noise.train_on='clean' (NC-bench's `oracle` row): training on only the pairs the injected noise left intact, with
the step budget of all pairs — and one clear line where it cannot apply."""

import numpy as np
import pytest

from helpers import load_config


def _experiment(arg: str):
  from ncjax.experiment import build_experiment
  return build_experiment(load_config("clip", arg))


def test_every_step_draws_only_intact_pairs_for_the_budget_of_all_pairs():
  from ncjax.train.schedule import stage_spans
  oracle = _experiment("noise=0.4,batch=64,epochs=3,train_on=clean")
  everyone = _experiment("noise=0.4,batch=64,epochs=3")
  clean = np.asarray(oracle.noisy.clean)
  assert oracle.noisy.sha256 == everyone.noisy.sha256   # the same noise draw: the oracle knows which pairs it hit
  assert 0.3 < 1 - clean.mean() < 0.5
  np.testing.assert_array_equal(oracle.train_data.examples, np.flatnonzero(clean))
  assert oracle.train_data.num_examples == everyone.train_data.num_examples   # ids (state capacity) unchanged

  # The budget: the main stage as long in steps as an epoch-count run over all pairs, more passes over fewer pairs.
  n_all = everyone.train_data.steps_per_epoch
  assert oracle.train_data.steps_per_epoch < n_all
  oracle_steps = sum(s.steps for s in stage_spans(oracle.method.stages(), oracle.steps_per_epoch))
  everyone_steps = sum(s.steps for s in stage_spans(everyone.method.stages(), everyone.steps_per_epoch))
  assert oracle_steps == everyone_steps == 3 * n_all

  drawn = np.concatenate([oracle.train_data.indices(step) for step in range(oracle_steps)])
  assert clean[drawn].all(), "a noisy pair reached an oracle batch"
  assert len(np.unique(drawn)) == clean.sum()   # and every intact pair is trained on
  assert not clean[np.concatenate([everyone.train_data.indices(s) for s in range(everyone_steps)])].all()


def test_config_num_steps_still_wins():
  from ncjax.train.schedule import stage_spans
  cfg = load_config("clip", "noise=0.4,batch=64,epochs=3,train_on=clean")
  with cfg.unlocked():
    cfg.num_steps = 5
  from ncjax.experiment import build_experiment
  exp = build_experiment(cfg)
  assert [s.steps for s in stage_spans(exp.method.stages(), exp.steps_per_epoch)] == [5]


@pytest.mark.parametrize("change, expected", [
    (dict(dataset="web:/data/shards"), "ncjax filter"),
    (dict(noise_kind="in_batch_resample"), "in_batch_resample"),
    (dict(concept_train_on="retain"), "set one of them"),
])
def test_what_it_cannot_apply_to_is_one_clear_line(change, expected):
  from ncjax import errors
  from ncjax.experiment import check_train_on, resolve
  cfg = load_config("clip", "noise=0.4,batch=64,train_on=clean")
  with cfg.unlocked():
    if "dataset" in change:
      cfg.input.dataset = change["dataset"]
    if "noise_kind" in change:
      cfg.noise.kind = change["noise_kind"]
    if "concept_train_on" in change:
      cfg.concept.train_on, cfg.concept.classes = change["concept_train_on"], ("0",)
  with pytest.raises(errors.ConfigurationError, match=expected) as raised:
    check_train_on(resolve(cfg))
  assert "\n" not in str(raised.value)


def test_an_unknown_choice_names_the_known_ones():
  from ncjax.experiment import resolve
  cfg = load_config("clip", "noise=0.4,train_on=intact")
  with pytest.raises(ValueError, match=r"noise.train_on 'intact'.*\('all', 'clean'\)"):
    resolve(cfg)


def test_ncbench_oracle_row_trains_clip_on_the_clean_pairs(tmp_path):
  from ncjax import config_lib
  from ncjax.cli import ncbench
  bench = config_lib.load_config_file("ncbench", "noise=0.4,seeds=1,methods=clip+oracle").bench
  cells = ncbench.cells_of(bench)
  oracle = next(c for c in cells if c.method == "oracle")
  cfg = ncbench.cell_config(bench, oracle, str(tmp_path))
  assert cfg.method.name == "clip" and cfg.noise.train_on == "clean"
  assert ncbench.cell_config(bench, next(c for c in cells if c.method == "clip"), str(tmp_path)).noise.train_on == "all"
