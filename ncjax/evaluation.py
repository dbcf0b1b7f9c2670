"""Evaluation: the one path every evaluation takes — periodic (during training), final (after it), a saved
checkpoint (`ncjax eval --checkpoints=...`) and a pretrained model (`ncjax eval --init=...`).

`Evaluation` builds one `EvalContext` (the config's evaluation data settings, the model spec, the tokenizer, the
mesh, the run's training pairs, the method's name) and the evaluators of `config.evals` once; `run(step, state)`
gives each evaluator the method's `EvalModel` of that state (its per-sample clean scores attached) and writes
`OUT/step_N.json` (+ plots) on process 0. Evaluating a checkpoint restores its parameters and per-sample state
only (no optimiser state, no input pipeline); its training pairs are rebuilt from its config when an evaluator
needs them (noise detection).
"""

from __future__ import annotations

import json
import logging
import re

import jax

from ncjax import checkpoint as ckpt_lib
from ncjax import config_lib, errors, evals, experiment, fileio, tokenizers
from ncjax import sharding as shard_lib
from ncjax.data.pipeline import training_pairs

log = logging.getLogger("ncjax")


class Evaluation:
  """The evaluators of `config.evals` (those not switched off) on one method's states."""

  def __init__(self, config, *, model_spec, tokenizer, mesh, method, pairs=None, out_dir: str | None = None,
               info: dict | None = None):
    self.config, self.method, self.out_dir, self.info = config, method, out_dir, dict(info or {})
    self.context = evals.EvalContext(experiment.input_spec(config.input), tokenizer, mesh, model_spec, pairs=pairs,
                                     method_name=method.name,
                                     plot_dir=out_dir if jax.process_index() == 0 else None)
    self.evaluators = evals.build_evaluators(config.evals, self.context)

  @classmethod
  def of_experiment(cls, config, exp, workdir: str) -> "Evaluation":
    """For a training run: its tokenizer, mesh, method and training pairs; results under eval_dir()."""
    config = experiment.resolve_config(config)   # a pretrained init_from's preprocessing, as the run's
    return cls(config, model_spec=exp.model_spec, tokenizer=exp.tokenizer, mesh=exp.mesh, method=exp.method,
               pairs=exp.train_data.pairs(), out_dir=eval_dir(config, exp.config, workdir),
               info=dict(workdir=fileio.absolute(workdir), noise_sha256=exp.train_data.noise_sha256,
                         dataset=config.input.dataset))

  def check(self) -> None:
    """Fail in seconds, not after training: every evaluator loads its data now."""
    evals.check_evaluators(self.evaluators)

  def periodic_names(self, step: int) -> list[str]:
    return [name for name in self.evaluators
            if (every := evals.every_steps(self.config.evals[name])) and step % every == 0]

  def run(self, step: int, state, names=None, write: bool = True) -> dict:
    """Every evaluator (or those `names`) on `state` ({'params', 'method_state', ...}); with `write`, the results
    go to OUT/step_N.json on process 0."""
    self.context.tag = f"step_{step}"
    eval_model = self.method.eval_model(state["params"], state.get("method_state"))
    chosen = {k: v for k, v in self.evaluators.items() if names is None or k in names}
    results = evals.run_evaluators(chosen, eval_model)
    if write and jax.process_index() == 0 and results and self.out_dir:
      spec = self.context.model
      model = f"{self.method.name}:{spec.pretrained or spec.size}"
      records = evals.clip_benchmark_records(results, chosen, model=model, dataset=self.config.input.dataset)
      fileio.write_text(fileio.join(self.out_dir, f"step_{step}.json"), json.dumps(evals.finite_or_none(dict(
          step=step, method=self.method.name, **self.info, results=results, records=records)), indent=1,
          allow_nan=False))
    return results

  def periodic(self, step: int, state, writer) -> None:
    """The trainer's hook: the evaluators whose every_steps divides `step`, their metrics into metrics.jsonl."""
    names = self.periodic_names(step)
    if names:
      results = self.run(step, state, names, write=False)
      writer.write(step, {f"{name}/{k}": v for name, res in results.items() for k, v in res.items()}, kind="eval")


def eval_dir(config, run_config, workdir: str) -> str:
  """WORKDIR/eval for the run's own data; WORKDIR/eval/<dataset>[_<data_dir>] when the config evaluates other
  data (`ncjax eval --config=... --config.input.data_dir=...`), so no dataset overwrites another's results."""
  own, asked = run_config.input, config.input
  if (asked.dataset, asked.data_dir) == (own.dataset, own.data_dir):
    return fileio.join(workdir, "eval")
  slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{asked.dataset}_{fileio.basename(asked.data_dir)}")
  return fileio.join(workdir, "eval", slug.strip("_"))


# ---------------------------------------------------------------------------------------------------------------
# A training run: start-up check, periodic and final evaluation
# ---------------------------------------------------------------------------------------------------------------
def check(config, exp) -> None:
  """Every evaluator of config.evals can run on this experiment (its data, split, labels, templates)."""
  config = experiment.resolve_config(config)
  Evaluation(config, model_spec=exp.model_spec, tokenizer=exp.tokenizer, mesh=exp.mesh, method=exp.method,
             pairs=exp.train_data.pairs()).check()


def periodic_hook(config, trainer):
  """`Trainer.run(evaluate=...)`: the evaluators with every_steps > 0, on the same context as the final ones;
  None when there are none."""
  if not any(evals.is_enabled(v) and evals.every_steps(v) for v in config.evals.values()):
    return None
  return Evaluation.of_experiment(config, trainer.exp, trainer.workdir).periodic


