"""Metrics output: JSONL in the workdir (process 0 only), optional TensorBoard, and a progress display with
throughput and ETA (a live bar on a terminal, periodic lines otherwise).

A workdir in object storage (gs://) has no append: the writer keeps `metrics.jsonl` and the TensorBoard events in
a local staging directory and uploads them whole (`flush`: every `upload_every_s` seconds, after every checkpoint,
and at the end), so the remote copy is always a whole file holding every row up to its upload — as MaxText does
with its metrics file. A resumed run downloads it first and cuts it back to the checkpoint's step."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time

import jax
import numpy as np

from ncjax import fileio


def _jsonable(v):
  if isinstance(v, (np.floating, np.integer)):
    return v.item()
  if isinstance(v, np.ndarray) and v.ndim == 0:
    return v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)
  return v


def truncate_after(path: str, step: int) -> int:
  """Make a metrics file read as if the run had stopped cleanly at `step`: rows of later steps (written by
  a run killed before its next checkpoint, and about to be recomputed) and a torn last line go. Rewritten
  atomically (temporary file + rename); returns how many rows were dropped."""
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = f.read().split("\n")
  kept, dropped = [], 0
  for line in lines:
    if not line.strip():
      continue
    try:
      row_step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
      dropped += 1  # a line torn by a kill mid-write
      continue
    if row_step > step:
      dropped += 1
    else:
      kept.append(line)
  if dropped:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
      f.write("".join(line + "\n" for line in kept))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  return dropped


WANDB_ID_FILE = "wandb_run_id.txt"


class WandbRun:
  """A Weights & Biases run of a workdir (process 0 only): its id is kept in WORKDIR/wandb_run_id.txt, so a
  resumed run — the same command relaunched in the same workdir — continues the same wandb run (`resume="allow"`).
  `mode`: 'online', 'offline' (no network: files under WORKDIR/wandb/, `wandb sync` uploads them later) or ''
  (wandb's own default, WANDB_MODE). wandb is an optional dependency (`pip install ncjax[wandb]`)."""

  def __init__(self, workdir: str, *, project: str = "ncjax", entity: str = "", name: str = "", mode: str = "",
               config: dict | None = None, local_dir: str | None = None, group: str = ""):
    try:
      import wandb
    except ImportError:
      raise ImportError("log.wandb=True needs wandb: pip install 'ncjax[wandb]' (or pip install wandb)") from None
    id_file = fileio.join(workdir, WANDB_ID_FILE)
    if fileio.exists(id_file):
      self.run_id = fileio.read_text(id_file).strip()
    else:
      import secrets
      import string
      self.run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
      fileio.write_text(id_file, self.run_id + "\n")
    directory = local_dir or workdir
    os.makedirs(directory, exist_ok=True)
    self.run = wandb.init(project=project or None, entity=entity or None, name=name or None, id=self.run_id,
                          group=group or None,
                          resume="allow", dir=directory, config=config, mode=mode or None,
                          settings=wandb.Settings(console="off", silent=True))

  def log(self, step: int, metrics: dict, kind: str) -> None:
    values = {f"{kind}/{k}": float(v) for k, v in metrics.items()
              if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)}
    if values:
      self.run.log(values, step=int(step))

  def finish(self) -> None:
    self.run.finish()


