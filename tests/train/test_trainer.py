import json
import os

import numpy as np
import jax
import pytest

from helpers import assert_trees_equal as _assert_trees_equal, changed as _changed, host_params as _params
from helpers import override, stopped_at, tiny_clip_config
import toy_methods  # noqa: F401  (registers the test methods)
from ncjax import checkpoint as ckpt_lib
from ncjax import train

# The held-out tenth of digits (144 pairs): 2 steps per epoch at batch 64, so that epoch ends and stage boundaries
# come within a few steps instead of 22 (the trainer does the same at every epoch length).
SMALL_EPOCHS = {"input.split": "train:holdout"}


def _metrics_rows(workdir):
  return {r["step"]: r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())}


def _clip_run_config():
  return tiny_clip_config(total_steps=6, **{"log.every_steps": 3, "ckpt.every_steps": 3})


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
  """One CLIP run on 8 devices, shared by the tests below: 6 steps, a checkpoint and a metrics row every 3 (the lr
  schedule spans the configured epochs, so its step 3 is any 3-step run's); and the same run resumed from a copy of
  its workdir cut back to the step-3 checkpoint."""
  root = tmp_path_factory.mktemp("clip_run")
  cfg = _clip_run_config()
  cpus = jax.devices("cpu")   # the 8 simulated devices, also where JAX's default backend is a GPU
  full = train.train(cfg, str(root / "full"), devices=cpus)
  at_3 = ckpt_lib.restore_state_on_host(str(root / "full" / "checkpoints" / "3"))[0]
  resumed = train.train(cfg, stopped_at(root / "full", 3, root / "resumed"), devices=cpus)
  return dict(cfg=cfg, root=root, full=full, at_3=at_3, resumed=resumed)


def test_sharded_step_equals_single_device_step(clip_run, tmp_path, devices):
  """8 devices == 1. The single device is JAX's default backend's first: on a GPU host's slice of the suite
  (NCJAX_TEST_ACCELERATOR=1, benchmarks/accelerator/run.sh) the GPU against the 8 simulated CPU devices."""
  single = train.train(clip_run["cfg"], str(tmp_path / "one"), devices=jax.devices()[:1], until=3)
  assert clip_run["full"].experiment.mesh.devices.size == 8 and single.experiment.mesh.devices.size == 1
  assert int(single.state["step"]) == 3 and sorted(os.listdir(tmp_path / "one" / "checkpoints")) == ["3"]
  _assert_trees_equal(clip_run["at_3"]["params"], _params(single), exact=False, atol=2e-5)
  sharded_loss = _metrics_rows(clip_run["root"] / "full")[3]["loss"]
  assert sharded_loss == pytest.approx(_metrics_rows(tmp_path / "one")[3]["loss"], rel=1e-5)


def test_fsdp_mesh_matches_data_parallel(clip_run, tmp_path):
  cfg = tiny_clip_config(total_steps=6, **{"mesh.fsdp": 2, "ckpt.save_at_end": False})   # (nothing reads one)
  fsdp = train.train(cfg, str(tmp_path / "fsdp"), until=3)
  shardings = [x.sharding.spec for x in jax.tree.leaves(fsdp.params)]
  assert any("fsdp" in str(s) for s in shardings), "some parameter should be split over the fsdp axis"
  _assert_trees_equal(clip_run["at_3"]["params"], _params(fsdp), exact=False, atol=2e-5)


def test_resume_is_bitwise_identical_to_uninterrupted(clip_run):
  full, resumed = clip_run["full"], clip_run["resumed"]
  assert int(full.state["step"]) == 6 and int(resumed.state["step"]) == 6
  _assert_trees_equal(_params(full), _params(resumed), exact=True)
  _assert_trees_equal(jax.device_get(full.state["opt_state"]), jax.device_get(resumed.state["opt_state"]))
  meta_dir = clip_run["root"] / "resumed" / "checkpoints" / "6"
  meta = json.loads((meta_dir / "meta" / "metadata").read_text())
  assert meta["step"] == 6 and meta["method"] == "clip" and meta["noise_sha256"]
  assert meta["config"]["noise"]["ratio"] == 0.4 and meta["tokenizer"]["kind"] == "word"
  data_state = json.loads((meta_dir / "data" / "metadata").read_text())
  assert data_state["next_step"] == 6


