"""Sweeps: any config key over a grid, with seeds; one run per point and seed under WORKDIR/runs/<name>/; every
point in turn here or on a pod, one point per array task (`index`), or every N-th point (`shard`); results with
mean ± std over seeds, plots, TensorBoard's HParams and the best point chosen on a validation split.

`plan(...)` checks everything the user gave and builds the sweep (no JAX, nothing written); `run(...)` trains the
runs this invocation takes and writes the results once every run is finished. `ncjax sweep` (ncjax/cli/sweep.py)
and NC-bench (ncjax/cli/ncbench.py) run through here. Modules: `grid` (points, values, run names, index and shard,
the definition a workdir keeps), `runner` (training each run, marked finished), `results` (tables, plots,
best.json, HParams).

One rule for a workdir: it holds one sweep. A re-run with another definition (other points, seeds, validation
data, or a base config that differs outside `log` and `ckpt`) is refused with one line naming the difference: its
finished runs, table and best point would otherwise mix two sweeps.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex

import ml_collections

from ncjax import fileio
from ncjax.sweep import grid, results, runner
from ncjax.sweep.grid import Run, SweepError

log = logging.getLogger("ncjax")


@dataclasses.dataclass
class Sweep:
  base: ml_collections.ConfigDict     # the config every run starts from (validation evaluator and split laid in)
  points: list[tuple]
  seeds: list[int] | None
  runs: list[Run]                     # every run of the sweep
  chosen: list[Run]                   # the runs this invocation takes (index / shard)
  validation: dict | None             # where the best point is chosen: {'split', 'source', 'note', ...}
  select: str
  train_command: list[str]            # `ncjax train` with the user's config and overrides (for best.json)
  wandb_group: str = ""               # with log.wandb: every run of the sweep in this W&B group

  @property
  def keys(self) -> list[str]:
    return grid.swept_keys(self.points)

  def config_of(self, run: Run) -> ml_collections.ConfigDict:
    cfg = grid.apply(self.base, run.overrides)
    if bool(cfg.log.wandb):   # one W&B group per sweep, each run named by its id (unless the config names them)
      with cfg.unlocked():
        cfg.log.wandb_group = cfg.log.wandb_group or self.wandb_group
        cfg.log.wandb_name = cfg.log.wandb_name or run.name
    cfg.lock()
    return cfg

  def definition(self) -> dict:
    return grid.definition(self.base, self.points, self.seeds, self.validation)

  def summary(self) -> str:
    seeds = f" x {len(self.seeds)} seeds" if self.seeds else ""
    part = "" if len(self.chosen) == len(self.runs) else \
        f"; this invocation: {len(self.chosen)} runs of {len({r.index for r in self.chosen})} points"
    return f"sweep: {len(self.points)} points{seeds} = {len(self.runs)} runs{part}"

  def listing(self) -> str:
    lines = []
    for r in self.chosen:
      values = ", ".join(f"{k}={grid.format_value(v)}" for k, v in r.point) or "(the config as it is)"
      seed = "" if r.seed is None else f", seed={r.seed}"
      lines.append(f"  point {r.index:>3}  runs/{r.name}  {values}{seed}")
    return "\n".join(lines)

  def reproduce(self, run: Run, workdir: str) -> str:
    """The one command that trains `run` again (into WORKDIR/reproduce/<name>)."""
    args = list(self.train_command)
    for key, value in run.overrides.items():
      args.append(f"--config.{key}={_flag_value(value)}")
    if self.validation and self.validation.get("train_split"):
      args.append(f"--config.input.split={self.validation['train_split']}")
    args.append(f"--workdir={fileio.join(workdir, 'reproduce', run.name)}")
    return " ".join(shlex.quote(a) for a in args)


def _flag_value(value) -> str:
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, float):
    return repr(value)
  return str(value)


def with_validation(config, select: str, validation_split: str = "") -> tuple[ml_collections.ConfigDict, dict]:
  """The config whose runs also evaluate the selecting evaluator on a validation split (`evals.val_<name>`), and
  where that split comes from: the one the user names, the data's own, else a fixed held-out part of the training
  split (the runs then train without it: input.split='<split>:fit')."""
  from ncjax import data as data_lib, experiment
  try:
    evaluator, _, _ = results.parse_select(select)
  except ValueError as e:
    raise SweepError(str(e)) from None
  evals = config.evals
  if evaluator not in evals or not bool(evals[evaluator].get("enabled", True)):
    raise SweepError(f"--select={select}: the config has no enabled evaluator {evaluator!r}; evaluators: "
                     f"{sorted(k for k in evals.keys() if bool(evals[k].get('enabled', True)))}")
  if "split" not in evals[evaluator]:
    raise SweepError(f"--select={select}: evaluator {evaluator!r} evaluates no split of the data, so nothing can "
                     f"be held out for it; select on an evaluator of a split (zeroshot, retrieval)")
  test_split = evals[evaluator].split
  own_data = not evals[evaluator].get("dataset", "")
  spec = experiment.input_spec(config.input)
  info = dict(evaluator=f"{results.VALIDATION_PREFIX}{evaluator}", test_split=test_split)
  if validation_split:
    info.update(split=validation_split, source="named")
    info["note"] = f"validation split {validation_split!r}, as named (--validation_split)"
    if validation_split == test_split:
      info["optimistic"] = True
      info["note"] = (f"the best point was chosen on the test split {test_split!r} itself (--validation_split): "
                      f"its test figures are optimistic, not an estimate of unseen data")
  elif not own_data:
    raise SweepError(f"--select={select}: evaluator {evaluator!r} evaluates another dataset "
                     f"({evals[evaluator].dataset}); name its validation split with --validation_split=SPLIT")
  elif (own := data_lib.validation_split(spec)) is not None:
    info.update(split=own, source="own", note=f"the data's own validation split {own!r}")
  else:
    if spec.dataset.startswith("web:"):
      raise SweepError(f"--select={select}: web data has no validation split and none can be held out; evaluate "
                       f"on another dataset (--config.evals.{evaluator}.dataset=...) and name its split with "
                       f"--validation_split")
    base = config.input.split
    info.update(split=f"{base}:holdout", source="holdout", train_split=f"{base}:fit",
                note=f"{config.input.dataset} has no validation split: a fixed 10% of the images of its "
                     f"{base!r} split (with their captions) are held out of training and the point is chosen on "
                     f"them ({base}:holdout; the runs train on {base}:fit)")
  cfg = config.copy_and_resolve_references()
  with cfg.unlocked():
    twin = ml_collections.ConfigDict(cfg.evals[evaluator].to_dict())
    twin.split = info["split"]
    if "plot" in _options_of(twin.get("type", evaluator)):
      twin.plot = False   # the evaluators' plots are named by kind, not by evaluator: the test split's would go
    cfg.evals[info["evaluator"]] = twin
    if info.get("train_split"):
      cfg.input.split = info["train_split"]
  return cfg, info


def _options_of(kind: str) -> list[str]:
  from ncjax import evals
  return evals.base.accepted_options(evals.base.EVALUATORS[kind]) if kind in evals.base.EVALUATORS else []


def plan(config, *, sweep_flags=(), file_points=None, seeds: int | None = None, index: int | None = None,
         shard: str = "", select: str = "", validation_split: str = "", train_command=()) -> Sweep:
  """The sweep the user asked for, every input checked (SweepError: one line); nothing runs or is written."""
  if seeds is not None and seeds < 1:
    raise SweepError(f"--seeds={seeds}: a sweep needs at least one seed")
  if validation_split and not select:
    raise SweepError("--validation_split names where the best point is chosen: give --select=METRIC with it")
  points = grid.points_of(config, list(sweep_flags), file_points)
  seed_list = list(range(seeds)) if seeds is not None else None
  runs = grid.runs_of(points, seed_list)
  chosen = grid.select(runs, len(points), index, shard)
  base, validation = (with_validation(config, select, validation_split) if select
                      else (config.copy_and_resolve_references(), None))
  sweep = Sweep(base=base, points=points, seeds=seed_list, runs=runs, chosen=chosen, validation=validation,
                select=select, train_command=list(train_command))
  for run in runs[:1] + chosen[:1]:   # every run sets the same keys: one config shows that they all load
    sweep.config_of(run)
  return sweep


def check_workdir(sweep: Sweep, workdir: str) -> None:
  """The workdir holds this sweep or none (then its definition is written): one rule, see the module's doc."""
  import jax
  path = fileio.join(workdir, runner.DEFINITION)
  current = sweep.definition()
  difference = ""
  if jax.process_index() == 0 and fileio.isfile(path):
    difference = grid.definition_difference(json.loads(fileio.read_text(path)), current)
  if runner.agree(bool(difference)):
    raise SweepError(f"{workdir} holds another sweep ({difference or 'its definition differs'}): a workdir holds "
                     f"one sweep; use a new --workdir, or run the sweep of {path}")
  if jax.process_index() == 0 and not fileio.isfile(path):
    fileio.write_text(path, json.dumps(current, indent=1))