def final(config, result, workdir: str) -> dict:
  """Every evaluator of config.evals on a finished run; eval/step_N.json (+ plots) under workdir."""
  step = int(jax.device_get(result.state["step"]))
  return Evaluation.of_experiment(config, result.experiment, workdir).run(step, result.state)


# ---------------------------------------------------------------------------------------------------------------
# A saved checkpoint, a pretrained model
# ---------------------------------------------------------------------------------------------------------------
def fit_to_devices(config, n_devices: int):
  """Evaluation may run on another device count than training: keep fsdp if it divides, and a divisible batch."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    if n_devices % int(config.mesh.fsdp):
      config.mesh.fsdp = 1
    config.mesh.data = -1
    gb = int(config.input.global_batch_size)
    config.input.global_batch_size = max(n_devices, gb - gb % n_devices)
  config.lock()
  return config


def latest_step(workdir: str) -> int:
  """The step of a workdir's latest checkpoint; MissingCheckpoint (one line) when it holds none."""
  manager = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), async_save=False)
  step = manager.latest_step()
  manager.close()
  if step is None:
    raise errors.MissingCheckpoint(f"{workdir} holds no checkpoint (expected {workdir}/checkpoints/<step>/)")
  return int(step)


def restore_for_eval(workdir: str, step: int, mesh=None):
  """(method, {'step', 'params', 'method_state'}, run config, meta, tokenizer) of a saved checkpoint: the method
  rebuilt from the run's own config and vocabulary, its parameters and per-sample state restored (resharded onto
  this process's devices; no optimiser state, no input pipeline)."""
  manager = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), async_save=False)
  try:
    meta = manager.read_meta(step)
    own = fit_to_devices(config_lib.from_json_dict(meta["config"]), len(jax.devices()))
    resolved = experiment.resolve(own)
    mesh = mesh if mesh is not None else shard_lib.make_mesh(own.mesh)
    tokenizer = tokenizers.tokenizer_from_json(meta["tokenizer"])
    method = resolved.method(tokenizer=tokenizer, num_examples=int(meta["num_examples"]))
    abstract_params = method.abstract_params()
    param_sh = shard_lib.param_shardings(abstract_params, mesh)
    stored = manager.stored_shapes(step)["method_state"]
    is_leaf = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")   # noqa: E731
    capacity = int(meta.get("state_capacity", meta["num_examples"]))
    ms_abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), stored, is_leaf=is_leaf)
    ms_sh = shard_lib.state_shardings(ms_abstract, mesh, capacity)
    target = dict(
        params=jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params,
                            param_sh),
        method_state=jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), ms_abstract,
                                  ms_sh))
    parts = manager.restore_parts(step, target)
  finally:
    manager.close()
  state = dict(step=step, params=parts["params"], method_state=parts.get("method_state", {}))
  return method, state, resolved, meta, tokenizer, mesh


def _needs_training_pairs(config) -> bool:
  return any(evals.is_enabled(v) and (v.type if "type" in v else k) == "noise_detection"
             for k, v in config.evals.items())


def evaluate_checkpoint(config, workdir: str, step: int):
  """(results, meta) of one saved checkpoint under `config` (None: the run's own config).

  The state is restored with the run's own config (its training data sizes the per-example method state); the
  evaluators follow the given config, which may name other data: results on other data go to their own
  directory (`eval_dir`)."""
  method, state, resolved, meta, tokenizer, mesh = restore_for_eval(workdir, step)
  own = resolved.config
  cfg = fit_to_devices(config, len(jax.devices())) if config is not None else own
  pairs = (training_pairs(resolved.input, resolved.noise, image_size=resolved.model.image_size)
           if _needs_training_pairs(cfg) else None)
  evaluation = Evaluation(cfg, model_spec=resolved.model, tokenizer=tokenizer, mesh=mesh, method=method,
                          pairs=pairs, out_dir=eval_dir(cfg, own, workdir),
                          info=dict(workdir=fileio.absolute(workdir), noise_sha256=meta.get("noise_sha256"),
                                    dataset=cfg.input.dataset))
  return evaluation.run(step, state), meta


def restore_pretrained(config, spec: str, mesh=None):
  """(method, {'step': 0, 'params'}, resolved, tokenizer, mesh) of an imported checkpoint (`spec`: openai:PATH,
  open_clip:PATH, hf:DIR, meru:PATH, ...) under `config`'s method, its architecture and preprocessing laid in."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.method.init_from = spec
  resolved = experiment.resolve(config)
  mesh = mesh if mesh is not None else shard_lib.make_mesh(resolved.config.mesh)
  tokenizer = tokenizers.build_tokenizer([], context_length=resolved.model.context_length,
                                         kind=resolved.model.tokenizer_kind)
  method = resolved.method(tokenizer=tokenizer, num_examples=0)
  param_sh = shard_lib.param_shardings(method.abstract_params(), mesh)
  params = resolved.init.initialise(method.init_params, method.abstract_params(), param_sh, mesh)
  return method, dict(step=0, params=params), resolved, tokenizer, mesh


def evaluate_pretrained(config, spec: str, output: str) -> dict:
  """Evaluate an imported checkpoint as it is (no training): the evaluators of `config` (noise detection, which
  needs training pairs, is left out) on the model `spec` describes; writes OUTPUT/eval/step_0.json."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.evals = {k: v for k, v in config.evals.items() if (v.type if "type" in v else k) != "noise_detection"}
  method, state, resolved, tokenizer, mesh = restore_pretrained(config, spec)
  evaluation = Evaluation(resolved.config, model_spec=resolved.model, tokenizer=tokenizer, mesh=mesh,
                          method=method, out_dir=fileio.join(output, "eval"), info=dict(init=spec))
  return evaluation.run(0, state)
