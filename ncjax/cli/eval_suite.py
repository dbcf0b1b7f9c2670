"""`ncjax eval` as a suite: several datasets and tasks in one command, over saved checkpoints or a pretrained model.

  ncjax eval --checkpoints=/runs/clip,/runs/ncu:latest --datasets=tfds:cifar10,image_folder:/data/imagenet@val,\
      flickr30k,table:/data/mine.csv --tasks=auto,linear_probe --output=/runs/suite --num_workers=8 --skip_existing
  ncjax eval --init=open_clip:/models/ViT-B-32.safetensors --config=clip --suite=suite.json --output=/runs/b32

A dataset is any name the data layer reads (`image_folder:PATH`, `table:PATH`, `tfds:NAME` prepared under
`--data_dir`, built `tfds:karpathy/flickr30k`, `digits`, ...) or one of CLIP_benchmark's names (`cifar10`,
`imagenet1k`, `flickr30k`, `mscoco_captions`, ...: `DATASET_ALIASES`), optionally with `@SPLIT` (default `test`).
Tasks: `zeroshot` (its class names and templates: the dataset's own, CLIP_benchmark's shipped ones, or the user's
files), `retrieval`, `linear_probe`; `auto` is zero-shot on a labelled dataset and retrieval otherwise. A suite
file (JSON: a list of objects, or {"datasets": [...]}) gives each dataset its own options: `dataset`, `split`,
`tasks`, `data_dir`, `templates`, `classnames`, `name`, and any evaluator option (`folds`, `train_split`, ...).

Writes OUT/<model>/<dataset>.json per (checkpoint, dataset) — CLIP_benchmark's record (`dataset`, `model`, `task`,
`metrics`) for each task, with the checkpoint it came from — and OUT/summary.csv (every metric), OUT/summary.md
(one row per checkpoint, the main metric of each dataset and task) and OUT/summary.png (those metrics across the
checkpoints). `--skip_existing` keeps the tasks a JSON already holds (a checkpoint whose every dataset is done is
not even restored). Every evaluation goes through `ncjax.evaluation.Evaluation`; on several processes every process
evaluates and process 0 writes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re

import jax
import numpy as np

from ncjax import config_lib, evals, evaluation, experiment, fileio

TASKS = ("zeroshot", "retrieval", "linear_probe")
MAIN_METRIC = {"zeroshot": "acc1", "retrieval": "rsum", "linear_probe": "lp_acc1"}
# Options a suite entry passes to its evaluators (the rest of an entry's keys are the suite's own).
ENTRY_KEYS = ("dataset", "split", "tasks", "task", "data_dir", "name")


def _aliases() -> dict[str, str]:
  from ncjax.data.tables.classification import TFDS_TO_CLIP_BENCHMARK
  out = {}
  for tfds_name, key in TFDS_TO_CLIP_BENCHMARK.items():
    out.setdefault(key, f"tfds:{tfds_name}")      # the first tfds dataset of a key (imagenet1k: imagenet2012)
  out.update(flickr30k="tfds:karpathy/flickr30k", mscoco_captions="tfds:karpathy/coco")
  return out


# CLIP_benchmark's dataset names -> ncjax's (prepared tfds datasets; Karpathy splits built by ncjax.data.build).
DATASET_ALIASES = _aliases()


@dataclasses.dataclass
class SuiteEntry:
  dataset: str
  split: str = "test"
  tasks: tuple[str, ...] = ("auto",)
  data_dir: str = ""
  name: str = ""
  options: dict = dataclasses.field(default_factory=dict)   # evaluator options (templates, classnames, folds, ...)

  @property
  def resolved_dataset(self) -> str:
    return DATASET_ALIASES.get(self.dataset, self.dataset)

  @property
  def slug(self) -> str:
    if self.name:
      return _slug(self.name)
    body = self.dataset.split(":", 1)[-1] if self.dataset.startswith(("image_folder:", "table:")) else self.dataset
    body = os.path.basename(os.path.normpath(body)) if os.sep in body else body
    prefix = self.dataset.split(":", 1)[0] + "_" if ":" in self.dataset else ""
    return _slug(f"{prefix}{body}_{self.split}")


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "dataset"


def _tasks(value) -> tuple[str, ...]:
  items = [value] if isinstance(value, str) else list(value)
  out = tuple(t.strip() for item in items for t in str(item).replace("+", ",").split(",") if t.strip())
  bad = [t for t in out if t not in TASKS + ("auto",)]
  if bad:
    raise ValueError(f"unknown task(s) {bad}; tasks: {list(TASKS)} or 'auto' (zero-shot on labelled data, "
                     f"retrieval otherwise)")
  return out or ("auto",)


def parse_datasets(spec: str, tasks: str = "auto", data_dir: str = "") -> list[SuiteEntry]:
  """'--datasets=A,B@val,...': one entry per dataset, each with the command's tasks."""
  entries = []
  for item in [x.strip() for x in spec.split(",") if x.strip()]:
    dataset, _, split = item.rpartition("@") if "@" in item else (item, "", "")
    entries.append(SuiteEntry(dataset=dataset, split=split or "test", tasks=_tasks(tasks), data_dir=data_dir))
  return entries


