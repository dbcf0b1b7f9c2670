import numpy as np
import jax
import jax.numpy as jnp
import pytest

from ncjax.losses import contrastive


def _normalise(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _logsumexp(a, axis):
  m = a.max(axis=axis, keepdims=True)
  return (m + np.log(np.exp(a - m).sum(axis=axis, keepdims=True))).squeeze(axis)


def numpy_infonce(v, t, logit_scale, w=None):
  logits = np.exp(logit_scale) * v.astype(np.float64) @ t.astype(np.float64).T
  d = np.diag(logits)
  per = 0.5 * ((_logsumexp(logits, 1) - d) + (_logsumexp(logits, 0) - d))
  return float(np.mean(per if w is None else w * per))


def numpy_sigmoid(v, t, logit_scale, bias):
  logits = np.exp(logit_scale) * v.astype(np.float64) @ t.astype(np.float64).T + bias
  z = 2 * np.eye(len(v)) - 1
  return float(np.sum(np.logaddexp(0.0, -z * logits)) / len(v))


@pytest.mark.parametrize("n,d,seed", [(8, 4, 0), (64, 32, 1), (257, 16, 2)])
def test_infonce_matches_numpy(n, d, seed):
  rng = np.random.default_rng(seed)
  v = _normalise(rng.normal(size=(n, d))).astype(np.float32)
  t = _normalise(rng.normal(size=(n, d))).astype(np.float32)
  w = rng.uniform(size=n).astype(np.float32)
  ls = np.log(1 / 0.07)
  loss, metrics = contrastive.infonce(v, t, ls)
  np.testing.assert_allclose(float(loss), numpy_infonce(v, t, ls), rtol=1e-5)
  loss_w, _ = contrastive.infonce(v, t, ls, weights=w)
  np.testing.assert_allclose(float(loss_w), numpy_infonce(v, t, ls, w), rtol=1e-5)
  assert metrics["per_pair_loss"].shape == (n,)


def test_infonce_hand_values():
  # Orthonormal pairs, perfectly aligned: each row is [s, 0, ..., 0] -> loss = log(1 + (N-1) e^{-s}).
  n = 4
  e = np.eye(n, dtype=np.float32)
  s = 3.0  # moderate: lse - diagonal cancels in float32 for large s
  loss, m = contrastive.infonce(e, e, np.log(s))
  assert float(loss) == pytest.approx(np.log(1 + (n - 1) * np.exp(-s)), rel=2e-6)
  assert float(m["acc_i2t"]) == 1.0 and float(m["acc_t2i"]) == 1.0
  # All embeddings identical: every logit equal -> loss = log N exactly.
  same = np.ones((n, 3), np.float32) / np.sqrt(3)
  loss, _ = contrastive.infonce(same, same, np.log(20.0))
  assert float(loss) == pytest.approx(np.log(n), rel=1e-6)
  # Swapped pairs (a perfect anti-alignment on the diagonal): 2 pairs, scale 1.
  v = np.array([[1, 0], [0, 1]], np.float32)
  t = np.array([[0, 1], [1, 0]], np.float32)
  loss, _ = contrastive.infonce(v, t, 0.0)
  assert float(loss) == pytest.approx(np.log(1 + np.e), rel=1e-6)


def test_infonce_unit_weights_equal_unweighted_and_grad_finite_on_zero_vectors():
  rng = np.random.default_rng(3)
  v = _normalise(rng.normal(size=(16, 8))).astype(np.float32)
  t = _normalise(rng.normal(size=(16, 8))).astype(np.float32)
  a, _ = contrastive.infonce(v, t, 2.0)
  b, _ = contrastive.infonce(v, t, 2.0, weights=np.ones(16, np.float32))
  assert float(a) == pytest.approx(float(b), rel=1e-7)
  zeros = np.zeros((16, 8), np.float32)
  g = jax.grad(lambda x: contrastive.infonce(x, zeros, 2.0)[0])(jnp.asarray(v))
  assert np.isfinite(np.asarray(g)).all()


def test_infonce_shape_errors():
  with pytest.raises(ValueError, match="must both be"):
    contrastive.infonce(np.zeros((4, 3)), np.zeros((5, 3)), 0.0)
  with pytest.raises(ValueError, match="weights must have shape"):
    contrastive.infonce(np.zeros((4, 3)), np.zeros((4, 3)), 0.0, weights=np.ones(3))


@pytest.mark.parametrize("n,seed", [(8, 0), (100, 1)])
def test_sigmoid_matches_numpy(n, seed):
  rng = np.random.default_rng(seed)
  v = _normalise(rng.normal(size=(n, 16))).astype(np.float32)
  t = _normalise(rng.normal(size=(n, 16))).astype(np.float32)
  loss, _ = contrastive.sigmoid(v, t, np.log(10.0), -10.0)
  np.testing.assert_allclose(float(loss), numpy_sigmoid(v, t, np.log(10.0), -10.0), rtol=1e-5)


def test_sigmoid_hand_value():
  # One pair, cosine 1, scale 1, bias 0: -log sigmoid(1).
  loss, _ = contrastive.sigmoid(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32), 0.0, 0.0)
  assert float(loss) == pytest.approx(np.log1p(np.exp(-1.0)), rel=1e-6)


