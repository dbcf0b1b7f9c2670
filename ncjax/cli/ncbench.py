"""NC-bench: every listed method on the same data, the same noise, the same initialisation seed and the same
budget, evaluated by the same evaluators; a table with mean ± std over seeds, and curves.

  ncjax ncbench --config=configs/ncbench.py:noise=0.2+0.4+0.6,seeds=3,methods=clip+ncu+gsc+bayes \\
      --workdir=/runs/ncbench_digits --cpu_devices=8

For every (noise level, seed) cell row, each method's run gets `noise.seed = seed` and `seed = seed`, so all
methods train on the *same* noisy pairs (the noise index's sha256 is recorded per run and checked equal across
the methods of a cell) from the same parameter-initialisation seed. NCU and gradient ascent unlearn the CLIP run
of their own cell (they need a trained model: the paper's setting). `epochs` (when given) replaces every method's
epoch count (NCU: its unlearning stage). NC-bench is a sweep over method x noise x seed run by the sweep runner
(ncjax.sweep.runner), with its own table: each run lives in WORKDIR/runs/<method>_noise<r>_seed<s>/ (its config
in config.json) and writes `cell.json` when it is done: a re-run skips finished cells, and a killed run resumes
from its checkpoint.

Outputs under WORKDIR: results.csv (one row per run), results.md (mean ± std over seeds per method and noise
level), metric_vs_noise_<metric>.png, roc_noise<r>.png (noise-detection ROC curves of every method, seed 0), and
each run's own plots (clean-vs-noisy histograms) under runs/*/eval/.
"""

from __future__ import annotations

import csv
import dataclasses
import io

import numpy as np

from ncjax import fileio

def methods() -> dict:
  """{row name: BenchEntry}: every registered method's NC-bench rows (ncjax.methods.Method.bench) — a method added
  with its `bench` entries appears here without any edit to this module."""
  from ncjax.methods import bench_entries
  return bench_entries()


def legend(names) -> str:
  table = methods()
  return "\n".join(f"  {m:<17} {table[m].description if m in table else ''}" for m in dict.fromkeys(names))


# The metrics the table and the curves show (evaluator/metric), when the runs report them.
KEY_METRICS = ("zeroshot/acc1", "retrieval/rsum", "retrieval/i2t_R@1", "retrieval/t2i_R@1", "noise_detection/auc")


@dataclasses.dataclass
class Cell:
  method: str
  noise: float
  seed: int

  @property
  def name(self) -> str:
    return f"{self.method}_noise{self.noise:g}_seed{self.seed}"


def cells_of(bench) -> list[Cell]:
  """Every run of the sweep, dependencies first (a method's start run comes before it)."""
  table = methods()
  unknown = [m for m in bench.methods if m not in table]
  if unknown:
    raise ValueError(f"unknown NC-bench method(s) {unknown}; known: {sorted(table)}")
  # A run another needs joins the sweep even when not listed (NCU needs the CLIP run of its cell); every run comes
  # after the runs it needs, otherwise in the order listed.
  order: list[str] = []

  def visit(method):
    if method not in order:
      for need in table[method].needs:
        visit(need)
      order.append(method)

  listed = list(bench.methods)
  for m in listed:
    for need in table[m].needs:
      if need not in listed:
        visit(need)
  for m in sorted(listed, key=lambda m: bool(table[m].needs)):
    visit(m)
  cells = [Cell(m, float(r), int(s)) for r in bench.noise for s in range(int(bench.seeds)) for m in order]
  reference = bench.reference
  if reference:   # the clean-caption reference run of every seed, first (unless a noise level 0 already has it)
    if reference not in table or table[reference].needs:
      raise ValueError(f"bench.reference={reference!r}: expected a method that trains from scratch (e.g. 'clip')")
    extra = [Cell(reference, 0.0, int(s)) for s in range(int(bench.seeds))]
    cells = [c for c in extra if c not in cells] + cells
  return cells


def cell_config(bench, cell: Cell, workdir: str):
  """The run config of one cell: the row's config file with the bench's data, noise, seed and budget — the
  arguments every NC-bench config accepts (ncjax.config_lib.BENCH_ARGUMENTS)."""
  from ncjax import config_lib
  entry = methods()[cell.method]
  args = [entry.args, f"data={bench.data}", f"noise={cell.noise:g}"]
  if bench.epochs:   # every method's main stage (its preparatory stages keep their own length)
    args.append(f"epochs={int(bench.epochs)}")
  if bench.batch:
    args.append(f"batch={int(bench.batch)}")
  if bench.model and entry.model_kind == "two_tower":
    args.append(f"model={bench.model}")
  if entry.start:
    args.append(f"init={run_dir(workdir, Cell(entry.start, cell.noise, cell.seed))}")
  if entry.scores:
    args.append(f"forget_scores={run_dir(workdir, Cell(entry.scores, cell.noise, cell.seed))}")
  cfg = config_lib.load_config_file(entry.config, ",".join(a for a in args if a))
  with cfg.unlocked():
    cfg.seed = cell.seed
    cfg.noise.seed = cell.seed
    cfg.input.shuffle_seed = cell.seed
    if bench.data_dir:
      cfg.input.data_dir = bench.data_dir
    cfg.log.progress = False
  return cfg


