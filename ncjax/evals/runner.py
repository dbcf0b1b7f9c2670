"""Running a config's evaluators on a train state: one JSON per step (+ plots), written where no other dataset's
results are; the start-up check that every evaluator can run. Used by the CLI (`ncjax.main`), the demo and
NC-bench; the state and experiment are duck-typed (ncjax.train's), so this module sits in the evals layer."""

from __future__ import annotations

import json
import os
import re

from ncjax.evals.base import (EvalContext, build_evaluators, check_evaluators, clip_benchmark_records,
                              finite_or_none, run_evaluators)


def run_evaluations(config, *, tokenizer, mesh, method, state, out_dir: str, step: int, experiment=None,
                    info: dict | None = None) -> dict:
  """Run every evaluator of config.evals on `state`; write OUT_DIR/step_N.json (+ plots) on process 0."""
  import jax
  ctx = EvalContext(config, tokenizer, mesh, experiment=experiment,
                          plot_dir=out_dir if jax.process_index() == 0 else None, tag=f"step_{step}")
  evaluators = build_evaluators(config.evals, ctx)
  results = run_evaluators(evaluators, method.eval_model(state["params"]), state)
  if jax.process_index() == 0 and results:
    os.makedirs(out_dir, exist_ok=True)
    model = config.model.get("pretrained", "") or config.model.size
    records = clip_benchmark_records(results, evaluators, model=f"{method.name}:{model}",
                                           dataset=config.input.dataset)
    with open(os.path.join(out_dir, f"step_{step}.json"), "w") as f:
      json.dump(finite_or_none(dict(step=step, method=method.name, **(info or {}), results=results,
                                          records=records)), f, indent=1, allow_nan=False)
  return results


def eval_dir(config, exp, workdir: str) -> str:
  """WORKDIR/eval for the run's own data; WORKDIR/eval/<dataset>[_<data_dir>] when the config evaluates other
  data (`ncjax eval --config=... --config.input.data_dir=...`), so no dataset overwrites another's results."""
  own, asked = exp.config.input, config.input
  if (asked.dataset, asked.data_dir) == (own.dataset, own.data_dir):
    return os.path.join(workdir, "eval")
  slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{asked.dataset}_{os.path.basename(asked.data_dir.rstrip('/'))}")
  return os.path.join(workdir, "eval", slug.strip("_"))


def evaluate_state(config, exp, state, workdir: str) -> dict:
  """Run every evaluator of config.evals on a train state; write eval/step_N.json (+ plots) under workdir."""
  import jax
  step = int(jax.device_get(state["step"]))
  return run_evaluations(config, tokenizer=exp.tokenizer, mesh=exp.mesh, method=exp.method, state=state,
                         out_dir=eval_dir(config, exp, workdir), step=step, experiment=exp,
                         info=dict(workdir=os.path.abspath(workdir), noise_sha256=exp.train_data.noise_sha256,
                                   dataset=config.input.dataset))


def final_evaluation(config, result, workdir: str) -> dict:
  return evaluate_state(config, result.experiment, result.state, workdir)


def check_final_evaluators(config, exp) -> None:
  """Fail in seconds, not after training: every evaluator of config.evals loads its data now."""
  check_evaluators(build_evaluators(config.evals, EvalContext(config, exp.tokenizer, exp.mesh,
                                                                                 experiment=exp)))