def load_suite_file(path: str, tasks: str = "auto", data_dir: str = "") -> list[SuiteEntry]:
  """A JSON suite: [{"dataset": ..., "split": ..., "tasks": [...], "templates": ..., "classnames": ...}, ...]
  (or {"datasets": [...]}); a plain string entry is a dataset with the defaults."""
  data = json.loads(fileio.read_text(path))
  items = data.get("datasets") if isinstance(data, dict) else data
  if not isinstance(items, list):
    raise ValueError(f"{path}: expected a JSON list of datasets (or {{'datasets': [...]}})")
  entries = []
  for k, item in enumerate(items):
    if isinstance(item, str):
      item = dict(dataset=item)
    if not isinstance(item, dict) or "dataset" not in item:
      raise ValueError(f"{path}: entry {k} needs a 'dataset' ({item!r})")
    options = {key: v for key, v in item.items() if key not in ENTRY_KEYS}
    entries.append(SuiteEntry(dataset=item["dataset"], split=item.get("split", "test"),
                              tasks=_tasks(item.get("tasks", item.get("task", tasks))),
                              data_dir=item.get("data_dir", data_dir), name=item.get("name", ""), options=options))
  return entries


def _unique_slugs(entries: list[SuiteEntry]) -> list[str]:
  slugs, seen = [], {}
  for e in entries:
    s = e.slug
    seen[s] = seen.get(s, 0) + 1
    slugs.append(s if seen[s] == 1 else f"{s}_{seen[s]}")
  return slugs


# Per-task evaluator options an entry may carry; an option of another task is left out of that task's evaluator.
_TASK_OPTIONS = {t: set(evals.accepted_options(evals.EVALUATORS.get(t))) for t in TASKS}


def entry_tasks(entry: SuiteEntry, split) -> list[str]:
  """The tasks that run on an entry: 'auto' -> zero-shot on labelled data, retrieval otherwise; a labelled task
  asked for on data without labels is an error naming the dataset."""
  labelled = split.image_labels is not None
  out = []
  for t in entry.tasks:
    if t == "auto":
      t = "zeroshot" if labelled else "retrieval"
    elif t in ("zeroshot", "linear_probe") and not labelled:
      raise ValueError(f"{entry.dataset}@{entry.split}: {t} needs class labels, and this split has none")
    if t not in out:
      out.append(t)
  return out


def evaluator_configs(entry: SuiteEntry, key: str, tasks: list[str]) -> dict[str, dict]:
  """config.evals entries of one suite entry: '<key>__<task>' -> dict(type=task, dataset, split, ...)."""
  out = {}
  declared = TASKS if "auto" in entry.tasks else entry.tasks
  accepted = set().union(*(_TASK_OPTIONS[x] for x in declared))
  unknown = set(entry.options) - accepted
  if unknown:
    raise ValueError(f"suite entry {entry.dataset!r}: unknown option(s) {sorted(unknown)} for tasks "
                     f"{list(entry.tasks)}; accepted: {sorted(accepted)}")
  for t in tasks:
    opts = {k: v for k, v in entry.options.items() if k in _TASK_OPTIONS[t]}
    if t == "retrieval":
      opts.setdefault("plot", False)
    out[f"{_slug(key).replace('.', '_').replace('-', '_')}__{t}"] = dict(
        type=t, dataset=entry.resolved_dataset, split=entry.split, data_dir=entry.data_dir, every_steps=0, **opts)
  return out


@dataclasses.dataclass
class Model:
  """One thing evaluated: a checkpoint (workdir, step) or a pretrained spec."""
  label: str
  workdir: str = ""
  step: int = 0
  init: str = ""

  def describe(self) -> dict:
    return dict(workdir=self.workdir, step=self.step) if self.workdir else dict(init=self.init)


