"""`ncjax sweep`: a config over a grid of any of its keys, with seeds — here, on a pod, or one point per array task.

  ncjax sweep --config=gsc:data=scenes,noise=0.4 --sweep=loss.gamma=0.5,1,2 --sweep=optim.lr=1e-3,3e-3 --seeds=3 \\
      --select=retrieval/rsum --workdir=/runs/gsc_sweep [--dry_run] [--index=I | --shard=I/N] [--report]

The library does the work (ncjax.sweep); this module reads the flags and the config file's `get_sweep(arg)`.
"""

from __future__ import annotations

import sys

from absl import flags

SWEEP = flags.DEFINE_multi_string("sweep", [], "sweep: KEY=V1,V2,... (repeatable; any config key, each value parsed "
                                  "as the type of the config's value); the grid is every combination")
SEEDS = flags.DEFINE_integer("seeds", None, "sweep: run every point with seeds 0..N-1 (seed, noise.seed and "
                             "input.shuffle_seed); default: the config's own seeds, one run per point")
DRY_RUN = flags.DEFINE_bool("dry_run", False, "sweep: list the points and their run ids, run nothing")
INDEX = flags.DEFINE_integer("index", None, "sweep: run point I only (a Kubernetes Indexed Job's "
                             "$JOB_COMPLETION_INDEX, a SLURM array's $SLURM_ARRAY_TASK_ID)")
SHARD = flags.DEFINE_string("shard", "", "sweep: I/N runs every N-th point from point I")
REPORT = flags.DEFINE_bool("report", False, "sweep: write the results from the finished runs now, train nothing")
SELECT = flags.DEFINE_string("select", "", "sweep: EVALUATOR/METRIC[:min] the best point is chosen by, on a "
                             "validation split (best.json)")
VALIDATION_SPLIT = flags.DEFINE_string("validation_split", "", "sweep --select: the split to choose on (default: "
                                       "the data's own validation split, else a fixed 10% held out of training)")


def config_spec(argv) -> str:
  """The --config=SPEC the command was given ('--config SPEC' too)."""
  for i, a in enumerate(argv[1:], 1):
    if a.startswith("--config="):
      return a[len("--config="):]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return ""


def train_command(argv, config_flag) -> list[str]:
  """`ncjax train` with the user's --config, its --config.KEY overrides, --cpu_devices and --plugins."""
  out = ["ncjax", "train", f"--config={config_spec(argv)}"]
  for key, value in config_flag.override_values.items():
    out.append(f"--config.{key}={str(value).lower() if isinstance(value, bool) else value}")
  out += [a for a in argv[1:] if a.startswith(("--cpu_devices=", "--plugins="))]
  return out


def plan_from_flags(config, argv=None):
  """The sweep the flags describe (every input checked; nothing runs)."""
  from ncjax import config_lib, sweep
  argv = sys.argv if argv is None else argv
  spec = config_spec(argv)
  file_points = config_lib.load_sweep_points(spec) if spec else None
  return sweep.plan(config, sweep_flags=SWEEP.value, file_points=file_points, seeds=SEEDS.value,
                    index=INDEX.value, shard=SHARD.value, select=SELECT.value,
                    validation_split=VALIDATION_SPLIT.value, train_command=train_command(argv, flags.FLAGS["config"]))


def main(config, workdir: str, init_jax) -> dict | None:
  """Check the sweep, print its size (and with --dry_run its runs), then run it; `init_jax` starts JAX (and the
  processes of a multi-process run) only once the inputs are known to be good."""
  from ncjax import fileio, sweep as sweep_lib
  plan = plan_from_flags(config)
  plan.wandb_group = fileio.basename(fileio.absolute(workdir).rstrip("/"))
  print(plan.summary(), flush=True)
  if DRY_RUN.value:
    print(plan.listing(), flush=True)
    return None
  jax = init_jax()
  log_line = (lambda line: print(line, flush=True)) if jax.process_index() == 0 else (lambda line: None)
  if plan.validation is not None:
    log_line(f"validation: {plan.validation['note']}")
  return sweep_lib.run(plan, workdir, report_only=REPORT.value, log_line=log_line)
