"""Linear probe, CLIP paper protocol (Radford et al. 2021, App. A.3; as MERU's evaluator runs it).

Multinomial logistic regression on frozen, un-normalised, pre-projection image features, fitted with L-BFGS
(optax) in JAX. The L2 strength is swept on a validation split: the coarse grid C in {1e-6, 1e-4, ..., 1e6}, then a
binary search of 4 steps, each trying best/delta and best*delta with delta = 10, 10^(1/2), 10^(1/4), 10^(1/8); a
candidate must beat the current best strictly. The classifier is refitted on train + val with the chosen C and
evaluated on test (top-1 and mean per-class recall).

Objective: sum_i CE(W x_i + b, y_i) + ||W||^2 / (2C), the same minimiser as scikit-learn's LogisticRegression(C)
(intercept not penalised). We minimise it divided by n for conditioning. `protocol='sklearn'` runs the same sweep
with scikit-learn instead (the parity reference).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

from ncjax.evals import common
from ncjax.evals.base import Evaluator, register

COARSE_GRID = (1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6)
BINARY_STEPS = 4


@functools.partial(jax.jit, static_argnames=("num_classes", "max_iter"))
def _fit(x, y, inv_c, num_classes: int, max_iter: int = 1000, tol: float = 1e-6):
  n, d = x.shape
  onehot = jax.nn.one_hot(y, num_classes)

  def objective(params):
    logits = x @ params["w"] + params["b"]
    ce = -jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1)
    return jnp.mean(ce) + 0.5 * inv_c * jnp.sum(params["w"] ** 2) / n

  opt = optax.lbfgs()
  value_and_grad = optax.value_and_grad_from_state(objective)
  init = dict(w=jnp.zeros((d, num_classes), jnp.float32), b=jnp.zeros((num_classes,), jnp.float32))

  def step(carry):
    params, state = carry
    value, grad = value_and_grad(params, state=state)
    updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=objective)
    return optax.apply_updates(params, updates), state

  def keep_going(carry):
    _, state = carry
    it = otu.tree_get(state, "count")
    grad = otu.tree_get(state, "grad")
    return (it == 0) | ((it < max_iter) & (otu.tree_norm(grad) >= tol))

  params, _ = jax.lax.while_loop(keep_going, step, (init, opt.init(init)))
  return params


def fit(x, y, c: float, num_classes: int, max_iter: int = 1000):
  x = jnp.asarray(x, jnp.float32)
  return _fit(x, jnp.asarray(y, jnp.int32), jnp.asarray(1.0 / c, jnp.float32), num_classes, max_iter)


def predict(params, x) -> np.ndarray:
  return np.asarray(jnp.argmax(jnp.asarray(x, jnp.float32) @ params["w"] + params["b"], axis=-1))


def _accuracy(pred, y):
  return float(np.mean(pred == y))


def mean_per_class(pred, y):
  return float(np.mean([np.mean(pred[y == k] == k) for k in np.unique(y)]))


def _fit_score_jax(num_classes):
  def run(xtr, ytr, xev, yev, c):
    return _accuracy(predict(fit(xtr, ytr, c, num_classes), xev), yev)
  return run


def _fit_score_sklearn(xtr, ytr, xev, yev, c):
  from sklearn.linear_model import LogisticRegression
  clf = LogisticRegression(C=c, max_iter=1000, random_state=0)
  clf.fit(xtr, ytr)
  return _accuracy(clf.predict(xev), yev)


def sweep(fit_score, xtr, ytr, xval, yval) -> dict:
  """The C search; returns the chosen C, the best coarse grid point and every score tried."""
  tried = {}

  def score(c):
    if c not in tried:
      tried[c] = fit_score(xtr, ytr, xval, yval, c)
    return tried[c]

  best = COARSE_GRID[0]
  for c in COARSE_GRID:
    if score(c) > score(best):
      best = c
  coarse_best = best
  delta = 10.0
  for _ in range(BINARY_STEPS):
    for cand in (best / delta, best * delta):
      if score(cand) > score(best):
        best = cand
    delta = math.sqrt(delta)
  return dict(c=best, coarse_c=coarse_best, val_acc=score(best), tried=tried)


def linear_probe(train_x, train_y, val_x, val_y, test_x, test_y, num_classes: int | None = None,
                 protocol: str = "jax") -> dict:
  """The full protocol; returns test top-1, mean per-class recall, the chosen C and the coarse grid point."""
  train_y, val_y, test_y = (np.asarray(a, np.int64) for a in (train_y, val_y, test_y))
  k = int(num_classes or max(train_y.max(), val_y.max(), test_y.max()) + 1)
  if protocol == "jax":
    fit_score = _fit_score_jax(k)
  elif protocol == "sklearn":
    fit_score = _fit_score_sklearn
  else:
    raise ValueError(f"unknown linear-probe protocol {protocol!r}; expected 'jax' or 'sklearn'")
  chosen = sweep(fit_score, train_x, train_y, val_x, val_y)
  all_x = np.concatenate([train_x, val_x])
  all_y = np.concatenate([train_y, val_y])
  if protocol == "jax":
    pred = predict(fit(all_x, all_y, chosen["c"], k), test_x)
  else:
    from sklearn.linear_model import LogisticRegression
    pred = LogisticRegression(C=chosen["c"], max_iter=1000, random_state=0).fit(all_x, all_y).predict(test_x)
  return dict(lp_acc1=_accuracy(pred, test_y), lp_mean_per_class_recall=mean_per_class(pred, test_y),
              C=chosen["c"], coarse_C=chosen["coarse_c"], val_acc=chosen["val_acc"])


def train_val_split(n: int, val_fraction: float = 0.2):
  """MERU's convention for datasets without an official val split: train[:80%] / train[80%:]."""
  cut = int(round(n * (1 - val_fraction)))
  return np.arange(cut), np.arange(cut, n)


