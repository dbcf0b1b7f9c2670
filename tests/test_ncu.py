"""NCU: the methods.md §1.7 cross-check, masked-OT invariants, degenerate batches, and the method end to end."""

import math

import numpy as np
import jax
import pytest

from ncjax.losses import ncu
from ncjax.ot import masked_sinkhorn, masked_sinkhorn_with_info, reference_sinkhorn

LOGIT_SCALE = math.log(1 / 0.07)


def crosscheck_inputs():
  """methods.md §1.7: N=8, D=4."""
  i = np.arange(8)[:, None]
  d = np.arange(4)[None, :]
  v = np.cos(0.5 * i * d + i + 0.3 * d)
  t = v + 0.3 * np.sin(1.7 * i + d)
  for r in (2, 5):
    t[r] = np.cos(0.9 * r * np.arange(4) + 2.0)
  tn = -t + 0.5 * np.cos(i + 2 * d)  # from the un-normalised t
  norm = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
  return norm(v), norm(t), norm(tn)


def test_crosscheck_forget_selection():
  v, t, _ = crosscheck_inputs()
  forget, w = ncu.select_forget(v, t, LOGIT_SCALE, 0.25)
  np.testing.assert_allclose(np.asarray(w), [0.99937, 0.99995, 0.94818, 0.99851, 0.98493, 0.0, 0.99986, 0.99995],
                             atol=1e-5)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(forget)), [2, 5])


@pytest.mark.parametrize("solver,tol", [("ott", 1e-4), ("reference", 2e-6)])
def test_crosscheck_unlearning_loss(solver, tol):
  v, t, tn = crosscheck_inputs()
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, 0.25)
  loss, m = ncu.unlearning_loss(v, t, tn, LOGIT_SCALE, forget, kappa=0.7, epsilon=0.03, solver=solver)
  assert float(m["loss_img"]) == pytest.approx(2.677844, abs=tol)
  assert float(m["loss_txt"]) == pytest.approx(2.364622, abs=tol)
  assert float(m["loss_otr"]) == pytest.approx(2.521233, abs=tol)
  assert float(m["loss_sep"]) == pytest.approx(0.216589, abs=2e-6)
  assert float(loss) == pytest.approx(2.521233 + 0.216589, abs=tol)
  plan_v, plan_t = np.asarray(m["plan_img"]), np.asarray(m["plan_txt"])
  np.testing.assert_allclose(plan_v.sum(0), 1 / 9, atol=1e-7)          # column marginals exact
  np.testing.assert_allclose(plan_v.sum(1), 1 / 8, atol=1.5e-4)        # rows within tolerance
  assert np.abs(plan_t - plan_v.T).max() < 1e-4
  np.testing.assert_allclose(np.asarray(m["targets_txt"]).sum(1), [1, 1, 0.7, 1, 1, 0.7, 1, 1, 1.3], atol=1e-5)
  assert float(m["targets_img"][2, 8]) == pytest.approx(0.3 + 0.7 * plan_v[2, 8] / plan_v[2].sum(), abs=1e-6)
  if solver == "reference":  # the public loop's own iteration counts
    assert (int(m["sinkhorn_iterations_img"]), int(m["sinkhorn_iterations_txt"])) == (81, 91)


def test_transport_invariants():
  v, t, tn = crosscheck_inputs()
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, 0.25)
  _, m = ncu.unlearning_loss(v, t, tn, LOGIT_SCALE, forget)
  plan, mask = np.asarray(m["plan_img"]), np.asarray(m["mask"])
  assert (plan[~mask] == 0.0).all()                       # masked entries exactly zero
  f = np.asarray(forget)
  assert (plan[f, np.flatnonzero(f)] == 0.0).all()        # forget rows: no mass on their own text
  assert (plan[~f, 8] == 0.0).all()                       # retained rows: no mass on the negative column
  assert (plan[f, 8] > 0).all()


def test_max_normalised_cost_is_used():
  """Adding a constant to every similarity changes the plan: the cost is divided by its max."""
  v, t, tn = crosscheck_inputs()
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, 0.25)
  s = np.asarray(ncu.extended_similarity(v, t, tn))
  mask = np.asarray(ncu.transport_mask(forget))
  a, b = np.full(8, 1 / 8, np.float32), np.full(9, 1 / 9, np.float32)
  c1 = (1 - s) / (1 - s).max()
  p_norm = np.asarray(masked_sinkhorn(c1, mask, a, b, epsilon=0.03, max_iterations=500, threshold=1e-7))
  _, m = ncu.unlearning_loss(v, t, tn, LOGIT_SCALE, forget, max_iterations=500, threshold=1e-9)
  np.testing.assert_allclose(np.asarray(m["plan_img"]), p_norm, atol=2e-5)
  p_raw = np.asarray(masked_sinkhorn(1 - s, mask, a, b, epsilon=0.03, max_iterations=500, threshold=1e-7))
  assert np.abs(p_raw - p_norm).max() > 1e-3


