"""A sweep's results from its runs' records: `results.csv` (one row per run), `results.md` (mean ± std over
seeds per point), a plot of each shown metric against each swept key, `best.json` (the point chosen on the
validation split, with its test metrics and the command that reproduces it) and TensorBoard's HParams
dashboard (each run's swept values and final metrics)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import tempfile

import numpy as np

from ncjax import fileio
from ncjax.sweep.grid import format_value, short_names

# The metrics results.md and the plots show by default, when the runs report them (NC-bench's key metrics).
SHOWN_METRICS = ("zeroshot/acc1", "retrieval/rsum", "retrieval/i2t_R@1", "retrieval/t2i_R@1", "noise_detection/auc")
VALIDATION_PREFIX = "val_"   # evals.val_<name>: the selecting evaluator's twin on the validation split


def write_csv(records: list[dict], keys: list[str], path: str) -> str:
  metrics = sorted({m for r in records for m in r["metrics"]})
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(["run", "point", *keys, "seed", *metrics, "steps", "seconds"])
  for r in records:
    w.writerow([r["name"], r["index"], *[_csv_value(r["point"].get(k, "")) for k in keys],
                "" if r["seed"] is None else r["seed"], *[r["metrics"].get(m, "") for m in metrics],
                r["steps"], r["seconds"]])
  fileio.write_text(path, buf.getvalue())
  return path


def _csv_value(v):
  return format_value(v) if isinstance(v, (tuple, list, bool)) else v


def by_point(records: list[dict]) -> list[dict]:
  """One row per point, in point order: its values, its seeds, and (mean, std) over seeds of every metric
  (non-finite values left out)."""
  groups: dict[int, list[dict]] = {}
  for r in records:
    groups.setdefault(r["index"], []).append(r)
  rows = []
  for index in sorted(groups):
    rs = groups[index]
    row = dict(index=index, point=rs[0]["point"], seeds=len(rs), runs=[r["name"] for r in rs], metrics={})
    for key in sorted({k for r in rs for k in r["metrics"]}):
      values = [v for r in rs if (v := r["metrics"].get(key)) is not None and np.isfinite(v)]
      if values:
        row["metrics"][key] = (float(np.mean(values)), float(np.std(values)))
    rows.append(row)
  return rows


def shown_metrics(rows: list[dict], select: str = "") -> list[str]:
  present = {k for r in rows for k in r["metrics"]}
  chosen = [select_key(select), select.split(":")[0]] if select else []
  return [k for k in dict.fromkeys(chosen + list(SHOWN_METRICS)) if k in present]


def format_metric(value, key: str) -> str:
  if value is None:
    return "-"
  mean, std = value
  if key.endswith("acc1"):
    return f"{100 * mean:.1f} ± {100 * std:.1f}"
  return f"{mean:.3f} ± {std:.3f}" if key.endswith("auc") else f"{mean:.2f} ± {std:.2f}"


def format_markdown(rows: list[dict], keys: list[str], metrics: list[str]) -> str:
  from ncjax.logging_utils import render_table
  names = short_names(keys)
  return render_table(
      [(names[k], "right") for k in keys] + [("seeds", "right")] + [(m, "right") for m in metrics],
      [[format_value(r["point"].get(k, "")) for k in keys] + [str(r["seeds"])]
       + [format_metric(r["metrics"].get(m), m) for m in metrics] for r in rows])


def write_plots(rows: list[dict], keys: list[str], metrics: list[str], workdir: str) -> list[str]:
  """`plot_<metric>_vs_<key>.png`: the metric's mean ± std over seeds against the key's values, one line per
  setting of the other swept keys."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  paths = []
  for metric in metrics:
    for key in keys:
      values = list(dict.fromkeys(r["point"].get(key) for r in rows))
      numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
      others = [k for k in keys if k != key]
      lines: dict[str, list] = {}
      for r in rows:
        if metric in r["metrics"]:
          label = ", ".join(f"{k}={format_value(r['point'].get(k))}" for k in others) or metric
          lines.setdefault(label, []).append((r["point"].get(key), *r["metrics"][metric]))
      if not lines:
        continue
      fig, ax = plt.subplots(figsize=(6, 4))
      for label, pts in lines.items():
        pts.sort(key=lambda p: p[0] if numeric else values.index(p[0]))
        x = [p[0] if numeric else values.index(p[0]) for p in pts]
        ax.errorbar(x, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=label)
      if numeric and min(values) > 0 and max(values) / min(values) >= 10:
        ax.set_xscale("log")
      if not numeric:
        ax.set_xticks(range(len(values)), [format_value(v) for v in values])
      ax.set_xlabel(key)
      ax.set_ylabel(metric)
      ax.set_title(f"{metric} vs {key} (mean ± std over seeds)")
      if len(lines) > 1:
        ax.legend(fontsize=7)
      path = fileio.join(workdir, f"plot_{_slug(metric)}_vs_{_slug(key)}.png")
      fig.tight_layout()
      fileio.save_figure(fig, path)
      plt.close(fig)
      paths.append(path)
  return paths


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9.@-]+", "_", text)