class MetricWriter:
  """Append-only JSONL (`metrics.jsonl`) plus optional TensorBoard and Weights & Biases (`WandbRun`); silent on
  processes other than 0. A remote workdir is written through a local staging directory, uploaded whole by
  `flush()`."""

  def __init__(self, workdir: str, tensorboard: bool = False, filename: str = "metrics.jsonl",
               resume_step: int | None = None, upload_every_s: float = 30.0, wandb: dict | None = None):
    """`wandb`: None, or WandbRun's keyword arguments (project, entity, name, mode, config)."""
    self.active = jax.process_index() == 0
    self.remote = fileio.is_remote(workdir)
    self.workdir, self.filename, self.upload_every_s = workdir, filename, upload_every_s
    self.tb = None
    self.wandb = None
    self._staging = None
    self._last_upload = time.monotonic()
    if not self.active:
      return
    if self.remote:
      self._staging = tempfile.mkdtemp(prefix="ncjax-metrics-")
      local_dir = self._staging
      remote_file = fileio.join(workdir, filename)
      if fileio.exists(remote_file):   # a resumed run continues the uploaded file
        with open(os.path.join(local_dir, filename), "wb") as f:
          f.write(fileio.read_bytes(remote_file))
    else:
      local_dir = workdir
      os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(local_dir, filename)
    if resume_step is not None:
      truncate_after(self.path, resume_step)
    self.file = open(self.path, "a", buffering=1)
    if tensorboard:
      from tensorboardX import SummaryWriter  # optional dependency path
      self.tb = SummaryWriter(os.path.join(local_dir, "tensorboard"))
    if wandb is not None:
      self.wandb = WandbRun(workdir, local_dir=local_dir, **wandb)

  @classmethod
  def from_config(cls, workdir: str, config, resume_step: int | None = None) -> "MetricWriter":
    """The writer a run's `config.log` asks for: TensorBoard (`log.tensorboard`), wandb (`log.wandb`, with
    `log.wandb_project`, `wandb_entity`, `wandb_name`, `wandb_mode`; the resolved config goes with the run)."""
    log_cfg = config.log
    wandb = None
    if bool(log_cfg.get("wandb", False)):
      wandb = dict(project=log_cfg.get("wandb_project", "ncjax"), entity=log_cfg.get("wandb_entity", ""),
                   name=log_cfg.get("wandb_name", ""), mode=log_cfg.get("wandb_mode", ""), config=config.to_dict(),
                   group=log_cfg.get("wandb_group", ""))
    return cls(workdir, tensorboard=bool(log_cfg.tensorboard), resume_step=resume_step, wandb=wandb)

  def write(self, step: int, metrics: dict, kind: str = "train"):
    if not self.active:
      return
    row = {"step": int(step), "kind": kind, "time": time.time()}
    row.update({k: _jsonable(v) for k, v in metrics.items()})
    self.file.write(json.dumps(row) + "\n")
    if self.tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float, np.floating, np.integer)):
          self.tb.add_scalar(f"{kind}/{k}", float(v), step)
    if self.wandb is not None:
      self.wandb.log(step, metrics, kind)
    if self.remote and time.monotonic() - self._last_upload >= self.upload_every_s:
      self.flush()

  def flush(self):
    """Everything written so far reaches the workdir (a remote one: the staged files are uploaded whole)."""
    if not self.active:
      return
    self.file.flush()
    if self.tb is not None:
      self.tb.flush()
    if self.remote:
      fileio.copy_file(self.path, fileio.join(self.workdir, self.filename))
      tb_dir = os.path.join(self._staging, "tensorboard")
      if os.path.isdir(tb_dir):
        for name in os.listdir(tb_dir):
          fileio.copy_file(os.path.join(tb_dir, name), fileio.join(self.workdir, "tensorboard", name))
      self._last_upload = time.monotonic()

  def close(self):
    if self.active:
      if self.tb is not None:
        self.tb.close()
        self.tb = None
      if self.wandb is not None:
        self.wandb.finish()
        self.wandb = None
      self.flush()
      self.file.close()
      if self._staging:
        shutil.rmtree(self._staging, ignore_errors=True)


def parse_profile_steps(spec: str) -> tuple[int, int] | None:
  """'A:B' -> (A, B): trace the steps that take the state from step A to step B (B - A steps); '' -> None."""
  if not spec:
    return None
  head, sep, tail = str(spec).partition(":")
  try:
    first, last = int(head), int(tail)
  except ValueError:
    first = last = -1
  if not sep or first < 0 or last <= first:
    raise ValueError(f"log.profile_steps must be 'A:B' with 0 <= A < B (trace the steps from A to B), got {spec!r}")
  return first, last


