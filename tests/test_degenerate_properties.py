"""Degenerate batches, property-tested: every public loss and sampler gives finite values and gradients on empty
and full forget sets, identical captions, duplicated images, zero or tiny vectors, huge logit scales (e^50 for
dot-product logits, e^20 for given logits, e^9.2 = 100x MERU's cap for distance logits), all-masked rows and
batches of one — or a clear error where the input is truly invalid.

Every degeneracy is enumerated (pytest parametrize: each kind of rows on each input, each forget set, each mask
layout, each score spread), so each one is tested on every run; hypothesis varies what is left — the random values
(a seed), the logit scale — a few examples per case. Shapes are fixed per property (N = 8, D = 4, and N = 1), so
each function compiles once whatever the case."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ncjax.losses import ac, bayes, chunked, contrastive, disncl, gsc, ncu
from ncjax.models import lorentz
from ncjax.ot import KernelSinkhorn, OttSinkhorn, ReferenceSinkhorn
from ncjax.samplers import gamma, gmm

N, D = 8, 4
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = ("random", "identical", "zero", "tiny", "duplicated_images", "one_hot")
DEGENERATE = KINDS[1:]


def _rows(kind, rng, n=N, d=D):
  x = rng.standard_normal((n, d))
  if kind == "identical":
    x[:] = x[:1]
  elif kind == "zero":
    x[:] = 0.0
  elif kind == "tiny":
    x *= 1e-30
  elif kind == "duplicated_images":
    x[n // 2:] = x[: n - n // 2]
  elif kind == "one_hot":
    x = np.eye(d)[rng.integers(0, d, n)]
  norms = np.linalg.norm(x, axis=1, keepdims=True)
  return np.where(norms > 0, x / np.where(norms > 0, norms, 1), 0).astype(np.float32)


# (image rows, text rows): each degenerate kind on the image side alone, on the text side alone, and on both; plus
# the non-degenerate pair. 16 cases.
PAIRS = ([("random", "random")] + [(k, "random") for k in DEGENERATE] + [("random", k) for k in DEGENERATE]
         + [(k, k) for k in DEGENERATE])
seeds = st.integers(0, 2 ** 31 - 1)
# the scale: CLIP's range (0 to ln 100), and far past it (e^20: a multiplier of 5e8), both drawn every run
scales = st.one_of(st.floats(0.0, 4.6), st.floats(15.0, 20.0))
FORGET_SETS = ("empty", "full", "half", "one")
def _forget(kind, n=N):
  return {"empty": np.zeros(n, bool), "full": np.ones(n, bool), "half": np.arange(n) % 2 == 0,
          "one": np.arange(n) == 0}[kind]


def _finite(value, grads):
  assert np.isfinite(np.asarray(value)).all(), value
  for g in jax.tree.leaves(grads):
    assert np.isfinite(np.asarray(g)).all()


def _check(value_and_grads, *args):
  value, grads = value_and_grads(*args)
  _finite(value, grads)


def _value_and_grad(fn, n_diff):
  """jit(value_and_grad) over the first n_diff arguments: compiled once per property, whatever hypothesis draws
  (the scale and masks are traced arguments, not constants)."""
  return jax.jit(jax.value_and_grad(fn, argnums=tuple(range(n_diff))))


def _contrastive(v, t, s):
  return (contrastive.infonce(v, t, s)[0] + contrastive.sigmoid(v, t, s, -10.0)[0]
          + chunked.infonce(v, t, s, chunk=4)[0])


_contrastive_vg = _value_and_grad(_contrastive, 2)


@pytest.mark.parametrize("kv,kt", PAIRS)
@SETTINGS
@given(seed=seeds, scale=scales)
def test_contrastive_losses(kv, kt, seed, scale):
  rng = np.random.default_rng(seed)
  v, t = _rows(kv, rng), _rows(kt, rng)
  # Dot-product logits fold the scale into an operand (ncjax.numerics.scaled_dot): finite even at e^50.
  for s in (scale, 50.0):
    _check(_contrastive_vg, v, t, jnp.float32(s))


def _ncu_all(v, t, tn, s, forget):
  l1 = ncu.unlearning(v, t, tn, s, forget).loss
  l2 = ncu.unlearning(v, t, tn, s, forget, ncu.UnlearningOptions(chunk_rows=4)).loss
  l3 = ncu.prompt(v, t, tn, s, forget).loss
  return l1 + l2 + l3


_ncu_vg = _value_and_grad(_ncu_all, 3)
_select = jax.jit(lambda v, t, s: ncu.select_forget(v, t, s, 0.25))


# NCU's three inputs: each degenerate kind on images, captions or negative captions (the others random), or on all
# three (21 cases); each with every forget set
NCU_CASES = ([("random", "random", "random")] + [(k, "random", "random") for k in DEGENERATE]
             + [("random", k, "random") for k in DEGENERATE] + [("random", "random", k) for k in DEGENERATE]
             + [(k, k, k) for k in DEGENERATE])


@pytest.mark.parametrize("fk", FORGET_SETS)
@pytest.mark.parametrize("kv,kt,kn", NCU_CASES)
@SETTINGS
@given(seed=seeds, scale=scales)
def test_ncu_selection_prompt_and_unlearning(kv, kt, kn, fk, seed, scale):
  rng = np.random.default_rng(seed)
  v, t, tn = _rows(kv, rng), _rows(kt, rng), _rows(kn, rng)
  mask, conf = _select(v, t, jnp.float32(scale))
  assert int(np.sum(mask)) == 2 and np.isfinite(np.asarray(conf)).all()
  _check(_ncu_vg, v, t, tn, jnp.float32(scale), jnp.asarray(_forget(fk)))


_SOLVERS = [jax.jit(lambda c, m, solver=solver: solver(c, m).plan)
            for solver in (KernelSinkhorn(), ReferenceSinkhorn(), OttSinkhorn())]


@pytest.mark.parametrize("layout", ["dense", "sparse", "one_per_row", "empty_column", "all_masked_row",
                                    "all_masked_rows_and_columns", "all_masked", "constant_cost"])
@SETTINGS
@given(seed=seeds)
def test_sinkhorn_solvers_on_masks(layout, seed):
  rng = np.random.default_rng(seed)
  cost = rng.uniform(size=(N, N + 1)).astype(np.float32)
  mask = np.ones((N, N + 1), bool)
  if layout == "sparse":
    mask = rng.uniform(size=mask.shape) > 0.7
    mask[np.arange(N), rng.integers(0, N + 1, N)] = True
  elif layout == "one_per_row":
    mask = np.zeros_like(mask)
    mask[np.arange(N), rng.permutation(N + 1)[:N]] = True
  elif layout == "empty_column":
    mask[:, N] = False
  elif layout == "all_masked_row":                    # a row with nowhere to send its mass
    mask[rng.integers(0, N)] = False
  elif layout == "all_masked_rows_and_columns":
    mask[rng.choice(N, 3, replace=False)] = False
    mask[:, rng.choice(N + 1, 2, replace=False)] = False
  elif layout == "all_masked":
    mask[:] = False
  elif layout == "constant_cost":
    cost[:] = 0.5
  for solve in _SOLVERS:
    plan = np.asarray(solve(cost, mask))
    assert np.isfinite(plan).all() and (plan[~mask] == 0).all() and (plan >= 0).all()
    assert (plan[~mask.any(axis=1)] == 0).all() and plan.sum() <= 1.0 + 1e-5


_gsc_vg = _value_and_grad(lambda s, a, b, y: gsc.batch_loss(s, a, b, y)[0], 3)
_gsc_gram_vg = _value_and_grad(lambda v, t, y: gsc.batch_loss_gram(None, v, t, y, sim_scale=2.0)[0], 2)
_update_labels = jax.jit(gsc.update_labels)


@pytest.mark.parametrize("labels", ["ones", "zeros", "mixed"])
@pytest.mark.parametrize("kv,kt", PAIRS)
@SETTINGS
@given(seed=seeds)
def test_gsc_loss(kv, kt, labels, seed):
  rng = np.random.default_rng(seed)
  v, t = _rows(kv, rng), _rows(kt, rng)
  y = {"ones": np.ones(N), "zeros": np.zeros(N), "mixed": rng.uniform(size=N)}[labels].astype(np.float32)
  _check(_gsc_vg, v @ t.T, v @ v.T, t @ t.T, y)
  _check(_gsc_gram_vg, v, t, y)     # the D x D form CLIP towers use: zero, identical, one-hot rows stay finite


def _scores(spread, rng, n=64):
  """Per-sample structure scores for the epoch's label update."""
  if spread == "constant":
    return np.full(n, 0.5)
  if spread == "two_values":
    return rng.choice([0.5, rng.uniform()], size=n)
  if spread == "one_outlier":
    return np.where(np.arange(n) == rng.integers(0, n), 0.0, 0.9)
  if spread == "bimodal":
    return np.where(rng.uniform(size=n) < 0.6, rng.normal(0.9, 0.03, n), rng.normal(0.6, 0.08, n))
  return rng.uniform(size=n)                                      # "spread": 64 distinct values