def run(sweep: Sweep, workdir: str, *, report_only: bool = False, log_line=print) -> dict:
  """Train the runs this invocation takes (finished ones are skipped), then, when every run of the sweep is
  finished (or with `report_only`), write the results. Returns {'records', 'complete', 'files'}."""
  check_workdir(sweep, workdir)
  if not report_only:
    runner.execute(sweep.chosen, workdir, sweep.config_of, log=log_line)
  records = [r for run_ in sweep.runs if (r := runner.read_record(workdir, run_.name)) is not None]
  complete = len(records) == len(sweep.runs)
  files = []
  if complete or report_only:
    files = write_results(sweep, records, workdir, log_line=log_line)
  else:
    log_line(f"{len(records)}/{len(sweep.runs)} runs finished; the results are written when every run is "
             f"(or with --report)")
  return dict(records=records, complete=complete, files=files)


def write_results(sweep: Sweep, records: list[dict], workdir: str, log_line=print) -> list[str]:
  """results.csv, results.md, plots, best.json (with --select) and the HParams dashboard, by process 0."""
  import jax
  if jax.process_index() != 0 or not records:
    return []
  keys = sweep.keys
  rows = results.by_point(records)
  metrics = results.shown_metrics(rows, sweep.select)
  table = results.format_markdown(rows, keys, metrics)
  missing = len(sweep.runs) - len(records)
  head = (f"Sweep of {len(sweep.points)} points x {len(sweep.seeds or [None])} seed(s): mean ± std over seeds"
          + (f" ({missing} runs not finished yet)" if missing else "")
          + ("; zero-shot accuracy in %" if any(m.endswith("acc1") for m in metrics) else ""))
  files = [results.write_csv(records, keys, fileio.join(workdir, "results.csv"))]
  fileio.write_text(fileio.join(workdir, "results.md"), f"{head}\n\n{table}\n")
  files.append(fileio.join(workdir, "results.md"))
  files += results.write_plots(rows, keys, metrics, workdir)
  log_line(table)
  if sweep.select:
    best = results.best_point(rows, sweep.select)
    first = next(r for r in sweep.runs if r.index == best["index"])
    payload = results.best_json(rows, sweep.select, sweep.validation, sweep.reproduce(first, workdir))
    files.append(results.write_json(fileio.join(workdir, "best.json"), payload))
    log_line(f"best point by {payload['chosen_by']} (validation split {sweep.validation['split']!r}): "
             + ", ".join(f"{k}={grid.format_value(v)}" for k, v in best["point"].items()))
    if "warning" in payload:
      log_line(f"warning: {payload['warning']}")
  files.append(results.write_hparams(records, keys, workdir))
  log_line(f"results.csv, results.md, {len(files) - 3 - bool(sweep.select)} plots"
           + (", best.json" if sweep.select else "") + f" and tensorboard/ (HParams) under {workdir}")
  return files


__all__ = ["Sweep", "SweepError", "Run", "plan", "run", "check_workdir", "write_results", "with_validation",
           "grid", "results", "runner"]
