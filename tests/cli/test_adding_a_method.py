"""Adding a method = its losses + a Method + a config, and nothing else: a method written outside ncjax
(tests/plugins/toy_plugin.py and toy_config.py) trains through `ncjax train` with every default evaluator, periodic
and final, and is an NC-bench row (its cell's config and its table row; trained as a row end to end: `slow`),
without an edit to any ncjax module. `ncjax train` runs as its `main(argv)` in this process
(tests/cli_in_process.py; the entry point's own process: tests/cli/test_errors.py)."""

import json
import os

import numpy as np
import pytest

import cli_in_process
from helpers import ROOT

PLUGIN = os.path.join(ROOT, "tests", "plugins", "toy_plugin.py")
CONFIG = os.path.join(ROOT, "tests", "plugins", "toy_config.py")


def test_a_plugin_method_trains_through_the_cli_with_periodic_and_final_evaluation(tmp_path, monkeypatch):
  # The evaluators' plots (drawn in tests/evals/test_evals.py, written by a real run in
  # tests/train/test_multiprocess_evaluation.py) are not drawn here, three histograms of them for two steps: what
  # they would draw is recorded instead, and checked below.
  from ncjax.evals import plots
  drawn = {}
  monkeypatch.setattr(plots, "plot_clean_noisy_histogram", lambda scores, clean, path, title="", **_: drawn.setdefault(
      os.path.basename(path), []).append((np.asarray(scores), np.asarray(clean))) or path)
  monkeypatch.setattr(plots, "plot_similarity_distributions", lambda sim, c2i, path, title="": drawn.setdefault(
      os.path.basename(path), []).append(np.shape(sim)) or path)
  out = cli_in_process.run(["train", f"--plugins={PLUGIN}", f"--config={CONFIG}:batch=64", f"--workdir={tmp_path}",
                            "--cpu_devices=8", "--config.total_steps=4", "--config.log.progress=False",
                            "--config.evals.noise_detection.every_steps=2"], cwd=ROOT)
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
  # the plots: a histogram of those scores at each evaluation (the periodic ones and the final one at step 4), and
  # the test split's similarities at the end
  assert sorted(drawn) == ["step_2_clean_noisy.png", "step_4_clean_noisy.png", "step_4_similarity.png"], drawn
  assert len(drawn["step_2_clean_noisy.png"]) == 1 and len(drawn["step_4_clean_noisy.png"]) == 2
  for scores, flags in drawn["step_4_clean_noisy.png"]:
    np.testing.assert_array_equal(scores, -hinge)
    np.testing.assert_array_equal(flags, clean)
  (shape,) = drawn["step_4_similarity.png"]
  assert len(shape) == 2 and min(shape) > 0


BENCH = "methods=toy_hinge,noise=0.4,seeds=1,epochs=1,batch=64,model=micro,reference="


def test_a_plugin_method_is_an_nc_bench_row(tmp_path):
  """Its row, without training (trained end to end: the slow test below; the bench's runner, records, table and
  plots for every method alike: tests/cli/test_ncbench.py): NC-bench lists the plugin's row, builds each cell's run
  config from the plugin's config file with the bench's data, noise, budget, model and seed (each unlike the
  config's own default), and tabulates its records."""
  from ncjax import config_lib
  from ncjax.cli import main, ncbench
  main.load_plugins([PLUGIN])
  assert "toy_hinge" in ncbench.methods() and "symmetric hinge" in ncbench.legend(["toy_hinge"])
  bench = config_lib.load_config_file(
      "ncbench", "methods=toy_hinge,noise=0.2,seeds=2,epochs=3,batch=32,model=tiny,reference=").bench
  cells = ncbench.cells_of(bench)
  assert [(c.method, c.noise, c.seed) for c in cells] == [("toy_hinge", 0.2, 0), ("toy_hinge", 0.2, 1)]
  for cell in cells:
    cfg = ncbench.cell_config(bench, cell, str(tmp_path))
    assert (cfg.method.name, cfg.loss.margin, cfg.input.dataset, cfg.noise.ratio) == ("toy_hinge", 0.2, "digits", 0.2)
    assert (cfg.num_epochs, cfg.input.global_batch_size, cfg.model.size) == (3, 32, "tiny")
    assert (cfg.seed, cfg.noise.seed, cfg.input.shuffle_seed) == (cell.seed,) * 3
    assert set(cfg.evals) == {"zeroshot", "retrieval", "noise_detection"}
  records = [dict(method="toy_hinge", noise=0.2, seed=seed, noise_sha256="0", steps_per_epoch=44, seconds=1.0,
                  metrics={"zeroshot/acc1": 0.5, "retrieval/rsum": 100.0, "noise_detection/auc": auc})
             for seed, auc in ((0, 0.7), (1, 0.8))]
  table = ncbench.format_markdown(ncbench.aggregate(records), bench.reference)
  assert any(line.split("|")[1].strip() == "toy_hinge" and "0.750 ± 0.050" in line for line in table.splitlines()), \
      table


@pytest.mark.slow
def test_a_plugin_method_trains_as_an_nc_bench_row(tmp_path):
  from ncjax import config_lib
  from ncjax.cli import main, ncbench
  main.load_plugins([PLUGIN])
  out = ncbench.run(config_lib.load_config_file("ncbench", BENCH), str(tmp_path), log=lambda line: None)
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
