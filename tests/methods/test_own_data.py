"""The README's own-data walk: a labelled CSV with a clean column, built with a held-out split, then CLIP and GSC
compared with NC-bench, evaluated on the held-out images (zero-shot on the labels, retrieval, noise detection)."""

import json
import os

import numpy as np
import pytest

import data_fixtures as fx
import recompute
from helpers import TEST_MODEL, make_config


def _check_against_the_checkpoint(restored, metrics):
  """NC-bench's zero-shot top-1 and retrieval of one run against a recomputation here: the held-out split embedded
  from the restored parameters (`restored`: recompute.checkpoint_embeddings of the run's checkpoint), the prompts
  ensembled as CLIP does (restated), recall restated. Equal to float
  rounding: the 10 held-out images (the split hashes the table's relative paths, so it is the same on every machine) and their captions have no near ties for a last-bit difference to swap."""
  import jax
  from ncjax.evals.zeroshot import templates_for
  em, img, txt, split, tokenizer, config = restored
  assert split.num_images == 10
  templates = templates_for(config.evals.zeroshot.templates, config.input.dataset)
  weights = recompute.zero_shot_weights(em, tokenizer, split.class_names, templates)
  predicted = (img @ weights.T).argmax(axis=1)
  assert metrics["zeroshot/acc1"] == pytest.approx(np.mean(predicted == split.image_labels), abs=1e-9)
  expected = recompute.recall(np.asarray(jax.jit(em.score)(img, txt)), split.caption_to_image)
  for key in ("rsum", "i2t_R@1", "t2i_R@1", "i2t_meanr", "t2i_meanr"):
    assert metrics[f"retrieval/{key}"] == pytest.approx(expected[key], abs=1e-6), key


def _check_noise_detection(run, restored, method, metrics):
  """Noise detection on the training pairs against the table's own clean column, recomputed from the checkpoint
  (`restored`, as above): the noise rate is the column's share of 0s in the training split; the AUC is
  scikit-learn's of GSC's labels (its per-sample state, read from the checkpoint here) or of CLIP's cosine of each
  training pair (embedded here)."""
  from sklearn.metrics import roc_auc_score
  from ncjax import checkpoint as ckpt_lib
  from ncjax import data as data_lib
  from ncjax.models import ModelSpec
  em, _, _, _, tokenizer, config = restored
  image_size = ModelSpec.from_config(config.model).image_size
  from ncjax import experiment
  train = data_lib.load_split(experiment.input_spec(config.input), "train", image_size)
  clean = np.asarray(train.pair_clean, bool)
  assert metrics["noise_detection/noise_rate"] == pytest.approx(1 - clean.mean(), abs=1e-9) and 0 < clean.mean() < 1
  if method == "gsc":
    state, _, _ = ckpt_lib.restore_state_on_host(str(run))
    scores = np.asarray(state["method_state"]["model"]["y"])[:len(clean)]
  else:
    img, txt = recompute.split_embeddings(em, train, tokenizer, config, image_size)
    scores = np.sum(img[train.caption_to_image] * txt, axis=1)
  assert metrics["noise_detection/auc"] == pytest.approx(roc_auc_score(clean, scores), abs=1e-6)


