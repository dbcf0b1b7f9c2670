"""GSC, GSC+ and Bayesian CL as methods: exact resume of per-sample state, sharding, co-teaching."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from helpers import assert_trees_equal as _tree_equal, make_config
from ncjax import train


def _method_config(name, arg, **kw):
  return make_config(name, arg, **kw)


@pytest.mark.parametrize("name,arg", [
    # GSC's resume (per-sample labels, the epoch hook) is also checked by the fault-injection trials. warmup=0: the
    # first label update runs at the end of epoch 0, inside the steps run here.
    pytest.param("gsc", "batch=128,epochs=2,warmup=0", marks=pytest.mark.slow),
    pytest.param("gsc", "batch=128,epochs=2,coteach=true,warmup=0", marks=pytest.mark.slow),
    # The u moving average rides in method state like any other; the trainer's resume test covers the mechanism.
    pytest.param("bayes", "batch=128,epochs=2,u_momentum=0.5", marks=pytest.mark.slow)])
def test_method_state_survives_resume_exactly(name, arg, tmp_path):
  spe = 1438 // 128
  cfg = _method_config(name, arg, total_steps=spe + 3)   # crosses the first epoch end (a label update)
  full = train.train(cfg, str(tmp_path / "full"))
  assert full.experiment.steps_per_epoch == spe
  train.train(cfg, str(tmp_path / "resumed"), until=spe + 1)   # stops in the second epoch, after the update
  resumed = train.train(cfg, str(tmp_path / "resumed"))
  _tree_equal(full.state["method_state"], resumed.state["method_state"])
  _tree_equal(full.params, resumed.params)
  if name == "gsc":
    st = jax.device_get(full.state["method_state"])
    for net in (st[name] for name in full.experiment.method.nets):   # besides last_seen and the epoch counter
      y = np.asarray(net["y"])[:full.experiment.train_data.num_examples]
      assert (y < 1.0).any() and (y >= 0).all()   # the epoch-end update ran and moved the labels


@pytest.mark.parametrize("name,arg", [
    ("gsc", "batch=64,epochs=1"),
    pytest.param("gsc", "batch=64,epochs=1,coteach=true", marks=pytest.mark.slow),
    # make test keeps GSC's (per-sample state, epoch hook); Bayes' sharded Gibbs draws are checked per row in
    # tests/samplers and on one example per device in tests/test_degenerate_properties.py
    pytest.param("bayes", "batch=64,epochs=1", marks=pytest.mark.slow)])
def test_steps_on_8_devices_equal_steps_on_1(name, arg, tmp_path, devices):
  cfg = _method_config(name, arg, total_steps=2, **{"ckpt.save_at_end": False})   # compared in memory
  eight = train.train(cfg, str(tmp_path / "8"))
  one = train.train(cfg, str(tmp_path / "1"), devices=devices[:1])
  for x, y in zip(jax.tree.leaves(jax.device_get(eight.params)), jax.tree.leaves(jax.device_get(one.params))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=5e-5)
  n = eight.experiment.train_data.num_examples   # state is padded to the device count (1440 vs 1438)
  for x, y in zip(jax.tree.leaves(jax.device_get(eight.state["method_state"])),
                  jax.tree.leaves(jax.device_get(one.state["method_state"]))):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    if x.ndim:  # per-example arrays (padded); scalars (GSC's epoch counter) compare as they are
      x, y = x[:n], y[:n]
    np.testing.assert_allclose(x, y, atol=5e-5)


def test_coteaching_uses_the_peers_labels_and_evaluates_both_networks(tmp_path):
  """GSC+'s training step, once, from its initial state with net_b's labels set to 0: net_a, weighted by its
  peer's labels, has no cross-modal loss, net_b (net_a's labels, all 1) has one; each network has its own update
  (optimiser state, gradient clipping). Evaluation averages the two networks' scores."""
  from ncjax.methods.gsc import GSC
  cfg = _method_config("gsc", "batch=64,epochs=1,coteach=true", total_steps=1)
  trainer = train.Trainer(cfg, str(tmp_path))
  method, (span,) = trainer.exp.method, trainer.spans
  assert isinstance(method, GSC) and method.nets == ("net_a", "net_b")
  # One update per network: its own optimiser state and gradient clipping (GSC+'s two Adam optimisers).
  assert [u.name for u in span.stage.updates] == ["net_a", "net_b"]
  state = trainer.init_state(span)
  assert set(state["opt_state"]) == {"net_a", "net_b"}
  labels = state["method_state"]["net_b"]["y"]
  state["method_state"]["net_b"]["y"] = jax.device_put(jnp.zeros_like(labels), labels.sharding)
  batch, _ = trainer.exp.train_data.global_batch(0)
  with jax.set_mesh(trainer.exp.mesh):   # the trainer's own compiled step, as its loop calls it
    new, metrics = trainer.program(span).step(state, batch)
  assert {"net_a/grad_norm", "net_b/grad_norm", "net_a/loss", "net_b/loss"} <= set(metrics)
  assert float(metrics["net_a/loss_cm"]) == 0.0 and float(metrics["net_b/loss_cm"]) > 0.0
  images, tokens = np.asarray(batch["image"])[:8], np.asarray(batch["tokens"])[:8]

  @jax.jit
  def both(params):
    em = method.eval_model(params)
    mods = method.bind(params)
    averaged = em.score(em.encode_image(images), em.encode_text(tokens))
    expected = 0.5 * sum(n.score(n.encode_image(images), n.encode_text(tokens)) for n in (mods.net_a, mods.net_b))
    return averaged, expected

  averaged, expected = both(new["params"])
  np.testing.assert_allclose(np.asarray(averaged), np.asarray(expected), atol=1e-5)
