"""ncjax.sweep without training: values parsed as the config's types, the grid and its run names, the points an
array task or a shard takes, the workdir's definition rule, the table over seeds, the best point chosen on the
validation metric (never the test one), and the held-out part of a split that has no validation split."""

import numpy as np
import pytest

from helpers import load_config
from ncjax import config_lib, sweep
from ncjax.data import holdout
from ncjax.data.embedded import digits
from ncjax.sweep import grid, results


def test_values_are_parsed_as_the_type_of_the_configs_value():
  cfg = load_config("gsc", "")
  assert grid.parse_axis(cfg, "optim.lr=1e-3,3e-3") == ("optim.lr", (1e-3, 3e-3))
  assert grid.parse_axis(cfg, "loss.gamma=1,2") == ("loss.gamma", (1.0, 2.0))          # a float key: 1 -> 1.0
  assert grid.parse_axis(cfg, "input.global_batch_size=64,128")[1] == (64, 128)
  assert grid.parse_axis(cfg, "num_steps=5,10")[1] == (5, 10)                          # a typed placeholder (int)
  assert grid.parse_axis(cfg, "input.augment=true,0")[1] == (True, False)
  assert grid.parse_axis(cfg, "model.size=micro,tiny")[1] == ("micro", "tiny")
  assert grid.parse_axis(cfg, "input.crop_scale=(0.5,1.0),(0.9,1.0)")[1] == ((0.5, 1.0), (0.9, 1.0))
  for flag, words in [("optim.lrr=1", "no key 'optim.lrr'; closest known keys: optim.lr"),
                      ("optim.lr=1e-3,fast", "value 'fast' is not a float"),
                      ("input.global_batch_size=64,1.5", "value '1.5' is not an int"),
                      ("input.augment=maybe", "is not a boolean"),
                      ("optim.lr=", "an empty list"), ("optim.lr=1e-3,", "an empty list"),
                      ("optim=1", "a section of the config"), ("optim.lr", "expected KEY=V1,V2"),
                      ("optim.lr=1e-3,0.001", "listed twice")]:
    with pytest.raises(grid.SweepError, match=words.replace("(", r"\(")):
      grid.parse_axis(cfg, flag)


def test_grid_run_names_and_the_points_an_index_or_a_shard_takes():
  cfg = load_config("gsc", "")
  points = grid.points_of(cfg, ["optim.lr=1e-3,3e-3", "loss.gamma=0.5,1,2"])
  assert len(points) == 6 and points[1] == (("optim.lr", 1e-3), ("loss.gamma", 1.0))
  runs = grid.runs_of(points, [0, 1])
  assert [r.name for r in runs[:3]] == ["lr=0.001_gamma=0.5_seed=0", "lr=0.001_gamma=0.5_seed=1",
                                        "lr=0.001_gamma=1_seed=0"]
  assert runs[1].overrides == {"seed": 1, "noise.seed": 1, "input.shuffle_seed": 1, "optim.lr": 1e-3,
                               "loss.gamma": 0.5}
  assert [r.name for r in grid.select(runs, 6, index=5)] == ["lr=0.003_gamma=2_seed=0", "lr=0.003_gamma=2_seed=1"]
  shards = [grid.select(runs, 6, shard=f"{i}/4") for i in range(4)]
  assert sorted(r.name for s in shards for r in s) == sorted(r.name for r in runs)      # a partition
  assert {r.index for r in shards[1]} == {1, 5}
  with pytest.raises(grid.SweepError, match="--index=6 is past the last point: this sweep has 6 points"):
    grid.select(runs, 6, index=6)
  with pytest.raises(grid.SweepError, match="--index and --shard together"):
    grid.select(runs, 6, index=0, shard="0/2")
  # the same leaf twice: longer names; names that coincide once made readable: a hash of the point
  assert grid.short_names(["optim.lr", "method.lr", "loss.gamma"]) == {
      "optim.lr": "optim.lr", "method.lr": "method.lr", "loss.gamma": "gamma"}
  clash = grid.runs_of([(("model.size", "a/b"),), (("model.size", "a b"),)], None)
  assert clash[0].name != clash[1].name and all(r.name.startswith("size=a-b_") for r in clash)
  # a config file's own points (get_sweep) crossed with the flags; its values checked against the config
  file_points = [{"loss.gamma": 1, "model.size": "micro"}, {"loss.gamma": 2.5}]
  both = grid.points_of(cfg, ["optim.lr=1e-3,3e-3"], file_points)
  assert len(both) == 4 and both[0] == (("loss.gamma", 1.0), ("model.size", "micro"), ("optim.lr", 1e-3))
  with pytest.raises(grid.SweepError, match="get_sweep: loss.gamma='x' is a str, but the config's loss.gamma"):
    grid.points_of(cfg, [], [{"loss.gamma": "x"}])
  with pytest.raises(grid.SweepError, match="both set"):
    grid.points_of(cfg, ["loss.gamma=1,2"], file_points)


