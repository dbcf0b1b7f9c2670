"""Command line: train a method from a config, with periodic and final evaluation.

  python -m ncjax.main --config=configs/clip.py:model=tiny,noise=0.4 --workdir=/tmp/run [--config.optim.lr=1e-3]
  ncjax train --config=... --workdir=...          (the console script; `train` is the default command)
  ncjax eval --checkpoints=WORKDIR[,WORKDIR2/checkpoints/400] [--config=...]   (evaluate saved checkpoints)
  ncjax eval --init=open_clip:PATH [--config=configs/clip.py] --output=DIR     (evaluate a pretrained model)
  ncjax eval --checkpoints=WORKDIR|--init=SPEC --datasets=tfds:cifar10,image_folder:PATH@val,flickr30k --output=DIR
             [--tasks=auto,linear_probe --suite=FILE.json --num_workers=8 --skip_existing]   (an evaluation suite)
  ncjax export --checkpoint=WORKDIR[:STEP] --format=open_clip|hf --output=DIR  (back to PyTorch tools)
  ncjax audit --checkpoint=WORKDIR[:STEP]|--init=SPEC [--config=...] [--dataset=...] --output=DIR
                                                  (every pair ranked by suspicion: audit.csv and index.html)
  ncjax audit --init=SPEC|--checkpoint=WORKDIR --dataset=web:ROOT --output=DIR [--score=method --sample=100]
                                                  (web data at any size, on N processes: per-shard score files,
                                                   resumable; a report from the top suspects and a random sample)
  ncjax filter --scores=DIR --keep=0.7|--min_score=X [--per_dataset --write_keys --write_shards=ROOT] --output=F
                                                  (the pairs to train on: --config.input.web.filter=F)
  ncjax ncbench --config=configs/ncbench.py:noise=0.2+0.4,seeds=3,methods=clip+ncu+gsc --workdir=DIR
                                                  (every method on the same noise, data and budget)
  ncjax sweep --config=... --sweep=optim.lr=1e-3,3e-3 [--sweep=KEY=...] --seeds=3 --select=retrieval/rsum
              --workdir=DIR [--dry_run] [--index=I | --shard=I/N] [--report]
                                                  (any config keys over a grid: results, plots, best.json)

Re-running with the same workdir resumes from its latest checkpoint. `--cpu_devices=8` simulates 8 devices on a
CPU host; `--num_processes/--process_id/--coordinator_address` start one process of a multi-process run (on a
cluster `jax.distributed.initialize()` auto-detects these and the flags can be omitted).
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags

from ncjax import errors
from ncjax.cli import sweep as sweep_cli   # noqa: F401  (defines the sweep's flags)
from ml_collections.config_flags import config_flags

class _ConfigSpecParser(config_flags.ConfigFileFlagParser):
  """--config=SPEC: a shipped config by name ('clip:model=small,noise=0.4', from any directory) or a path to a .py
  file ('configs/clip.py:...', 'my_config.py:...'); a failure is one line (ncjax.config_lib.load_config_spec)."""

  def parse(self, spec):
    from ncjax import config_lib
    try:
      config = config_lib.load_config_spec(spec)
    except config_lib.ConfigError as e:
      raise flags.IllegalFlagValueError(str(e)) from None
    if self._lock_config:
      config.lock()
    return config


class _ConfigFlag(config_flags._ConfigFlag):   # noqa: SLF001 (ml_collections' flag, with checked overrides)
  """`--config.a.b=v` overrides checked against the loaded config first: a misspelt key is one line naming it and
  the closest known keys (ml_collections alone raises a bare AttributeError from deep inside its parser)."""

  def _initialize_missing_parent_fields(self, config, overrides):
    from ncjax import config_lib
    for path in overrides:
      try:
        config_lib.check_override_path(config, path)
      except config_lib.ConfigError as e:
        raise flags.IllegalFlagValueError(str(e)) from None
    super()._initialize_missing_parent_fields(config, overrides)


_CONFIG = flags.DEFINE_flag(_ConfigFlag(
    parser=_ConfigSpecParser(name="config", lock_config=True), serializer=flags.ArgumentSerializer(), name="config",
    default=None, help_string="A shipped config by name with its arguments (clip:model=small,noise=0.4; from any "
    "directory) or a path to a config file (configs/clip.py:model=tiny, path/to/mine.py)"))
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics.jsonl, eval results")
_CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0, "Simulate this many CPU devices (testing sharding)")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (cluster auto-detection)")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0 (multi-process runs)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Number of processes (multi-process runs)")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index (multi-process runs)")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout", 100, "Multi-process runs: seconds without a heartbeat after which a process counts as lost "
    "and every other one stops with an error naming it (jax.distributed's heartbeat timeout)")
_SHUTDOWN_TIMEOUT = flags.DEFINE_integer(
    "shutdown_timeout", 300, "Multi-process runs: seconds a finishing process waits for the others at shutdown")
_UNTIL = flags.DEFINE_integer("until_step", None, "Stop after this global step (the run stays resumable)")
_CHECKPOINTS = flags.DEFINE_string(
    "checkpoints", None, "eval: comma-separated WORKDIR (every checkpoint of the run), WORKDIR:latest, "
    "WORKDIR/checkpoints/STEP or WORKDIR/STEP")
_OUTPUT = flags.DEFINE_string("output", None, "eval: where the summary table goes (default: the first WORKDIR/eval); "
                              "export: the directory to write")
_INIT = flags.DEFINE_string("init", None, "eval: evaluate a pretrained checkpoint directly (openai:PATH, "
                            "open_clip:PATH, hf:DIR, meru:PATH) with --config's evaluators")
_DATASETS = flags.DEFINE_string(
    "datasets", None, "eval: a suite of datasets, comma-separated: image_folder:PATH, table:PATH.csv, tfds:NAME, "
    "tfds:karpathy/flickr30k, digits, or CLIP_benchmark's names (cifar10, imagenet1k, flickr30k, ...), each "
    "optionally @SPLIT; one JSON per (checkpoint, dataset) under --output, a summary and a plot")
_SUITE = flags.DEFINE_string("suite", None, "eval: a JSON suite file: a list of {dataset, split, tasks, templates, "
                             "classnames, data_dir, name, evaluator options}")
_TASKS = flags.DEFINE_string("tasks", "auto", "eval suite: tasks run on each dataset: zeroshot, retrieval, "
                             "linear_probe, or auto (zero-shot on labelled data, retrieval otherwise)")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "eval suite: where tfds datasets are prepared or built (default: the "
                                "config's input.data_dir)")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "eval suite: threads (or processes) decoding evaluation images "
                                    "in parallel (default input.eval_workers: one per usable core; 0: serially)")
_DECODE = flags.DEFINE_enum("decode", None, ["thread", "process"], "eval suite: decode workers are threads (default) or "
                            "spawned processes")
_SKIP_EXISTING = flags.DEFINE_bool("skip_existing", False, "eval suite: keep the results a (checkpoint, dataset) "
                                   "JSON already holds instead of recomputing them")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "export, audit: WORKDIR[:STEP] (default: its latest "
                                  "checkpoint)")
_DATASET = flags.DEFINE_string("dataset", "", "audit: the dataset whose pairs are scored (default: the data the run "
                               "trained on; with --init, the config's input.dataset)")
_SPLIT = flags.DEFINE_string("split", "", "audit: its split (default: the run's / config's training split)")
_SCORE = flags.DEFINE_enum("score", "auto", ["auto", "similarity", "method"], "audit: the run's own per-sample clean "
                           "scores (method: GSC labels, Bayesian CL weights, NCU scores), the model's similarity of "
                           "each pair, or auto (the method's when it keeps them and the pairs are its own)")
_TOP = flags.DEFINE_integer("top", 100, "audit: the most suspicious pairs shown as thumbnails in index.html")
_SAMPLE = flags.DEFINE_integer("sample", 100, "audit of web data: a random sample of pairs shown beside the suspects")
_PROGRESS_EVERY = flags.DEFINE_float("progress_every", 30.0, "audit of web data: seconds between progress lines "
                                     "(pairs/s, ETA) of each process; 0: only at the end")
_SCORES = flags.DEFINE_string("scores", None, "filter: the --output of a web audit (its per-shard score files)")
_KEEP = flags.DEFINE_float("keep", None, "filter: the fraction of scored pairs to keep, the highest scores")
_MIN_SCORE = flags.DEFINE_float("min_score", None, "filter: keep every pair scoring at least this")
_PER_DATASET = flags.DEFINE_bool("per_dataset", False, "filter: --keep of each dataset of a mixture apart")
_WRITE_KEYS = flags.DEFINE_bool("write_keys", False, "filter: also write OUTPUT/kept_keys/d<d>.parquet (shard, key, "
                                "id, score of every kept pair) for tools outside ncjax")
_WRITE_SHARDS = flags.DEFINE_string("write_shards", "", "filter: also write the kept pairs as img2dataset-layout "
                                    "shards under this root (each of --num_processes processes its share)")
_FORMAT = flags.DEFINE_enum("format", "open_clip", ["open_clip", "hf"], "export: open_clip folder or transformers "
                            "CLIPModel directory")
_MODULE = flags.DEFINE_string("module", "model", "export: which two-tower module of the method ('model'; 'net_a' "
                              "or 'net_b' for GSC+)")
_PLUGINS = flags.DEFINE_list("plugins", [], "Python files (path/to/my_method.py) or importable modules, imported "
                             "before anything else: methods, evaluators, datasets or towers registered outside "
                             "ncjax (`@ncjax.methods.register(...)`), usable by every command")

_VERBOSE = flags.DEFINE_bool("verbose", False, "On an error, print its traceback as well (also NCJAX_DEBUG=1)")

COMMANDS = ("train", "eval", "export", "ncbench", "audit", "filter", "sweep")


def load_plugins(specs) -> list:
  """Import each plugin: a path to a .py file (imported under its file name) or a module name. A plugin registers
  what it adds (a method with its `bench` rows, an evaluator, a dataset) when imported; nothing in ncjax is edited."""
  import importlib
  import importlib.util
  loaded = []
  for spec in [s for s in specs if s]:
    if spec.endswith(".py"):
      path = os.path.abspath(spec)
      if not os.path.isfile(path):
        raise errors.ConfigurationError(f"--plugins: no such file {spec!r}")
      name = f"ncjax_plugin_{os.path.splitext(os.path.basename(path))[0]}"
      if name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
      loaded.append(sys.modules[name])
    else:
      loaded.append(importlib.import_module(spec))
  return loaded


def _quiet_logging():
  """Library INFO logs (orbax's per-save lines, tfds) only when asked for with --verbosity=0 (or -v 0); ncjax's
  own progress, results and errors are printed regardless."""
  from absl import logging as absl_logging
  if not flags.FLAGS["verbosity"].present:
    absl_logging.set_verbosity(absl_logging.WARNING)


def _init_jax():
  import jax
  from ncjax import runtime
  _quiet_logging()
  if _CPU_DEVICES.value:
    runtime.configure_cpu_devices(_CPU_DEVICES.value)
  # The trainer agrees on preemptions itself (ncjax.train.PreemptionWatch): jax's service would catch SIGTERM first
  # and its sync barrier can deadlock at the end of a run.
  jax.config.update("jax_enable_preemption_service", False)
  timeouts = dict(heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
                  shutdown_timeout_seconds=_SHUTDOWN_TIMEOUT.value)
  if _NUM_PROCESSES.value > 1:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                               process_id=_PROCESS_ID.value, **timeouts)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize(**timeouts)
  return jax


def expand_checkpoints(spec: str) -> list[tuple[str, int]]:
  """'WORKDIR' -> every step; 'WORKDIR:latest'; 'WORKDIR/checkpoints/STEP' or 'WORKDIR/STEP' -> that step."""
  from ncjax import checkpoint as ckpt_lib, fileio
  out = []
  for item in [x for x in spec.split(",") if x]:
    latest_only = item.endswith(":latest")
    path = fileio.absolute(item[:-len(":latest")] if latest_only else item)
    base = fileio.basename(path)
    if base.isdigit():
      parent = fileio.dirname(path)
      workdir = fileio.dirname(parent) if fileio.basename(parent) == "checkpoints" else parent
      out.append((workdir, int(base)))
      continue
    workdir = fileio.dirname(path) if base == "checkpoints" else path
    manager = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), async_save=False)
    steps = manager.all_steps()
    manager.close()
    if not steps:
      raise errors.MissingCheckpoint(f"{workdir} holds no checkpoint (expected {workdir}/checkpoints/<step>/): "
                                     f"give --checkpoints a run's workdir (ncjax train --workdir=...)")
    out.extend((workdir, s) for s in (steps[-1:] if latest_only else sorted(steps)))
  return out


def eval_command(config):
  """Evaluate checkpoints: one JSON per checkpoint (WORKDIR/eval/step_N.json) and a summary (markdown + CSV)."""
  import jax
  if not _CHECKPOINTS.value:
    raise errors.ConfigurationError("eval needs --checkpoints=WORKDIR[/checkpoints/STEP][,...]")
  from ncjax import evaluation
  rows = []
  for workdir, step in expand_checkpoints(_CHECKPOINTS.value):
    results, meta = evaluation.evaluate_checkpoint(config, workdir, step)
    row = dict(workdir=workdir, step=step, method=meta["method"])
    for name, res in results.items():
      row.update({f"{name}/{k}": v for k, v in res.items() if isinstance(v, (int, float))})
    rows.append(row)
    if jax.process_index() == 0:
      print(f"{workdir} step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items()
                                                  if k.endswith(("acc1", "R@1", "rsum", "auc", "lp_acc1"))))
  if jax.process_index() == 0 and rows:
    from ncjax import fileio
    write_summary(rows, _OUTPUT.value or fileio.join(rows[0]["workdir"], "eval"))
  return rows


def suite_command(config):
  """`ncjax eval --datasets=...` / `--suite=FILE`: every dataset and task on every checkpoint (or the pretrained
  model of --init); see ncjax.cli.eval_suite."""
  from ncjax import fileio
  from ncjax.cli import eval_suite
  if bool(_CHECKPOINTS.value) == bool(_INIT.value):
    raise errors.ConfigurationError("an eval suite needs --checkpoints=WORKDIR[,...] or --init=SPEC (one of them)")
  data_dir = _DATA_DIR.value
  entries = eval_suite.parse_datasets(_DATASETS.value or "", _TASKS.value, data_dir)
  if _SUITE.value:
    entries += eval_suite.load_suite_file(_SUITE.value, _TASKS.value, data_dir)
  checkpoints = expand_checkpoints(_CHECKPOINTS.value) if _CHECKPOINTS.value else None
  output = _OUTPUT.value or (fileio.join(checkpoints[0][0], "eval", "suite") if checkpoints else "eval_suite")
  return eval_suite.run_suite(entries, eval_suite.models_of(checkpoints, _INIT.value), output, config=config,
                              skip_existing=_SKIP_EXISTING.value, workers=_NUM_WORKERS.value, decode=_DECODE.value)


def write_summary(rows: list[dict], out_dir: str) -> tuple[str, str]:
  import csv
  import io
  from ncjax import fileio
  keys = list(dict.fromkeys(k for r in rows for k in r))
  csv_path = fileio.join(out_dir, "summary.csv")
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=keys)
  w.writeheader()
  w.writerows(rows)
  fileio.write_text(csv_path, buf.getvalue())
  md_path = fileio.join(out_dir, "summary.md")
  shown = [k for k in keys if k in ("workdir", "step", "method") or k.endswith(
      ("acc1", "mean_per_class_recall", "i2t_R@1", "t2i_R@1", "rsum", "auc", "F_acc", "R_acc"))]

  def fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)

  fileio.write_text(md_path, "| " + " | ".join(shown) + " |\n|" + "---|" * len(shown) + "\n" + "".join(
      "| " + " | ".join(fmt(r.get(k, "")) for k in shown) + " |\n" for r in rows))
  print(f"summary: {md_path}, {csv_path}")
  return md_path, csv_path


def train_command(config, workdir: str):
  from ncjax import evaluation, train
  trainer = train.Trainer(config, workdir)
  config = trainer.config   # a pretrained init_from's architecture laid in
  evaluation.check(config, trainer.exp)
  result = trainer.run(until=_UNTIL.value, evaluate=evaluation.periodic_hook(config, trainer))
  results = evaluation.final(config, result, workdir)
  import jax
  for name, res in results.items() if jax.process_index() == 0 else ():
    shown = {k: round(v, 4) for k, v in res.items()
             if isinstance(v, float) and (k.endswith("R@1") or k in ("acc1", "rsum", "auc", "lp_acc1"))}
    print(f"{name}: {shown}")
  return results


def export_command():
  """Write a run's model as an open_clip folder or a Hugging Face CLIPModel directory (a local path or gs://; on
  several processes every one restores, process 0 writes)."""
  import jax
  import tempfile
  from ncjax import checkpoint as ckpt_lib, config_lib, fileio
  from ncjax import pretrained
  if not _CHECKPOINT.value or not _OUTPUT.value:
    raise errors.ConfigurationError("export needs --checkpoint=WORKDIR[:STEP] and --output=DIR")
  workdir, step = _CHECKPOINT.value, ""
  head, _, tail = workdir.rpartition(":")
  if head and (tail.isdigit() or tail == "latest"):   # WORKDIR:STEP (a gs:// workdir has a colon of its own)
    workdir, step = head, tail
  path = fileio.join(workdir, "checkpoints", step) if step and step != "latest" else workdir
  params, meta, step = ckpt_lib.restore_params(path)
  config = config_lib.from_json_dict(meta["config"])
  if _MODULE.value not in params:
    raise errors.ConfigurationError(f"the checkpoint has no module {_MODULE.value!r}; modules: {sorted(params)}")
  files = []
  if jax.process_index() == 0:
    remote = fileio.is_remote(_OUTPUT.value)
    local = tempfile.mkdtemp(prefix="ncjax-export-") if remote else _OUTPUT.value
    files = pretrained.export(params[_MODULE.value], config.model, local, _FORMAT.value,
                              tokenizer_kind=meta["tokenizer"]["kind"], normalization=config.input.normalization)
    if remote:   # written locally, then uploaded file by file (each upload is atomic)
      files = [_upload(f, fileio.join(_OUTPUT.value, os.path.basename(f))) for f in files]
  load = (f"open_clip.create_model_and_transforms('local-dir:{_OUTPUT.value}')" if _FORMAT.value == "open_clip"
          else f"transformers.CLIPModel.from_pretrained('{_OUTPUT.value}')")
  if jax.process_index() == 0:
    print(f"exported {workdir} step {step} ({meta['method']}) -> {', '.join(files)}\nload it with {load}")
  return files


def _split_checkpoint(spec: str) -> tuple[str, int | None]:
  """'WORKDIR[:STEP|:latest]' -> (WORKDIR, STEP or None); a gs:// workdir keeps its own colon."""
  head, _, tail = spec.rpartition(":")
  if head and (tail.isdigit() or tail == "latest"):
    return head, (int(tail) if tail.isdigit() else None)
  return spec, None


