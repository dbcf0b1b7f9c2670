"""Optimisers built from a method's parameter groups: AdamW per group, frozen groups get no state, global-norm
clipping, and a linear warm-up + cosine schedule per group relative to that group's learning rate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ncjax.contract import Update, group_labels


def lr_schedule(base_lr: float, total_steps: int, warmup_steps: int, kind: str = "cosine",
                min_lr_ratio: float = 0.0):
  warmup_steps = max(0, min(int(warmup_steps), int(total_steps)))
  decay_steps = max(1, int(total_steps) - warmup_steps)
  if kind == "cosine":
    main = optax.cosine_decay_schedule(base_lr, decay_steps, alpha=min_lr_ratio)
  elif kind == "constant":
    main = optax.constant_schedule(base_lr)
  elif kind == "linear":
    main = optax.linear_schedule(base_lr, base_lr * min_lr_ratio, decay_steps)
  else:
    raise ValueError(f"unknown optim.schedule {kind!r}; expected 'cosine', 'constant' or 'linear'")
  if warmup_steps == 0:
    return main
  warm = optax.linear_schedule(0.0, base_lr, warmup_steps)
  return optax.join_schedules([warm, main], [warmup_steps])


def decay_mask(params):
  """Weight decay on matrices only (no decay for norms, biases, scales, embeddings of rank 1)."""
  return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def build_optimizer(update: Update, params, optim_config, total_steps: int):
  """(optax transform, labels pytree, trainable-mask pytree) for one Update of a stage."""
  if optim_config.name != "adamw":
    raise ValueError(f"unknown optim.name {optim_config.name!r}; supported: 'adamw'")
  labels = group_labels(params, update.param_groups)
  by_label = {g.label: g for g in update.param_groups if g.lr is not None}
  used = set(jax.tree.leaves(labels))
  transforms = {"frozen": optax.set_to_zero()}
  for label, group in by_label.items():
    if label not in used:
      continue
    sched = lr_schedule(group.lr, total_steps, optim_config.warmup_steps, optim_config.schedule,
                        optim_config.min_lr_ratio)
    transforms[label] = optax.adamw(sched, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                                    weight_decay=group.weight_decay, mask=decay_mask)
  chain = []
  if optim_config.grad_clip_norm and optim_config.grad_clip_norm > 0:
    chain.append(optax.clip_by_global_norm(optim_config.grad_clip_norm))
  chain.append(optax.multi_transform(transforms, labels))
  trainable = jax.tree.map(lambda lab: lab != "frozen", labels)
  return optax.chain(*chain), labels, trainable


def group_learning_rates(update: Update, optim_config, total_steps: int, step):
  """{group label: lr at this stage-relative step} for logging."""
  out = {}
  for g in update.param_groups:
    if g.lr is not None:
      out[g.label] = lr_schedule(g.lr, total_steps, optim_config.warmup_steps, optim_config.schedule,
                                 optim_config.min_lr_ratio)(step)
  return out
