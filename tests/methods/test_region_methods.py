"""SGRAF, GSC on SGRAF and DisNCL train from NCR-layout precomp files and evaluate; DisNCL sharded == unsharded."""

import json
import os

import numpy as np
import jax
import pytest

import recompute
from helpers import make_config
from ncjax import evaluation, train

TINY = {"model.region.feature_dim": 64, "model.region.word_dim": 8, "model.region.sim_dim": 8,
        "model.embed_dim": 16}


@pytest.fixture(scope="module")
def ncr_precomp(tmp_path_factory):
  """The synthetic region data written in NCR's layout ({split}_ims.npy, {split}_caps.txt, 5 captions per image)
  and built with the precomp builder, as a user's F30K precomp directory would be."""
  from ncjax.data.embedded import precomp_synthetic
  from ncjax.data.tables import builders as tfds_builders
  root = tmp_path_factory.mktemp("ncr")
  precomp_synthetic.write_ncr_layout(str(root / "f30k_precomp"), dict(train=8, dev=4, test=4))
  assert sorted(os.listdir(root / "f30k_precomp")) == ["dev_caps.txt", "dev_ims.npy", "test_caps.txt",
                                                       "test_ims.npy", "train_caps.txt", "train_ims.npy"]
  tfds_builders.build("precomp", "f30k_precomp", str(root / "f30k_precomp"), str(root / "tfds"))
  return str(root / "tfds")


@pytest.mark.parametrize("name,arg,extra", [
    # the small presets (on a user's precomp data the default is the public code's full-size recipe)
    pytest.param("sgraf", "setting=synthetic,batch=8,epochs=1", {"loss.all_negatives_epochs": 1},
                 marks=pytest.mark.slow),
    # GSC's label machinery is the two-tower one (tested there); its SGRAF structures are tested in
    # tests/models/test_sgraf_model.py.
    pytest.param("gsc", "backbone=sgraf,setting=digits,batch=8,epochs=2,warmup=0", {}, marks=pytest.mark.slow),
    # make test-all (41 s); make test steps DisNCL in test_disncl_reconstructed_pieces_... and test_recipes.py
    pytest.param("disncl", "setting=synthetic,batch=8,epochs=1,warmup=1", {}, marks=pytest.mark.slow)])
def test_region_methods_train_and_evaluate_from_ncr_precomp_files(name, arg, extra, ncr_precomp, tmp_path,
                                                                  monkeypatch):
  cfg = make_config(name, arg + ",data=tfds:precomp/f30k_precomp,noise=0.4", **TINY, **extra,
                    **{"input.data_dir": ncr_precomp})
  with cfg.unlocked():
    cfg.evals.retrieval = dict(type="retrieval", split="test", every_steps=0, plot=False)
    cfg.evals.noise_detection = dict(type="noise_detection", every_steps=0, plot=False)
  result = train.train(cfg, str(tmp_path))
  spe = result.experiment.steps_per_epoch
  assert spe == 40 // 8
  rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl") if '"train"' in l]
  assert rows and all(np.isfinite(r["loss"] if "loss" in r else r["main/loss"]) for r in rows)
  if name == "disncl":   # after the warm-up stage: the discriminator update, then the encoders'
    assert [s.name for s in result.experiment.method.stages()] == ["warmup", "train"]
    assert any("adversary/loss" in r and "main/soft_loss" in r for r in rows)
  spy = recompute.ScoreSpy(monkeypatch)
  out = evaluation.final(cfg, result, str(tmp_path))
  # 4 test images x 20 captions: every R@10 of images is 100 whatever the model, so the metrics are recomputed from
  # the learned similarity of the run's own embeddings of the split (tests/recompute.py), and the noise AUC of its
  # 40 training pairs by scikit-learn (within one discordant pair: a last-bit difference may break a near tie).
  own, c2i = recompute.own_scores(result, cfg)
  assert own.shape == (4, 20)
  ranked = spy.of_shape(own.shape)
  np.testing.assert_allclose(ranked, own, atol=1e-5)
  recompute.assert_recall_matches(out["retrieval"], ranked, c2i)
  auc, pairs = recompute.own_noise_auc(result)
  assert out["noise_detection"]["auc"] == pytest.approx(auc, abs=1 / pairs + 1e-9)


# make test-all. make test: DisNCL's losses on one example per device (tests/test_degenerate_properties.py); SGRAF's
# similarity head chunked and unchunked (tests/models/test_sgraf_model.py).
@pytest.mark.slow
@pytest.mark.parametrize("name,arg,extra", [
    ("disncl", "batch=64,warmup=0", {}),
    ("sgraf", "batch=64", {"loss.all_negatives_epochs": 0}),     # the hardest-negative hinge from step 0
    ("gsc", "backbone=sgraf,batch=64,warmup=0", {})])          # GSC's loss and structures from step 0
def test_region_method_steps_on_8_devices_equal_steps_on_1(name, arg, extra, tmp_path, devices):
  # Adam's eps at 1e-6: with torch's 1e-8 (the region presets' since 2026-11-23) a parameter whose gradient is
  # float noise (~1e-9, summed in another order on 8 devices than on 1) moves by ~lr in a random direction, which
  # says nothing about the sharding.
  cfg = make_config(name, arg, total_steps=2, **TINY, **{"optim.eps": 1e-6, **extra})
  eight = train.train(cfg, str(tmp_path / "8"))
  one = train.train(cfg, str(tmp_path / "1"), devices=devices[:1])
  for x, y in zip(jax.tree.leaves(jax.device_get(eight.params)), jax.tree.leaves(jax.device_get(one.params))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=5e-5)


