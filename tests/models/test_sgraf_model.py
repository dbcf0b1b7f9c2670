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
    assert np.abs(off - np.diag(m)[0]).min() > 1e-5   # (measured >= 7e-5 on these items; float32 noise is ~1e-7)


# --- GSC's intra-modal structures, restated from the public code ----------------------------------------------------
def _np_linear(layer, x):
  return x @ np.asarray(layer.kernel[...], np.float64) + np.asarray(layer.bias[...], np.float64)


def _np_l2norm(x, axis=-1):
  return x / (np.sqrt((x ** 2).sum(axis, keepdims=True)) + 1e-8)


def _np_softmax(x, axis=-1):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def _np_sgr_score(head, sim_emb):
  """SGRAF.py's EncoderSimilarity tail: 3 GraphReasoning steps over the nodes, node 0's vector -> sim_eval_w (the
  raw score; RINCE applies the sigmoid)."""
  for step in head.reasoning:
    edges = _np_softmax(_np_linear(step.q, sim_emb) @ np.swapaxes(_np_linear(step.k, sim_emb), -1, -2))
    sim_emb = np.maximum(_np_linear(step.g, edges @ sim_emb), 0.0)
  return _np_linear(head.sim_eval, sim_emb[..., 0, :])[..., 0]


def _np_scan_attention(query, context, smooth, lens):
  """SGRAF.py's SCAN_attention(query, context, smooth, lens) for a batch of contexts (float64)."""
  attn = context @ np.swapaxes(query, 1, 2)                         # (n, sourceL, queryL)
  attn = np.where(attn > 0, attn, 0.1 * attn)
  attn = _np_l2norm(attn, axis=2)
  for k, n in enumerate(lens):
    attn[k, n:] = -1e9
  attn = _np_softmax(np.swapaxes(attn, 1, 2) * smooth, axis=2)      # (n, queryL, sourceL)
  return _np_l2norm(attn @ context, axis=-1)                         # (n, queryL, d)


def _np_caption_structure(head, words, lens, glo):
  """GSC/model/SGRAF.py forward_topology, caption part: for each caption i (the query, its own words only), every
  caption k as the context (`cap_emb + 1e-6`); the raw scores of query i form *column* i (`torch.cat(sim_cap, 1)`)."""
  n = len(lens)
  columns = []
  for i in range(n):
    cap_i = np.repeat(words[i:i + 1, :lens[i]], n, axis=0)
    context = _np_scan_attention(cap_i, words + 1e-6, head.smooth, lens)
    sim_loc = _np_l2norm(_np_linear(head.sim_local, (context - cap_i) ** 2))
    sim_glo = _np_l2norm(_np_linear(head.sim_global, (glo - glo[i:i + 1]) ** 2 + 1e-6))
    columns.append(_np_sgr_score(head, np.concatenate([sim_glo[:, None], sim_loc], axis=1)))
  return np.stack(columns, axis=1)


def _np_image_structure(head, regions, glo):
  """forward_topology, image part: same-index region differences + 1e-6 and global differences + 1e-6."""
  columns = []
  for i in range(len(regions)):
    sim_loc = _np_l2norm(_np_linear(head.sim_local, (regions - regions[i:i + 1]) ** 2 + 1e-6))
    sim_glo = _np_l2norm(_np_linear(head.sim_global, (glo - glo[i:i + 1]) ** 2 + 1e-6))
    columns.append(_np_sgr_score(head, np.concatenate([sim_glo[:, None], sim_loc], axis=1)))
  return np.stack(columns, axis=1)


def _np_aligned_caption_structure(head, words, lens, glo):
  """GSC+/model/SGRAF.py forward_topology, caption part: captions padded (zeros) to the batch's longest, every
  position a node, position-aligned differences + 1e-6, global differences + 1e-6; entry [a, b] of the view is
  (caption b - caption a)^2 — symmetric."""
  longest = max(lens)
  w = words[:, :longest]
  sim_loc = _np_l2norm(_np_linear(head.sim_local, (w[None, :] - w[:, None]) ** 2 + 1e-6))
  sim_glo = _np_l2norm(_np_linear(head.sim_global, (glo[None, :] - glo[:, None]) ** 2 + 1e-6))
  return _np_sgr_score(head, np.concatenate([sim_glo[:, :, None], sim_loc], axis=2))