def test_ott_and_reference_agree_when_converged():
  rng = np.random.default_rng(0)
  cost = rng.uniform(size=(12, 13)).astype(np.float32)
  mask = rng.uniform(size=(12, 13)) > 0.3
  mask[np.arange(12), np.arange(12)] = True
  mask[:, 12] = True
  a, b = np.full(12, 1 / 12, np.float32), np.full(13, 1 / 13, np.float32)
  p_ott = masked_sinkhorn(cost, mask, a, b, epsilon=0.05, max_iterations=2000, threshold=1e-7)
  p_ref, _ = reference_sinkhorn(cost, mask, a, b, epsilon=0.05, max_iterations=2000, threshold=1e-9)
  np.testing.assert_allclose(np.asarray(p_ott), np.asarray(p_ref), atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_masked_sinkhorn_no_nan_for_sparse_masks(seed):
  rng = np.random.default_rng(seed)
  n = 10
  cost = rng.uniform(size=(n, n + 1)).astype(np.float32)
  mask = np.zeros((n, n + 1), bool)
  mask[np.arange(n), rng.permutation(n + 1)[:n]] = True   # one allowed entry per row
  mask[rng.integers(0, n), n] = True
  if seed % 2:
    mask |= rng.uniform(size=mask.shape) > 0.8
  plan, info = masked_sinkhorn_with_info(cost, mask, epsilon=0.03)
  plan = np.asarray(plan)
  assert np.isfinite(plan).all() and (plan[~mask] == 0.0).all() and (plan >= 0).all()


def test_masked_sinkhorn_requires_explicit_epsilon():
  with pytest.raises(ValueError, match="explicit epsilon"):
    masked_sinkhorn_with_info(np.ones((2, 2)), np.ones((2, 2), bool), epsilon=None)


def _random_batch(n=16, d=8, seed=0, identical=False):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(3, n, d)).astype(np.float32)
  if identical:
    x[:] = x[:, :1]
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  return x[0], x[1], x[2]


@pytest.mark.parametrize("case", ["empty", "full", "identical", "zero"])
def test_degenerate_batches_give_finite_losses_and_gradients(case):
  v, t, tn = _random_batch(identical=(case == "identical"))
  if case == "zero":
    v = np.zeros_like(v)
  ratio = {"empty": 0.0, "full": 1.0}.get(case, 0.25)
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, ratio)
  assert int(np.sum(forget)) == int(np.floor(ratio * 16))

  def total(v, t, tn):
    l1, _ = ncu.unlearning_loss(v, t, tn, LOGIT_SCALE, forget)
    l2, _ = ncu.prompt_loss(v, t, tn, LOGIT_SCALE, forget)
    return l1 + l2

  value, grads = jax.value_and_grad(total, argnums=(0, 1, 2))(v, t, tn)
  assert np.isfinite(float(value))
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_prompt_loss_uses_only_retained_pairs_and_matches_subset():
  v, t, tn = _random_batch(n=12, seed=3)
  forget = np.zeros(12, bool)
  forget[[1, 4, 7]] = True
  full, m = ncu.prompt_loss(v, t, tn, 2.0, forget)
  keep = ~forget
  sub, _ = ncu.prompt_loss(v[keep], t[keep], tn[keep], 2.0, np.zeros(keep.sum(), bool))
  assert float(full) == pytest.approx(float(sub), rel=1e-5)
  # Hand restatement of the public code's terms on the subset.
  vs, ts, tns = v[keep], t[keep], tn[keep]
  b = len(vs)
  msign = 2 * np.eye(b) - 1
  s = np.exp(2.0)
  logsig = lambda x: -np.logaddexp(0, -x)
  yes = -np.sum(logsig(msign * s * (vs @ ts.T))) / b
  no = -np.sum(logsig(-msign * s * (vs @ tns.T))) / b
  rel = 10 * np.sum((ts @ ts.T - tns @ tns.T) ** 2) / b
  c = np.sum(ts * tns, 1)
  sep = 10 * np.mean(np.maximum(c + 0.2, 0) + np.maximum(-0.7 - c, 0))
  assert float(full) == pytest.approx(yes + no + rel + sep, rel=1e-5)
  paper, _ = ncu.prompt_loss(v, t, tn, 2.0, forget, rel="paper")
  assert float(paper) != pytest.approx(float(full))