@pytest.mark.parametrize("spread", ["constant", "two_values", "one_outlier", "bimodal", "spread"])
@SETTINGS
@given(seed=seeds, unseen=st.integers(0, 63))
def test_gsc_label_update(spread, seed, unseen):
  """The epoch's GMM label update on score sets from one value (every score equal) to 64 distinct ones, with some
  examples unseen in the epoch: finite labels in [0, 1], and unseen examples keep theirs."""
  rng = np.random.default_rng(seed)
  topo = _scores(spread, rng).astype(np.float32)
  state = {k: jnp.ones((64,), jnp.float32) for k in ("pred", "pred_target", "topo_target", "y", "clean_prob")}
  seen = jnp.arange(64) < 64 - unseen
  out = _update_labels(dict(state, topo=jnp.asarray(topo)), seen)
  assert all(np.isfinite(np.asarray(x)).all() for x in out.values())
  y = np.asarray(out["y"])
  assert ((y >= 0) & (y <= 1)).all() and (y[~np.asarray(seen)] == 1.0).all()
  p = _gmm_fit(jnp.asarray(topo[:32]))
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(p))


_gmm_fit = jax.jit(gmm.fit)


def _bayes_fn(key, logits, b_pos, b_neg):
  lu, lwp, lwn = gamma.gibbs_log(key, jnp.diagonal(logits), logits, b_pos=b_pos, b_neg=b_neg,
                                 neg_mask=~jnp.eye(N, dtype=bool))
  value, grad = jax.value_and_grad(lambda z: bayes.weighted_infonce(z, lwp, lwn, lwp, lwn)[0])(logits)
  return lu, lwp, value, grad