def audit_command(config):
  """Score every pair of a dataset with a run or a pretrained model; write DIR/audit.csv, plots and index.html."""
  from ncjax.cli import audit
  if not _OUTPUT.value or bool(_CHECKPOINT.value) == bool(_INIT.value):
    raise errors.ConfigurationError("audit needs --output=DIR and --checkpoint=WORKDIR[:STEP] or --init=SPEC "
                                    "(with --config)")
  workdir, step = _split_checkpoint(_CHECKPOINT.value) if _CHECKPOINT.value else ("", None)
  if _web_audit_wanted(workdir, config):
    from ncjax.cli import web_audit
    return web_audit.run(_OUTPUT.value, checkpoint=workdir, step=step, init=_INIT.value or "", config=config,
                         dataset=_DATASET.value, score=_SCORE.value, top=_TOP.value, sample=_SAMPLE.value,
                         threads=_NUM_WORKERS.value if _NUM_WORKERS.value is not None else 8,
                         workers=(_NUM_WORKERS.value or 1) if _DECODE.value == "process" else 0,
                         progress_every=_PROGRESS_EVERY.value)
  return audit.run(_OUTPUT.value, top=_TOP.value, checkpoint=workdir, step=step, init=_INIT.value or "",
                   config=config, dataset=_DATASET.value, split=_SPLIT.value, data_dir=_DATA_DIR.value,
                   score=_SCORE.value)


