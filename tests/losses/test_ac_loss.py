"""AC and HAC losses: hand-computed values, float64 numpy restatements of the slides' equations, HAC -> AC."""

import math

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from ncjax.losses import ac
from ncjax.models import lorentz


def _hand_batch():
  """N = 2: retain pairs (e1, e1), (e2, e2); forget pairs (e1, e2), (e2, e1) (their texts swapped)."""
  e1, e2 = np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)
  return np.stack([e1, e2]), np.stack([e1, e2]), np.stack([e1, e2]), np.stack([e2, e1])


def test_ac_hand_values():
  xr, tr, xf, tf = _hand_batch()
  loss, m = ac.ac_loss(xr, tr, xf, tf, 0.0, alpha=0.5, beta=0.5, gamma=0.5, epsilon=0.1)   # tau = 1
  # Similarity rows (images) x columns (texts e1, e2, e2, e1): [1,0,0,1], [0,1,1,0], [1,0,0,1], [0,1,1,0].
  retain = math.log(2 + 2 / math.e)          # -log(e / (2e + 2)) for every retain row and column
  neg = -(2 * 1 + 2 * 1) / (2 * 2 ** 2)      # forget block [[0,1],[1,0]]: off-diagonal terms of (4)
  pos = 0.0                                   # forget diagonal
  perf = math.log((2 * math.e + 2) / 4)      # log-mean-exp of [1,0,0,1] over the 2N texts / images
  assert float(m["loss_retain"]) == pytest.approx(retain, rel=1e-6)
  assert float(m["loss_neg"]) == pytest.approx(neg, abs=1e-7)
  assert float(m["loss_pos"]) == pytest.approx(pos, abs=1e-7)
  assert float(m["loss_perf"]) == pytest.approx(perf, rel=1e-6)
  assert float(loss) == pytest.approx(retain + 0.1 * (0.5 * neg + 0.5 * pos + 0.5 * perf), rel=1e-6)