RECORD = "cell.json"   # a finished cell's record, written atomically last


def run_dir(workdir: str, cell: Cell) -> str:
  return fileio.join(workdir, "runs", cell.name)


def as_run(index: int, cell: Cell):
  """The cell as a run of the sweep runner (ncjax.sweep): its point is (method, noise), its directory its name."""
  from ncjax.sweep import Run
  return Run(index=index, point=(("method", cell.method), ("noise", cell.noise)), seed=cell.seed, name=cell.name)


def cell_record(cell: Cell, result, results: dict, seconds: float) -> dict:
  """A finished cell's record (runs/<cell>/cell.json)."""
  from ncjax.sweep.runner import flat_metrics
  return dict(method=cell.method, noise=cell.noise, seed=cell.seed,
              noise_sha256=result.experiment.train_data.noise_sha256,
              steps_per_epoch=int(result.experiment.steps_per_epoch), seconds=round(seconds, 1),
              metrics=flat_metrics(results))


def check_same_noise(records: list[dict]) -> None:
  """Every method of a (noise, seed) row trained on the same noisy pairs."""
  by_row = {}
  for r in records:
    by_row.setdefault((r["noise"], r["seed"]), set()).add(r["noise_sha256"])
  bad = {k: v for k, v in by_row.items() if len(v) > 1}
  if bad:
    raise RuntimeError(f"methods of the same cell trained on different noise indices: {bad}")


def aggregate(records: list[dict]) -> list[dict]:
  """Mean and std over seeds of every metric, per (method, noise); undefined values (the clean reference's noise
  AUC: no noisy pair to detect) are left out, so the table prints '-' for them, never 'nan ± nan'."""
  groups = {}
  for r in records:
    groups.setdefault((r["method"], r["noise"]), []).append(r)
  rows = []
  for (method, noise), rs in groups.items():
    row = dict(method=method, noise=noise, seeds=len(rs))
    for key in sorted({k for r in rs for k in r["metrics"]}):
      values = [v for r in rs if (v := r["metrics"].get(key)) is not None and np.isfinite(v)]
      if values:
        row[key] = (float(np.mean(values)), float(np.std(values)))
    rows.append(row)
  return rows


def write_csv(records: list[dict], path: str) -> str:
  keys = sorted({k for r in records for k in r["metrics"]})
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(["method", "noise", "seed", "noise_sha256", "seconds"] + keys)
  for r in records:
    w.writerow([r["method"], r["noise"], r["seed"], r["noise_sha256"], r["seconds"]]
               + [r["metrics"].get(k, "") for k in keys])
  fileio.write_text(path, buf.getvalue())
  return path


# The metrics whose recovery the table reports (when the runs have them).
RECOVERED_METRICS = {"zeroshot/acc1": "recovered zero-shot", "retrieval/rsum": "recovered rsum"}


def recovered_fraction(rows: list[dict], reference: str, key: str = "zeroshot/acc1") -> dict:
  """{(method, noise): fraction of the metric's drop that the method wins back}: with the reference method's mean
  at noise 0 (clean captions) and at the same noise, (method − reference_noisy) / (reference_clean −
  reference_noisy). Empty without the reference's runs."""
  by = {(r["method"], r["noise"]): r[key][0] for r in rows if key in r}
  clean = by.get((reference, 0.0))
  out = {}
  for (method, noise), value in by.items():
    noisy = by.get((reference, noise))
    if clean is None or noisy is None or noise == 0.0 or clean - noisy <= 0:
      continue
    out[(method, noise)] = (value - noisy) / (clean - noisy)
  return out


