"""Command line: train a method from a config, with periodic and final evaluation.

  python -m ncjax.main --config=configs/clip.py:model=tiny,noise=0.4 --workdir=/tmp/run [--config.optim.lr=1e-3]
  ncjax train --config=... --workdir=...          (the console script; `train` is the default command)

Re-running with the same workdir resumes from its latest checkpoint. `--cpu_devices=8` simulates 8 devices on a
CPU host; `--num_processes/--process_id/--coordinator_address` start one process of a multi-process run (on a
cluster `jax.distributed.initialize()` auto-detects these and the flags can be omitted).
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/clip.py:model=tiny",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics.jsonl, eval results")
_CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0, "Simulate this many CPU devices (testing sharding)")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (cluster auto-detection)")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0 (multi-process runs)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Number of processes (multi-process runs)")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index (multi-process runs)")
_UNTIL = flags.DEFINE_integer("until_step", None, "Stop after this global step (the run stays resumable)")

COMMANDS = ("train",)


def _init_jax():
  import jax
  if _CPU_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  if _NUM_PROCESSES.value > 1:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                               process_id=_PROCESS_ID.value)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()
  return jax


def make_periodic_evaluator(config, trainer):
  """A callback for Trainer.run: runs each evaluator whose every_steps divides the step."""
  from ncjax import evals
  periodic = {k: v for k, v in config.evals.items() if v.get("every_steps", 0)}
  if not periodic:
    return None
  exp = trainer.exp
  evaluators = evals.build_evaluators(periodic, evals.EvalContext(config, exp.tokenizer, exp.mesh))

  def evaluate(step, state, writer):
    for name, ev in evaluators.items():
      if step % periodic[name].every_steps == 0:
        res = ev.run(exp.method.eval_model(state["params"]))
        writer.write(step, {f"{name}/{k}": v for k, v in res.items()}, kind="eval")
  return evaluate


def final_evaluation(config, result, workdir: str) -> dict:
  import jax
  from ncjax import evals
  exp = result.experiment
  evaluators = evals.build_evaluators(config.evals, evals.EvalContext(config, exp.tokenizer, exp.mesh))
  results = evals.run_evaluators(evaluators, exp.method.eval_model(result.params))
  step = int(jax.device_get(result.state["step"]))
  if jax.process_index() == 0 and results:
    os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
    with open(os.path.join(workdir, "eval", f"step_{step}.json"), "w") as f:
      json.dump(dict(step=step, results=results), f, indent=1)
  return results


def train_command(config, workdir: str):
  from ncjax import train
  trainer = train.Trainer(config, workdir)
  result = trainer.run(until=_UNTIL.value, evaluate=make_periodic_evaluator(config, trainer))
  results = final_evaluation(config, result, workdir)
  for name, res in results.items():
    shown = {k: round(v, 4) for k, v in res.items() if "@" in k or k.startswith("acc") or k == "rsum"}
    print(f"{name}: {shown}")
  return results


def main(argv):
  args = [a for a in argv[1:]]
  command = args[0] if args else "train"
  if command not in COMMANDS:
    raise app.UsageError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config=configs/clip.py:model=tiny")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  _init_jax()
  logging.getLogger("ncjax").setLevel(logging.INFO)
  if command == "train":
    train_command(_CONFIG.value, _WORKDIR.value)


def run():
  """Console-script entry point (`ncjax`)."""
  app.run(main)


if __name__ == "__main__":
  sys.exit(run())