def test_own_labelled_table_from_build_to_an_evaluated_comparison(tmp_path, monkeypatch):
  fx.write_labelled_table(str(tmp_path / "pairs"), n=36)
  # The build command in this process: in its own process, with the same flags, it is
  # tests/data/test_builders.py::test_table_with_labels_clean_flags_and_a_held_out_split.
  from ncjax.data import build
  assert build.main(["--dataset=web_pairs/custom_table", f"--manual_dir={tmp_path / 'pairs'}",
                     f"--data_dir={tmp_path / 'tfds'}", "--table=pairs.csv", "--separator=,", "--image_column=path",
                     "--caption_column=caption", "--label_column=label",
                     f"--class_names={tmp_path / 'pairs' / 'names.txt'}", "--clean_column=clean",
                     "--holdout=0.25"]) == 0
  for name in ("clip", "gsc"):   # the user's data: nothing injected by default
    assert make_config(name, "data=tfds:web_pairs/custom_table").noise.kind == "none"

  # NC-bench on the table (the comparison a user of their own data runs): both methods on the table's own (real)
  # noise, evaluated on the held-out split (zero-shot on its labels, retrieval, noise detection from the table's
  # clean column), ROC curves; a re-run skips both.
  from helpers import load_config
  from ncjax.cli import ncbench
  bench = load_config("ncbench", "data=tfds:web_pairs/custom_table,noise=0,methods=clip+gsc,epochs=1,batch=8")
  assert bench.bench.reference == "" and bench.bench.model == ""     # a user's data: no clean reference
  with bench.unlocked():
    bench.bench.data_dir = str(tmp_path / "tfds")
    bench.bench.model = TEST_MODEL
  from ncjax.evals import plots
  titles, roc = [], plots.plot_roc_curves
  monkeypatch.setattr(plots, "plot_roc_curves", lambda curves, path, title="": titles.append(title) or roc(
      curves, path, title))
  # Each run's evaluation plots (drawn in tests/evals/test_evals.py, written by a real run in
  # tests/train/test_multiprocess_evaluation.py): what they would draw recorded, not drawn, and checked below.
  drawn = {}
  monkeypatch.setattr(plots, "plot_clean_noisy_histogram", lambda scores, clean, path, title="", **_: drawn.setdefault(
      os.path.relpath(path, tmp_path), []).append((np.asarray(scores), np.asarray(clean))) or path)
  monkeypatch.setattr(plots, "plot_similarity_distributions", lambda sim, c2i, path, title="": drawn.setdefault(
      os.path.relpath(path, tmp_path), []).append(np.shape(sim)) or path)
  # NC-bench's metric-vs-noise plots (drawn in tests/cli/test_ncbench.py) have one noise level here: their series
  # recorded, not drawn, and checked against the records below.
  vs_noise = {}
  monkeypatch.setattr(plots, "plot_metric_vs_noise", lambda series, path, ylabel, title="": vs_noise.setdefault(
      ylabel, series) and path)
  out = ncbench.run(bench, str(tmp_path / "bench"), log=lambda *_: None)
  assert [r["method"] for r in out["records"]] == ["clip", "gsc"]
  # the ROC plot names the table's own noise (the share its clean column marks noisy), not the 0% injected
  flags = np.load(tmp_path / "bench" / "runs" / "clip_noise0_seed0" / "eval" /
                  f"step_{out['records'][0]['steps_per_epoch']}_clean_scores.npz")["clean"]
  assert titles == [f"noise detection: the data's own noise, {1 - flags.mean():.1%} of the training pairs (seed 0)"]
  assert 0 < 1 - flags.mean() < 1
  for r in out["records"]:
    m = r["metrics"]
    run = tmp_path / "bench" / "runs" / f"{r['method']}_noise0_seed0"
    saved = json.loads((run / "eval" / f"step_{r['steps_per_epoch']}.json").read_text())
    eval_dir = os.path.relpath(run / "eval", tmp_path)
    (histogram,), (similarity,) = (drawn.pop(os.path.join(eval_dir, f"step_{r['steps_per_epoch']}_{name}.png"))
                                   for name in ("clean_noisy", "similarity"))
    scores = np.load(run / "eval" / f"step_{r['steps_per_epoch']}_clean_scores.npz")
    np.testing.assert_array_equal(histogram[0], scores["scores"])   # the scores the ROC curves read, as drawn
    np.testing.assert_array_equal(histogram[1], scores["clean"])
    assert len(similarity) == 2 and min(similarity) > 0
    assert saved["results"]["noise_detection"]["auc"] == m["noise_detection/auc"]
    restored = recompute.checkpoint_embeddings(run, r["steps_per_epoch"])   # restored once for both checks
    _check_noise_detection(run, restored, r["method"], m)
    # zero-shot and retrieval on the held-out images, recomputed from the run's checkpoint (tests/recompute.py)
    _check_against_the_checkpoint(restored, m)
  assert not drawn, drawn   # no other plot
  assert {"zeroshot/acc1", "retrieval/rsum", "noise_detection/auc"} <= set(vs_noise), vs_noise
  for key, series in vs_noise.items():
    assert list(series) == ["clip", "gsc"], series
    for r in out["records"]:
      assert series[r["method"]] == ((0.0,), (pytest.approx(r["metrics"][key]),), (0.0,)), (key, series)
  assert (tmp_path / "bench" / "roc_noise0.png").is_file() and "gsc" in out["table"]
  # The re-run: both cells read back, not trained. Its tables and plots are the first run's again (the plots drawn
  # above from the same records): not drawn a second time here.
  lines, replotted = [], []
  monkeypatch.setattr(ncbench, "write_plots", lambda rows, records, workdir: replotted.append(records) or [])
  again = ncbench.run(bench, str(tmp_path / "bench"), log=lines.append)
  assert sum("done before" in line for line in lines) == 2
  assert len(replotted) == 1 and [r["method"] for r in again["records"]] == ["clip", "gsc"]
