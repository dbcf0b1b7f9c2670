"""MERU, AC and HAC end to end on digits, and every method's stance on MERU's Lorentz geometry."""

import functools
import json
import os

import numpy as np
import jax
import jax.numpy as jnp
import pytest

import recompute
from helpers import leaves, load_config, make_config, tiny_clip_config
from ncjax import data as data_lib
from ncjax import evaluation, train
from ncjax.methods import METHODS

# Each registered method with the config that sets it up.
METHOD_CONFIGS = {"clip": ("clip", ""), "siglip": ("siglip", ""), "gsc": ("gsc", ""), "bayes": ("bayes", ""),
                  "ncu": ("ncu", ""), "ncu_ga": ("ncu", "method=ncu_ga"), "ac": ("ac", ""), "hac": ("hac", ""),
                  "meru": ("meru", ""), "sgraf": ("sgraf", ""), "disncl": ("disncl", "")}


def test_every_method_is_listed():
  # every method ncjax ships (test-only and plugin methods registered by other tests are not ncjax's)
  assert set(METHOD_CONFIGS) == {m for m, cls in METHODS.items() if cls.__module__.startswith("ncjax.")}


@pytest.fixture(scope="module")
def start_models(tmp_path_factory):
  """AC's start: a CLIP checkpoint at step 0 whose parameters are moved (noise of 0.02) off the initialisation that
  AC's own run draws (same seed, same model), so that a calibration that ignored its start would not begin from
  them; no CLIP step is compiled for it (AC's checks read the start's parameters, not its training). HAC's start:
  MERU trained 4 steps (test_meru_trains_with_its_entailment_term checks that run)."""
  root = tmp_path_factory.mktemp("start")
  clip = train.Trainer(tiny_clip_config(arg="noise=0.0,batch=64,epochs=1", total_steps=4), str(root / "clip"))
  state, span = clip.restore_or_init()
  rng = np.random.default_rng(1)
  moved = jax.tree.map(lambda x: jax.device_put(
      (np.asarray(jax.device_get(x)) + 0.02 * rng.standard_normal(x.shape)).astype(x.dtype), x.sharding),
      state["params"])
  clip.save(dict(state, params=moved), 0, span, force=True)
  clip.checkpointer.wait()
  meru = train.train(make_config("meru", "batch=64,epochs=1", total_steps=4), str(root / "meru"))
  return str(root / "clip"), str(root / "meru"), meru


def test_meru_trains_with_its_entailment_term(start_models):
  _, _, meru = start_models
  assert meru.experiment.method.bind(meru.params).model.geometry.name == "lorentz"
  assert {"loss_contrastive", "loss_entailment", "curvature"} <= set(meru.metrics)
  assert np.isfinite(meru.metrics["loss"])
  assert meru.metrics["loss"] == pytest.approx(meru.metrics["loss_contrastive"] + 0.2 * meru.metrics["loss_entailment"],
                                               rel=1e-5)


def _set_params(params, values: dict):
  """params with the leaves at '/'-joined paths replaced by scalars (same dtype and sharding)."""
  params = jax.tree.map(lambda x: x, params)
  for path, value in values.items():
    *parents, leaf = path.split("/")
    node = params
    for p in parents:
      node = node[p]
    node[leaf] = jax.device_put(np.asarray(value, node[leaf].dtype), node[leaf].sharding)
  return params


def test_meru_training_step_clamps_curvature_alphas_and_logit_scale_from_past_their_bounds(start_models):
  """One training step from stored scalars set past MERU's bounds ends with each exactly on its bound: curvature
  in [c0/10, 10 c0] (c0 = 1, stored as logs), alphas <= 0, logit scale <= ln 100 (MERU's and open_clip's clamps
  on the stored parameters; a step of Adam at lr ~1e-4 moves a scalar by ~1e-4, far less than the 1.0 past).
  Both sides through the start model's own compiled step: its last state, at step 0, with the scalars replaced."""
  meru = start_models[2]
  (span,) = meru.trainer.spans
  program = meru.trainer.program(span)
  batch, _ = meru.experiment.train_data.global_batch(0)
  copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))   # a step donates its input state
  for side in ("above", "below"):
    state = copy(meru.state)
    state["step"] = jax.device_put(np.int32(0), state["step"].sharding)
    past = 1.0 if side == "above" else -1.0
    start = {"model/geometry/curv": (np.log(10.0) if side == "above" else np.log(0.1)) + past,
             "model/geometry/visual_alpha": 0.5, "model/geometry/textual_alpha": 0.5 if side == "above" else -3.0,
             "model/logit_scale": np.log(100.0) + 1.0 if side == "above" else 1.0}
    state["params"] = _set_params(state["params"], start)
    with jax.set_mesh(meru.experiment.mesh):   # as the loop calls it: the traced step is reused
      new, metrics = program.step(state, batch)
    assert np.isfinite(float(metrics["loss"])), side
    geo = jax.device_get(new["params"]["model"]["geometry"])
    scale = float(jax.device_get(new["params"]["model"]["logit_scale"]))
    assert float(geo["curv"]) == pytest.approx(np.log(10.0) if side == "above" else np.log(0.1), abs=1e-6), side
    assert float(geo["visual_alpha"]) == 0.0, side
    if side == "above":
      assert float(geo["textual_alpha"]) == 0.0 and scale == pytest.approx(np.log(100.0), abs=1e-6)
    else:   # inside their ranges: the step moves them only slightly, no clamp
      assert float(geo["textual_alpha"]) == pytest.approx(-3.0, abs=1e-2) and scale == pytest.approx(1.0, abs=1e-2)