class StepProfiler:
  """A jax.profiler trace of the training steps `log.profile_steps='A:B'`, in WORKDIR/profile/process_<i>/ (one
  directory per process: two processes on one host would otherwise write the same <hostname>.xplane.pb).

  The device work queued before step A is waited for before the trace starts, and step B's results before it
  stops, so the trace holds those steps and nothing else; each step is a `StepTraceAnnotation('train', step_num=s)`
  (TensorBoard's profile plugin / XProf group the trace by them). A Perfetto trace (`perfetto_trace.json.gz`) is
  written beside the XPlane file. A gs:// workdir is traced to a local directory and uploaded at the stop."""

  def __init__(self, workdir: str, steps: tuple[int, int] | None, start: int = 0, stop: int | None = None):
    self.window = steps
    self.active = False
    self.done = steps is None or (stop is not None and steps[0] >= stop) or steps[1] <= start
    self.dir = fileio.join(workdir, "profile", f"process_{jax.process_index()}")
    self._local = None

  @classmethod
  def from_config(cls, workdir: str, config, start: int, stop: int) -> "StepProfiler":
    return cls(workdir, parse_profile_steps(config.log.get("profile_steps", "")), start, stop)

  def before(self, step: int, state) -> None:
    """Called before step `step` runs: starts the trace at the window's first step (or the first one run)."""
    if self.done or self.active or not (self.window[0] <= step < self.window[1]):
      return
    jax.block_until_ready(state)
    self._local = tempfile.mkdtemp(prefix="ncjax-profile-") if fileio.is_remote(self.dir) else self.dir
    os.makedirs(self._local, exist_ok=True)
    jax.profiler.start_trace(self._local, create_perfetto_trace=True)
    self.active = True

  def annotate(self, step: int):
    import contextlib
    return jax.profiler.StepTraceAnnotation("train", step_num=step) if self.active else contextlib.nullcontext()

  def after(self, done: int, state) -> None:
    """Called once the state has reached step `done`: stops the trace at the window's end."""
    if self.active and done >= self.window[1]:
      jax.block_until_ready(state)
      self.stop()

  def stop(self) -> None:
    if not self.active:
      return
    jax.profiler.stop_trace()
    self.active, self.done = False, True
    if self._local != self.dir:   # a remote workdir: upload the trace files
      for root, _, files in os.walk(self._local):
        for f in files:
          rel = os.path.relpath(os.path.join(root, f), self._local)
          fileio.copy_file(os.path.join(root, f), fileio.join(self.dir, *rel.split(os.sep)))
      shutil.rmtree(self._local, ignore_errors=True)

  def close(self) -> None:
    """The run ended (or failed) inside the window: stop and keep what was traced."""
    self.stop()


def _fmt_time(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}"


class Progress:
  """Step progress with examples/s and ETA. Throughput excludes the first (compiling) step of a run.

  On a terminal: a `rich` progress bar redrawn in place. In logs (not a TTY): one plain line every `every_steps`
  steps (a redrawn bar would be a single line at the end, or control characters in the log)."""

  def __init__(self, total_steps: int, start_step: int, batch_size: int, enabled: bool = True,
               every_steps: int = 10, stream=None):
    self.total, self.start, self.batch = total_steps, start_step, batch_size
    self.enabled = enabled and jax.process_index() == 0
    self.every = max(1, every_steps)
    self.stream = stream or sys.stdout
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.t0 = None
    self.n0 = start_step
    self.last = ""
    self._bar = self._task = None
    if self.enabled and self.tty:
      from rich.console import Console
      from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn
      self._bar = RichProgress(BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                               console=Console(file=self.stream), auto_refresh=False)
      self._task = self._bar.add_task("train", total=max(total_steps, 1), completed=start_step, status="compiling")
      self._bar.start()

  def rate(self, step: int) -> float:
    if self.t0 is None or step <= self.n0:
      return float("nan")
    return (step - self.n0) * self.batch / (time.perf_counter() - self.t0)

  def status(self, step: int, metrics: dict | None = None) -> str:
    rate = self.rate(step)
    eta = (self.total - step) * self.batch / rate if rate == rate and rate > 0 else float("nan")
    loss = "" if not metrics or "loss" not in metrics else f"loss {metrics['loss']:.4f} | "
    return f"{loss}{rate:,.0f} ex/s | ETA {_fmt_time(eta)}" if rate == rate else f"{loss}compiling"

  def update(self, step: int, metrics: dict | None = None):
    """`step` = number of completed steps."""
    if self.t0 is None and step > self.start:  # first step compiled: start timing from here
      self.t0, self.n0 = time.perf_counter(), step
    if not self.enabled:
      return
    if self._bar is not None:
      self.last = self.status(step, metrics)
      self._bar.update(self._task, completed=step, status=self.last)
      self._bar.refresh()
      return
    if not (step % self.every == 0 or step == self.total):
      return
    width = 24
    filled = int(width * step / max(self.total, 1))
    line = f"[{'#' * filled + '-' * (width - filled)}] {step}/{self.total} | {self.status(step, metrics)}"
    self.stream.write(line + "\n")
    self.stream.flush()
    self.last = line

  def close(self):
    if self._bar is not None:
      self._bar.stop()
      self._bar = None


def render_table(columns, rows) -> str:
  """A markdown table (what results.md holds and the terminal shows), laid out by rich."""
  import io
  from rich import box
  from rich.console import Console
  from rich.table import Table
  table = Table(box=box.MARKDOWN)
  for name, justify in columns:
    table.add_column(name, justify=justify, no_wrap=True)
  for cells in rows:
    table.add_row(*cells)
  console = Console(file=io.StringIO(), width=240, record=True, color_system=None)
  console.print(table)
  return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")