def _normalised(rng, *shape):
  x = rng.standard_normal(shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def numpy_terms(sim, scale):
  """Eq. (3)-(6) restated literally in float64 with loops."""
  two_n = sim.shape[0]
  n = two_n // 2
  z = sim * scale
  lse_row = lambda i: np.log(np.sum(np.exp(z[i, :])))
  lse_col = lambda i: np.log(np.sum(np.exp(z[:, i])))
  retain = -sum((z[i, i] - lse_row(i)) + (z[i, i] - lse_col(i)) for i in range(n)) / (2 * n)
  neg = -sum(z[n + i, n + j] + z[n + j, n + i] for i in range(n) for j in range(n) if j != i) / (2 * n * n)
  pos = sum(z[n + i, n + i] for i in range(n)) / n
  perf = sum(np.log(np.mean(np.exp(z[n + i, :]))) + np.log(np.mean(np.exp(z[:, n + i]))) for i in range(n)) / (2 * n)
  return retain, neg, pos, perf


@pytest.mark.parametrize("n,d,seed", [(3, 8, 0), (8, 16, 1)])
def test_ac_matches_a_numpy_restatement(n, d, seed):
  rng = np.random.default_rng(seed)
  xr, tr, xf, tf = (_normalised(rng, n, d) for _ in range(4))
  scale = math.log(1 / 0.07)
  loss, m = ac.ac_loss(xr, tr, xf, tf, scale, alpha=0.75, beta=0.25, gamma=0.75, epsilon=0.1)
  sim = np.concatenate([xr, xf]) @ np.concatenate([tr, tf]).T
  r, ng, p, pf = numpy_terms(sim, 1 / 0.07)
  np.testing.assert_allclose([float(m[k]) for k in ("loss_retain", "loss_neg", "loss_pos", "loss_perf")],
                             [r, ng, p, pf], rtol=2e-5, atol=2e-5)
  assert float(loss) == pytest.approx(r + 0.1 * (0.75 * ng + 0.25 * p + 0.75 * pf), rel=2e-5)


def _meru_points(rng, n, d, c, scale=0.6):
  return np.asarray(lorentz.exp_map0(scale * rng.standard_normal((n, d)), c), np.float64)


def np_dist(x, y, c):
  xt = np.sqrt(1 / c + np.sum(x * x, -1))
  yt = np.sqrt(1 / c + np.sum(y * y, -1))
  inner = x @ y.T - np.outer(xt, yt)
  return np.arccosh(np.maximum(-c * inner, 1 + 1e-8)) / np.sqrt(c)


def np_oxy_angle(x, y, c):
  xt = np.sqrt(1 / c + np.sum(x * x, -1))
  yt = np.sqrt(1 / c + np.sum(y * y, -1))
  ci = c * (np.sum(x * y, -1) - xt * yt)
  num = yt + ci * xt
  den = np.linalg.norm(x, axis=-1) * np.sqrt(np.maximum(ci * ci - 1, 1e-8)) + 1e-8
  return np.arccos(np.clip(num / den, -1 + 1e-8, 1 - 1e-8))


def np_aperture(x, c, k=0.1):
  return np.arcsin(np.clip(2 * k / (np.sqrt(c) * np.linalg.norm(x, axis=-1) + 1e-8), -1 + 1e-8, 1 - 1e-8))


@pytest.mark.parametrize("f_ent_on,norm_reg", [("forget", "toward_origin"), ("retain", "away")])
def test_hac_matches_a_numpy_restatement(f_ent_on, norm_reg):
  rng = np.random.default_rng(3)
  n, d, c = 6, 8, 0.7
  xr, tr, xf, tf = (_meru_points(rng, n, d, c) for _ in range(4))
  scale = math.log(10.0)
  kw = dict(alpha=0.5, beta=0.5, gamma=0.5, epsilon=0.1, omega_r=0.2, omega_f=1.0, lam=0.5)
  loss, m = ac.hac_loss(xr, tr, xf, tf, scale, c, f_ent_on=f_ent_on, norm_reg=norm_reg, **kw)
  sim = -np_dist(np.concatenate([xr, xf]), np.concatenate([tr, tf]), c)
  r, ng, p, pf = numpy_terms(sim, 10.0)
  r_ent = np.mean(np.maximum(np_oxy_angle(tr, xr, c) - np_aperture(tr, c), 0))
  ft, fx = (tf, xf) if f_ent_on == "forget" else (tr, xr)
  f_ent = np.mean(np.maximum(np_aperture(ft, c) - np_oxy_angle(ft, fx, c), 0))
  hnorm = lambda x: np.arcsinh(np.sqrt(c) * np.linalg.norm(x, axis=-1)) / np.sqrt(c)
  norms = np.mean(hnorm(xf) + hnorm(tf)) * (1 if norm_reg == "toward_origin" else -1)
  expected = r + 0.1 * (0.5 * ng + 0.5 * p + 0.5 * pf) + 0.2 * r_ent + 1.0 * f_ent + 0.5 * norms
  assert float(m["loss_r_ent"]) == pytest.approx(r_ent, rel=1e-4, abs=1e-6)
  assert float(m["loss_f_ent"]) == pytest.approx(f_ent, rel=1e-4, abs=1e-6)
  assert float(m["loss_norm_reg"]) == pytest.approx(norms, rel=1e-5)
  assert float(loss) == pytest.approx(expected, rel=1e-4)


def test_hac_with_zero_entailment_and_norm_weights_on_cosine_is_ac():
  rng = np.random.default_rng(4)
  xr, tr, xf, tf = (_normalised(rng, 5, 8).astype(np.float32) for _ in range(4))
  kw = dict(alpha=0.75, beta=0.5, gamma=0.25, epsilon=0.2)
  ac_value, _ = ac.ac_loss(xr, tr, xf, tf, 2.5, **kw)
  hac_value, _ = ac.hac_loss(xr, tr, xf, tf, 2.5, 1.0, omega_r=0.0, omega_f=0.0, lam=0.0,
                             similarity=lambda a, b: a @ b.T, **kw)
  assert float(hac_value) == pytest.approx(float(ac_value), rel=1e-6)


def test_forget_entailment_pushes_images_out_of_their_cone():
  """d L_f-ent / d image points away from the cone: one step along -grad increases every inside image's exterior
  angle ext(t, x), and descending L_f-ent alone takes every image out of its text's cone (ext > aper), where the
  term is 0."""
  rng = np.random.default_rng(5)
  c = 1.0
  v = 0.5 * rng.standard_normal((4, 6))
  tf = np.asarray(lorentz.exp_map0(v, c), np.float32)
  # Farther from the origin along the text's direction, slightly off-axis: inside the text's entailment cone.
  xf = np.asarray(lorentz.exp_map0(1.6 * v + 0.005 * rng.standard_normal(v.shape), c), np.float32)
  xr, tr = (_meru_points(rng, 4, 6, c).astype(np.float32) for _ in range(2))

  def f_ent(x):
    return ac.hac_loss(xr, tr, x, tf, 1.0, c, epsilon=0.0, omega_r=0.0, omega_f=1.0, lam=0.0)[1]["loss_f_ent"]

  ext = lambda x: np.asarray(lorentz.oxy_angle(tf, x, c))
  aper = np.asarray(lorentz.half_aperture(tf, c))
  assert (ext(xf) < aper).all()                        # every forget image starts inside its text's cone
  before = float(f_ent(xf))
  assert before > 0
  grad = jax.jit(jax.grad(f_ent))
  stepped = xf - 0.05 * np.asarray(grad(jnp.asarray(xf)))
  assert float(f_ent(stepped)) < before and (ext(stepped) > ext(xf)).all()
  x = xf
  for _ in range(200):
    x = x - 0.05 * np.asarray(grad(jnp.asarray(x)))
    if float(f_ent(x)) == 0.0:
      break
  assert float(f_ent(x)) == 0.0 and (ext(x) > aper).all()   # out of the cone: nothing left to push


@pytest.mark.parametrize("case", ["identical", "zero", "tiny", "huge_scale"])
def test_degenerate_batches_stay_finite(case):
  rng = np.random.default_rng(6)
  n, d = 4, 8
  x = _normalised(rng, n, d).astype(np.float32)
  parts = [x, x, x, x] if case == "identical" else [_normalised(rng, n, d).astype(np.float32) for _ in range(4)]
  if case == "zero":
    parts = [np.zeros((n, d), np.float32)] * 4
  if case == "tiny":
    parts = [1e-20 * p for p in parts]
  scale = 50.0 if case == "huge_scale" else 2.0

  def both(*p):
    a, _ = ac.ac_loss(*p, scale)
    h, _ = ac.hac_loss(*p, scale, 1.0, lam=0.5)
    return a + h

  value, grads = jax.value_and_grad(both, argnums=(0, 1, 2, 3))(*parts)
  assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_shape_and_option_errors():
  x = np.zeros((4, 3), np.float32)
  with pytest.raises(ValueError, match="N retain and N forget pairs"):
    ac.ac_loss(x, x, x[:2], x[:2], 1.0)
  with pytest.raises(ValueError, match="unknown f_ent_on 'both'"):
    ac.hac_loss(x, x, x, x, 1.0, 1.0, f_ent_on="both")
