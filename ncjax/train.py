"""The method-agnostic trainer.

It takes an experiment assembled from a config (`ncjax.experiment`: mesh, data, method); creates the train state
already sharded
(`eval_shape` -> shardings -> `jit(init, out_shardings=...)`) or restores it from the latest checkpoint in the
workdir; and runs, stage by stage, one jitted step with explicit in/out shardings and donated state. The trainer
knows nothing about any particular method: stages, updates, parameter groups, per-sample state and epoch hooks
all come from the Method object (see ncjax/methods/base.py and docs/architecture.md).

Train state: {'step': int32, 'params': {module: ...}, 'opt_state': {update name: optax state},
'method_state': pytree}. The RNG of step s is fold_in(PRNGKey(seed), s), so nothing random needs checkpointing.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ncjax import errors
import ncjax
from ncjax import checkpoint as ckpt_lib
from ncjax import optim as optim_lib
from ncjax import sharding as shard_lib
from ncjax.config_lib import to_json_dict
from ncjax.contract import Stage, scalar_metrics, strip_diagnostics
from ncjax.experiment import Experiment, build_experiment
from ncjax.logging_utils import MetricWriter, Progress, StepProfiler

log = logging.getLogger("ncjax")

# The exit status of a run stopped by a preemption after saving its checkpoint (BSD's EX_TEMPFAIL: "try again
# later"): relaunching the same command resumes it. launch/slurm.sbatch requeues on it.
PREEMPTED_EXIT_STATUS = 75


class Preempted(Exception):
  """Training stopped at `step` for a preemption (SIGTERM: TPU maintenance, `scancel`, SLURM's --signal,
  Kubernetes), after the checkpoint of that step was written: relaunch the same command to resume."""

  def __init__(self, step: int, workdir: str):
    super().__init__(f"preempted: saved the checkpoint of step {step} in {workdir}; relaunch the same command to "
                     f"resume (exit status {PREEMPTED_EXIT_STATUS})")
    self.step = step


class PreemptionWatch:
  """Whether a preemption was asked for, agreed by every process at the same step.

  Every process catches SIGTERM itself (a flag set by a handler); at the end of every step the processes agree with
  one all-gather of their flags (any flag set: all stop at this step, save and exit), so the decision is a collective
  every process makes the same number of times. jax's own preemption service (turned off in ncjax.main) agrees on a
  sync step through a barrier instead, and deadlocked when the notice reached one process after its last sync call:
  that process went on to the final evaluation's collectives while the other waited in the barrier (a 2-process
  chaos trial, 2026-11-23). A SIGTERM after the last step is left alone: the run ends normally, its final
  checkpoint written. SIGUSR1 (what some schedulers send ahead of a time limit) is turned into a SIGTERM."""

  def __init__(self):
    self._flag = threading.Event()
    self._previous = {}
    if threading.current_thread() is not threading.main_thread():
      return   # signal handlers can only be installed from the main thread (a trainer run in a thread: no watch)
    self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_term)
    self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_usr1)

  def _on_term(self, signum, frame):
    del signum, frame
    if not self._flag.is_set():
      log.warning("SIGTERM: saving a checkpoint at the end of this step, then stopping")
    self._flag.set()

  def _on_usr1(self, signum, frame):
    del signum, frame
    import os
    os.kill(os.getpid(), signal.SIGTERM)

  def asked(self) -> bool:
    """Whether this process was sent SIGTERM (agreed with the others by `end_of_step`)."""
    return self._flag.is_set()

  def close(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}


class SaveSchedule:
  """When the loop saves a periodic checkpoint: every `ckpt.every_steps` steps and every `ckpt.every_minutes`
  minutes of wall-clock time (0 turns either off). Process 0's clock decides for every process (end_of_step), so all
  processes save the same step."""

  def __init__(self, every_steps: int, every_minutes: float, clock=time.monotonic):
    self.every_steps, self.every_s, self.clock = int(every_steps), 60.0 * float(every_minutes), clock
    self.last = clock()

  def step_due(self, step: int) -> bool:
    return bool(self.every_steps) and step % self.every_steps == 0

  def late(self) -> bool:
    """This process's clock says a save is due (process 0's decides for all: `end_of_step`)."""
    return bool(self.every_s) and self.clock() - self.last >= self.every_s

  def saved(self):
    self.last = self.clock()


def end_of_step(watch: PreemptionWatch, schedule: SaveSchedule, step: int) -> tuple[bool, bool]:
  """(preempted, save) after `step`, the same on every process: one all-gather per step carries every process's
  SIGTERM flag (any one stops all) and process 0's save clock (until 2026-11-23 two collectives per step). Every process calls it once per step, so the
  all-gathers pair up by their order."""
  asked, late = watch.asked(), schedule.late()
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    rows = np.asarray(multihost_utils.process_allgather(np.asarray([asked, late], np.int32))).reshape(-1, 2)
    asked, late = bool(rows[:, 0].max()), bool(rows[0, 1])
  return asked, asked or late or schedule.step_due(step)


# ---------------------------------------------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StageSpan:
  index: int
  stage: Stage
  start: int       # first global step of the stage
  steps: int       # scheduled length (the lr schedule always spans it, even when total_steps cuts the run short)
  run_steps: int   # scheduled length of the whole run (run-scope schedules)


def stage_spans(stages, steps_per_epoch: int) -> list[StageSpan]:
  lengths = [int(st.steps) if st.steps else int(st.epochs) * steps_per_epoch for st in stages]
  spans, start = [], 0
  for i, (st, n) in enumerate(zip(stages, lengths)):
    spans.append(StageSpan(i, st, start, n, sum(lengths)))
    start += n
  return spans


def total_steps_of(config, spans) -> int:
  scheduled = sum(s.steps for s in spans)
  return scheduled if config.total_steps is None else min(int(config.total_steps), scheduled)


def span_at(spans, step: int) -> StageSpan:
  for s in spans:
    if step < s.start + s.steps:
      return s
  return spans[-1]


# ---------------------------------------------------------------------------------------------------------------
# State and step
# ---------------------------------------------------------------------------------------------------------------
class StageProgram:
  """Optimisers, shardings and the jitted step of one stage."""

  def __init__(self, exp: Experiment, span: StageSpan, abstract_params, param_sh, ms_abstract, ms_sh):
    cfg = exp.config
    self.exp, self.span, self.stage = exp, span, span.stage
    mesh = exp.mesh
    self.rep = shard_lib.replicated(mesh)
    self.txs, self.trainable = {}, {}
    self.schedule = optim_lib.ScheduleContext(stage_start=span.start, stage_steps=span.steps,
                                              run_steps=span.run_steps, steps_per_epoch=exp.steps_per_epoch)
    for upd in self.stage.updates:
      tx, _, trainable = optim_lib.build_optimizer(upd, abstract_params, cfg.optim, self.schedule)
      self.txs[upd.name], self.trainable[upd.name] = tx, trainable
    opt_abstract = jax.eval_shape(lambda p: {k: tx.init(p) for k, tx in self.txs.items()}, abstract_params)
    opt_sh = shard_lib.like_params_shardings(opt_abstract, abstract_params, param_sh, mesh)
    self.state_sh = dict(step=self.rep, params=param_sh, opt_state=opt_sh, method_state=ms_sh)
    self.abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        dict(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=opt_abstract,
             method_state=ms_abstract), self.state_sh)
    self.init_opt = jax.jit(lambda p: {k: tx.init(p) for k, tx in self.txs.items()}, in_shardings=(param_sh,),
                            out_shardings=opt_sh)
    self.batch_sh = shard_lib.batch_sharding(mesh)
    self.step = jax.jit(self._step, in_shardings=(self.state_sh, self.batch_sh),
                        out_shardings=(self.state_sh, self.rep), donate_argnums=(0,))

  def _step(self, state, batch):
    stage, optim_cfg = self.stage, self.exp.config.optim
    step = state["step"]
    rng = jax.random.fold_in(jax.random.PRNGKey(self.exp.config.seed), step)
    if self.exp.batch_transform is not None:  # dynamic noise: fresh pairs every step, reproducible on resume
      batch = self.exp.batch_transform(batch, step)
    method_batch = strip_diagnostics(batch)
    params, mstate = state["params"], state["method_state"]
    new_opt, metrics = {}, {}
    for k, upd in enumerate(stage.updates):
      (loss, (m, mstate)), grads = jax.value_and_grad(upd.loss_fn, has_aux=True)(
          params, mstate, method_batch, jax.random.fold_in(rng, k))
      trainable = self.trainable[upd.name]
      grads = jax.tree.map(lambda g, t: g if t else jnp.zeros_like(g), grads, trainable)
      updates, new_opt[upd.name] = self.txs[upd.name].update(grads, state["opt_state"][upd.name], params)
      params = optax.apply_updates(params, updates)
      post_update = stage.post_update_of(upd)
      if post_update is not None:
        params = post_update(params)
      prefix = "" if len(stage.updates) == 1 else f"{upd.name}/"
      metrics.update({prefix + key: v for key, v in scalar_metrics(m).items()})
      metrics[prefix + "loss"] = jnp.asarray(loss, jnp.float32)
      metrics[prefix + "grad_norm"] = optax.tree.norm(grads)
      rel = step - self.span.start
      for label, lr in optim_lib.group_learning_rates(upd, optim_cfg, self.schedule, rel).items():
        metrics[f"{prefix}lr/{label}"] = jnp.asarray(lr, jnp.float32)
    metrics["param_norm"] = optax.tree.norm(params)
    return dict(step=step + 1, params=params, opt_state=new_opt, method_state=mstate), metrics


class Trainer:
  """Holds the experiment, its stage programs and the checkpointer; `run()` trains to the end (or `until`)."""

  def __init__(self, config, workdir: str, *, devices=None, step: int | None = None):
    """`step`: restore that checkpoint instead of the latest (evaluation of a run's history)."""
    self.config, self.workdir = config, workdir
    if step is None:  # training: the workdir takes checkpoints and metrics (checked before any work)
      ckpt_lib.ensure_writable(workdir)
    self.checkpointer = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), keep=config.ckpt.keep,
                                              async_save=config.ckpt.async_save,
                                              write_deadline_s=config.ckpt.write_deadline_s)
    latest = self.checkpointer.latest_step() if step is None else step
    if step is not None and step not in self.checkpointer.all_steps():
      raise errors.MissingCheckpoint(f"{workdir} has no checkpoint at step {step}; it has "
                                     f"{self.checkpointer.all_steps()}")
    self.resume_meta = self.checkpointer.read_meta(latest) if latest is not None else None
    saved_tok = self.resume_meta["tokenizer"] if self.resume_meta else None
    self.exp = build_experiment(config, devices=devices, saved_tokenizer=saved_tok)
    exp = self.exp
    if step is None:
      exp.resolved.check_start()
    self.config = config = exp.config   # with a pretrained init_from's architecture laid in
    if exp.steps_per_epoch < 1:
      raise errors.ConfigurationError(f"{exp.train_data.num_examples} training examples are fewer than one global "
                                      f"batch of {config.input.global_batch_size}: choose a smaller batch")
    self.spans = stage_spans(exp.method.stages(), exp.steps_per_epoch)
    self.total_steps = total_steps_of(config, self.spans)
    mesh = exp.mesh
    self.abstract_params = exp.method.abstract_params()
    self.param_sh = shard_lib.param_shardings(self.abstract_params, mesh)
    self.capacity = shard_lib.state_capacity(exp.train_data.num_examples, mesh)
    self.ms_abstract = jax.eval_shape(functools.partial(exp.method.init_state, self.capacity))
    self.ms_sh = shard_lib.state_shardings(self.ms_abstract, mesh, self.capacity)
    self._programs: dict[int, StageProgram] = {}
    self._end_of_epoch = None

  def program(self, span: StageSpan) -> StageProgram:
    if span.index not in self._programs:
      self._programs = {span.index: StageProgram(self.exp, span, self.abstract_params, self.param_sh,
                                                 self.ms_abstract, self.ms_sh)}
    return self._programs[span.index]

  # --- state creation / restore -------------------------------------------------------------------------------
  def init_params(self):
    params = jax.jit(self.exp.method.init_params, out_shardings=self.param_sh)()
    return self.exp.init.overlay(params, self.abstract_params, self.param_sh)

  def init_state(self, span: StageSpan):
    prog = self.program(span)
    params = self.init_params()
    mstate = jax.jit(functools.partial(self.exp.method.init_state, self.capacity), out_shardings=self.ms_sh)()
    step = jax.device_put(jnp.asarray(span.start, jnp.int32), prog.rep)
    return dict(step=step, params=params, opt_state=prog.init_opt(params), method_state=mstate)

  def restore_or_init(self):
    """(state, span of the state's optimiser) from the latest checkpoint, or fresh."""
    if self.resume_meta is None:
      span = self.spans[0]
      return self.init_state(span), span
    meta = self.resume_meta
    self.check_resumable(meta)
    span = self.spans[meta["stage_index"]]
    prog = self.program(span)
    ckpt_lib.check_state_shapes(self.checkpointer, meta["step"], prog.abstract_state)
    state = self.checkpointer.restore(meta["step"], prog.abstract_state)
    log.info("resumed from step %d (stage %s)", meta["step"], span.stage.name)
    return state, span

  def check_resumable(self, meta: dict):
    """Resuming continues the same run: a workdir holding another method's run, other noisy pairs or another
    dataset is a clear error instead of a silent mix (or an opaque restore failure)."""
    exp, where = self.exp, f"{self.workdir} (step {meta['step']})"
    current = dict(method=exp.method.name, noise_sha256=exp.train_data.noise_sha256,
                   num_examples=exp.train_data.num_examples, steps_per_epoch=exp.steps_per_epoch)
    what = dict(method="the method", noise_sha256="the noisy pairs (noise.* settings or the data changed)",
                num_examples="the number of training examples", steps_per_epoch="the steps per epoch "
                "(input.global_batch_size or the data changed)")
    for key, value in current.items():
      if key in meta and meta[key] != value:
        raise errors.CheckpointError(f"cannot resume {where}: {what[key]} differs: checkpoint {meta[key]!r}, this "
                                     f"config {value!r}. Use a new --workdir for a different run.")
    check_order = getattr(exp.train_data, "check_resume", None)
    if check_order is not None:   # web data: the order of the remaining steps depends on more than the step
      try:
        check_order(meta.get("data") or {})
      except ValueError as e:
        raise errors.CheckpointError(f"cannot resume {where}: {str(e).removeprefix('cannot resume: ')}") from None
    order = meta.get("data", {}).get("order_version", 1)
    if order != exp.train_data.iterator_state(meta["step"]).get("order_version", order):
      log.warning("resuming %s, whose data order was drawn by an earlier ncjax (order version %s): from here the "
                  "examples follow the current order, drawn independently of the noise (ncjax.data.streams)",
                  where, order)
    if meta.get("ncjax_version") not in (None, ncjax.__version__):
      log.warning("resuming a checkpoint written by ncjax %s with ncjax %s", meta["ncjax_version"],
                  ncjax.__version__)

  def switch_stage(self, state, span: StageSpan):
    """Enter a new stage: its optimiser state starts fresh (its own groups and schedules)."""
    prog = self.program(span)
    return dict(step=state["step"], params=state["params"], opt_state=prog.init_opt(state["params"]),
                method_state=state["method_state"])

  def end_of_epoch_fn(self):
    if self._end_of_epoch is None:
      self._end_of_epoch = jax.jit(self.exp.method.end_of_epoch, in_shardings=(self.param_sh, self.ms_sh, None),
                                   out_shardings=self.ms_sh)
    return self._end_of_epoch

  # --- metadata ------------------------------------------------------------------------------------------------
  def meta(self, step: int, span: StageSpan) -> dict:
    exp = self.exp
    return dict(step=int(step), stage=span.stage.name, stage_index=span.index, method=exp.method.name,
                ncjax_version=ncjax.__version__, git=ckpt_lib.git_hash(), config=to_json_dict(self.config),
                tokenizer=exp.tokenizer.to_json(), noise_sha256=exp.train_data.noise_sha256,
                steps_per_epoch=exp.steps_per_epoch, num_examples=exp.train_data.num_examples,
                state_capacity=self.capacity)

  def save(self, state, step: int, span: StageSpan, force: bool = False):
    self.checkpointer.save(step, state, self.meta(step, span), self.exp.train_data.iterator_state(step), force=force)

  # --- the loop ------------------------------------------------------------------------------------------------
  def run(self, until: int | None = None, evaluate=None):
    """Train to the end (or to step `until`). `evaluate(step, state)` runs periodic evaluators if given."""
    cfg, exp = self.config, self.exp
    if cfg.ckpt.every_steps or cfg.ckpt.save_at_end:
      state_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(self.program(self.spans[0]).abstract_state))
      ckpt_lib.ensure_writable(self.workdir, needed_bytes=state_bytes)
    else:
      ckpt_lib.ensure_writable(self.workdir)
    state, span = self.restore_or_init()
    start = int(jax.device_get(state["step"]))
    stop = self.total_steps if until is None else min(until, self.total_steps)
    profiler = StepProfiler.from_config(self.workdir, cfg, start, stop)   # log.profile_steps: a trace of A:B
    writer = MetricWriter.from_config(self.workdir, cfg, resume_step=start)
    progress = Progress(stop, start, cfg.input.global_batch_size, enabled=cfg.log.progress,
                        every_steps=cfg.log.every_steps)
    pending = None  # (step, ids, metrics on device): checked one step late so the host never stalls the device
    last_metrics: dict = {}
    t_last, n_last = time.perf_counter(), start
    skipped = 0
    schedule = SaveSchedule(cfg.ckpt.every_steps, cfg.ckpt.every_minutes)
    watch = PreemptionWatch()
    last_saved = start

    def log_pending(final: bool = False):
      nonlocal pending, last_metrics, t_last, n_last
      last_metrics = self._check_and_log(pending, writer, progress, (t_last, n_last), final=final)
      if pending[0] % cfg.log.every_steps == 0:
        t_last, n_last = time.perf_counter(), pending[0]
      pending = None

    try:
      batches = exp.train_data.batches(start, stop)
      for step in range(start, stop):
        target = span_at(self.spans, step)
        if target.index != span.index:
          state, span = self.switch_stage(state, target), target
        prog = self.program(span)
        batch, ids, input_stats = next(batches)
        skipped += input_stats["skipped_records"]
        profiler.before(step, state)
        with jax.set_mesh(exp.mesh), profiler.annotate(step):  # losses may shard_map over the batch
          state, metrics = prog.step(state, batch)
        profiler.after(step + 1, state)
        if pending is not None:
          log_pending()
        pending = (step + 1, ids, metrics, skipped)
        if exp.method.has_end_of_epoch and (step + 1) % exp.steps_per_epoch == 0:
          epoch = (step + 1) // exp.steps_per_epoch - 1
          with jax.set_mesh(exp.mesh):
            mstate = self.end_of_epoch_fn()(state["params"], state["method_state"],
                                            jnp.asarray(epoch, jnp.int32))
          state = dict(state, method_state=mstate)
        preempted, save = end_of_step(watch, schedule, step + 1)
        if save:
          # Log the pending step before its checkpoint exists: a run killed after the save resumes past it,
          # and its metrics line would otherwise never be written.
          log_pending(final=step + 1 == stop)
          self.save(state, step + 1, span, force=preempted)
          last_saved = step + 1
          schedule.saved()
          writer.flush()
        if preempted:
          self.checkpointer.wait()
          raise Preempted(step + 1, self.workdir)
        if evaluate is not None:
          evaluate(step + 1, state, writer)
      if pending is not None:
        log_pending(final=True)
      if cfg.ckpt.save_at_end and stop > start and last_saved != stop:
        self.save(state, stop, span, force=True)
    except BaseException:
      try:  # let the saves in flight finish, without hiding the error that stopped the run
        self.checkpointer.wait()
      except ckpt_lib.CheckpointWriteError as e:
        log.error("%s", e)
      raise
    else:
      self.checkpointer.wait()
    finally:
      profiler.close()
      watch.close()
      progress.close()
      writer.close()
    return TrainResult(state=state, experiment=exp, metrics=last_metrics, trainer=self)

  def _check_and_log(self, pending, writer, progress, since, final: bool = False) -> dict:
    done, ids, metrics, skipped = pending
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    host["input/skipped_records"] = skipped
    losses = {k: v for k, v in host.items() if k == "loss" or k.endswith("/loss")}
    if not all(math.isfinite(v) for v in losses.values()):
      bad = losses
      raise errors.DivergedError(f"non-finite loss at step {done - 1} ({bad}): lower the learning rate "
                                 f"(optim.lr) or look at the pairs of that global batch, example ids "
                                 f"{np.sort(ids).tolist()}")
    progress.update(done, host)
    if done % self.config.log.every_steps == 0 or final:
      t0, n0 = since
      dt = time.perf_counter() - t0
      if done > n0 and dt > 0:
        host["examples_per_sec"] = (done - n0) * self.config.input.global_batch_size / dt
      host["epoch"] = done / self.exp.steps_per_epoch
      writer.write(done, host)
    return host


@dataclasses.dataclass
class TrainResult:
  state: dict
  experiment: Experiment
  metrics: dict
  trainer: Trainer

  @property
  def params(self):
    return self.state["params"]


def train(config, workdir: str, *, devices=None, until: int | None = None, evaluate=None) -> TrainResult:
  return Trainer(config, workdir, devices=devices).run(until=until, evaluate=evaluate)