def _web_audit_wanted(workdir: str, config) -> bool:
  """A web dataset to audit: --dataset=web:..., else the run's (or the config's) training data."""
  from ncjax.data.web import pipeline as web_pipeline
  if _DATASET.value:
    return web_pipeline.is_web(_DATASET.value)
  if workdir:
    from ncjax import checkpoint as ckpt_lib
    try:
      return web_pipeline.is_web(ckpt_lib.read_source_meta(workdir)["config"]["input"]["dataset"])
    except Exception:  # noqa: BLE001 — no readable checkpoint: the audit's own restore reports it
      return False
  return config is not None and web_pipeline.is_web(config.input.dataset)


def filter_command():
  """`ncjax filter`: the pairs to train on, chosen from a web audit's score files."""
  from ncjax.cli import web_audit
  if not _SCORES.value or not _OUTPUT.value:
    raise errors.ConfigurationError("filter needs --scores=AUDIT_OUTPUT, --keep=FRACTION or --min_score=X and "
                                    "--output=FILTER_DIR")
  return web_audit.filter_command(_SCORES.value, _OUTPUT.value, keep=_KEEP.value, min_score=_MIN_SCORE.value,
                                  per_dataset=_PER_DATASET.value, keys=_WRITE_KEYS.value, shards=_WRITE_SHARDS.value,
                                  process_index=_PROCESS_ID.value, process_count=_NUM_PROCESSES.value)