# --- the best point ----------------------------------------------------------------------------------------------
def parse_select(select: str) -> tuple[str, str, str]:
  """'retrieval/rsum' -> ('retrieval', 'rsum', 'max'); 'x/loss:min' -> ('x', 'loss', 'min')."""
  metric, _, mode = select.partition(":")
  evaluator, slash, name = metric.partition("/")
  if not slash or not evaluator or not name or mode not in ("", "max", "min"):
    raise ValueError(f"--select={select}: expected EVALUATOR/METRIC[:min], e.g. --select=retrieval/rsum or "
                     f"--select=zeroshot/acc1")
  return evaluator, name, mode or "max"


def select_key(select: str) -> str:
  """The metric a point is chosen by: the selecting evaluator's validation twin."""
  evaluator, name, _ = parse_select(select)
  return f"{VALIDATION_PREFIX}{evaluator}/{name}"


def best_point(rows: list[dict], select: str) -> dict:
  """The point with the best mean over seeds of the validation metric (ties: the earlier point)."""
  key = select_key(select)
  _, _, mode = parse_select(select)
  candidates = [r for r in rows if key in r["metrics"]]
  if not candidates:
    known = sorted({k for r in rows for k in r["metrics"] if k.startswith(VALIDATION_PREFIX)})
    raise ValueError(f"--select={select}: no run reports {key}; validation metrics of these runs: {known or 'none'}")
  sign = 1.0 if mode == "max" else -1.0
  return max(candidates, key=lambda r: (sign * r["metrics"][key][0], -r["index"]))


def best_json(rows: list[dict], select: str, validation: dict, command: str) -> dict:
  row = best_point(rows, select)
  key = select_key(select)
  test = {k: {"mean": m, "std": s} for k, (m, s) in row["metrics"].items() if not k.startswith(VALIDATION_PREFIX)}
  out = dict(select=select, chosen_by=key, validation=validation, point=row["point"], point_index=row["index"],
             seeds=row["seeds"], runs=row["runs"],
             validation_metric={"mean": row["metrics"][key][0], "std": row["metrics"][key][1]},
             test_metrics=test, command=command)
  if validation.get("optimistic"):
    out["warning"] = validation["note"]
  return out


# --- TensorBoard's HParams dashboard -----------------------------------------------------------------------------
def write_hparams(records: list[dict], keys: list[str], workdir: str) -> str:
  """WORKDIR/tensorboard/<run>/: one HParams session per run (its swept values and seed; its final metrics). The
  directory is rewritten whole each time (staged locally, then copied: a gs:// workdir too)."""
  from tensorboardX import SummaryWriter
  staging = tempfile.mkdtemp(prefix="ncjax-sweep-tb-")
  try:
    for r in records:
      hparams = {k: _hparam(r["point"].get(k)) for k in keys}
      if r["seed"] is not None:
        hparams["seed"] = int(r["seed"])
      metrics = {f"final/{k}": float(v) for k, v in r["metrics"].items() if v is not None and np.isfinite(v)}
      with SummaryWriter(logdir=staging) as w:
        w.add_hparams(hparams, metrics, name=r["name"])
    target = fileio.join(workdir, "tensorboard")
    if fileio.exists(target):
      fileio.rmtree(target)
    for dirpath, _, files in os.walk(staging):
      for f in files:
        rel = os.path.relpath(os.path.join(dirpath, f), staging)
        fileio.copy_file(os.path.join(dirpath, f), fileio.join(target, *rel.split(os.sep)))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return target


def _hparam(v):
  if isinstance(v, (bool, int, float, str)):
    return v
  return format_value(v) if v is not None else "none"


def write_json(path: str, payload: dict) -> str:
  fileio.write_text(path, json.dumps(payload, indent=1, default=str))
  return path
