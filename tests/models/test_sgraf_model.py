"""SGRAF's region retrieval model (ncjax.models.sgraf): masking, chunking, the bi-GRU, clear shape errors."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from ncjax.models import sgraf


def _model(head="sgr", **kw):
  return sgraf.RegionRetrievalModel(feature_dim=12, embed_dim=16, vocab_size=30, word_dim=8, sim_dim=8, head=head,
                                    rngs=nnx.Rngs(0), **kw)


def _tokens(lengths, width):
  out = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    out[i, :n] = 4 + (np.arange(n) * (i + 3)) % 25
  return jnp.asarray(out)


@pytest.mark.parametrize("head", ["sgr", "saf"])
def test_scores_do_not_depend_on_padding_and_pair_scores_are_the_diagonal(head):
  graphdef, state = nnx.split(_model(head))

  @jax.jit   # as the trainer runs it; eagerly, this test compiled ~200 single-op programs
  def scores(state, regions, short, long):
    model = nnx.merge(graphdef, state)
    img = model.encode_image(regions)
    return (model.similarity(img, model.encode_text(short)), model.similarity(img, model.encode_text(long)),
            model.pair_score(img, model.encode_text(short)))

  regions = jnp.asarray(np.random.default_rng(0).normal(size=(5, 6, 12)), jnp.float32)
  s_short, s_long, pair = scores(state, regions, _tokens([3, 5, 2, 7, 4], 8), _tokens([3, 5, 2, 7, 4], 20))
  np.testing.assert_allclose(np.asarray(s_short), np.asarray(s_long), atol=1e-6)
  assert s_short.shape == (5, 5) and np.all((np.asarray(s_short) > 0) & (np.asarray(s_short) < 1))
  np.testing.assert_allclose(np.asarray(pair), np.diag(np.asarray(s_short)), atol=1e-6)


def test_similarity_chunking_changes_nothing():
  regions = jnp.asarray(np.random.default_rng(1).normal(size=(4, 6, 12)), jnp.float32)
  tokens = _tokens([2, 6, 4, 3, 5, 7], 8)
  results = []
  for pairs in (1, 8, 10 ** 6):   # one caption per step, two, all at once
    graphdef, state = nnx.split(_model(pairs_per_step=pairs))
    sim = jax.jit(lambda st: (lambda m: m.similarity(m.encode_image(regions), m.encode_text(tokens)))(
        nnx.merge(graphdef, st)))
    results.append(np.asarray(sim(state)))
  assert results[0].shape == (4, 6)
  np.testing.assert_allclose(results[0], results[1], atol=1e-6)
  np.testing.assert_allclose(results[0], results[2], atol=1e-6)


def test_bigru_backward_direction_starts_at_each_sequences_last_word():
  gru = sgraf.BiGRU(3, 4, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(2).normal(size=(1, 6, 3)), jnp.float32)
  mask = jnp.asarray([[True] * 4 + [False] * 2])
  padded = gru(x, mask)[0, :4]
  alone = gru(x[:, :4], jnp.ones((1, 4), bool))[0]
  np.testing.assert_allclose(np.asarray(padded), np.asarray(alone), atol=1e-6)


def test_zero_vectors_have_finite_gradients_and_wrong_feature_sizes_are_named():
  g = jax.grad(lambda x: jnp.sum(sgraf.l2norm(x) ** 2 + sgraf.l2norm(x)))(jnp.zeros((2, 3)))
  assert np.all(np.isfinite(np.asarray(g)))
  with pytest.raises(ValueError, match=r"region features \(batch, regions, 12\).*model.region.feature_dim"):
    _model().encode_image(jnp.zeros((2, 6, 2048)))


def test_intra_modal_structures_are_symmetric_with_one_self_similarity():
  """GSC's image-image and caption-caption structures through the shared head are built from squared differences
  (region i vs region i, word l vs word l, global vs global), so swapping the two items changes nothing: both
  matrices are symmetric in value, not only square. An item compared with itself has zero differences, so every
  diagonal entry is the head's score of the zero difference, the same for all items; off the diagonal the items
  differ. (Every entry is a sigmoid, in (0, 1), whatever the head computes: that range tests nothing.) The
  caption structure here is GSC+'s position-aligned form; GSC's attended form (the default) is tested in
  tests/test_recipes.py."""
  model = _model(text_structure="aligned")
  img = model.encode_image(jnp.asarray(np.random.default_rng(3).normal(size=(4, 6, 12)), jnp.float32))
  txt = model.encode_text(_tokens([2, 5, 3, 5], 8))
  a, b = np.asarray(model.image_structure(img)), np.asarray(model.text_structure(txt))
  assert a.shape == b.shape == (4, 4)
  np.testing.assert_allclose(a, a.T, atol=1e-6)
  np.testing.assert_allclose(b, b.T, atol=1e-6)
  for m in (a, b):
    np.testing.assert_allclose(np.diag(m), np.diag(m)[0], atol=1e-6)
    off = m[~np.eye(4, dtype=bool)]
    assert np.abs(off - np.diag(m)[0]).min() > 1e-4
