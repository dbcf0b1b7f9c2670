"""MERU, AC and HAC end to end on digits, and every method's stance on MERU's Lorentz geometry."""

import json
import os

import numpy as np
import jax
import pytest

from helpers import leaves, load_config, make_config, tiny_clip_config
from ncjax import evaluation, train
from ncjax.methods import METHODS

# Each registered method with the config that sets it up.
METHOD_CONFIGS = {"clip": ("clip", ""), "siglip": ("siglip", ""), "gsc": ("gsc", ""), "bayes": ("bayes", ""),
                  "ncu": ("ncu", ""), "ncu_ga": ("ncu", "method=ncu_ga"), "ac": ("ac", ""), "hac": ("hac", ""),
                  "meru": ("meru", ""), "sgraf": ("sgraf", ""), "disncl": ("disncl", "")}


def test_every_method_is_listed():
  # every method ncjax ships (test-only and plugin methods registered by other tests are not ncjax's)
  assert set(METHOD_CONFIGS) == {m for m, cls in METHODS.items() if cls.__module__.startswith("ncjax.")}


def _trainer(name, geometry, tmp_path):
  config_name, arg = METHOD_CONFIGS[name]
  concept = {"concept.classes": ("three",)} if name in ("ac", "hac") else {}   # region data has no classes
  cfg = make_config(config_name, ",".join(x for x in (arg, "batch=32") if x), total_steps=1,
                    **{"model.geometry": geometry, "method.init_from": ""}, **concept)
  return train.Trainer(cfg, str(tmp_path))


@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_each_method_works_in_the_lorentz_geometry_or_refuses_it(name, tmp_path):
  """A method either computes its loss through the geometry (finite on MERU's model: its sphere path is tested
  with the method) or refuses the geometry it does not support when the experiment is built."""
  supported = METHODS.get(name).supported_geometries
  for geometry in ("sphere", "lorentz"):
    if geometry not in supported:
      with pytest.raises(ValueError, match=rf"method '{name}' supports model.geometry in .* not '{geometry}'"):
        _trainer(name, geometry, tmp_path / geometry)
  if "lorentz" not in supported:
    return
  trainer = _trainer(name, "lorentz", tmp_path / "run")
  exp, span = trainer.exp, trainer.spans[0]
  state = trainer.init_state(span)
  batch, _, _ = next(exp.train_data.batches(0, 1))
  batch = {k: v for k, v in batch.items() if k not in ("clean", "label")}
  with jax.set_mesh(exp.mesh):
    loss, _ = jax.jit(span.stage.updates[0].loss_fn)(state["params"], state["method_state"], batch,
                                                     jax.random.PRNGKey(0))
  assert np.isfinite(float(loss)) and exp.method.bind(state["params"]).model.geometry.name == "lorentz"


@pytest.fixture(scope="module")
def start_models(tmp_path_factory):
  root = tmp_path_factory.mktemp("start")
  train.train(tiny_clip_config(arg="noise=0.0,batch=64,epochs=1", total_steps=4), str(root / "clip"))
  meru = train.train(make_config("meru", "batch=64,epochs=1", total_steps=4), str(root / "meru"))
  return str(root / "clip"), str(root / "meru"), meru


def test_meru_trains_with_its_entailment_term_and_clamps(start_models):
  _, _, meru = start_models
  assert {"loss_contrastive", "loss_entailment", "curvature"} <= set(meru.metrics)
  assert meru.metrics["loss"] == pytest.approx(meru.metrics["loss_contrastive"] + 0.2 * meru.metrics["loss_entailment"],
                                               rel=1e-5)
  geo = jax.device_get(meru.params["model"]["geometry"])
  assert float(geo["visual_alpha"]) <= 0 and float(geo["textual_alpha"]) <= 0
  assert np.log(0.1) <= float(geo["curv"]) <= np.log(10.0)


@pytest.mark.parametrize("config_name,start", [("ac", 0), ("hac", 1)])
def test_calibration_runs_from_its_start_model_and_reports_forget_retain_metrics(start_models, config_name, start,
                                                                                  tmp_path):
  init = start_models[start]
  cfg = make_config(config_name, f"init={init},batch=32", total_steps=3)
  with cfg.unlocked():
    cfg.evals = load_config(config_name, f"init={init},batch=32").evals   # make_config drops them
  trainer = train.Trainer(cfg, str(tmp_path))
  start_params = leaves(trainer.init_params())
  from ncjax import checkpoint as ckpt_lib
  source = leaves(ckpt_lib.restore_params(init)[0])
  for key, value in source.items():
    np.testing.assert_array_equal(start_params[key], value)
  result = trainer.run()
  assert np.isfinite(result.metrics["loss"]) and "loss_neg" in result.metrics
  if config_name == "hac":
    assert {"loss_r_ent", "loss_f_ent", "loss_norm_reg"} <= set(result.metrics)
  evals = evaluation.final(cfg, result, str(tmp_path))
  unl = evals["unlearning"]
  assert 0 <= unl["F_acc"] <= 1 and 0 <= unl["R_acc"] <= 1 and "forget_i2t_R@1" in unl
  files = os.listdir(tmp_path / "eval")
  if config_name == "hac":
    assert unl["norm_forget_images"] > 0 and any(f.endswith("_norms.png") for f in files)
  with open(tmp_path / "eval" / "step_3.json") as f:
    assert "unlearning" in json.load(f)["results"]


@pytest.mark.slow   # make test: the loss on one example per device (tests/test_degenerate_properties.py)
def test_hac_step_on_8_devices_equals_1(start_models, tmp_path, devices):
  cfg = make_config("hac", f"init={start_models[1]},batch=32", total_steps=2)
  eight = train.train(cfg, str(tmp_path / "8"))
  one = train.train(cfg, str(tmp_path / "1"), devices=devices[:1])
  a, b = leaves(eight.params), leaves(one.params)
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=5e-5, err_msg=k)


def test_original_variant_evaluates_the_start_model_without_training(start_models, tmp_path):
  cfg = make_config("ac", f"init={start_models[0]},variant=original,batch=32")
  result = train.train(cfg, str(tmp_path))
  assert int(result.state["step"]) == 0
