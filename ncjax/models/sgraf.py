"""SGRAF-style region-feature retrieval model (Diao et al., AAAI 2021; the backbone of NCR, DECL, GSC, L2RM, DisNCL).

  image encoder   precomputed BUTD regions (R, F) -> Linear -> L2 per region                 (R, D)
  text encoder    word embedding (word_dim) -> bi-GRU (hidden D, the two directions averaged) -> L2 per word (L, D)
  similarity H    a learned function of one image's regions and one caption's words, for all B x B pairs:
                    global vectors by self-attention pooling (VisualSA / TextSA);
                    local: each word attends over the regions (SCAN text-to-image attention, smooth lambda = 9);
                    similarity *vectors* l2norm(W (a - b)^2) (dim sim_dim) for the global pair and every word;
                    'sgr': graph reasoning over [global, words] (3 steps), the global node -> Linear -> sigmoid;
                    'saf': attention filtration (sigmoid gate per node, normalised) -> Linear -> sigmoid.
The score is in (0, 1), as SGRAF's `sim_eval_w` ends in a sigmoid.

What differs from the public PyTorch code, on purpose:
  * no BatchNorm (VisualSA's BatchNorm1d(36), SAF's BatchNorm1d): batch statistics would be per-device state that
    sharded == unsharded could not hold; the tanh/sigmoid gates are kept;
  * captions of different lengths are masked (the public code loops over captions and slices each to its length):
    padded words take no attention, are no graph node and no filtration weight, so a caption's score does not
    depend on how long the batch's longest caption is;
  * word dropout (0.4 in the public code) is an option (`model.region.word_dropout`), off by default in ncjax's
    small configs.
The B x B similarity is computed a few captions at a time (`lax.map`, `pairs_per_step` image-caption pairs per
step), so its working set is O(pairs_per_step x L x (R + D)) instead of O(B^2 x L x (R + D)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ncjax.contract import EvalModel
from ncjax.numerics import f32


def l2norm(x, axis=-1, eps=1e-8):
  """x / (||x|| + eps), SGRAF's l2norm. A zero vector (a padded word) maps to zero with a zero gradient: the norm's
  square root never sees an exact 0, whose derivative is infinite (inf * 0 = NaN in the backward pass)."""
  x = f32(x)
  return x / (jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=axis, keepdims=True), 1e-30)) + eps)


INITS = ("public", "flax")


def _linear(in_dim: int, out_dim: int, init: str, rngs: nnx.Rngs) -> nnx.Linear:
  """A Linear layer as `init` says: 'public' (SGRAF's / GSC's code: xavier-uniform weights, U(+-sqrt(6 / (in +
  out))), and zero biases, every Linear of the model) or 'flax' (flax's defaults: lecun-normal weights, zero
  biases)."""
  if init == "public":
    return nnx.Linear(in_dim, out_dim, kernel_init=nnx.initializers.xavier_uniform(),
                      bias_init=nnx.initializers.zeros, rngs=rngs)
  if init != "flax":
    raise ValueError(f"unknown model.region.init {init!r}; expected one of {INITS}")
  return nnx.Linear(in_dim, out_dim, rngs=rngs)


class RegionEncoder(nnx.Module):
  """EncoderImagePrecomp: one linear map of every region feature, then L2 per region."""

  def __init__(self, feature_dim: int, embed_dim: int, *, init: str = "public", rngs: nnx.Rngs):
    # xavier-uniform in both schemes (the public code's; ncjax's before the schemes were named)
    self.fc = nnx.Linear(feature_dim, embed_dim, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
    self.feature_dim = feature_dim

  def __call__(self, regions):
    if regions.ndim != 3 or regions.shape[-1] != self.feature_dim:
      raise ValueError(f"the region encoder expects region features (batch, regions, {self.feature_dim}) "
                       f"(model.region.feature_dim); got an input of shape {tuple(regions.shape)}")
    return l2norm(self.fc(f32(regions)))


class BiGRU(nnx.Module):
  """A one-layer bidirectional GRU over right-padded sequences; the two directions are averaged (SGRAF's
  `use_bi_gru`). A masked step keeps the carry, so the backward direction starts at each sequence's last word."""

  def __init__(self, in_dim: int, hidden: int, *, init: str = "public", rngs: nnx.Rngs):
    """init 'public': torch's nn.GRU default, every weight and bias U(+-1/sqrt(hidden)) (SGRAF's code leaves the GRU
    at it); 'flax': xavier-uniform input weights, orthogonal recurrent weights, zero biases."""
    self.hidden = hidden
    if init == "public":
      u = _uniform_init(1.0 / float(hidden) ** 0.5)
      layer = lambda a, b: nnx.Linear(a, b, kernel_init=u, bias_init=u, rngs=rngs)
      self.fwd_in, self.fwd_h = layer(in_dim, 3 * hidden), layer(hidden, 3 * hidden)
      self.bwd_in, self.bwd_h = layer(in_dim, 3 * hidden), layer(hidden, 3 * hidden)
      return
    if init != "flax":
      raise ValueError(f"unknown model.region.init {init!r}; expected one of {INITS}")
    xavier = nnx.initializers.xavier_uniform()
    self.fwd_in = nnx.Linear(in_dim, 3 * hidden, kernel_init=xavier, rngs=rngs)
    self.fwd_h = nnx.Linear(hidden, 3 * hidden, kernel_init=nnx.initializers.orthogonal(), rngs=rngs)
    self.bwd_in = nnx.Linear(in_dim, 3 * hidden, kernel_init=xavier, rngs=rngs)
    self.bwd_h = nnx.Linear(hidden, 3 * hidden, kernel_init=nnx.initializers.orthogonal(), rngs=rngs)

  def _direction(self, x_proj, h_lin, mask, reverse):
    h0 = jnp.zeros((x_proj.shape[0], self.hidden), jnp.float32)

    def step(h, inputs):
      xp, m = inputs
      hp = h_lin(h)
      r = jax.nn.sigmoid(xp[:, :self.hidden] + hp[:, :self.hidden])
      z = jax.nn.sigmoid(xp[:, self.hidden:2 * self.hidden] + hp[:, self.hidden:2 * self.hidden])
      n = jnp.tanh(xp[:, 2 * self.hidden:] + r * hp[:, 2 * self.hidden:])
      new = (1.0 - z) * n + z * h
      h = jnp.where(m[:, None], new, h)
      return h, h

    _, out = jax.lax.scan(step, h0, (jnp.swapaxes(x_proj, 0, 1), jnp.swapaxes(mask, 0, 1)), reverse=reverse)
    return jnp.swapaxes(out, 0, 1)

  def __call__(self, x, mask):
    x = f32(x)
    fwd = self._direction(self.fwd_in(x), self.fwd_h, mask, reverse=False)
    bwd = self._direction(self.bwd_in(x), self.bwd_h, mask, reverse=True)
    return (fwd + bwd) / 2