def _upload(local: str, remote: str) -> str:
  from ncjax import fileio
  fileio.copy_file(local, remote)
  os.remove(local)
  return remote


def _dispatch(argv):
  args = [a for a in argv[1:]]
  command = args[0] if args else "train"
  if command not in COMMANDS:
    raise errors.ConfigurationError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
  load_plugins(_PLUGINS.value)
  if command == "export":
    _init_jax()
    export_command()
    return
  if command == "audit":
    _init_jax()
    audit_command(_CONFIG.value)
    return
  if command == "filter":   # no JAX: it reads and writes files
    _quiet_logging()
    filter_command()
    return
  if command == "eval":
    _init_jax()
    if _DATASETS.value or _SUITE.value:
      suite_command(_CONFIG.value)
      return
    if _INIT.value:
      from ncjax import config_lib
      config = _CONFIG.value if _CONFIG.value is not None else config_lib.load_config_file("clip")
      from ncjax import evaluation
      results = evaluation.evaluate_pretrained(config, _INIT.value, _OUTPUT.value or "eval_pretrained")
      for name, res in results.items():
        print(f"{name}: " + ", ".join(f"{k}={v:.4g}" for k, v in res.items() if isinstance(v, float)))
      return
    eval_command(_CONFIG.value)
    return
  if _CONFIG.value is None:
    raise errors.ConfigurationError("--config is required, e.g. --config=clip:model=tiny (a shipped config by name) or "
                         "--config=path/to/config.py")
  if not _WORKDIR.value:
    raise errors.ConfigurationError("--workdir is required")
  if command == "sweep":   # its inputs are checked (and --dry_run answered) before JAX starts
    logging.getLogger("ncjax").setLevel(logging.INFO)
    sweep_cli.main(_CONFIG.value, _WORKDIR.value, _init_jax)
    return
  _init_jax()
  logging.getLogger("ncjax").setLevel(logging.INFO)
  if command == "ncbench":
    from ncjax.cli import ncbench
    ncbench.run(_CONFIG.value, _WORKDIR.value)
  else:
    train_command(_CONFIG.value, _WORKDIR.value)