def models_of(checkpoints: list[tuple[str, int]] | None, init: str | None) -> list[Model]:
  if init:   # 'open_clip:/models/ViT-B-32.safetensors' -> 'open_clip_ViT-B-32'
    kind, _, path = init.partition(":")
    stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0] if path else ""
    return [Model(label=_slug(f"{kind}_{stem}" if stem else kind), init=init)]
  out, seen = [], {}
  for workdir, step in checkpoints:
    base = _slug(f"{fileio.basename(workdir.rstrip('/'))}_step{step}")
    seen[base] = seen.get(base, 0) + 1
    out.append(Model(label=base if seen[base] == 1 else f"{base}_{seen[base]}", workdir=workdir, step=step))
  return out


def _existing(path: str) -> dict | None:
  if not fileio.exists(path):
    return None
  try:
    return json.loads(fileio.read_text(path))
  except (ValueError, OSError):
    return None


def _agree(mask: np.ndarray) -> np.ndarray:
  """Process 0's decision, on every process (what each one skips must be the same: evaluation is collective)."""
  if jax.process_count() == 1:
    return mask
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.broadcast_one_to_all(mask))


def _eval_config(base, workers: int, decode: str):
  cfg = base.copy_and_resolve_references()
  with cfg.unlocked():
    cfg.evals = {}
    if workers is not None:
      cfg.input.eval_workers = int(workers)
    if decode:
      cfg.input.eval_decode = decode
  return cfg


class _SplitInfo:
  """Which splits have labels: loaded once per command (lazily read sources cost nothing to open twice)."""

  def __init__(self):
    self.cache = {}

  def __call__(self, entry: SuiteEntry, spec, image_size: int):
    key = (entry.resolved_dataset, entry.split, entry.data_dir or spec.data_dir)
    if key not in self.cache:
      from ncjax import data as data_lib
      self.cache[key] = data_lib.load_split(spec.on(entry.resolved_dataset, entry.data_dir), entry.split,
                                            image_size)
    return self.cache[key]


def run_suite(entries: list[SuiteEntry], models: list[Model], output: str, *, config=None, skip_existing=False,
              workers: int | None = None, decode: str = "") -> list[dict]:
  """Evaluate every model on every entry; returns the summary rows (one per model, dataset and task)."""
  if not entries:
    raise ValueError("the suite names no dataset")
  slugs = _unique_slugs(entries)
  splits = _SplitInfo()
  rows = []
  for model in models:
    out_dir = fileio.join(output, model.label)
    paths = [fileio.join(out_dir, f"{s}.json") for s in slugs]
    done = [(_existing(p) or {}) if skip_existing else {} for p in paths]
    # which tasks each dataset's JSON holds, as process 0 reads them (every process must skip the same ones)
    mask = _agree(np.asarray([[t in d.get("tasks", {}) for t in TASKS] for d in done], bool).reshape(-1, len(TASKS)))
    done_tasks = [{t for t, held in zip(TASKS, row) if held} for row in mask]
    # a checkpoint whose every dataset holds every asked task (auto counted as done once anything is) is skipped
    # without restoring it
    complete = np.asarray([bool(d) and all(t in d or t == "auto" for t in e.tasks) for d, e in
                           zip(done_tasks, entries)], bool)
    if complete.all():
      for e, d, path in zip(entries, done, paths):
        rows.extend(_rows(model, e, d))
      if jax.process_index() == 0:
        print(f"{model.label}: every dataset done already ({output})", flush=True)
      continue
    method, state, resolved, tokenizer, mesh = _restore(model, config)
    # a checkpoint: evaluation settings from --config when given (as `ncjax eval` without a suite), else the run's
    # own; a pretrained model: the config with the checkpoint's architecture and preprocessing laid in
    base = (evaluation.fit_to_devices(config, len(jax.devices())) if model.workdir and config is not None
            else resolved.config)
    cfg = _eval_config(base, workers, decode)
    input_spec = experiment.input_spec(cfg.input)
    plan = {}
    for i, (entry, slug) in enumerate(zip(entries, slugs)):
      tasks = [t for t in entry_tasks(entry, splits(entry, input_spec, resolved.model.image_size))
               if t not in done_tasks[i]]
      if tasks:
        plan[i] = evaluator_configs(entry, slug, tasks)
    with cfg.unlocked():
      cfg.evals = {k: v for i in plan for k, v in plan[i].items()}
    ev = evaluation.Evaluation(cfg, model_spec=resolved.model, tokenizer=tokenizer, mesh=mesh, method=method,
                               info=model.describe())
    ev.check()    # every dataset, split, label set and template file loads before the first evaluation
    name = f"{method.name}:{resolved.model.pretrained or resolved.model.size}"
    for i, (entry, path) in enumerate(zip(entries, paths)):
      record = dict(done[i]) if done[i] else dict(model=name, model_label=model.label, dataset=entry.dataset,
                                                   resolved_dataset=entry.resolved_dataset, split=entry.split,
                                                   **model.describe(), tasks={}, records=[])
      if i in plan:
        results = ev.run(model.step, state, names=list(plan[i]), write=False)
        for key in plan[i]:     # in the entry's task order
          task, metrics = plan[i][key]["type"], results[key]
          metrics = evals.finite_or_none(metrics)
          record["tasks"][task] = metrics
          record["records"] = [r for r in record["records"] if r.get("task") != ev.evaluators[key].task] + [
              dict(dataset=entry.dataset, model=name, task=ev.evaluators[key].task, metrics=metrics,
                   language="en")]
        if jax.process_index() == 0:
          fileio.write_text(path, json.dumps(record, indent=1, allow_nan=False))
          shown = ", ".join(f"{t}/{MAIN_METRIC[t]}={_fmt(record['tasks'][t].get(MAIN_METRIC[t]))}"
                            for t in record["tasks"])
          print(f"{model.label} {entry.dataset}@{entry.split}: {shown}", flush=True)
      rows.extend(_rows(model, entry, record))
  if jax.process_index() == 0 and rows:
    write_summary(rows, output)
  return rows


