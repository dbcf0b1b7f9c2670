"""One evaluation path (ncjax.evaluation): periodic and final evaluation build the same context and give every
evaluator the method's EvalModel of the state; a saved checkpoint is evaluated from its parameters and per-sample
state alone."""

import json

import jax
import numpy as np
import pytest

from helpers import make_config, tiny_clip_config
from ncjax import evaluation, train


def _train_with_periodic(cfg, workdir):
  trainer = train.Trainer(cfg, str(workdir))
  result = trainer.run(evaluate=evaluation.periodic_hook(cfg, trainer))
  final = evaluation.final(cfg, result, str(workdir))
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return result, final, {r["step"]: r for r in rows if r["kind"] == "eval"}


# What the claims below do not read, left out for their cost: the evaluators' plots (matplotlib; the scores they
# check are computed before plotting), and evaluation batches of 512 (one batch of the whole split instead: one
# traced and compiled program per tower and evaluation, not one per batch shape).
NO_PLOTS = {"plot": False}
ONE_EVAL_BATCH = {"input.eval_batch_size": 2048}


def test_periodic_noise_detection_scores_the_training_pairs_like_the_final_one(tmp_path):
  """Until 2026-11-23 periodic evaluators ran without the experiment and the state, so
  `--config.evals.noise_detection.every_steps=N` passed the start-up check and failed at step N."""
  cfg = tiny_clip_config(total_steps=2, **{"evals": dict(noise_detection=dict(type="noise_detection",
                                                                              every_steps=1, **NO_PLOTS)),
                                            **ONE_EVAL_BATCH, "ckpt.save_at_end": False})
  result, final, periodic = _train_with_periodic(cfg, tmp_path)
  assert sorted(periodic) == [1, 2]
  assert periodic[2]["noise_detection/auc"] == final["noise_detection"]["auc"]
  assert periodic[1]["noise_detection/auc"] != periodic[2]["noise_detection/auc"]   # two states, two scores
  # CLIP keeps no clean scores: the AUC is the model's cosine of each training pair (image caption_to_image[k],
  # caption k), recomputed here from the final parameters, and scikit-learn's ROC-AUC of it.
  from sklearn.metrics import roc_auc_score
  exp = result.experiment
  model = exp.method.bind(jax.device_get(result.params)).model
  pairs = exp.train_data.pairs()
  img = np.asarray(jax.jit(model.encode_image)(pairs.images()[:]))
  txt = np.asarray(jax.jit(model.encode_text)(pairs.token_ids(exp.tokenizer)))
  cosine = np.sum(img[pairs.caption_to_image] * txt, axis=1)
  assert final["noise_detection"]["auc"] == pytest.approx(roc_auc_score(pairs.clean, cosine), abs=2e-4)


@pytest.fixture(scope="module")
def gsc_run(tmp_path_factory):
  """GSC for one epoch of 22 steps, its label update at the epoch's end; noise detection every 22 steps and at the
  end, retrieval at the end: one run for the two tests below (the run does not depend on its evaluators)."""
  workdir = tmp_path_factory.mktemp("gsc_run")
  cfg = make_config("gsc", "batch=64,epochs=1,warmup=0", **{
      "evals": dict(noise_detection=dict(type="noise_detection", every_steps=22, **NO_PLOTS),
                    retrieval=dict(type="retrieval", split="test", **NO_PLOTS)), **ONE_EVAL_BATCH})
  result, final, periodic = _train_with_periodic(cfg, workdir)
  return dict(workdir=workdir, result=result, final=final, periodic=periodic)


def test_periodic_noise_detection_of_a_method_with_per_sample_state_reads_its_labels(gsc_run):
  # Periodic evaluation at step 22, after the epoch's label update, sees the new labels.
  result, final, periodic = gsc_run["result"], gsc_run["final"], gsc_run["periodic"]
  assert list(periodic) == [22] and periodic[22]["noise_detection/auc"] == final["noise_detection"]["auc"]
  from sklearn.metrics import roc_auc_score
  y = np.asarray(jax.device_get(result.state["method_state"]["model"]["y"]))[:1438]
  assert len(np.unique(y)) > 2   # the labels moved from 1
  assert final["noise_detection"]["auc"] == pytest.approx(roc_auc_score(result.experiment.train_data.clean, y),
                                                          abs=1e-9)


def test_a_checkpoint_is_evaluated_without_its_input_pipeline_or_optimiser_state(gsc_run, monkeypatch):
  expected = gsc_run["final"]
  from ncjax import checkpoint
  from ncjax.data import pipeline

  def refuse(*args, **kwargs):
    raise AssertionError("evaluating a checkpoint built the training pipeline or restored the optimiser state")

  monkeypatch.setattr(pipeline.TrainData, "__init__", refuse)
  monkeypatch.setattr(checkpoint.Checkpointer, "restore", refuse)
  got, meta = evaluation.evaluate_checkpoint(None, str(gsc_run["workdir"]), 22)
  assert meta["method"] == "gsc"
  assert set(got) == {"noise_detection", "retrieval"}
  assert got["noise_detection"] == expected["noise_detection"]
  for k, v in expected["retrieval"].items():
    assert got["retrieval"][k] == pytest.approx(v, abs=1e-9), k