def test_forget_score_mean_and_text_target_normalisation_options():
  v, t, tn = crosscheck_inputs()
  row = np.asarray(ncu.clean_confidence(v, t, LOGIT_SCALE, "row"))
  mean = np.asarray(ncu.clean_confidence(v, t, LOGIT_SCALE, "mean"))
  assert not np.allclose(row, mean)
  forget, _ = ncu.select_forget(v, t, LOGIT_SCALE, 0.25)
  _, m = ncu.unlearning_loss(v, t, tn, LOGIT_SCALE, forget, normalize_text_targets=True)
  np.testing.assert_allclose(np.asarray(m["targets_txt"]).sum(1), 1.0, atol=1e-5)
  l_sum, ms = ncu.unlearning_loss(v, t, tn, LOGIT_SCALE, forget, combine="sum")
  assert float(ms["loss_otr"]) == pytest.approx(float(ms["loss_img"] + ms["loss_txt"]), rel=1e-6)


# --- the method, end to end on digits -----------------------------------------------------------------------------
from helpers import make_config, tiny_clip_config  # noqa: E402
from ncjax import train  # noqa: E402


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("clip")
  train.train(tiny_clip_config(total_steps=3), str(workdir))
  return str(workdir)


def ncu_config(init, **kw):
  return make_config("ncu", f"init={init},batch=64,epochs=2,epochs_prompt=1",
                     **{"method.frozen_text_blocks": 1, **kw})


def _leaves(tree):
  import jax as _jax
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in _jax.tree_util.tree_flatten_with_path(_jax.device_get(tree))[0]}


def test_ncu_stages_train_and_freeze_the_right_groups(clip_run, tmp_path):
  cfg = ncu_config(clip_run)
  trainer = train.Trainer(cfg, str(tmp_path))
  spe = trainer.exp.steps_per_epoch
  init = _leaves(trainer.init_params())
  clip_params = _leaves(train.ckpt_lib.restore_params(clip_run)[0])
  for k, v in clip_params.items():   # the model starts from the CLIP checkpoint
    np.testing.assert_array_equal(init[k], v)
  after_prompt = _leaves(trainer.run(until=spe).params)
  changed = {k for k in init if not np.array_equal(init[k], after_prompt[k])}
  assert "prompt/ctx" in changed
  assert not {k for k in changed if k.startswith("model/img/")}           # image tower frozen in stage 1
  assert any(k.startswith("model/txt/") for k in changed)                 # text tower trains (public code)
  done = _leaves(train.train(cfg, str(tmp_path)).params)                  # resumes into stage 2
  changed2 = {k for k in done if not np.array_equal(after_prompt[k], done[k])}
  assert "prompt/ctx" not in changed2
  assert not {k for k in changed2 if k.startswith(("model/txt/transformer/block_0/", "model/txt/pos_embedding"))}
  assert any(k.startswith("model/txt/transformer/block_1/") for k in changed2)
  assert any(k.startswith("model/img/") for k in changed2)
  assert 0.0 <= float(done["model/logit_scale"]) <= math.log(100) + 1e-6


def test_ncu_step_on_8_devices_equals_step_on_1(clip_run, tmp_path, devices):
  cfg = ncu_config(clip_run, total_steps=2)
  eight = train.train(cfg, str(tmp_path / "8"))
  one = train.train(cfg, str(tmp_path / "1"), devices=devices[:1])
  a, b = _leaves(eight.params), _leaves(one.params)
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=5e-5, err_msg=k)


def test_gradient_ascent_baseline_runs_and_records_forget_sets(clip_run, tmp_path):
  cfg = ncu_config(clip_run, total_steps=2, **{"method.name": "ncu_ga"})
  res = train.train(cfg, str(tmp_path))
  assert np.isfinite(res.metrics["loss"]) and res.metrics["loss_ascent"] <= 0
  st = jax.device_get(res.state["method_state"])
  assert st["forgotten"].sum() == int(np.floor(0.4 * 64)) * 2   # two batches, 25 forgotten each