def test_disncl_reconstructed_pieces_are_options_with_finite_gradients(devices):
  # On one device (DisNCL's losses sharded == unsharded: tests/test_degenerate_properties.py), from the same initial
  # parameters: neither option has parameters of its own.
  from ncjax.experiment import build_experiment
  from ncjax.contract import strip_diagnostics
  losses, params = {}, None
  for soft, pool in (("bootstrap", "mean"), ("soft_infonce", "max")):
    cfg = make_config("disncl", "batch=16,warmup=0", **TINY, **{"loss.soft_target": soft, "method.critic_pool": pool})
    exp = build_experiment(cfg, devices=devices[:1])
    params = exp.method.init_params() if params is None else params
    batch = strip_diagnostics(exp.train_data.global_batch(0)[0])
    fn = jax.jit(jax.value_and_grad(exp.method.main_loss, has_aux=True))
    (loss, (metrics, _)), grads = fn(params, {}, batch, jax.random.PRNGKey(0))
    assert np.isfinite(float(loss)) and all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))
    losses[soft] = float(metrics["soft_loss"] if soft == "bootstrap" else metrics["soft_infonce"])
  assert losses["bootstrap"] != losses["soft_infonce"]
  with pytest.raises(ValueError, match="unknown method.critic_pool 'median'"):
    cfg = make_config("disncl", "batch=16", **TINY, **{"method.critic_pool": "median"})
    build_experiment(cfg, devices=devices[:1]).method.abstract_params()


def test_ncr_vocabulary_file_is_kept_by_the_build_and_used_by_the_word_tokenizer(tmp_path):
  # NCR ships {data}_precomp_vocab.json (word2idx / idx2word, count >= 4 over train + dev): a run on the built
  # dataset tokenises with it, in its order, after ncjax's special tokens; without it the captions are counted.
  from ncjax.data.embedded import precomp_synthetic
  from ncjax.data.tables import builders as tfds_builders
  from ncjax.experiment import build_experiment
  manual = tmp_path / "f30k_precomp"
  precomp_synthetic.write_ncr_layout(str(manual), dict(train=8, dev=4, test=4))
  words = ["<pad>", "<start>", "<end>", "<unk>", "a", "near", "dog", "cat", "and"]
  (manual / "f30k_precomp_vocab.json").write_text(json.dumps(dict(
      word2idx={w: i for i, w in enumerate(words)}, idx2word={str(i): w for i, w in enumerate(words)},
      idx=len(words))))
  tfds_builders.build("precomp", "f30k_precomp", str(manual), str(tmp_path / "tfds"))
  cfg = make_config("sgraf", "data=tfds:precomp/f30k_precomp,batch=8", **TINY,
                    **{"input.data_dir": str(tmp_path / "tfds")})
  tok = build_experiment(cfg).tokenizer
  assert tok.vocab[4:] == ["a", "near", "dog", "cat", "and"]
  assert tok.encode(["a dog near a horse"])[0][:7].tolist() == [2, 4, 6, 5, 4, 1, 3]   # horse: <unk>
  # the default command on a user's precomp data is the public recipe (BUTD's 2048-d regions); features of another
  # size get one line naming the fix before anything is built
  from ncjax import errors
  with pytest.raises(errors.ConfigurationError, match=r"f30k_precomp.*region features are 64-dimensional and "
                     r"model.region.feature_dim is 2048: pass --config.model.region.feature_dim=64"):
    build_experiment(make_config("sgraf", "data=tfds:precomp/f30k_precomp",
                                 **{"input.data_dir": str(tmp_path / "tfds")}))


@pytest.mark.parametrize("config", ["sgraf", "gsc_sgraf"])
def test_the_pooling_dropout_draws_from_the_steps_key_in_training(config):
  """SGRAF's self-attention pooling dropout (model.region.pool_dropout, its code's 0.4) is on in training: the same
  parameters and batch give another loss under another step key, and the same loss under the same key; with the
  dropout at 0 the key changes nothing (the word dropout off in both, so that only the pooling's can differ)."""
  from ncjax.contract import strip_diagnostics
  from ncjax.experiment import build_experiment
  name, arg = ("sgraf", "batch=16") if config == "sgraf" else ("gsc", "backbone=sgraf,batch=16")
  losses = {}
  for rate in (0.4, 0.0):
    cfg = make_config(name, arg, **TINY, **{"model.region.pool_dropout": rate, "model.region.word_dropout": 0.0})
    exp = build_experiment(cfg)
    params, state = exp.method.init_params(), exp.method.init_state(exp.train_data.num_examples)
    batch = strip_diagnostics(exp.train_data.global_batch(0)[0])
    loss_fn = exp.method.stages()[-1].updates[0].loss_fn
    fn = jax.jit(lambda p, s, b, k: loss_fn(p, s, b, k)[0])
    losses[rate] = [float(fn(params, state, batch, jax.random.PRNGKey(k))) for k in (0, 1, 0)]
  (a, b, again), (c, d, _) = losses[0.4], losses[0.0]
  assert a == again and a != b, losses[0.4]
  assert c == d, losses[0.0]
