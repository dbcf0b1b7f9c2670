"""Optimisers built from a method's parameter groups: AdamW (or Adam) per group, frozen groups get no state,
global-norm clipping, and a learning-rate schedule per group relative to that group's learning rate.

Schedules (`optim.schedule`): 'cosine' (linear warm-up, then cosine to min_lr_ratio), 'constant', 'linear', and
'step' (multiplied by `decay_factor` every `decay_every_epochs` epochs: GSC's public code, x0.2). Scope
(`optim.schedule_scope`): 'stage' gives each stage its own schedule over its own steps (warm-up from 0; a step
decay counts the stage's own epochs: DisNCL decays 25 epochs into its main stage, after its warm-up stage, as the
same group's MSCN restarts its epoch counter after warm-up); 'run' runs one schedule over all stages' steps, as
NCU's public code does (a step decay then counts the run's epochs). With 'run', `schedule_offset_epochs` shifts the
step the schedule sees: NCU's code counts epochs from 1 (step = batches_per_epoch * epoch + i), so its 100-step
warm-up never takes effect and the cosine, over batches_per_epoch * epochs steps, starts at 0.98 on CC3M
(`public_cosine` is that formula, used for scope 'run' with the cosine schedule).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from ncjax.contract import Update, group_labels

SCHEDULES = ("cosine", "constant", "linear", "step")
SCOPES = ("stage", "run")


@dataclasses.dataclass(frozen=True)
class ScheduleContext:
  """Where a stage sits in the run: its first global step, its steps, the run's steps, steps per epoch."""
  stage_start: int
  stage_steps: int
  run_steps: int
  steps_per_epoch: int


def public_cosine(step, warmup_steps: int, total_steps: int):
  """NCU's (and CyCLIP's) cosine_scheduler multiplier at `step`: (step + 1) / W during warm-up, then
  0.5 (1 + cos(pi (step - W) / (T - W))); not clipped at T (the public code runs past it in its last epoch)."""
  step = jnp.asarray(step, jnp.float32)
  w, t = float(warmup_steps), float(max(total_steps, warmup_steps + 1))
  warm = (step + 1.0) / max(w, 1.0)
  cos = 0.5 * (1.0 + jnp.cos(math.pi * (step - w) / (t - w)))
  return jnp.where(step < w, warm, cos)


def multiplier_fn(optim_config, ctx: ScheduleContext):
  """count (the stage's optimiser step) -> learning-rate multiplier."""
  kind = optim_config.schedule
  if kind not in SCHEDULES:
    raise ValueError(f"unknown optim.schedule {kind!r}; expected one of {SCHEDULES}")
  scope = optim_config.get("schedule_scope", "stage")
  if scope not in SCOPES:
    raise ValueError(f"unknown optim.schedule_scope {scope!r}; expected one of {SCOPES}")
  warmup = int(optim_config.warmup_steps)
  floor = float(optim_config.min_lr_ratio)
  if kind == "step":
    every = int(optim_config.get("decay_every_epochs", 0) or 0)
    factor = float(optim_config.get("decay_factor", 0.1))
    if every <= 0:
      raise ValueError("optim.schedule='step' needs optim.decay_every_epochs > 0")
    # The stage's own epochs ('stage'), or the whole run's ('run'); one-stage runs (GSC) see no difference.
    start = ctx.stage_start if scope == "run" else 0
    return lambda count: factor ** jnp.floor((start + count) / (every * ctx.steps_per_epoch))
  if scope == "run":
    offset = int(optim_config.get("schedule_offset_epochs", 0)) * ctx.steps_per_epoch
    if kind == "cosine":
      return lambda count: floor + (1 - floor) * public_cosine(ctx.stage_start + count + offset, warmup,
                                                                ctx.run_steps)
    total, start = ctx.run_steps, ctx.stage_start + offset
  else:
    total, start = ctx.stage_steps, 0
  warmup = max(0, min(warmup, int(total)))
  decay = max(1, int(total) - warmup)
  if kind == "cosine":
    main = optax.cosine_decay_schedule(1.0, decay, alpha=floor)
  elif kind == "constant":
    main = optax.constant_schedule(1.0)
  else:
    main = optax.linear_schedule(1.0, floor, decay)
  sched = main if warmup == 0 else optax.join_schedules([optax.linear_schedule(0.0, 1.0, warmup), main], [warmup])
  return lambda count: sched(start + count)


def lr_schedule(base_lr: float, optim_config, ctx: ScheduleContext):
  mult = multiplier_fn(optim_config, ctx)
  return lambda count: base_lr * mult(count)


def decay_mask(params):
  """Weight decay on matrices only (no decay for norms, biases, scales, embeddings of rank 1)."""
  return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def _optimizer(optim_config, sched, weight_decay):
  b1, b2, eps = optim_config.b1, optim_config.b2, optim_config.eps
  if optim_config.name == "adamw":
    return optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
  if optim_config.name == "adam":   # torch.optim.Adam with weight_decay adds wd * p to the gradient (L2)
    chain = [optax.add_decayed_weights(weight_decay, mask=decay_mask)] if weight_decay else []
    return optax.chain(*chain, optax.adam(sched, b1=b1, b2=b2, eps=eps))
  raise ValueError(f"unknown optim.name {optim_config.name!r}; supported: 'adamw', 'adam'")


def build_optimizer(update: Update, params, optim_config, ctx: ScheduleContext):
  """(optax transform, labels pytree, trainable-mask pytree) for one Update of a stage."""
  labels = group_labels(params, update.param_groups)
  by_label = {g.label: g for g in update.param_groups if g.lr is not None}
  used = set(jax.tree.leaves(labels))
  transforms = {"frozen": optax.set_to_zero()}
  for label, group in by_label.items():
    if label not in used:
      continue
    transforms[label] = _optimizer(optim_config, lr_schedule(group.lr, optim_config, ctx), group.weight_decay)
  chain = []
  if optim_config.grad_clip_norm and optim_config.grad_clip_norm > 0:
    chain.append(optax.clip_by_global_norm(optim_config.grad_clip_norm))
  chain.append(optax.multi_transform(transforms, labels))
  trainable = jax.tree.map(lambda lab: lab != "frozen", labels)
  return optax.chain(*chain), labels, trainable


def group_learning_rates(update: Update, optim_config, ctx: ScheduleContext, count):
  """{group label: lr at this stage-relative step} for logging."""
  return {g.label: lr_schedule(g.lr, optim_config, ctx)(count) for g in update.param_groups if g.lr is not None}
