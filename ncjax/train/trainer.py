"""The Trainer: state created sharded or restored, and the loop over steps and stages."""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp

import ncjax
from ncjax import checkpoint as ckpt_lib
from ncjax import errors
from ncjax import sharding as shard_lib
from ncjax.config_lib import to_json_dict
from ncjax.experiment import Experiment, build_experiment
from ncjax.logging_utils import MetricWriter, Progress, StepProfiler
from ncjax.train.program import StageProgram
from ncjax.train.resume import check_resumable
from ncjax.train.saving import SavePolicy
from ncjax.train.schedule import StageSpan, span_at, stage_spans, total_steps_of
from ncjax.train.step_log import StepLog

log = logging.getLogger("ncjax")


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
    self.exp = exp = build_experiment(config, devices=devices, saved_tokenizer=saved_tok)
    if step is None:
      exp.resolved.check_start()
    self.config = config = exp.config   # with a pretrained init_from's architecture laid in
    if exp.steps_per_epoch < 1:
      raise errors.ConfigurationError(f"{exp.train_data.num_examples} training examples are fewer than one global "
                                      f"batch of {exp.resolved.input.global_batch_size}: choose a smaller batch")
    self.spans = stage_spans(exp.method.stages(), exp.steps_per_epoch)
    self.total_steps = total_steps_of(config, self.spans)
    self.abstract_params = exp.method.abstract_params()
    self.param_sh = shard_lib.param_shardings(self.abstract_params, exp.mesh)
    self.capacity = shard_lib.state_capacity(exp.train_data.num_examples, exp.mesh)
    self.ms_abstract = jax.eval_shape(functools.partial(exp.method.init_state, self.capacity))
    self.ms_sh = shard_lib.state_shardings(self.ms_abstract, exp.mesh, self.capacity)
    self._programs: dict[int, StageProgram] = {}
    self._end_of_epoch = None

  def program(self, span: StageSpan) -> StageProgram:
    if span.index not in self._programs:
      self._programs = {span.index: StageProgram(self.exp, span, self.abstract_params, self.param_sh,
                                                 self.ms_abstract, self.ms_sh)}
    return self._programs[span.index]

  # --- state creation / restore -------------------------------------------------------------------------------
  def init_params(self):
    return self.exp.init.initialise(self.exp.method.init_params, self.abstract_params, self.param_sh, self.exp.mesh)

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
    check_resumable(self.exp, meta, self.workdir)
    span = self.spans[meta["stage_index"]]
    prog = self.program(span)
    ckpt_lib.check_state_shapes(self.checkpointer, meta["step"], prog.abstract_state)
    state = self.checkpointer.restore(meta["step"], prog.abstract_state)
    log.info("resumed from step %d (stage %s)", meta["step"], span.stage.name)
    return state, span

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

  # --- checkpoints ---------------------------------------------------------------------------------------------
  def meta(self, step: int, span: StageSpan) -> dict:
    exp = self.exp
    return dict(step=int(step), stage=span.stage.name, stage_index=span.index, method=exp.method.name,
                ncjax_version=ncjax.__version__, git=ckpt_lib.git_hash(), config=to_json_dict(self.config),
                tokenizer=exp.tokenizer.to_json(), noise_sha256=exp.train_data.noise_sha256,
                steps_per_epoch=exp.steps_per_epoch, num_examples=exp.train_data.num_examples,
                state_capacity=self.capacity)

  def save(self, state, step: int, span: StageSpan, force: bool = False):
    self.checkpointer.save(step, state, self.meta(step, span), self.exp.train_data.iterator_state(step), force=force)

  def _ensure_space(self) -> None:
    ckpt = self.config.ckpt
    if ckpt.every_steps or ckpt.save_at_end:
      state = self.program(self.spans[0]).abstract_state
      ckpt_lib.ensure_writable(self.workdir, needed_bytes=sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(state)))
    else:
      ckpt_lib.ensure_writable(self.workdir)

  # --- the loop ------------------------------------------------------------------------------------------------
  def run(self, until: int | None = None, evaluate=None):
    """Train to the end (or to step `until`). `evaluate(step, state, writer)` runs periodic evaluators if given."""
    cfg, exp = self.config, self.exp
    self._ensure_space()
    state, span = self.restore_or_init()
    start = int(jax.device_get(state["step"]))
    stop = self.total_steps if until is None else min(until, self.total_steps)
    profiler = StepProfiler.from_config(self.workdir, cfg, start, stop)   # log.profile_steps: a trace of A:B
    writer = MetricWriter.from_config(self.workdir, cfg, resume_step=start)
    progress = Progress(stop, start, exp.resolved.input.global_batch_size, enabled=cfg.log.progress,
                        every_steps=cfg.log.every_steps)
    steps = StepLog(writer, progress, every_steps=cfg.log.every_steps,
                    global_batch_size=exp.resolved.input.global_batch_size, steps_per_epoch=exp.steps_per_epoch,
                    start=start)

    def save(step: int, force: bool):
      # The pending step is logged before its checkpoint exists: a run killed after the save resumes past it, and
      # its metrics line would otherwise never be written.
      steps.flush(final=step == stop)
      self.save(state, step, span, force=force)
      writer.flush()

    saving = SavePolicy(cfg.ckpt, self.checkpointer, self.workdir, start, save)
    skipped = 0
    batches = None
    try:
      batches = exp.train_data.batches(start, stop)
      for step in range(start, stop):
        target = span_at(self.spans, step)
        if target.index != span.index:
          state, span = self.switch_stage(state, target), target
        batch, ids, input_stats = next(batches)
        skipped += input_stats["skipped_records"]
        profiler.before(step, state)
        with jax.set_mesh(exp.mesh), profiler.annotate(step):  # losses may shard_map over the batch
          state, metrics = self.program(span).step(state, batch)
        profiler.after(step + 1, state)
        steps.push(step + 1, ids, metrics, skipped)
        if exp.method.has_end_of_epoch and (step + 1) % exp.steps_per_epoch == 0:
          epoch = (step + 1) // exp.steps_per_epoch - 1
          with jax.set_mesh(exp.mesh):
            mstate = self.end_of_epoch_fn()(state["params"], state["method_state"], jnp.asarray(epoch, jnp.int32))
          state = dict(state, method_state=mstate)
        saving.after_step(step + 1)
        if evaluate is not None:
          evaluate(step + 1, state, writer)
      steps.flush(final=True)
      saving.at_end(stop)
    except BaseException:
      try:  # let the saves in flight finish, without hiding the error that stopped the run
        self.checkpointer.wait()
      except ckpt_lib.CheckpointWriteError as e:
        log.error("%s", e)
      raise
    else:
      self.checkpointer.wait()
    finally:
      if batches is not None:   # the input's threads, processes and open files end with the run, even on an error
        batches.close()
      getattr(exp.train_data, "close", lambda: None)()
      profiler.close()
      saving.close()
      progress.close()
      writer.close()
    return TrainResult(state=state, experiment=exp, metrics=steps.last, trainer=self)


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