def test_losses_sharded_equal_unsharded(devices):
  from jax.sharding import NamedSharding, PartitionSpec as P
  from ncjax.sharding import make_mesh
  import ml_collections
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)), devices)
  rng = np.random.default_rng(5)
  v = _normalise(rng.normal(size=(64, 16))).astype(np.float32)
  t = _normalise(rng.normal(size=(64, 16))).astype(np.float32)
  sh = NamedSharding(mesh, P(("data", "fsdp")))
  f = jax.jit(jax.value_and_grad(lambda a, b: contrastive.infonce(a, b, 2.0)[0]))
  l1, g1 = f(jax.device_put(v, sh), jax.device_put(t, sh))
  l0, g0 = jax.jit(jax.value_and_grad(lambda a, b: contrastive.infonce(a, b, 2.0)[0]))(v, t)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(g1), np.asarray(g0), atol=1e-7)


def test_masked_row_sum_diagonal_is_bitwise_jnp_diagonal_and_its_sharded_gradient_stays_local(devices):
  """numerics.diagonal (every loss's positives) returns jnp.diagonal's values bit for bit, ignores non-finite
  off-diagonal entries as jnp.diagonal does, and its gradient under a row-sharded N x N matrix compiles to a local
  select: no scatter, no conditional, no collective (jnp.diagonal's scatter-add gradient brought all three)."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  from ncjax.numerics import diagonal
  rng = np.random.default_rng(3)
  m = rng.normal(size=(64, 64)).astype(np.float32) * 1e3
  m[0, 5], m[7, 2] = np.inf, np.nan
  np.testing.assert_array_equal(np.asarray(diagonal(jnp.asarray(m))), np.diagonal(m))
  w = jnp.asarray(rng.normal(size=(64,)).astype(np.float32))
  grad = jax.grad(lambda x: jnp.sum(w * diagonal(x)))(jnp.asarray(m))
  np.testing.assert_array_equal(np.asarray(grad), np.diag(np.asarray(w)))
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
  row_sharded = jax.device_put(jnp.asarray(np.nan_to_num(m)), NamedSharding(mesh, P("data")))
  hlo = jax.jit(jax.grad(lambda x: jnp.sum(w * diagonal(x)))).lower(row_sharded).compile().as_text()
  for op in ("scatter", "conditional", "all-gather", "all-reduce"):
    assert f" {op}(" not in hlo, f"{op} in the sharded gradient of diagonal()"
  with pytest.raises(ValueError, match="square"):
    diagonal(jnp.zeros((3, 4)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_column_argmax_hits_equal_argmax_over_columns_ties_included(seed):
  """The t2i accuracy's column reductions (no gather of per-column candidates on a pod) give argmax's answer,
  ties resolved to the first row as argmax does."""
  rng = np.random.default_rng(seed)
  n, m = 9, 9
  logits = rng.integers(0, 3, size=(n, m)).astype(np.float32)     # many ties
  logits[np.arange(n), np.arange(m)] += rng.integers(0, 2, size=n)
  got = np.asarray(contrastive.column_argmax_is_diagonal(jnp.asarray(logits)))
  np.testing.assert_array_equal(got, np.argmax(logits, axis=0) == np.arange(m))
  assert 0 < got.sum() < m     # both outcomes occur, so the comparison above can fail
  same = np.ones((4, 4), np.float32)    # all tied: only column 0's first maximum is its diagonal
  np.testing.assert_array_equal(np.asarray(contrastive.column_argmax_is_diagonal(jnp.asarray(same))),
                                [True, False, False, False])
