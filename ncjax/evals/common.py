"""Embedding whole evaluation splits with a method's EvalModel, sharded over the mesh, and reading per-sample values
to the host: every evaluator reads device values through this module (one place to make multi-process)."""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from ncjax import sharding as shard_lib


def _batched_apply(fn, arrays: np.ndarray, batch_size: int, mesh) -> np.ndarray:
  """Apply a jitted fn to `arrays` in batches (padded to a multiple of the device count), gathering on host."""
  n_dev = mesh.devices.size
  batch_size = max(n_dev, (batch_size // n_dev) * n_dev)
  sh = shard_lib.batch_sharding(mesh)
  out = []
  for start in range(0, len(arrays), batch_size):
    chunk = arrays[start:start + batch_size]
    pad = (-len(chunk)) % n_dev
    if pad:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])
    res = fn(jax.device_put(chunk, sh))
    out.append(np.asarray(jax.device_get(res))[: len(chunk) - pad if pad else None])
  return np.concatenate(out) if out else np.zeros((0,), np.float32)


def embed_images(eval_model, images: np.ndarray, batch_size: int, mesh) -> np.ndarray:
  return _batched_apply(jax.jit(eval_model.encode_image), images, batch_size, mesh)


def embed_texts(eval_model, tokens: np.ndarray, batch_size: int, mesh) -> np.ndarray:
  return _batched_apply(jax.jit(eval_model.encode_text), tokens, batch_size, mesh)


def image_features(eval_model, images: np.ndarray, batch_size: int, mesh) -> np.ndarray:
  return _batched_apply(jax.jit(eval_model.image_features), images, batch_size, mesh)


def score_matrix(eval_model, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.asarray(jax.jit(eval_model.score)(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)),
                    np.float32)


def host_values(x) -> np.ndarray:
  """A device array (per-sample method state, a metric's counts) as a host numpy array."""
  return np.asarray(jax.device_get(x))
