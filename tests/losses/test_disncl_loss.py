"""DisNCL's pieces (ncjax.losses.disncl) against hand values and independent restatements (methods.md §5)."""

import math

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from ncjax.losses import disncl as L


def _log_softmax(x, axis):
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def test_filtration_keeps_pairs_that_win_their_row_and_column():
  s = np.array([[0.9, 0.1, 0.2],
                [0.3, 0.8, 0.95],    # row 1's argmax is caption 2: pair 1 is dropped
                [0.1, 0.2, 0.7]])    # column 2's argmax is image 1: pair 2 is dropped
  np.testing.assert_array_equal(np.asarray(L.filtration(s)), [True, False, False])
  np.testing.assert_array_equal(np.asarray(L.filtration(np.eye(4) + 0.1)), [True] * 4)
  # ties: the lowest index wins, so a constant matrix keeps only its first pair (never NaN, never all)
  np.testing.assert_array_equal(np.asarray(L.filtration(np.ones((3, 3)))), [True, False, False])


@pytest.mark.parametrize("y,expected", [
    (0.5, dict(constant=0.2, linear=0.1, exponential=0.2 * (10 ** 0.5 - 1) / 9, sin=0.1, l2rm=0.1)),
    (0.8, dict(constant=0.2, linear=0.16, exponential=0.2 * (10 ** 0.8 - 1) / 9,
               sin=0.2 * (math.sin(math.pi * 0.8 - math.pi / 2) / 2 + 0.5), l2rm=0.2 / (1 + (0.8 / 0.2) ** -2))),
    (1.0, dict(constant=0.2, linear=0.2, exponential=0.2, sin=0.2, l2rm=0.2)),
    (0.0, dict(constant=0.2, linear=0.0, exponential=0.0, sin=0.0, l2rm=0.0))])
def test_soft_margins_match_ncr_and_l2rm_formulas(y, expected):
  # NCR: linear m y, exponential m (10^y - 1) / 9, sin m (sin(pi y - pi/2) / 2 + 1/2); L2RM's s_adaptive:
  # m / (1 + (p / (1 - p))^-2). Hand values: exponential(0.5) = 0.048051, l2rm(0.8) = 0.188235.
  for kind, value in expected.items():
    got = float(L.soft_margin(jnp.float32(y), 0.2, kind))
    assert got == pytest.approx(value, abs=1e-6), kind
  assert float(L.soft_margin(0.5, 0.2, "exponential")) == pytest.approx(0.048051, abs=1e-6)
  assert float(L.soft_margin(0.8, 0.2, "l2rm")) == pytest.approx(0.188235, abs=1e-6)
  with pytest.raises(ValueError, match="unknown margin kind 'cubic'"):
    L.soft_margin(0.5, 0.2, "cubic")


def _align_reference(s, alpha, keep):
  """Eq. (3) as a loop: hardest negative caption of image i, hardest negative image of caption i."""
  b, total = len(s), 0.0
  for i in range(b):
    if not keep[i]:
      continue
    neg_caption = max(s[i, j] for j in range(b) if j != i)
    neg_image = max(s[j, i] for j in range(b) if j != i)
    total += max(0.0, alpha[i] - s[i, i] + neg_caption) + max(0.0, alpha[i] - s[i, i] + neg_image)
  return total


def test_align_loss_is_the_hardest_negative_hinge_over_the_kept_pairs():
  s = np.array([[0.8, 0.5, 0.1], [0.7, 0.6, 0.2], [0.3, 0.65, 0.9]], np.float32)
  alpha = np.array([0.2, 0.3, 0.1], np.float32)
  keep = np.array([True, True, False])
  loss, m = L.align_loss(s, alpha, keep)
  # pair 0: [0.2-0.8+0.5]+ + [0.2-0.8+0.7]+ = 0.1; pair 1: [0.3-0.6+0.7]+ + [0.3-0.6+0.65]+ = 0.75
  assert float(loss) == pytest.approx(0.85, abs=1e-6)
  assert float(loss) == pytest.approx(_align_reference(s, alpha, keep), abs=1e-6)
  assert float(m["kept_fraction"]) == pytest.approx(2 / 3)
  mean, _ = L.align_loss(s, alpha, keep, reduction="mean")
  assert float(mean) == pytest.approx(0.425, abs=1e-6)
  rng = np.random.default_rng(0)
  s = rng.normal(size=(7, 7)).astype(np.float32)
  alpha = rng.uniform(0, 0.3, 7).astype(np.float32)
  keep = rng.random(7) < 0.6
  assert float(L.align_loss(s, alpha, keep)[0]) == pytest.approx(_align_reference(s, alpha, keep), abs=1e-5)
  # 'all' negatives: every off-diagonal hinge of the row and of the column
  ref = sum(max(0, alpha[i] - s[i, i] + s[i, j]) + max(0, alpha[i] - s[i, i] + s[j, i])
            for i in range(7) if keep[i] for j in range(7) if j != i)
  assert float(L.align_loss(s, alpha, keep, negatives="all")[0]) == pytest.approx(ref, abs=1e-4)