@register("linear_probe")
class LinearProbe(Evaluator):
  """The CLIP-paper linear probe on pre-projection image features.

  Args:
    train_split: the split the classifier is fitted on ('train'); `split` is the test split.
    val_fraction: the part of train_split held out to choose C.
    protocol: 'jax' (optax L-BFGS) or 'sklearn' (the parity reference).
    dataset, split: see Evaluator.
  """
  task = "linear_probe"

  def __init__(self, context, *, train_split: str = "train", val_fraction: float = 0.2, protocol: str = "jax",
               dataset: str = "", split: str = "test", data_dir: str = ""):
    super().__init__(context, dataset=dataset, split=split, data_dir=data_dir)
    if protocol not in ("jax", "sklearn"):
      raise ValueError(f"linear_probe protocol must be 'jax' or 'sklearn', got {protocol!r}")
    self.train_split, self.val_fraction, self.protocol = train_split, float(val_fraction), protocol

  def check(self):
    for name in (self.train_split, self.split):
      if self.data(name).image_labels is None:
        raise ValueError(f"{self.data(name).name} has no class labels: a linear probe needs them")

  def run(self, eval_model) -> dict:
    if eval_model.image_features is None:
      raise ValueError("this model exposes no pre-projection image features for a linear probe")
    ctx = self.context
    train = self.data(self.train_split)
    test = self.data(self.split)
    feats = {k: common.image_features(eval_model, self.images(sp), self.batch_size, ctx.mesh)
             for k, sp in (("train", train), ("test", test))}
    tr_idx, val_idx = train_val_split(len(feats["train"]), self.val_fraction)
    y = train.image_labels
    return linear_probe(feats["train"][tr_idx], y[tr_idx], feats["train"][val_idx], y[val_idx],
                        feats["test"], test.image_labels, len(train.class_names) or None, protocol=self.protocol)