def _uniform_init(scale):
  """U(-scale, scale): the public code's word-embedding initialisation."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)
  return init


class GRUTextEncoder(nnx.Module):
  """EncoderText: word embedding -> bi-GRU -> L2 per word; padded positions are zero vectors."""

  def __init__(self, vocab_size: int, word_dim: int, embed_dim: int, *, pad_id: int = 0,
               word_dropout: float = 0.0, init: str = "public", rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab_size, word_dim, embedding_init=_uniform_init(0.1), rngs=rngs)
    self.gru = BiGRU(word_dim, embed_dim, init=init, rngs=rngs)
    self.pad_id, self.word_dropout = pad_id, word_dropout

  def __call__(self, tokens, rng=None):
    mask = tokens != self.pad_id
    words = f32(self.embed(tokens))
    if rng is not None and self.word_dropout > 0:
      keep = jax.random.bernoulli(rng, 1.0 - self.word_dropout, words.shape)
      words = jnp.where(keep, words / (1.0 - self.word_dropout), 0.0)
    out = l2norm(self.gru(words, mask))
    return jnp.where(mask[..., None], out, 0.0), mask


def _dropout(key, x, rate: float):
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0)


def _split(rng, n: int):
  return (None,) * n if rng is None else tuple(jax.random.split(rng, n))


def _masked_softmax(logits, mask, axis=-1):
  logits = jnp.where(mask, logits, -1e30)
  w = jax.nn.softmax(logits, axis=axis)
  return jnp.where(mask, w, 0.0)


class SelfAttentionPool(nnx.Module):
  """VisualSA / TextSA: the global vector as an attention-weighted sum of the locals, the weights from
  tanh(W_l local) * tanh(W_g mean) (BatchNorm removed, see the module docstring)."""

  def __init__(self, dim: int, *, dropout: float = 0.0, init: str = "public", rngs: nnx.Rngs):
    self.local = _linear(dim, dim, init, rngs)
    self.glob = _linear(dim, dim, init, rngs)
    self.common = _linear(dim, 1, init, rngs)
    self.dropout = float(dropout)   # SGRAF's Dropout(0.4) after each tanh embedding, in training (`rng` given)

  def __call__(self, local, mask, rng=None):
    m = f32(mask)[..., None]
    mean = jnp.sum(local * m, axis=-2) / jnp.maximum(jnp.sum(m, axis=-2), 1.0)
    emb_local, emb_global = jnp.tanh(self.local(local)), jnp.tanh(self.glob(mean))
    if rng is not None and self.dropout > 0:
      k_local, k_global = jax.random.split(rng)
      emb_local, emb_global = _dropout(k_local, emb_local, self.dropout), _dropout(k_global, emb_global, self.dropout)
    common = emb_local * emb_global[..., None, :]
    weights = _masked_softmax(self.common(common)[..., 0], mask)
    return l2norm(jnp.sum(weights[..., None] * local, axis=-2))


class GraphReasoning(nnx.Module):
  """One SGR step: edges softmax(W_q n (W_k n)^T) over the (unmasked) nodes, then relu(W_g (edges @ nodes))."""

  def __init__(self, sim_dim: int, *, init: str = "public", rngs: nnx.Rngs):
    self.q = _linear(sim_dim, sim_dim, init, rngs)
    self.k = _linear(sim_dim, sim_dim, init, rngs)
    self.g = _linear(sim_dim, sim_dim, init, rngs)

  def __call__(self, nodes, mask):
    edges = jnp.einsum("...nd,...md->...nm", self.q(nodes), self.k(nodes))
    edges = _masked_softmax(edges, mask[..., None, :])
    return jax.nn.relu(self.g(jnp.einsum("...nm,...md->...nd", edges, nodes)))


class SimilarityHead(nnx.Module):
  """SGRAF's EncoderSimilarity: H(regions, words) in (0, 1) (SGR or SAF aggregation)."""

  def __init__(self, embed_dim: int, sim_dim: int = 256, *, kind: str = "sgr", steps: int = 3, smooth: float = 9.0,
               pool_dropout: float = 0.0, init: str = "public", rngs: nnx.Rngs):
    if kind not in ("sgr", "saf"):
      raise ValueError(f"unknown similarity head {kind!r}; expected 'sgr' or 'saf'")
    self.kind, self.smooth = kind, float(smooth)
    self.v_pool = SelfAttentionPool(embed_dim, dropout=pool_dropout, init=init, rngs=rngs)
    self.t_pool = SelfAttentionPool(embed_dim, dropout=pool_dropout, init=init, rngs=rngs)
    self.sim_local = _linear(embed_dim, sim_dim, init, rngs)
    self.sim_global = _linear(embed_dim, sim_dim, init, rngs)
    self.sim_eval = _linear(sim_dim, 1, init, rngs)
    if kind == "sgr":
      self.reasoning = nnx.List([GraphReasoning(sim_dim, init=init, rngs=rngs) for _ in range(steps)])
    else:
      self.filtration = _linear(sim_dim, 1, init, rngs)

  def _aggregate(self, sim_glo, sim_loc, word_mask):
    """sim_glo (..., S), sim_loc (..., L, S), word_mask (..., L) -> score (...)."""
    nodes = jnp.concatenate([sim_glo[..., None, :], sim_loc], axis=-2)
    mask = jnp.concatenate([jnp.ones_like(word_mask[..., :1]), word_mask], axis=-1)
    if self.kind == "sgr":
      for step in self.reasoning:
        nodes = step(nodes, mask)
      pooled = nodes[..., 0, :]
    else:
      gate = jax.nn.sigmoid(self.filtration(nodes)[..., 0]) * mask
      gate = gate / jnp.maximum(jnp.sum(gate, axis=-1, keepdims=True), 1e-8)
      pooled = l2norm(jnp.sum(gate[..., None] * nodes, axis=-2))
    return jax.nn.sigmoid(self.sim_eval(pooled)[..., 0])

  def global_vectors(self, regions, words, word_mask, rng=None):
    """The self-attention-pooled global vectors of each image (Bi, D) and each caption (Bt, D), computed once per
    item (not once per pair); `rng`: the pools' dropout in training."""
    k_v, k_t = _split(rng, 2)
    return self.v_pool(regions, jnp.ones(regions.shape[:-1], bool), k_v), self.t_pool(words, word_mask, k_t)

  def pair_vectors(self, regions, words, v_glo, t_glo):
    """Similarity vectors of aligned pairs: regions (P, R, D), words (P, L, D), their global vectors (P, D)
    -> ((P, S), (P, L, S))."""
    # SCAN text-to-image attention: each word attends over the regions.
    attn = jnp.einsum("prd,pld->prl", regions, words)
    attn = l2norm(jax.nn.leaky_relu(attn, 0.1), axis=-1)            # normalised over the words (SCAN's l2norm dim 2)
    attn = jax.nn.softmax(self.smooth * jnp.swapaxes(attn, -1, -2), axis=-1)   # (P, L, R): over the regions
    context = l2norm(jnp.einsum("plr,prd->pld", attn, regions))
    sim_loc = l2norm(self.sim_local(jnp.square(context - words)))
    sim_glo = l2norm(self.sim_global(jnp.square(v_glo - t_glo)))
    return sim_glo, sim_loc

  def pair_scores(self, regions, words, word_mask):
    """H of aligned pairs (P,)."""
    v_glo, t_glo = self.global_vectors(regions, words, word_mask)
    sim_glo, sim_loc = self.pair_vectors(regions, words, v_glo, t_glo)
    return self._aggregate(sim_glo, sim_loc, word_mask)

  def matrix(self, regions, words, word_mask, *, pairs_per_step: int = 4096, rng=None):
    """H of every (image i, caption j): regions (Bi, R, D), words (Bt, L, D) -> (Bi, Bt), computed
    pairs_per_step // Bi captions at a time; `rng`: the pools' dropout in training."""
    n_img, n_txt = regions.shape[0], words.shape[0]
    chunk = max(1, min(int(pairs_per_step) // max(n_img, 1), n_txt))
    v_glo, t_glo = self.global_vectors(regions, words, word_mask, rng)

    def one_caption(args):
      w, m, tg = args
      sim_glo, sim_loc = self.pair_vectors(regions, jnp.broadcast_to(w, (n_img,) + w.shape), v_glo, tg[None])
      return self._aggregate(sim_glo, sim_loc, jnp.broadcast_to(m, (n_img,) + m.shape))

    cols = jax.lax.map(one_caption, (words, word_mask, t_glo), batch_size=chunk)   # (Bt, Bi)
    return cols.T

  def intra_image(self, regions, rng=None):
    """GSC's image-image structure with this head (`forward_topology` of `GSC/model/SGRAF.py`): region-wise squared
    differences at the same region index, + 1e-6 (no attention), plus the global difference (+ 1e-6), aggregated
    like a pair. (Bi, R, D) -> (Bi, Bi), symmetric."""
    region_mask = jnp.ones(regions.shape[:-1], bool)
    glo = self.v_pool(regions, region_mask, rng)

    def row(i_regions, i_glo):
      sim_loc = l2norm(self.sim_local(jnp.square(i_regions[None] - regions) + 1e-6))
      sim_glo = l2norm(self.sim_global(jnp.square(i_glo[None] - glo) + 1e-6))
      return self._aggregate(sim_glo, sim_loc, region_mask)

    return jax.lax.map(lambda a: row(*a), (regions, glo))

  def intra_text(self, words, word_mask, form: str = "attention", rng=None):
    """GSC's caption-caption structure with this head, (Bt, L, D) -> (Bt, Bt), aggregated like a pair:
      'attention' (GSC's single-network code, `forward_topology` of `GSC/model/SGRAF.py`): entry [k, i] is caption i
                  as the query — its words attend over caption k's words (+ 1e-6, as that code's context; SCAN's
                  attention, smoothing `smooth`, each side within its length), the attended context differences
                  plus the global difference (+ 1e-6), aggregated over i's words. The code loops over the query i
                  and concatenates each result as column i, so the query is the *column* (the matrix is not
                  symmetric: SCAN's attention is not); GSC's label weights then scale the query's column;
      'aligned'   (GSC+'s code): position-aligned word differences (+ 1e-6; padding included up to the batch's
                  longest caption, as that code) plus the global difference, no attention; symmetric."""
    if form not in TEXT_STRUCTURES:
      raise ValueError(f"unknown model.region.text_structure {form!r}; expected one of {TEXT_STRUCTURES}")
    glo = self.t_pool(words, word_mask, rng)
    if form == "aligned":
      # GSC+ pads every caption to the batch's longest (pad_packed_sequence) and keeps the padding as nodes: the
      # positions up to that length, whatever the fixed context length the tokens come in
      longest = jnp.max(jnp.sum(word_mask, axis=-1))
      positions = jnp.broadcast_to(jnp.arange(word_mask.shape[-1]) < longest, word_mask.shape)

      def row(i_words, i_glo):
        sim_loc = l2norm(self.sim_local(jnp.square(i_words[None] - words) + 1e-6))
        sim_glo = l2norm(self.sim_global(jnp.square(i_glo[None] - glo) + 1e-6))
        return self._aggregate(sim_glo, sim_loc, positions)

      return jax.lax.map(lambda a: row(*a), (words, glo))

    context_mask = word_mask[:, None, :]                                # (Bt, 1, M): caption k's own words
    contexts = words + 1e-6                                             # the code's `cap_emb + 1e-6`

    def query_column(i_words, i_mask, i_glo):
      """Caption i as the query against every caption k as the context: (Bt,) over k."""
      attn = jnp.einsum("kmd,ld->kml", contexts, i_words)               # (Bt, M, L): k's words x i's words
      attn = jax.nn.leaky_relu(attn, 0.1) * f32(i_mask)[None, None, :]
      attn = l2norm(attn, axis=-1)                                      # over i's (valid) words, as SCAN
      attn = _masked_softmax(self.smooth * jnp.swapaxes(attn, -1, -2), context_mask)   # (Bt, L, M): over k's words
      context = l2norm(jnp.einsum("klm,kmd->kld", attn, contexts))
      sim_loc = l2norm(self.sim_local(jnp.square(context - i_words[None])))
      sim_glo = l2norm(self.sim_global(jnp.square(i_glo[None] - glo) + 1e-6))
      return self._aggregate(sim_glo, sim_loc, jnp.broadcast_to(i_mask, word_mask.shape))

    columns = jax.lax.map(lambda a: query_column(*a), (words, word_mask, glo))   # [i, k]: query i, context k
    return columns.T                                                     # [k, i], as GSC's sim_cap


TEXT_STRUCTURES = ("attention", "aligned")


def pack_text(words, mask):
  """Word features and their mask as one array (n, L, D + 1), what an EvalModel's encode_text returns."""
  return jnp.concatenate([words, f32(mask)[..., None]], axis=-1)


def unpack_text(packed):
  return packed[..., :-1], packed[..., -1] > 0.5


class RegionScoring:
  """The learned-similarity half of a region model: `self.head` (a SimilarityHead) over image region features and
  packed caption word features (`pack_text`), `self.pairs_per_step` pairs at a time."""

  def similarity(self, img, txt, rng=None):
    """H of every (image, caption) pair; `rng`: the head's dropout in training (SGRAF's pools)."""
    words, mask = unpack_text(txt)
    return self.head.matrix(img, words, mask, pairs_per_step=self.pairs_per_step, rng=rng)

  def score(self, img, txt):
    return self.similarity(img, txt)

  def pair_score(self, img, txt):
    words, mask = unpack_text(txt)
    return self.head.pair_scores(img, words, mask)

  def eval_model(self) -> EvalModel:
    """Evaluators' view: region / packed word features, ranked by the learned score H (aligned pairs scored
    without the B x B block)."""
    return EvalModel(encode_image=self.encode_image, encode_text=self.encode_text, score=self.similarity,
                     pair_score=self.pair_score)


class RegionRetrievalModel(RegionScoring, nnx.Module):
  """SGRAF: region encoder, bi-GRU text encoder and a learned similarity head.

  encode_image -> (B, R, D) region features; encode_text -> (B, L, D + 1) word features packed with their mask;
  similarity(img, txt) -> (B, B) learned H in (0, 1); pair_score(img, txt) -> (B,) H of aligned pairs.
  """

  def __init__(self, *, feature_dim: int, embed_dim: int, vocab_size: int, word_dim: int = 300, sim_dim: int = 256,
               head: str = "sgr", steps: int = 3, smooth: float = 9.0, word_dropout: float = 0.0, pad_id: int = 0,
               pairs_per_step: int = 4096, text_structure: str = "attention", pool_dropout: float = 0.0,
               init: str = "public", rngs: nnx.Rngs):
    if text_structure not in TEXT_STRUCTURES:
      raise ValueError(f"unknown model.region.text_structure {text_structure!r}; expected one of {TEXT_STRUCTURES}")
    self.text_structure_form = text_structure
    self.img = RegionEncoder(feature_dim, embed_dim, init=init, rngs=rngs)
    self.txt = GRUTextEncoder(vocab_size, word_dim, embed_dim, pad_id=pad_id, word_dropout=word_dropout, init=init,
                              rngs=rngs)
    self.head = SimilarityHead(embed_dim, sim_dim, kind=head, steps=steps, smooth=smooth, pool_dropout=pool_dropout,
                               init=init, rngs=rngs)
    self.pairs_per_step = int(pairs_per_step)

  def encode_image(self, regions):
    return self.img(regions)

  def encode_text(self, tokens, rng=None):
    return pack_text(*self.txt(tokens, rng))

  def image_structure(self, img, rng=None):
    return self.head.intra_image(img, rng)

  def text_structure(self, txt, rng=None):
    return self.head.intra_text(*unpack_text(txt), form=self.text_structure_form, rng=rng)


def build_region_model(spec: dict, *, vocab_size: int, pad_id: int = 0, seed: int = 0) -> RegionRetrievalModel:
  """The model a region ModelSpec describes (`ModelSpec.region`)."""
  return RegionRetrievalModel(**spec, vocab_size=vocab_size, pad_id=pad_id, rngs=nnx.Rngs(seed))
