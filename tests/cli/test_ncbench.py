"""NC-bench: the sweep's cells, the same noise per cell, aggregation over seeds, curves, and resume by skipping."""

import csv
import json

import numpy as np
import pytest

from helpers import load_config
from ncjax.cli import ncbench
from ncjax.evals import noise as noise_eval, plots


def test_cells_put_each_methods_start_run_first_and_refuse_unknown_methods():
  cfg = load_config("ncbench", "methods=gsc+ncu,noise=0.2+0.4,seeds=2,reference=")
  cells = ncbench.cells_of(cfg.bench)
  assert [c.name for c in cells[:3]] == ["clip_noise0.2_seed0", "gsc_noise0.2_seed0", "ncu_noise0.2_seed0"]
  assert len(cells) == 2 * 2 * 3           # CLIP joins: NCU unlearns the CLIP run of its own cell
  run_cfg = ncbench.cell_config(cfg.bench, cells[2], "/tmp/bench")
  assert run_cfg.method.init_from == "/tmp/bench/runs/clip_noise0.2_seed0"
  assert run_cfg.noise.ratio == 0.2 and run_cfg.noise.seed == 0 and run_cfg.seed == 0
  with pytest.raises(ValueError, match=r"unknown NC-bench method\(s\) \['clip2'\]"):
    ncbench.cells_of(load_config("ncbench", "methods=clip2").bench)


def test_aggregation_table_and_same_noise_check():
  records = [dict(method=m, noise=r, seed=s, noise_sha256=f"h{r}{s}", seconds=1.0,
                  metrics={"zeroshot/acc1": 0.5 + 0.1 * s - r, "noise_detection/auc": 0.9})
             for m in ("clip", "gsc") for r in (0.2, 0.4) for s in (0, 1)]
  ncbench.check_same_noise(records)
  rows = ncbench.aggregate(records)
  row = next(r for r in rows if r["method"] == "gsc" and r["noise"] == 0.4)
  assert row["seeds"] == 2 and row["zeroshot/acc1"] == pytest.approx((0.15, 0.05))
  table = ncbench.format_markdown(rows)
  assert "| gsc " in table and "15.0 ± 5.0" in table and "0.900 ± 0.000" in table
  records[1]["noise_sha256"] = "other"
  with pytest.raises(RuntimeError, match="different noise indices"):
    ncbench.check_same_noise(records)


def test_roc_curve_area_equals_the_evaluators_auc():
  rng = np.random.default_rng(0)
  clean = rng.random(300) < 0.6
  scores = np.round(rng.normal(size=300) + clean, 1)     # ties included
  fpr, tpr = plots.roc_curve(scores, clean)
  assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
  assert np.trapezoid(tpr, fpr) == pytest.approx(noise_eval.roc_auc(scores, clean), abs=1e-9)


def test_the_roc_title_states_the_noise_its_curves_detect():
  """Injected noise: its level. Nothing injected (a user's data, flags from its clean column): the data's own share
  of noisy training pairs, never '0% noise'."""
  clean = np.arange(200) % 8 != 0                              # 25 of 200 pairs marked noisy by the data
  assert ncbench.roc_title(0.4, clean) == "noise detection at 40% noise (seed 0)"
  assert ncbench.roc_title(0.0, clean) == "noise detection: the data's own noise, 12.5% of the training pairs (seed 0)"


@pytest.mark.slow
def test_sweep_on_digits_writes_table_curves_and_skips_finished_cells(tmp_path):
  cfg = load_config("ncbench", "methods=clip+gsc,noise=0.2+0.4,seeds=1,epochs=1,batch=128")
  out = ncbench.run(cfg, str(tmp_path), log=lambda *_: None)
  assert len(out["records"]) == 5            # + the clean-caption CLIP reference (digits' default)
  assert "recovered" in out["table"]
  rows = list(csv.DictReader(open(tmp_path / "results.csv")))
  assert {(r["method"], r["noise"]) for r in rows} == {(m, n) for m in ("clip", "gsc") for n in ("0.2", "0.4")} | {
      ("clip", "0.0")}
  for noise in ("0.2", "0.4"):     # the same noisy pairs for both methods
    assert len({r["noise_sha256"] for r in rows if r["noise"] == noise}) == 1
  assert (tmp_path / "results.md").read_text().count("±") >= 8
  assert (tmp_path / "metric_vs_noise_zeroshot_acc1.png").is_file() and (tmp_path / "roc_noise0.4.png").is_file()
  first = json.loads((tmp_path / "runs" / "gsc_noise0.4_seed0" / "cell.json").read_text())
  lines = []
  again = ncbench.run(cfg, str(tmp_path), log=lines.append)      # finished cells are skipped, not retrained
  assert sum("done before" in l for l in lines) == 5
  assert next(r for r in again["records"] if r["method"] == "gsc" and r["noise"] == 0.4) == first


def test_compositions_start_from_their_cells_run_and_ncu_budget_is_its_unlearning_stage():
  cfg = load_config("ncbench", "methods=gsc_then_ncu+bayes_then_ncu,noise=0.4,epochs=3,reference=")
  cells = ncbench.cells_of(cfg.bench)
  assert [c.method for c in cells] == ["gsc", "bayes", "gsc_then_ncu", "bayes_then_ncu"]
  run = ncbench.cell_config(cfg.bench, cells[2], "/tmp/b")
  assert run.method.name == "ncu" and run.method.init_from == "/tmp/b/runs/gsc_noise0.4_seed0"
  assert run.num_epochs == 3   # num_epochs: the main (unlearning) stage, after the prompt stage's own epochs
  assert ncbench.cell_config(cfg.bench, cells[0], "/tmp/b").num_epochs == 3