def format_markdown(rows: list[dict], reference: str = "") -> str:
  from ncjax.logging_utils import render_table
  keys = [k for k in KEY_METRICS if any(k in r for r in rows)]
  recovered = {k: rec for k in RECOVERED_METRICS if reference and (rec := recovered_fraction(rows, reference, k))}

  def cell(v, key):
    if v is None or not np.isfinite(v[0]):
      return "-"  # not measured, or undefined (the clean reference has no noisy pairs to detect)
    mean, std = v
    scale = 100.0 if key.endswith("acc1") else 1.0
    return f"{scale * mean:.1f} ± {scale * std:.1f}" if not key.endswith("auc") else f"{mean:.3f} ± {std:.3f}"

  extra = [(RECOVERED_METRICS[k], "right") for k in recovered]
  return render_table(
      [("method", "left"), ("noise", "right"), ("seeds", "right")] + [(k, "right") for k in keys] + extra,
      [[r["method"], f"{r['noise']:.0%}", str(r["seeds"])] + [cell(r.get(k), k) for k in keys]
       + [_percent(rec.get((r["method"], r["noise"]))) for rec in recovered.values()]
       for r in sorted(rows, key=lambda r: (r["noise"], r["method"] != reference, r["method"]))])


def _percent(x) -> str:
  return "-" if x is None else f"{100 * x:.0f}%"


def write_plots(rows: list[dict], records: list[dict], workdir: str) -> list[str]:
  from ncjax.data.scores import latest_clean_scores
  from ncjax.evals import plots
  paths = []
  for key in KEY_METRICS:
    series = {}
    for method in dict.fromkeys(r["method"] for r in rows):
      pts = sorted((r["noise"], *r[key]) for r in rows if r["method"] == method and key in r)
      if pts:
        x, mean, std = zip(*pts)
        series[method] = (x, mean, std)
    if series:
      path = fileio.join(workdir, f"metric_vs_noise_{key.replace('/', '_')}.png")
      paths.append(plots.plot_metric_vs_noise(series, path, key))
  for noise in sorted({r["noise"] for r in records}):
    curves = {}
    for r in records:
      if r["noise"] != noise or r["seed"] != 0:
        continue
      found = latest_clean_scores(run_dir(workdir, Cell(r["method"], r["noise"], r["seed"])))
      if found:
        data = fileio.load_npz(found)
        if (~data["clean"]).any() and data["clean"].any():
          curves[r["method"]] = (data["scores"], data["clean"])
    if curves:
      clean = next(iter(curves.values()))[1]   # the cell's training pairs: the same flags for every method
      paths.append(plots.plot_roc_curves(curves, fileio.join(workdir, f"roc_noise{noise:g}.png"),
                                         roc_title(noise, clean)))
  return paths


def roc_title(noise: float, clean) -> str:
  """The ROC plot's title: the noise its curves detect — the injected level, or, where nothing is injected and the
  flags are the data's own (a table's clean column), the share of the training pairs the data marks noisy."""
  if noise > 0:
    return f"noise detection at {noise:.0%} noise (seed 0)"
  return f"noise detection: the data's own noise, {1 - float(np.mean(clean)):.1%} of the training pairs (seed 0)"


def run(config, workdir: str, log=print, show_table: bool = True) -> dict:
  """The whole sweep (resumable); returns {'records', 'rows', 'table', 'plots'}. On several processes every one
  trains every cell together; the tables and plots are written by process 0. `show_table=False`: the caller prints
  the table itself (the demo, in its summary)."""
  import jax
  from ncjax.sweep import runner
  bench = config.bench
  cells = cells_of(bench)
  # The sweep runner trains each cell in turn (a finished one, its cell.json written last, is read back; a killed
  # one resumes from its checkpoint); the cells depend on one another (NCU unlearns its cell's CLIP), so in order.
  by_name = {c.name: c for c in cells}
  records = runner.execute([as_run(k, c) for k, c in enumerate(cells)], workdir,
                           lambda run: cell_config(bench, by_name[run.name], workdir), record=RECORD,
                           make_record=lambda run, result, results, seconds: cell_record(
                               by_name[run.name], result, results, seconds), tag="ncbench", log=log)
  check_same_noise(records)
  rows = aggregate(records)
  reference = bench.reference
  table = format_markdown(rows, reference)
  paths = []
  if jax.process_index() == 0:
    write_csv(records, fileio.join(workdir, "results.csv"))
    fileio.write_text(fileio.join(workdir, "results.md"), (
        f"NC-bench on {bench.data}: mean ± std over {int(bench.seeds)} seed(s); zero-shot in %, rsum in "
        f"points, noise AUC of each method's clean score"
        + (f"; recovered: the share of the metric's drop from {reference} on clean captions to "
           f"{reference} at that noise that the method wins back" if reference else "") + f"\n\n{table}\n"))
    paths = write_plots(rows, records, workdir)
  if show_table:
    log(table)
  log(f"results.csv, results.md and {len(paths)} plots under {workdir}")
  return dict(records=records, rows=rows, table=table, plots=paths)