_bayes = jax.jit(_bayes_fn)


@pytest.mark.parametrize("weights", ["unit_prior", "paper"])
@pytest.mark.parametrize("kv,kt", PAIRS)
@SETTINGS
@given(seed=seeds, scale=scales)
def test_bayes_sampler_and_weighted_loss(kv, kt, weights, seed, scale):
  rng = np.random.default_rng(seed)
  logits = np.exp(scale) * (_rows(kv, rng) @ _rows(kt, rng).T)
  b_pos, b_neg = (6.0, 10.0) if weights == "unit_prior" else (0.0, 0.0)
  lu, lwp, value, grad = _bayes(jax.random.PRNGKey(seed % 1000), jnp.asarray(logits, jnp.float32),
                                jnp.float32(b_pos), jnp.float32(b_neg))
  assert np.isfinite(np.asarray(lu)).all() and np.isfinite(np.asarray(lwp)).all()
  _finite(value, grad)


_ac_vg = _value_and_grad(lambda xr, tr, xf, tf, s: ac.ac_loss(xr, tr, xf, tf, s)[0], 4)
_hac_vg = _value_and_grad(lambda xr, tr, xf, tf, s: ac.hac_loss(xr, tr, xf, tf, s, 1.0, lam=0.5)[0], 4)
_exp_map0 = jax.jit(lambda x: lorentz.exp_map0(3.0 * x, 1.0))


# AC / HAC: retain pairs (images, texts) and forget pairs, each side's rows of one kind
AC_CASES = ([("random", "random", "random")] + [(k, "random", "random") for k in DEGENERATE]
            + [("random", k, "random") for k in DEGENERATE] + [("random", "random", k) for k in DEGENERATE])


@pytest.mark.parametrize("kv,kt,kf", AC_CASES)
@SETTINGS
@given(seed=seeds, scale=scales)
def test_alignment_calibration(kv, kt, kf, seed, scale):
  rng = np.random.default_rng(seed)
  xr, tr, xf, tf = _rows(kv, rng), _rows(kt, rng), _rows(kf, rng), _rows(kf, rng)
  _check(_ac_vg, xr, tr, xf, tf, jnp.float32(scale))
  hyp = [_exp_map0(x) for x in (xr, tr, xf, tf)]
  # Distance logits -s * d_L cannot fold the scale into a matmul operand (ncjax.numerics.scaled_dot): past ~e^15
  # a fused multiply-add's unrounded product moves the log-sum-exp shift beyond exp's range. MERU caps s at 100.
  _check(_hac_vg, *hyp, jnp.float32(min(scale, 9.2)))


