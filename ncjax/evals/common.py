"""Embedding whole evaluation splits with a method's EvalModel, sharded over the mesh, and reading per-sample values
to the host: every evaluator reads device values through this module, and it works the same on one process or on
several (a pod: the mesh spans devices other processes own).

Embedding a split: the rows go through the model in global batches split over every mesh device; each process
builds only the rows of its own devices (`jax.make_array_from_callback`: an image split is decoded only where it
is needed), every process runs the same number of batches (the last one padded by repeating the final row), and
the embeddings come back replicated (the jitted function's output sharding), so every process holds the whole
split's embeddings — what retrieval's full score matrix and zero-shot's class scores are computed from.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from ncjax import sharding as shard_lib


def _batched_apply(eval_model, name: str, arrays, batch_size: int, mesh) -> np.ndarray:
  """eval_model.<name> over `arrays` (numpy rows, or a lazily decoded view indexable by an index array) in global
  batches split over the mesh; the result, whole, on every process. Every batch has one shape (the last one padded
  by repeating the final row), so each split compiles one program, and a model carrying its parameters
  (`EvalModel.jitted`) compiles it once per run, not once per evaluation."""
  n_dev = mesh.devices.size
  n = len(arrays)
  if n == 0:
    return np.zeros((0,), np.float32)
  batch_size = max(n_dev, (batch_size // n_dev) * n_dev)
  batch_size = min(batch_size, n + (-n) % n_dev)   # a split smaller than a batch: one batch of its own size
  sh = shard_lib.batch_sharding(mesh)
  apply = eval_model.jitted(name, shard_lib.replicated(mesh))
  row_shape = np.asarray(arrays[np.asarray([0])]).shape[1:]
  shape = (batch_size,) + row_shape
  out = []
  for start in range(0, n, batch_size):
    size = min(batch_size, n - start)

    def rows(index, start=start):
      # this device's rows of the padded batch; rows past the data repeat the last one
      wanted = np.minimum(np.arange(batch_size)[index[0]] + start, n - 1)
      return np.asarray(arrays[wanted])

    res = apply(jax.make_array_from_callback(shape, sh, rows))
    out.append(host_values(res)[:size])
  return np.concatenate(out)


def embed_images(eval_model, images, batch_size: int, mesh) -> np.ndarray:
  return _batched_apply(eval_model, "encode_image", images, batch_size, mesh)


def embed_texts(eval_model, tokens: np.ndarray, batch_size: int, mesh) -> np.ndarray:
  return _batched_apply(eval_model, "encode_text", np.asarray(tokens), batch_size, mesh)


def image_features(eval_model, images, batch_size: int, mesh) -> np.ndarray:
  return _batched_apply(eval_model, "image_features", images, batch_size, mesh)


def score_matrix(eval_model, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """The model's score of host embeddings (this process's own device; every process computes the same)."""
  return np.asarray(eval_model.jitted("score")(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)),
                    np.float32)


def host_values(x) -> np.ndarray:
  """A device array as a host numpy array on every process — per-sample method state split over all devices of a
  pod included (gathered by a replicating identity: what an AUC over every training pair needs)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  mesh = getattr(x.sharding, "mesh", None)
  if mesh is None:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.jit(lambda v: v, out_shardings=shard_lib.replicated(mesh))(x).addressable_data(0))