def _infonce_reference(s):
  return (-np.mean(np.diag(_log_softmax(s, 1))) - np.mean(np.diag(_log_softmax(s, 0)))) / 2


def test_soft_loss_with_beta3_one_is_hard_target_infonce_whatever_the_target():
  rng = np.random.default_rng(1)
  s = rng.normal(size=(6, 6)).astype(np.float32)
  for target in (rng.normal(size=(6, 6)), np.zeros((6, 6)), 10 * rng.normal(size=(6, 6))):
    loss, _ = L.soft_loss(s, target.astype(np.float32), beta3=1.0, temperature=0.5)
    assert float(loss) == pytest.approx(_infonce_reference(s / 0.5), rel=1e-5)
  # and equals ncjax's own symmetric InfoNCE on the same logits
  from ncjax.losses import contrastive
  ref, _ = contrastive.infonce_from_logits(jnp.asarray(s / 0.5))
  assert float(L.soft_loss(s, s, beta3=1.0, temperature=0.5)[0]) == pytest.approx(float(ref), rel=1e-5)


def test_soft_loss_bootstrapped_targets_hand_restatement_and_no_gradient_into_the_target():
  rng = np.random.default_rng(2)
  s = rng.normal(size=(5, 5)).astype(np.float32)
  t = rng.normal(size=(5, 5)).astype(np.float32)
  tau, beta3 = 0.2, 0.5
  y_row = beta3 * np.eye(5) + (1 - beta3) * np.exp(_log_softmax(t / tau, 1))
  y_col = beta3 * np.eye(5) + (1 - beta3) * np.exp(_log_softmax(t / tau, 0))
  ref = (-np.mean(np.sum(y_row * _log_softmax(s / tau, 1), 1))
         - np.mean(np.sum(y_col * _log_softmax(s / tau, 0), 0))) / 2
  assert float(L.soft_loss(s, t, beta3=beta3, temperature=tau)[0]) == pytest.approx(ref, rel=1e-5)
  g = jax.grad(lambda tt: L.soft_loss(s, tt, beta3=beta3, temperature=tau)[0])(jnp.asarray(t))
  assert float(jnp.abs(g).max()) == 0.0


def test_l2rm_soft_infonce_with_identity_labels_is_both_directions_of_infonce():
  rng = np.random.default_rng(3)
  s = rng.normal(size=(4, 4)).astype(np.float32)
  loss, _ = L.soft_infonce(s, np.eye(4, dtype=np.float32), temperature=0.1)
  assert float(loss) == pytest.approx(2 * _infonce_reference(s / 0.1), rel=1e-4)


def test_jsd_estimator_optimum_value_and_sign():
  # Two outcomes with joint P and product Q. A 2 x 2 score matrix represents them: the diagonal carries P's
  # outcomes (weights p), the off-diagonal Q's (weights q). At T = log(p / q) the estimator reaches its supremum
  # 2 JSD(P || Q) - 2 log 2, with zero gradient; any other T is lower.
  p, q = np.array([0.8, 0.2]), np.array([0.3, 0.7])

  def value(t):
    scores = jnp.array([[t[0], t[0]], [t[1], t[1]]])
    return L.jsd_mi(scores, weights_joint=jnp.diag(jnp.asarray(p)), weights_marginal=jnp.array([[0, q[0]], [q[1], 0]]))

  t_star = jnp.asarray(np.log(p / q), jnp.float32)
  m = (p + q) / 2
  jsd = 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
  assert float(value(t_star)) == pytest.approx(2 * jsd - 2 * math.log(2), abs=1e-6)
  assert float(jnp.abs(jax.grad(value)(t_star)).max()) < 1e-6
  for delta in ([0.3, 0.0], [0.0, -0.5], [1.0, 1.0]):
    assert float(value(t_star + jnp.asarray(delta))) < float(value(t_star))
  # sign: uninformative scores give -2 log 2 (the floor of independence); separating the diagonal raises it
  assert float(L.jsd_mi(jnp.zeros((4, 4)))) == pytest.approx(-2 * math.log(2), abs=1e-6)
  assert float(L.jsd_mi(5 * jnp.eye(4) - 5 * (1 - jnp.eye(4)))) > -0.02