def test_a_batch_of_one():
  v = _rows("random", np.random.default_rng(0), n=1)
  _check(_value_and_grad(lambda v, t: contrastive.infonce(v, t, 2.0)[0], 2), v, v)
  forget, _ = ncu.select_forget(v, v, 2.0, 0.5)   # floor(0.5 * 1) = 0: nothing to forget
  assert not np.asarray(forget).any()
  _check(_value_and_grad(lambda v: ncu.unlearning(v, v, -v, 2.0, forget).loss
                         + ncu.prompt(v, v, -v, 2.0, forget).loss, 1), v)


def test_a_batch_of_one_per_device_sharded_equals_unsharded(devices):
  """Global batch 8 on 8 devices (one example each): every loss sees the whole batch, same values and gradients as
  unsharded (InfoNCE/SigLIP, NCU, AC, HAC, DisNCL, GSC's D x D form), and Bayes' Gibbs draws are the same under the mesh."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  rng = np.random.default_rng(1)
  v, t, tn = _rows("random", rng), _rows("duplicated_images", rng), _rows("identical", rng)
  shard = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))
  forget = jnp.asarray(_forget("half"))
  # HAC on distinct points: between identical points (t against itself) acosh's argument is 1 up to rounding, and
  # which side of MERU's clamp it lands on, slope 0 or up to 1e4, depends on the summation order, so a duplicate has
  # no gradient to compare across shardings (that it stays finite is test_alignment_calibration's property).
  hyp = [_exp_map0(_rows("random", rng)) for _ in range(4)]
  sim = jnp.asarray(v @ t.T)
  # HAC: Lorentz-distance logits of ~100 x d summed in another order on 8 devices; its loss is ~300 here, so the
  # float32 reduction-order differences reach ~2^-12 in gradients of order 1 (AC, on cosines: ~1e-6).
  for fn, args, atol in ((_contrastive_vg, (v, t, jnp.float32(4.6)), 1e-6),
                         (_ncu_vg, (v, t, tn, jnp.float32(4.6), forget), 1e-6),
                         (_ac_vg, (v, t, t, tn, jnp.float32(4.6)), 1e-5),
                         (_hac_vg, (*hyp, jnp.float32(4.6)), 1e-3),
                         (_disncl_vg, (sim, sim), 1e-6),
                         (_gsc_gram_vg, (v, t, jnp.linspace(0.2, 1.0, N)), 1e-6)):
    value, grads = fn(*args)
    value_sh, grads_sh = fn(*[shard(a) if a.ndim else a for a in map(jnp.asarray, args)])
    _finite(value_sh, grads_sh)
    np.testing.assert_allclose(value_sh, value, rtol=1e-5)
    for g, g_sh in zip(grads, grads_sh):
      np.testing.assert_allclose(g_sh, g, rtol=1e-4, atol=atol, err_msg=str(fn))
  # Bayesian CL under the mesh, as the trainer runs it: the Gibbs draws go device-local (shard_map, one key per
  # row), so the pair weights, and the weighted loss and its gradient, equal the unsharded ones.
  logits = jnp.asarray(np.exp(2.66) * (v @ t.T), jnp.float32)
  hyper = (jnp.float32(6.0), jnp.float32(10.0))
  plain = _bayes(jax.random.PRNGKey(3), logits, *hyper)
  with jax.set_mesh(mesh):
    sharded = jax.jit(_bayes_fn)(jax.random.PRNGKey(3), shard(logits), *hyper)
  for a, b in zip(plain, sharded):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def _disncl(s, target):
  margins = disncl.soft_margin(disncl.diagonal_confidence(s, 0.1))
  return (disncl.align_loss(s, margins)[0] + disncl.soft_loss(s, target, beta3=0.5, temperature=0.1)[0]
          + disncl.soft_infonce(s, jax.nn.sigmoid(target), temperature=0.1)[0])


_disncl_vg = _value_and_grad(_disncl, 1)


def test_truly_invalid_inputs_are_clear_errors():
  with pytest.raises(ValueError, match="square logit matrix"):
    contrastive.infonce_from_logits(np.zeros((2, 3)))
  with pytest.raises(ValueError, match="N retain and N forget pairs"):
    ac.ac_loss(np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 4)), 1.0)
  with pytest.raises(ValueError, match="mask shape"):
    KernelSinkhorn()(np.zeros((2, 3)), np.ones((3, 2), bool))
  with pytest.raises(ValueError, match="explicit epsilon"):
    OttSinkhorn(epsilon=0.0)(np.zeros((2, 2)), np.ones((2, 2), bool))