def test_a_config_files_get_sweep_is_read(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("from ncjax import config_lib\n"
                  "def get_config(arg=None):\n  return config_lib.load_config_file('clip', arg)\n"
                  "def get_sweep(arg=None):\n  return [{'optim.lr': lr} for lr in (1e-3, 2e-3)]\n")
  assert config_lib.load_sweep_points(f"{path}:model=micro") == [{"optim.lr": 1e-3}, {"optim.lr": 2e-3}]
  assert config_lib.load_sweep_points("clip:model=micro") is None


def test_a_workdir_holds_one_sweep_and_the_difference_is_named():
  cfg = load_config("clip", "model=micro")
  a = sweep.plan(cfg, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=2)
  assert grid.definition_difference(a.definition(), a.definition()) == ""
  quiet = config_lib.set_dotted(cfg.copy_and_resolve_references(), {"log.tensorboard": True, "ckpt.keep": 1})
  assert sweep.plan(quiet, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=2).definition() == a.definition()
  b = sweep.plan(cfg, sweep_flags=["optim.lr=1e-3,1e-2"], seeds=3)
  text = grid.definition_difference(a.definition(), b.definition())
  assert "points [{optim.lr=0.001}, {optim.lr=0.003}] (2) -> [{optim.lr=0.001}, {optim.lr=0.01}] (2)" in text
  assert "seeds [0, 1] -> [0, 1, 2]" in text
  longer = config_lib.set_dotted(cfg.copy_and_resolve_references(), {"num_epochs": 3})
  c = sweep.plan(longer, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=2)
  assert grid.definition_difference(a.definition(), c.definition()) == "config num_epochs: 40 -> 3"


def _records():
  """Two points x two seeds whose test metric prefers point 0 and whose validation metric prefers point 1."""
  out = []
  for index, (val, test) in enumerate([(10.0, 90.0), (20.0, 50.0)]):
    for seed in (0, 1):
      out.append(dict(name=f"p{index}_s{seed}", index=index, point={"optim.lr": [1e-3, 3e-3][index]}, seed=seed,
                      steps=3, seconds=1.0,
                      metrics={"val_retrieval/rsum": val + seed, "retrieval/rsum": test + 2 * seed,
                               "noise_detection/auc": float("nan")}))
  return out


def test_table_over_seeds_and_the_best_point_by_validation_not_test():
  rows = results.by_point(_records())
  assert rows[1]["metrics"]["retrieval/rsum"] == pytest.approx((51.0, 1.0))
  assert "noise_detection/auc" not in rows[0]["metrics"]             # no finite value: left out, shown as '-'
  metrics = results.shown_metrics(rows, "retrieval/rsum")
  assert metrics == ["val_retrieval/rsum", "retrieval/rsum"]
  table = results.format_markdown(rows, ["optim.lr"], metrics)
  assert "| 0.003 |     2 |       20.50 ± 0.50 |   51.00 ± 1.00 |" in table, table
  best = results.best_json(rows, "retrieval/rsum", {"split": "train:holdout"}, "ncjax train ...")
  assert best["point"] == {"optim.lr": 3e-3} and best["chosen_by"] == "val_retrieval/rsum"   # not point 0 (test)
  assert best["test_metrics"]["retrieval/rsum"] == {"mean": 51.0, "std": 1.0}
  assert results.best_point(rows, "retrieval/rsum:min")["index"] == 0
  with pytest.raises(ValueError, match="no run reports val_zeroshot/acc1"):
    results.best_point(rows, "zeroshot/acc1")
  for bad in ("rsum", "retrieval/rsum:best", "/rsum"):
    with pytest.raises(ValueError, match="expected EVALUATOR/METRIC"):
      results.parse_select(bad)


def test_validation_split_own_named_or_held_out_and_the_test_split_flagged():
  cfg = load_config("clip", "model=micro,noise=0.4")
  held, info = sweep.with_validation(cfg, "retrieval/rsum")
  assert info["source"] == "holdout" and held.input.split == "train:fit"
  assert held.evals.val_retrieval.split == "train:holdout" and held.evals.retrieval.split == "test"
  assert held.evals.val_retrieval.plot is False
  region = load_config("sgraf", "")
  assert sweep.with_validation(region, "retrieval/rsum")[1]["split"] == "dev"   # precomp_synthetic's own
  named, info = sweep.with_validation(cfg, "zeroshot/acc1", validation_split="test")
  assert info["optimistic"] and "optimistic" in info["note"] and named.input.split == "train"
  rows = results.by_point(_records())
  assert "optimistic" in results.best_json(rows, "retrieval/rsum", info, "")["warning"]
  with pytest.raises(sweep.SweepError, match="evaluates no split"):
    sweep.with_validation(cfg, "noise_detection/auc")
  with pytest.raises(sweep.SweepError, match="no enabled evaluator 'zeroshotx'"):
    sweep.with_validation(cfg, "zeroshotx/acc1")


def test_held_out_images_leave_training_with_their_captions():
  train = digits.load("train")
  fit, held = holdout.carve(train, "fit"), holdout.carve(train, "holdout")
  assert held.num_images == round(0.1 * train.num_images) and fit.num_images + held.num_images == train.num_images
  assert not set(fit.image_ids) & set(held.image_ids)
  assert fit.num_captions + held.num_captions == train.num_captions
  # each caption still describes its own image, renumbered
  index = {int(i): k for k, i in enumerate(train.image_ids)}
  for part in (fit, held):
    for c in (0, part.num_captions // 2, part.num_captions - 1):
      original = index[int(part.image_ids[part.caption_to_image[c]])]
      np.testing.assert_array_equal(part.images[part.caption_to_image[c]], train.images[original])
      assert part.captions[c] in [train.captions[k] for k in np.flatnonzero(train.caption_to_image == original)]
  np.testing.assert_array_equal(holdout.held_out_images(1000), holdout.held_out_images(1000))   # fixed
  with pytest.raises(ValueError, match="a split's part is fit or holdout"):
    holdout.parse("train:val")


def test_every_run_of_a_sweep_goes_into_one_wandb_group(tmp_path):
  cfg = config_lib.set_dotted(load_config("clip", "model=micro"), {"log.wandb": True, "log.wandb_mode": "offline"})
  plan = sweep.plan(cfg, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=2)
  plan.wandb_group = "my_sweep"
  configs = [plan.config_of(r) for r in plan.runs]
  assert {c.log.wandb_group for c in configs} == {"my_sweep"}
  assert [c.log.wandb_name for c in configs] == [r.name for r in plan.runs]
  # ... and the group reaches W&B (offline: read back from the run's own log)
  import glob
  import os
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train"))
  from test_tracking import wandb_records
  from ncjax.logging_utils import WandbRun
  run = WandbRun(str(tmp_path), project="ncjax-test", name=configs[0].log.wandb_name, mode="offline",
                 group=configs[0].log.wandb_group)
  run.finish()
  (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
  import time
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:   # wandb's service may still be writing the run's log after finish()
    records = wandb_records(path)
    if any(r.WhichOneof("record_type") == "exit" for r in records):
      break
    time.sleep(0.2)
  starts = [r.run for r in records if r.WhichOneof("record_type") == "run"]
  assert [(s.run_group, s.display_name) for s in starts] == [("my_sweep", "lr=0.001_seed=0")]


def test_the_workdir_keeps_the_first_definition_and_refuses_another(tmp_path):
  cfg = load_config("clip", "model=micro")
  first = sweep.plan(cfg, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=2)
  sweep.check_workdir(first, str(tmp_path))
  assert (tmp_path / "sweep.json").is_file()
  sweep.check_workdir(sweep.plan(cfg, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=2, index=1), str(tmp_path))
  with pytest.raises(sweep.SweepError, match=r"holds another sweep \(seeds \[0, 1\] -> \[0, 1, 2\]\)"):
    sweep.check_workdir(sweep.plan(cfg, sweep_flags=["optim.lr=1e-3,3e-3"], seeds=3), str(tmp_path))


def test_finished_runs_are_read_back_never_trained_again(tmp_path):
  import json
  from ncjax.sweep import runner
  plan = sweep.plan(load_config("clip", "model=micro"), sweep_flags=["optim.lr=1e-3,3e-3"])
  for run in plan.runs:
    (tmp_path / "runs" / run.name).mkdir(parents=True)
    (tmp_path / "runs" / run.name / "result.json").write_text(json.dumps({"name": run.name}))
  lines = []

  def trained(run):
    raise AssertionError(f"{run.name} is finished and was trained again")

  records = runner.execute(plan.runs, str(tmp_path), trained, log=lines.append)
  assert records == [{"name": r.name} for r in plan.runs]
  assert lines == ["[sweep] 1/2 lr=0.001: done before | ETA 0:00", "[sweep] 2/2 lr=0.003: done before | ETA 0:00"]