def test_forget_set_compositions_read_the_scores_of_their_cells_method():
  cfg = load_config("ncbench", "methods=ncu_gsc_forget+ncu_bayes_forget+ncu,noise=0.4,reference=")
  cells = ncbench.cells_of(cfg.bench)
  assert [c.method for c in cells] == ["clip", "gsc", "bayes", "ncu_gsc_forget", "ncu_bayes_forget", "ncu"]
  run = ncbench.cell_config(cfg.bench, cells[3], "/tmp/b")
  assert run.method.name == "ncu" and run.method.forget_from == "scores"
  assert run.method.init_from == "/tmp/b/runs/clip_noise0.4_seed0"          # unlearns the CLIP model
  assert run.method.forget_scores == "/tmp/b/runs/gsc_noise0.4_seed0"       # with GSC's labels as forget scores
  assert ncbench.cell_config(cfg.bench, cells[5], "/tmp/b").method.forget_from == "batch"


def test_clean_reference_runs_once_per_seed_and_the_table_shows_what_each_method_recovers():
  cfg = load_config("ncbench", "methods=clip+gsc,noise=0+0.4,seeds=2")
  assert cfg.bench.reference == "clip"                       # embedded data: clean-caption CLIP by default
  names = [c.name for c in ncbench.cells_of(cfg.bench)]
  assert names.count("clip_noise0_seed0") == 1 and len(names) == 2 * 2 * 2   # noise 0 already holds it
  names = [c.name for c in ncbench.cells_of(load_config("ncbench", "methods=gsc,noise=0.4,seeds=2").bench)]
  assert names == ["clip_noise0_seed0", "clip_noise0_seed1", "gsc_noise0.4_seed0", "gsc_noise0.4_seed1"]
  assert load_config("ncbench", "data=tfds:web_pairs/mine,methods=gsc").bench.reference == ""   # real noise
  with pytest.raises(ValueError, match="reference"):
    ncbench.cells_of(load_config("ncbench", "methods=gsc,reference=ncu").bench)
  records = [dict(method=m, noise=r, seed=0, noise_sha256=f"h{r}", seconds=1.0,
                  metrics={"zeroshot/acc1": v, "retrieval/rsum": 300 * v})
             for m, r, v in [("clip", 0.0, 0.9), ("clip", 0.4, 0.6), ("gsc", 0.4, 0.84), ("ncu", 0.4, 0.5)]]
  for r in records:   # the clean run has no noisy pairs: its detection AUC is undefined (NaN), shown as "-"
    r["metrics"]["noise_detection/auc"] = float("nan") if r["noise"] == 0 else 0.75
  records[2]["metrics"]["retrieval/rsum"] = 225.0        # gsc: (225 - 180) / (270 - 180) = 50% of rsum's drop
  rows = ncbench.aggregate(records)
  rec = ncbench.recovered_fraction(rows, "clip")
  assert rec[("gsc", 0.4)] == pytest.approx(0.8) and rec[("ncu", 0.4)] == pytest.approx(-1 / 3)
  assert rec[("clip", 0.4)] == 0 and ("clip", 0.0) not in rec
  assert ncbench.recovered_fraction(rows, "clip", "retrieval/rsum")[("gsc", 0.4)] == pytest.approx(0.5)
  table = ncbench.format_markdown(rows, "clip")
  assert "recovered zero-shot" in table and "recovered rsum" in table
  assert "80%" in table and "-33%" in table and "50%" in table
  clean_row = next(line for line in table.splitlines() if "|    0% |" in line)
  assert "nan" not in table and clean_row.split("|")[-4].strip() == "-", table   # AUC column of the clean run


def test_every_row_s_config_accepts_the_arguments_nc_bench_passes():
  """ncjax.config_lib.BENCH_ARGUMENTS: a method's rows are derived from the registry, so each row's config must
  take what cell_config passes it; loading each with all of them is what NC-bench does."""
  from ncjax import config_lib
  for name, entry in ncbench.methods().items():
    kinds = ["every"] + (["two_tower"] if entry.model_kind == "two_tower" else []) + \
            (["start"] if entry.start else []) + (["scores"] if entry.scores else [])
    values = dict(data="digits" if entry.model_kind == "two_tower" else "precomp_synthetic", noise="0.4",
                  epochs="2", batch="64", model="micro", init="/tmp/run", forget_scores="/tmp/scores")
    args = [entry.args] + [f"{k}={values[k]}" for kind in kinds for k in config_lib.BENCH_ARGUMENTS[kind]]
    cfg = config_lib.load_config_file(entry.config, ",".join(a for a in args if a))
    assert cfg.num_epochs == 2 and cfg.input.global_batch_size == 64 and cfg.noise.ratio == 0.4, name
    if entry.model_kind == "two_tower":
      assert cfg.model.size == "micro", name
    if entry.start:
      assert cfg.method.init_from == "/tmp/run", name
    if entry.scores:
      assert cfg.method.forget_scores == "/tmp/scores", name