def test_metrics_jsonl_has_loss_norms_and_throughput(clip_run):
  rows = _metrics_rows(clip_run["root"] / "full")
  assert sorted(rows) == [3, 6]   # log.every_steps=3
  for key in ("loss", "grad_norm", "param_norm", "examples_per_sec", "lr/default"):
    assert key in rows[6]


def test_batch_not_divisible_by_devices_is_a_clear_error(tmp_path):
  cfg = tiny_clip_config(**{"input.global_batch_size": 60})
  with pytest.raises(ValueError, match="global batch size 60 is not divisible by the 8 devices"):
    train.Trainer(cfg, str(tmp_path))


def test_non_finite_loss_names_step_and_batch_ids(tmp_path):
  """The run stops with the step, the fix and the batch's ids, as the kind of error the CLI reports in one line
  with exit status 8 (ncjax.errors; tests/cli/test_errors.py checks that one line for every kind). The loss goes
  non-finite through a parameter that starts as NaN, in the step clip_run has compiled (its config; a learning rate
  that blows the parameters up would be another program to compile, for the same report)."""
  from ncjax import errors
  trainer = train.Trainer(_clip_run_config(), str(tmp_path))
  create = trainer.init_params
  trainer.init_params = lambda: _with_nan_image_projection(create())
  with pytest.raises(errors.DivergedError, match=r"^non-finite loss at step 0 .*lower the learning rate \(optim.lr\) "
                     r"or look at the pairs of that global batch, example ids") as raised:
    trainer.run()
  first_batch_ids = np.sort(trainer.exp.train_data.indices(0)).tolist()
  assert str(raised.value).endswith(f"example ids {first_batch_ids}"), str(raised.value)[-300:]
  assert errors.status_of(raised.value) == 8


def _with_nan_image_projection(params):
  """params with the image tower's output projection NaN (same dtype and sharding): every image embedding, and
  with it the loss, is NaN from the first step on."""
  proj = params["model"]["img"]["proj"]
  poisoned = jax.device_put(np.full(proj.shape, np.nan, proj.dtype), proj.sharding)
  return {**params, "model": {**params["model"], "img": {**params["model"]["img"], "proj": poisoned}}}


@pytest.fixture(scope="module")
def epoch_state_run(tmp_path_factory):
  """The per-sample-state toy method over two short epochs with `optim.freeze` set: one run, one compiled step, for
  the epoch-hook test and the freeze test. Its stage is CLIP's (SingleModelMethod's default parameter groups, the
  config's frozen group first), so the freeze goes through the same groups as a CLIP run's. The parameters it
  starts from are fetched as the run creates them (before the first step donates them)."""
  cfg = tiny_clip_config(**{"method.name": "test_epoch_state", "optim.freeze": r"model/img/.*|model/logit_scale",
                            "ckpt.save_at_end": False, **SMALL_EPOCHS})   # (nothing reads a checkpoint)
  trainer = train.Trainer(cfg, str(tmp_path_factory.mktemp("epoch_state")))
  init, create = [], trainer.init_params
  trainer.init_params = lambda: _fetched(create(), into=init)
  result = trainer.run()
  assert len(init) == 1, "the run did not create its parameters through Trainer.init_params"
  return init[0], result


def _fetched(params, into: list):
  into.append(jax.device_get(params))
  return params


def test_freeze_regex_keeps_parameters_fixed(epoch_state_run):
  init, result = epoch_state_run
  after = jax.device_get(result.params)
  for x, y in zip(jax.tree.leaves(init["model"]["img"]), jax.tree.leaves(after["model"]["img"])):
    np.testing.assert_array_equal(x, y)
  assert float(init["model"]["logit_scale"]) == float(after["model"]["logit_scale"])
  assert any(_changed(init["model"]["txt"], after["model"]["txt"]))


