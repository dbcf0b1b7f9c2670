"""One stage's optimisers, shardings and jitted step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ncjax import optim as optim_lib
from ncjax import sharding as shard_lib
from ncjax.contract import scalar_metrics, strip_diagnostics
from ncjax.experiment import Experiment
from ncjax.train.schedule import StageSpan

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