def _trainer(name, geometry, tmp_path):
  config_name, arg = METHOD_CONFIGS[name]
  concept = {"concept.classes": ("three",)} if name in ("ac", "hac") else {}   # region data has no classes
  cfg = make_config(config_name, ",".join(x for x in (arg, "batch=32") if x), total_steps=1,
                    **{"model.geometry": geometry, "method.init_from": "random"}, **concept)
  return train.Trainer(cfg, str(tmp_path))


# Methods whose training steps in this module run on MERU's Lorentz model, with finite losses: MERU's start model
# (test_meru_trains_with_its_entailment_term) and HAC's calibration from it. (Below MERU's tests: CLIP's model in
# the Lorentz geometry is MERU's, whose initialisation MERU's start model has compiled by then.)
TRAINED_IN_LORENTZ_IN_THIS_MODULE = ("meru", "hac")


@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_each_method_works_in_the_lorentz_geometry_or_refuses_it(name, tmp_path):
  """A method either computes its loss through the geometry (finite on MERU's model: its sphere path is tested
  with the method) or refuses the geometry it does not support when the experiment is built."""
  supported = METHODS.get(name).supported_geometries
  for geometry in ("sphere", "lorentz"):
    if geometry not in supported:
      with pytest.raises(ValueError, match=rf"method '{name}' supports model.geometry in .* not '{geometry}'"):
        _trainer(name, geometry, tmp_path / geometry)
  if "lorentz" not in supported or name in TRAINED_IN_LORENTZ_IN_THIS_MODULE:
    return
  trainer = _trainer(name, "lorentz", tmp_path / "run")
  exp, span = trainer.exp, trainer.spans[0]
  params = trainer.init_params()   # (no optimiser state: only the loss is computed)
  method_state = jax.jit(functools.partial(exp.method.init_state, trainer.capacity), out_shardings=trainer.ms_sh)()
  batch, _, _ = next(exp.train_data.batches(0, 1))
  batch = {k: v for k, v in batch.items() if k not in ("clean", "label")}
  with jax.set_mesh(exp.mesh):
    loss, _ = jax.jit(span.stage.updates[0].loss_fn)(params, method_state, batch, jax.random.PRNGKey(0))
  assert np.isfinite(float(loss)) and exp.method.bind(params).model.geometry.name == "lorentz"


@pytest.mark.parametrize("config_name,start", [("ac", 0), ("hac", 1)])
def test_calibration_runs_from_its_start_model_and_reports_forget_retain_metrics(start_models, config_name, start,
                                                                                  tmp_path, monkeypatch):
  init = start_models[start]
  cfg = make_config(config_name, f"init={init},batch=32", total_steps=3)
  with cfg.unlocked():   # the config's own unlearning evaluator (make_config drops evaluators)
    cfg.evals = {"unlearning": load_config(config_name, f"init={init},batch=32").evals.unlearning}
  trainer = train.Trainer(cfg, str(tmp_path))
  start_params = leaves(trainer.init_params())
  from ncjax import checkpoint as ckpt_lib
  source = leaves(ckpt_lib.restore_params(init)[0])
  for key, value in source.items():
    np.testing.assert_array_equal(start_params[key], value)
  result = trainer.run()
  assert np.isfinite(result.metrics["loss"]) and "loss_neg" in result.metrics
  geometry = result.experiment.method.bind(result.params).model.geometry.name
  assert geometry == ("lorentz" if config_name == "hac" else "sphere")
  if config_name == "hac":
    assert {"loss_r_ent", "loss_f_ent", "loss_norm_reg"} <= set(result.metrics)
  spy = recompute.ScoreSpy(monkeypatch)
  evals = evaluation.final(cfg, result, str(tmp_path))
  unl = evals["unlearning"]
  # F-acc / R-acc and the forget / retain recalls recomputed here from the scores the evaluator ranked, and those
  # scores checked against the run's own embeddings: the digits test split's 359 images, 718 captions, and the 10
  # class prompts of the slides' single template "a picture of a {}" (one template: no ensemble to restate).
  exp = result.experiment
  split = data_lib.load_split(exp.resolved.input, "test", exp.model_spec.image_size)
  em = exp.method.eval_model(result.params)
  img, txt = recompute.split_embeddings(em, split, exp.tokenizer, cfg, exp.model_spec.image_size)
  prompts = exp.tokenizer.encode([f"a picture of a {name}" for name in split.class_names])
  weights = np.asarray(jax.jit(em.encode_text)(prompts))
  class_scores = spy.of_shape((split.num_images, len(split.class_names)))
  np.testing.assert_allclose(class_scores, np.asarray(jax.jit(em.score)(img, weights)), atol=1e-4)
  labels, forget = np.asarray(split.image_labels), np.asarray(split.image_labels) == 3    # concept: "three"
  predicted = class_scores.argmax(axis=1)
  assert unl["F_acc"] == pytest.approx(np.mean(predicted[forget] == 3), abs=1e-12)
  assert unl["R_acc"] == pytest.approx(np.mean(predicted[~forget] == labels[~forget]), abs=1e-12)
  assert (unl["n_forget"], unl["n_retain"]) == (forget.sum(), (~forget).sum())
  sim = spy.of_shape((split.num_images, split.num_captions))
  np.testing.assert_allclose(sim, np.asarray(jax.jit(em.score)(img, txt)), atol=1e-4)
  i2t, t2i = recompute.ranks(sim, split.caption_to_image)
  caption_forget = forget[np.asarray(split.caption_to_image)]
  for k in (1, 5, 10):
    assert unl[f"forget_i2t_R@{k}"] == pytest.approx(100 * np.mean(i2t[forget] < k), abs=1e-9)
    assert unl[f"retain_t2i_R@{k}"] == pytest.approx(100 * np.mean(t2i[~caption_forget] < k), abs=1e-9)
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