def test_gaussian_kl_bound_equals_the_closed_form_kl_of_unit_covariance_gaussians():
  rng = np.random.default_rng(4)
  a, b = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
  k = 5
  per_pair = []
  # KL(N0 || N1) = (tr(S1^-1 S0) + (mu1-mu0)^T S1^-1 (mu1-mu0) - k + ln det S1/det S0) / 2
  for mu0, mu1 in zip(a, b):
    s0 = s1 = np.eye(k)
    d = mu1 - mu0
    per_pair.append(0.5 * (np.trace(np.linalg.solve(s1, s0)) + d @ np.linalg.solve(s1, d) - k
                           + np.log(np.linalg.det(s1) / np.linalg.det(s0))))
  assert float(L.gaussian_kl_bound(a.astype(np.float32), b.astype(np.float32))) == pytest.approx(np.mean(per_pair),
                                                                                                 rel=1e-5)


def test_disentangle_and_adversary_losses_combine_the_terms_as_eqs_4_to_8():
  t = L.DisentangleTerms(*[jnp.float32(v) for v in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)])
  loss, m = L.disentangle_loss(t, gamma=0.5, beta1=0.1, beta2=0.1)
  l_s = -(0.1 + 0.2) + 0.1 * 0.3
  l_x = -(0.4 + 0.5) + 1.1 * (0.6 + 0.7)
  assert float(loss) == pytest.approx(0.5 * l_s + 0.5 * l_x + (0.8 + 0.9), abs=1e-6)
  assert float(m["l_reg"]) == pytest.approx(1.7, abs=1e-6)
  adv, _ = L.adversary_loss(t)
  assert float(adv) == pytest.approx(-(0.6 + 0.7 + 0.8 + 0.9), abs=1e-6)


@pytest.mark.parametrize("s", [np.zeros((4, 4)), np.ones((4, 4)), np.full((1, 1), 0.3),
                               np.array([[1e4, -1e4], [-1e4, 1e4]])])
def test_degenerate_similarities_give_finite_losses_and_gradients(s):
  s = jnp.asarray(s, jnp.float32)

  def total(x):
    keep = L.filtration(x)
    margins = L.soft_margin(L.diagonal_confidence(x, 0.1), 0.2)
    return L.align_loss(x, margins, keep)[0] + L.soft_loss(x, x, beta3=0.5, temperature=0.1)[0] + L.jsd_mi(x)

  value, grad = jax.value_and_grad(total)(s)
  assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))


def test_the_warmup_hinge_averages_each_row_over_all_b_columns_as_ncr_does():
  """NCR / MSCN's warm-up (the public code DisNCL's group builds on): cost_s = relu(margin + S - diag[:, None]) and
  cost_im = relu(margin + S - diag[None, :]) with the diagonal zeroed, then cost_s.mean(1) + cost_im.mean(0) — the
  mean over all B columns, the zero diagonal included — summed over the batch (restated in float64 here; until
  2026-11-25 ncjax divided by B - 1, which this tells apart)."""
  from ncjax.losses import disncl as L
  rng = np.random.default_rng(4)
  b, margin = 6, 0.2
  s = rng.normal(0, 0.4, (b, b))
  diag = np.diag(s)
  cost_s = np.maximum(margin + s - diag[:, None], 0) * (1 - np.eye(b))
  cost_im = np.maximum(margin + s - diag[None, :], 0) * (1 - np.eye(b))
  expected = (cost_s.mean(1) + cost_im.mean(0)).sum()
  loss, _ = L.align_loss(np.float32(s), margin, negatives="all_mean")
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  assert abs(expected * b / (b - 1) - expected) > 1e-2