def _process_info() -> tuple[int, int]:
  """(this process's index, the process count) for reporting an error, without starting JAX for it."""
  if _NUM_PROCESSES.value > 1:
    return _PROCESS_ID.value, _NUM_PROCESSES.value
  if "jax" in sys.modules and _DISTRIBUTED.value:
    import jax
    return jax.process_index(), jax.process_count()
  return 0, 1


def main(argv):
  """Every command through one error path (ncjax.errors): a user error ends as one line `ncjax: error: ...` and its
  own exit status, printed once over the processes, and the process leaves at once (no background thread prints
  after it); a preemption ends with its checkpoint saved and status 75; anything else keeps its traceback.
  `--verbose` (or NCJAX_DEBUG=1) prints the traceback of a user error too."""
  from ncjax.train import PREEMPTED_EXIT_STATUS, Preempted
  try:
    _dispatch(argv)
  except Preempted as e:
    # The checkpoint of the step it stopped at is written; the relaunched command resumes there.
    print(f"ncjax: {e}", file=sys.stderr, flush=True)
    sys.exit(PREEMPTED_EXIT_STATUS)   # a normal shutdown: every process stops at the same step (jax's barrier)
  except Exception as e:  # noqa: BLE001 — user errors are reported, the others re-raised with their traceback
    index, count = _process_info()
    status = errors.report(e, process_index=index, process_count=count,
                           debug=_VERBOSE.value or errors.debug_requested([]))
    if status is None:
      raise
    if count > 1:
      _wait_for_the_others()
    errors.exit_now(status)