def test_two_stage_schedule_switches_frozen_sets_and_resumes_across_the_boundary(tmp_path):
  cfg = tiny_clip_config(**{"method.name": "test_two_stage", **SMALL_EPOCHS})
  trainer = train.Trainer(cfg, str(tmp_path / "a"))
  spe = trainer.exp.steps_per_epoch
  assert trainer.total_steps == 2 * spe   # stage a's epoch, then stage b's
  fetched, create = [], trainer.init_params
  trainer.init_params = lambda: _fetched(create(), into=fetched)
  stage_a = trainer.run(until=spe)
  (init,) = fetched
  pa = jax.device_get(stage_a.params)
  assert not any(_changed(init["model"]["img"], pa["model"]["img"]))
  assert any(_changed(init["model"]["txt"], pa["model"]["txt"]))
  # Resume exactly at the stage boundary: the checkpoint holds stage a's optimiser, stage b starts afresh.
  done = train.train(cfg, str(tmp_path / "a"))
  assert int(done.state["step"]) == 2 * spe
  pb = jax.device_get(done.params)
  assert not any(_changed(pa["model"]["txt"], pb["model"]["txt"]))
  assert any(_changed(pa["model"]["img"], pb["model"]["img"]))
  no_checkpoint = override(cfg.copy_and_resolve_references(), **{"ckpt.save_at_end": False})   # compared in memory
  straight = train.train(no_checkpoint, str(tmp_path / "b"))
  _assert_trees_equal(_params(straight), _params(done), exact=True)


def test_per_sample_state_and_end_of_epoch_hook(epoch_state_run):
  _, result = epoch_state_run
  exp = result.experiment
  state = jax.device_get(result.state["method_state"])
  assert int(state["epochs"]) == 2  # the hook ran once per epoch
  seen = state["seen"]
  assert seen.shape[0] % 8 == 0 and seen.shape[0] >= exp.train_data.num_examples
  per_epoch = exp.steps_per_epoch * exp.train_data.global_batch_size
  assert exp.train_data.num_examples > per_epoch   # a remainder is left out of each epoch
  assert seen.sum() == 2 * per_epoch
  # Each epoch is a permutation: nobody is seen more than twice in two epochs.
  assert seen.max() <= 2
  ms_sharding = result.state["method_state"]["seen"].sharding
  assert len(ms_sharding.device_set) == 8  # per-sample state is sharded over all devices
  ids = np.concatenate([exp.train_data.indices(s) for s in range(2 * exp.steps_per_epoch)])
  np.testing.assert_array_equal(np.bincount(ids, minlength=seen.shape[0]), seen)


def test_alternating_updates_train_only_their_own_groups(tmp_path):
  """Each step runs the discriminator's update, then the encoder's, here restricted to the text tower: the image
  tower, which neither update trains, stays bitwise where it started, while each update's own group moves."""
  cfg = tiny_clip_config(total_steps=2, **{"method.name": "test_alternating", "ckpt.save_at_end": False})
  with cfg.unlocked():
    cfg.method.enc_update_trains = r"model/txt/.*"
  trainer = train.Trainer(cfg, str(tmp_path))
  fetched, create = [], trainer.init_params
  trainer.init_params = lambda: _fetched(create(), into=fetched)
  res = trainer.run()
  (init,) = fetched
  after = jax.device_get(res.params)
  assert not any(_changed(init["model"]["img"], after["model"]["img"]))
  assert all(_changed(init["disc"], after["disc"]))
  assert any(_changed(init["model"]["txt"], after["model"]["txt"]))
  assert "disc/loss" in res.metrics and "enc/loss" in res.metrics


@pytest.mark.parametrize("fsdp", [1, 2])
def test_parameters_drawn_split_over_the_mesh_equal_those_drawn_whole_on_every_device(fsdp):
  """shard_lib.initialise_params draws each replicated parameter split over the 8 devices and gathers it (a
  49,408-token embedding: ~1 s instead of 8-10 s on 8 CPU devices): the same bits as the initialisation run whole
  on every device (replicated over a mesh of the same 8 devices: one program for both cases), data-parallel and
  FSDP."""
  from ncjax import experiment, sharding as shard_lib
  exp = experiment.build_experiment(tiny_clip_config(**{"mesh.fsdp": fsdp}))
  abstract = exp.method.abstract_params()
  param_sh = shard_lib.param_shardings(abstract, exp.mesh)
  spread = shard_lib.spread_over_mesh(abstract, param_sh, exp.mesh)
  embedding = spread["model"]["txt"]["token_embedding"]["embedding"]
  assert any(part is not None for part in embedding.spec), embedding
  drawn = shard_lib.initialise_params(exp.method.init_params, abstract, param_sh, exp.mesh)
  every_device = jax.sharding.Mesh(np.array(sorted(exp.mesh.devices.flat, key=lambda d: d.id)), ("all",))
  whole = jax.jit(exp.method.init_params, out_shardings=shard_lib.replicated(every_device))()
  assert [x.sharding for x in jax.tree.leaves(drawn)] == jax.tree.leaves(param_sh)
  _assert_trees_equal(whole, drawn)
