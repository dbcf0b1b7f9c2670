"""Adding a method = its losses + a Method + a config, and nothing else: a method written outside ncjax
(tests/plugins/toy_plugin.py and toy_config.py) trains through `ncjax train` with every default evaluator, periodic
and final, and runs as an NC-bench row, without an edit to any ncjax module."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT

PLUGIN = os.path.join(ROOT, "tests", "plugins", "toy_plugin.py")
CONFIG = os.path.join(ROOT, "tests", "plugins", "toy_config.py")


def test_a_plugin_method_trains_through_the_cli_with_periodic_and_final_evaluation(tmp_path):
  args = [sys.executable, "-m", "ncjax.main", "train", f"--plugins={PLUGIN}", f"--config={CONFIG}:batch=64",
          f"--workdir={tmp_path}", "--cpu_devices=8", "--config.total_steps=4", "--config.log.progress=False",
          "--config.evals.noise_detection.every_steps=2"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  final = json.loads((tmp_path / "eval" / "step_4.json").read_text())
  assert final["method"] == "toy_hinge" and set(final["results"]) == {"zeroshot", "retrieval", "noise_detection"}
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  periodic = {r["step"]: r["noise_detection/auc"] for r in rows if r["kind"] == "eval"}
  assert sorted(periodic) == [2, 4]
  # The periodic evaluation at step 4 and the final one score the same state through the same path.
  assert periodic[4] == final["results"]["noise_detection"]["auc"]
  # ... and both are the AUC of the method's own clean score: minus each pair's last hinge, as the run's checkpoint
  # holds it in the plugin's per-sample state (read here from the checkpoint, not from the evaluator's output), by
  # scikit-learn against the ground-truth noise.
  saved = np.load(tmp_path / "eval" / "step_4_clean_scores.npz")
  assert str(saved["method"]) == "toy_hinge"
  from sklearn.metrics import roc_auc_score
  from helpers import load_config
  from ncjax import checkpoint as ckpt_lib
  from ncjax.data import noise
  from ncjax.data.embedded import digits
  cfg = load_config("clip", "noise=0.4")
  split = digits.load("train")
  clean = noise.make_noisy_index(split.caption_to_image, cfg.noise.ratio, cfg.noise.seed).clean
  state, _, step = ckpt_lib.restore_state_on_host(str(tmp_path))
  hinge = np.asarray(state["method_state"]["hinge"])[:len(clean)]
  assert step == 4 and np.count_nonzero(hinge) > 0   # the pairs seen in 4 steps have a hinge, the others 0
  np.testing.assert_array_equal(saved["scores"], -hinge)
  np.testing.assert_array_equal(saved["clean"], clean)
  assert final["results"]["noise_detection"]["auc"] == pytest.approx(roc_auc_score(clean, -hinge), abs=1e-9)


def test_a_plugin_method_is_an_nc_bench_row(tmp_path):
  from ncjax import config_lib
  from ncjax.cli import main, ncbench
  main.load_plugins([PLUGIN])
  assert "toy_hinge" in ncbench.methods() and "symmetric hinge" in ncbench.legend(["toy_hinge"])
  cfg = config_lib.load_config_file("ncbench", "methods=toy_hinge,noise=0.4,seeds=1,epochs=1,batch=64,model=micro,"
                                                 "reference=")
  out = ncbench.run(cfg, str(tmp_path), log=lambda line: None)
  (record,) = out["records"]
  assert record["method"] == "toy_hinge" and record["steps_per_epoch"] == 1438 // 64
  assert {"zeroshot/acc1", "retrieval/rsum", "noise_detection/auc"} <= set(record["metrics"])
  assert "toy_hinge" in (tmp_path / "results.md").read_text()


def test_nothing_in_ncjax_names_the_plugin_method():
  for dirpath, _, files in os.walk(os.path.join(ROOT, "ncjax")):
    for f in files:
      if f.endswith(".py"):
        with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
          assert "toy_hinge" not in fh.read(), os.path.join(dirpath, f)
