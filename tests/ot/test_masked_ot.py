"""Masked entropic OT: ott-jax and the public loop agree, no NaN on sparse masks, explicit epsilon."""

import numpy as np
import pytest

from ncjax.ot import masked_sinkhorn, masked_sinkhorn_with_info, reference_sinkhorn


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
