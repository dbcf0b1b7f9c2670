"""Per-sample clean scores on disk: what a run's noise-detection evaluator saves, and what a composed method reads.

A run's scores live in RUN/eval/step_<N>_clean_scores.npz: `scores` (float32, example-id order), `clean` (the
ground-truth flags they were evaluated against), `noise_sha256` (the noise index of the training pairs they score)
and `method`. NC-bench draws its ROC curves from them; NCU with `method.forget_from='scores'` selects its forget
set from another method's (GSC's soft labels, Bayesian CL's positive probabilities).
"""

from __future__ import annotations

import re

import numpy as np

from ncjax import fileio

CLEAN_SCORES_FILE = re.compile(r"step_(\d+)_clean_scores\.npz")


def latest_clean_scores(run_dir: str) -> str | None:
  """RUN_DIR/eval/step_<N>_clean_scores.npz of the largest N (what the evaluator last wrote), or None."""
  eval_dir = fileio.join(run_dir, "eval")
  if not fileio.isdir(eval_dir):
    return None
  found = sorted((int(m.group(1)), f) for f in fileio.listdir(eval_dir) if (m := CLEAN_SCORES_FILE.fullmatch(f)))
  return fileio.join(eval_dir, found[-1][1]) if found else None


def save_clean_scores(path: str, scores, clean, noise_sha256: str | None, method: str) -> None:
  fileio.save_npz(path, scores=np.asarray(scores, np.float32), clean=np.asarray(clean, bool),
                  noise_sha256=np.asarray(noise_sha256 or ""), method=np.asarray(method))


def load_clean_scores(source: str, num_examples: int, noise_sha256: str | None = None) -> np.ndarray:
  """Per-example clean scores (example-id order) from a `*_clean_scores.npz` the noise-detection evaluator wrote,
  or from a run directory (the one of its latest evaluation). Checks they score this run's training pairs: the
  same number of examples and, when both are recorded, the same noise index."""
  if not source:
    raise ValueError("method.forget_from='scores' needs method.forget_scores (a *_clean_scores.npz or a run "
                     "directory) or method.init_from naming the run whose scores to use")
  path = source
  if fileio.isdir(source):
    path = latest_clean_scores(source)
    if path is None:
      raise FileNotFoundError(
          f"{source} has no eval/step_<N>_clean_scores.npz: the run's noise_detection evaluator writes it at its "
          "final evaluation (evals.noise_detection with plot=True); run `ncjax eval --checkpoints=" + source
          + "` to write it")
  if not fileio.isfile(path):
    raise FileNotFoundError(f"method.forget_scores: no such file {path!r} (expected a *_clean_scores.npz)")
  data = fileio.load_npz(path)
  if "scores" not in data:
    raise ValueError(f"{path} has no 'scores' array (keys: {sorted(data)})")
  scores = np.asarray(data["scores"], np.float32)
  theirs = str(data["noise_sha256"]) if "noise_sha256" in data else ""
  if num_examples and scores.shape != (num_examples,):
    raise ValueError(f"{path} scores {scores.shape} examples, this run trains on {num_examples}: the scores must "
                     "come from a run on the same training pairs")
  if noise_sha256 and theirs and theirs != noise_sha256:
    raise ValueError(f"{path} was computed on other noisy pairs (noise index sha256 {theirs[:12]}..., this run "
                     f"{noise_sha256[:12]}...): use the same data, noise ratio and noise seed")
  if not np.all(np.isfinite(scores)):
    raise ValueError(f"{path} holds {int(np.sum(~np.isfinite(scores)))} non-finite scores")
  return scores