def _wait_for_the_others(timeout_s: float = 10.0) -> None:
  """Before a process leaves on a user error, wait (at most `timeout_s`) until every process has reached its own:
  process 0 hosts JAX's coordination service, and leaving first would abort the others (SIGABRT on losing the
  coordinator) instead of letting each exit with the error's status. A problem found by one process alone (its
  disk) finds no partner: it leaves after the timeout, and the others stop as when a process is lost."""
  if "jax" not in sys.modules:
    return
  try:
    from jax._src import distributed
    client = distributed.global_state.client
    if client is not None:
      client.wait_at_barrier("ncjax_user_error", int(timeout_s * 1000))
  except Exception:  # noqa: BLE001 — best effort: the error is already reported, the exit must not be delayed
    pass


def run():
  """Console-script entry point (`ncjax`). absl prints `__main__`'s docstring as the usage of --help; the console
  script's __main__ has none, so it would print only 'USAGE: ncjax [flags]': give it this module's (the
  commands and their flags). Restarts itself once first with malloc backing large buffers by huge pages
  (ncjax.runtime.restart_with_huge_pages; NCJAX_HUGE_PAGES=0 opts out)."""
  from ncjax import runtime
  runtime.restart_with_huge_pages()
  sys.modules["__main__"].__doc__ = __doc__
  app.run(main, flags_parser=_parse_flags)


def _parse_flags(argv):
  """absl's flag parsing, with a bad flag (a config that does not load, a misspelt --config.KEY) reported on one
  line and exit status 2, instead of absl's two lines or ml_collections' traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"ncjax: error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == "__main__":
  sys.exit(run())