def test_gsc_structures_equal_a_restatement_of_the_public_forward_topology():
  """GSC's A (image-image) and Bc (caption-caption, both forms) against numpy float64 restatements of the public
  `forward_topology` (GSC/ and GSC+/ model/SGRAF.py), on random inputs, with the head's own weights and its pooled
  global vectors as inputs. The caption structure of GSC/ is not symmetric: its entry [k, i] has caption i as the
  query (until 2026-11-25 ncjax returned the transpose, which this test tells apart: the check below)."""
  head = sgraf.SimilarityHead(8, 6, kind="sgr", rngs=nnx.Rngs(3))
  for layer in (head.sim_local, head.sim_global):   # zero biases, as SGRAF's init_weights: then an item against
    layer.bias[...] = jnp.zeros_like(layer.bias[...])   # itself scores through the code's + 1e-6 alone
  rng = np.random.default_rng(7)
  lens = [4, 6, 2, 5, 3]
  mask = np.arange(6)[None, :] < np.asarray(lens)[:, None]
  words = _np_l2norm(rng.normal(size=(5, 6, 8))) * mask[..., None]     # the bi-GRU's zeros beyond each length
  regions = _np_l2norm(rng.normal(size=(4, 7, 8)))
  w32, m32, r32 = jnp.asarray(words, jnp.float32), jnp.asarray(mask), jnp.asarray(regions, jnp.float32)
  graphdef, state = nnx.split(head)

  @jax.jit   # one program (eagerly, every small op compiled on its own took ~20 s)
  def ncjax_side(state, w, m, r):
    h = nnx.merge(graphdef, state)
    return (h.t_pool(w, m), h.v_pool(r, jnp.ones(r.shape[:-1], bool)), h.intra_text(w, m, form="attention"),
            h.intra_image(r), h.intra_text(w, m, form="aligned"))

  t_glo, v_glo, attention, image, aligned = [np.asarray(x, np.float64) for x in ncjax_side(state, w32, m32, r32)]
  sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))
  expected = sigmoid(_np_caption_structure(head, words, lens, t_glo))
  got = attention
  assert np.abs(expected - expected.T).max() > 1e-3                  # the orientation matters
  # float32 against float64: within 1e-5 (measured 2.6e-6, on the diagonal, where a caption meets itself and l2norm
  # magnifies differences near zero)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  np.testing.assert_allclose(image, sigmoid(_np_image_structure(head, regions, v_glo)), atol=1e-5)
  np.testing.assert_allclose(aligned, sigmoid(_np_aligned_caption_structure(head, words, lens, t_glo)), atol=1e-5)
  # a fixed context length longer than the batch's longest caption changes nothing (GSC+ pads to the longest)
  wide = jnp.concatenate([w32, jnp.zeros((5, 4, 8), jnp.float32)], axis=1)
  wide_mask = jnp.concatenate([m32, jnp.zeros((5, 4), bool)], axis=1)
  np.testing.assert_allclose(np.asarray(ncjax_side(state, wide, wide_mask, r32)[4]), aligned, atol=1e-6)


def test_the_public_codes_initialisation_is_the_default_and_flax_a_named_option():
  """SGRAF's / GSC's code initialise every Linear layer (the region encoder, the pools, the head, the reasoning
  steps) xavier-uniform — U(+-sqrt(6 / (in + out))) — with zero biases, and leave the bi-GRU at torch's default,
  every weight and bias U(+-1/sqrt(H)); `model.region.init='flax'` keeps flax's defaults (lecun-normal weights)."""
  public, flax = _model(), _model(init="flax")
  linears = [(name, layer) for name, layer in nnx.iter_graph(public) if isinstance(layer, nnx.Linear)
             and not any(p in str(name) for p in ("gru",))]
  assert len(linears) >= 10
  for name, layer in linears:
    w, b = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
    limit = np.sqrt(6.0 / sum(w.shape))
    assert np.all(b == 0) and np.abs(w).max() <= limit, name
    if w.size >= 64:   # a uniform's spread: limit / sqrt(3)
      assert abs(w.std() - limit / np.sqrt(3)) < 0.25 * limit / np.sqrt(3), (name, w.std(), limit)
  gru = public.txt.gru
  h = gru.hidden
  for layer in (gru.fwd_in, gru.fwd_h, gru.bwd_in, gru.bwd_h):
    for v in (np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])):
      assert np.abs(v).max() <= 1 / np.sqrt(h) and v.std() > 0.45 / np.sqrt(h) / np.sqrt(3)
  # flax's defaults differ: a Gaussian (lecun-normal), not bounded by the xavier limit everywhere
  w = np.asarray(flax.head.sim_local.kernel[...])
  assert not np.array_equal(w, np.asarray(public.head.sim_local.kernel[...]))
  assert np.abs(np.asarray(flax.txt.gru.fwd_h.bias[...])).max() == 0
  with pytest.raises(ValueError, match="unknown model.region.init 'torch'"):
    _model(init="torch")