def _restore(model: Model, config):
  if model.init:
    if config is None:
      config = config_lib.load_config_file("clip")
    return evaluation.restore_pretrained(config, model.init)
  method, state, resolved, _meta, tokenizer, mesh = evaluation.restore_for_eval(model.workdir, model.step)
  return method, state, resolved, tokenizer, mesh


def _fmt(v) -> str:
  return "n/a" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def _rows(model: Model, entry: SuiteEntry, record: dict) -> list[dict]:
  out = []
  for task, metrics in (record or {}).get("tasks", {}).items():
    row = dict(model=model.label, **model.describe(), dataset=entry.dataset, split=entry.split, task=task,
               main_metric=MAIN_METRIC.get(task, ""), main=metrics.get(MAIN_METRIC.get(task, "")))
    row.update({k: v for k, v in metrics.items() if isinstance(v, (int, float)) or v is None})
    out.append(row)
  return out


def write_summary(rows: list[dict], output: str) -> dict[str, str]:
  """summary.csv (every metric of every model, dataset and task), summary.md (a row per model, a column per
  dataset and task: its main metric), summary.png (the main metrics across the models)."""
  keys = list(dict.fromkeys(k for r in rows for k in r))
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=keys)
  writer.writeheader()
  writer.writerows(rows)
  paths = dict(csv=fileio.join(output, "summary.csv"), md=fileio.join(output, "summary.md"),
               png=fileio.join(output, "summary.png"))
  fileio.write_text(paths["csv"], buf.getvalue())
  models = list(dict.fromkeys(r["model"] for r in rows))
  columns = list(dict.fromkeys(f"{r['dataset']}@{r['split']} {r['task']} {r['main_metric']}" for r in rows))
  table = {(r["model"], f"{r['dataset']}@{r['split']} {r['task']} {r['main_metric']}"): r["main"] for r in rows}
  lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
  for m in models:
    lines.append(f"| {m} | " + " | ".join(_fmt(table.get((m, c))) for c in columns) + " |")
  fileio.write_text(paths["md"], "\n".join(lines) + "\n")
  _plot(models, columns, table, paths["png"])
  print(f"summary: {paths['md']}, {paths['csv']}, {paths['png']}", flush=True)
  return paths


def _plot(models, columns, table, path):
  from ncjax.evals.plots import _pyplot
  plt = _pyplot()
  n = len(columns)
  cols = min(3, n)
  rows_ = (n + cols - 1) // cols
  fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.2 * rows_), squeeze=False)
  x = np.arange(len(models))
  for k, column in enumerate(columns):
    ax = axes[k // cols][k % cols]
    y = [table.get((m, column)) for m in models]
    y = [np.nan if v is None else float(v) for v in y]
    ax.plot(x, y, marker="o")
    ax.set_title(column, fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(models, rotation=30, ha="right", fontsize=7)
    ax.grid(alpha=0.3)
  for k in range(n, rows_ * cols):
    axes[k // cols][k % cols].axis("off")
  fig.tight_layout()
  fileio.save_figure(fig, path, dpi=110)
  plt.close(fig)
