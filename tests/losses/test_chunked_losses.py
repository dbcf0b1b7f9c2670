"""The memory-lean (row-chunked, row-sharded) losses equal the dense ones: values and gradients, 8 devices and 1."""

import math

import ml_collections
import numpy as np
import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from ncjax.losses import chunked, contrastive, ncu
from ncjax.sharding import make_mesh
from ncjax.testing import ncu_crosscheck_inputs

LOGIT_SCALE = math.log(1 / 0.07)


def _batch(n, d=16, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(3, n, d)).astype(np.float32)
  x[1] = 0.6 * x[0] + 0.4 * x[1]
  return tuple(x / np.linalg.norm(x, axis=-1, keepdims=True))


def _on(devs, fn, *arrays):
  """value_and_grad of fn(*arrays) (all batch arrays) under a mesh of `devs` (None: no mesh)."""
  g = jax.jit(jax.value_and_grad(fn, argnums=tuple(range(len(arrays)))))
  if devs is None:
    value, grads = g(*arrays)
  else:
    mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)), devs)
    sh = NamedSharding(mesh, P(tuple(mesh.axis_names)))
    with jax.set_mesh(mesh):
      value, grads = g(*[jax.device_put(a, sh) for a in arrays])
  return float(value), [np.asarray(x) for x in grads]


def _assert_same(a, b, tol=2e-5):
  assert a[0] == pytest.approx(b[0], rel=tol, abs=tol)
  for x, y in zip(a[1], b[1]):
    np.testing.assert_allclose(x, y, atol=tol, rtol=1e-4)


def test_chunked_infonce_equals_dense(devices):
  v, t, _ = _batch(64)
  dense = _on(None, lambda v, t: contrastive.infonce(v, t, LOGIT_SCALE)[0], v, t)
  for devs in (None, devices[:1], devices):
    _assert_same(_on(devs, lambda v, t: chunked.infonce(v, t, LOGIT_SCALE, chunk=16)[0], v, t), dense)


def test_chunked_softmax_diagonals_and_forget_selection(devices):
  v, t, _ = _batch(64, seed=1)
  row, col = ncu.clean_confidence(v, t, LOGIT_SCALE, "row"), ncu.clean_confidence(v, t, LOGIT_SCALE, "mean")
  dense_forget = {s: np.asarray(ncu.select_forget(v, t, LOGIT_SCALE, 0.25, s)[0]) for s in ("row", "mean")}
  # the selection is only meaningful if the chunked confidences decide it: no near tie at the 16th lowest
  for s, conf in (("row", row), ("mean", col)):
    ordered = np.sort(np.asarray(conf))
    assert ordered[16] - ordered[15] > 1e-4 and dense_forget[s].sum() == 16

  def chunked(v, t):
    return tuple(ncu.clean_confidence(v, t, LOGIT_SCALE, s, chunk=16) for s in ("row", "mean")) + tuple(
        ncu.select_forget(v, t, LOGIT_SCALE, 0.25, s, chunk=16)[0] for s in ("row", "mean"))

  for devs in (None, devices):
    if devs is None:
      got_row, got_mean, forget_row, forget_mean = chunked(v, t)
    else:
      mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)), devs)
      sh = NamedSharding(mesh, P(tuple(mesh.axis_names)))
      with jax.set_mesh(mesh):
        got_row, got_mean, forget_row, forget_mean = jax.jit(chunked)(jax.device_put(v, sh), jax.device_put(t, sh))
    np.testing.assert_allclose(np.asarray(got_row), np.asarray(row), atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_mean), np.asarray(col), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(forget_row), dense_forget["row"])
    np.testing.assert_array_equal(np.asarray(forget_mean), dense_forget["mean"])


@pytest.mark.parametrize("ratio,normalize", [(0.25, False), (0.0, True), (1.0, False)])
def test_chunked_ncu_loss_equals_the_dense_kernel_loss(devices, ratio, normalize):
  v, t, tn = _batch(64, seed=2)
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, ratio)
  forget = np.asarray(forget)
  opts = ncu.UnlearningOptions(normalize_text_targets=normalize)
  dense = _on(None, lambda v, t, tn: ncu.unlearning(v, t, tn, LOGIT_SCALE, forget, opts).loss, v, t, tn)
  lean = ncu.UnlearningOptions(normalize_text_targets=normalize, chunk_rows=16)
  for devs in (None, devices):
    fn = lambda v, t, tn: ncu.unlearning(v, t, tn, LOGIT_SCALE, forget, lean).loss
    _assert_same(_on(devs, fn, v, t, tn), dense, tol=5e-5)


def test_chunked_ncu_matches_the_methods_md_crosscheck():
  """methods.md §1.7's inputs and values (an independent restatement of the public NCU code; tests/README.md)."""
  v, t, tn = ncu_crosscheck_inputs()
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, 0.25)
  out = ncu.unlearning(v, t, tn, LOGIT_SCALE, forget, ncu.UnlearningOptions(chunk_rows=4))
  assert float(out.scalars["loss_img"]) == pytest.approx(2.677844, abs=2e-6)
  assert float(out.scalars["loss_txt"]) == pytest.approx(2.364622, abs=2e-6)
  assert (int(out.scalars["sinkhorn_iterations_img"]), int(out.scalars["sinkhorn_iterations_txt"])) == (81, 91)
