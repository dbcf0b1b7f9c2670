import math

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from ncjax import models
from ncjax.config_lib import base_config
from ncjax.models import lorentz
from ncjax.models.text import eot_positions


def model_cfg(**kw):
  c = base_config().model
  for k, v in kw.items():
    c[k] = v
  return c


def build(**kw):
  return models.build_two_tower(models.ModelSpec.from_config(model_cfg(**kw)), vocab_size=30, eot_id=3, pad_id=0,
                                seed=0)


def jitted(module, method="__call__"):
  """module.<method> under jax.jit, as the trainer and evaluators run it: one compile per input shape instead of one
  per eager op (the first eager forward of this file compiled ~140 programs)."""
  from flax import nnx
  graphdef, state = nnx.split(module)
  fn = jax.jit(lambda st, *args: getattr(nnx.merge(graphdef, st), method)(*args))
  return lambda *args: fn(state, *args)


def _inputs(b=4, size=16, ctx=16, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.normal(size=(b, size, size, 3)).astype(np.float32)
  tokens = np.zeros((b, ctx), np.int32)
  for i in range(b):
    n = 3 + i
    tokens[i, 0] = 2
    tokens[i, 1:n] = rng.integers(4, 30, size=n - 1)
    tokens[i, n] = 3
  return images, tokens


def test_two_tower_embeddings_are_unit_norm_and_float32():
  m = build()
  images, tokens = _inputs()
  out = jitted(m)(images, tokens)
  assert out["image_emb"].shape == (4, 64) and out["text_emb"].shape == (4, 64)
  assert out["image_emb"].dtype == jnp.float32
  np.testing.assert_allclose(np.linalg.norm(out["image_emb"], axis=-1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(out["text_emb"], axis=-1), 1.0, rtol=1e-5)
  assert float(out["logit_scale"]) == pytest.approx(math.log(1 / 0.07), rel=1e-6)


def test_stored_scalars_are_clamped_after_updates_not_where_read():
  from ncjax.models.two_tower import clamp_stored
  m = build(logit_scale_init=10.0)
  assert float(m.get_logit_scale()) == 10.0     # reading never clamps (a clamped read has zero gradient)
  params = dict(logit_scale=jnp.float32(10.0),
                geometry=dict(curv=jnp.float32(5.0), visual_alpha=jnp.float32(0.3), textual_alpha=jnp.float32(-2.0)))
  out = clamp_stored(params, geometry="lorentz", curv_init=1.0)
  assert float(out["logit_scale"]) == pytest.approx(math.log(100.0), rel=1e-6)
  assert float(out["geometry"]["curv"]) == pytest.approx(math.log(10.0), rel=1e-6)
  assert float(out["geometry"]["visual_alpha"]) == 0.0 and float(out["geometry"]["textual_alpha"]) == -2.0
  low = clamp_stored(dict(params, geometry=dict(params["geometry"], curv=jnp.float32(-5.0))), geometry="lorentz")
  assert float(low["geometry"]["curv"]) == pytest.approx(math.log(0.1), rel=1e-6)


def test_a_clamped_parameter_comes_back_when_its_gradient_reverses():
  """Drive the logit scale and the curvature up against their caps, then reverse the loss: with the clamp on the
  stored value they move back at once (a read-time clamp would leave them above the cap with zero gradient)."""
  import optax
  from ncjax.models.two_tower import clamp_stored
  params = dict(logit_scale=jnp.float32(4.5), geometry=dict(curv=jnp.float32(2.2), visual_alpha=jnp.float32(-0.1),
                                                            textual_alpha=jnp.float32(-0.1)))
  opt = optax.sgd(0.1)
  state = opt.init(params)

  def run(params, state, sign, steps):
    for _ in range(steps):
      grads = jax.grad(lambda p: sign * (p["logit_scale"] + p["geometry"]["curv"] + p["geometry"]["visual_alpha"]))(
          params)
      updates, state = opt.update(grads, state)
      params = clamp_stored(optax.apply_updates(params, updates), geometry="lorentz", curv_init=1.0)
    return params, state

  params, state = run(params, state, -1.0, 10)   # push up
  assert float(params["logit_scale"]) == pytest.approx(math.log(100.0), rel=1e-6)
  assert float(params["geometry"]["curv"]) == pytest.approx(math.log(10.0), rel=1e-6)
  assert float(params["geometry"]["visual_alpha"]) == 0.0
  params, _ = run(params, state, 1.0, 1)         # reverse: one step below the caps
  assert float(params["logit_scale"]) == pytest.approx(math.log(100.0) - 0.1, rel=1e-5)
  assert float(params["geometry"]["curv"]) == pytest.approx(math.log(10.0) - 0.1, rel=1e-5)
  assert float(params["geometry"]["visual_alpha"]) == pytest.approx(-0.1, rel=1e-5)


def test_bf16_compute_keeps_float32_params_and_outputs_close():
  images, tokens = _inputs()
  # The einsum path under both dtypes, whatever the platform ('auto' would pick cuDNN's kernel on a GPU): the kinds'
  # parity, cuDNN's included where it runs, is tests/models/test_attention.py's.
  f32 = build(attention="einsum")
  bf = build(dtype="bfloat16", attention="einsum")
  from flax import nnx
  _, p32 = nnx.split(f32, nnx.Param)
  _, pbf = nnx.split(bf, nnx.Param)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.to_pure_dict(pbf)))
  a = jitted(bf)(images, tokens)
  b = jitted(f32)(images, tokens)
  assert a["image_emb"].dtype == jnp.float32
  # bf16 is really used: the towers' program computes in bf16 (the float32 model's has no bf16 at all), and the
  # embeddings differ from float32's — by 2.4e-3 (image) and 3.4e-3 (text) at most here, within 1e-2.
  g_bf, s_bf = nnx.split(bf)
  g_32, s_32 = nnx.split(f32)
  hlo = lambda g, s: jax.jit(lambda st: nnx.merge(g, st)(images, tokens)).lower(s).as_text()
  assert "bf16" in hlo(g_bf, s_bf) and "bf16" not in hlo(g_32, s_32)
  for key in ("image_emb", "text_emb"):
    diff = np.abs(np.asarray(a[key]) - np.asarray(b[key])).max()
    assert 1e-4 < diff < 1e-2, (key, diff)


def test_remat_gives_identical_values_and_gradients():
  from flax import nnx
  images, tokens = _inputs()
  plain, remat = build(), build(remat=True)
  g1, p1 = nnx.split(plain, nnx.Param)
  g2, p2 = nnx.split(remat, nnx.Param)

  def loss(g, p):
    m = nnx.merge(g, p)
    o = m(images, tokens)
    return jnp.sum(o["image_emb"] @ o["text_emb"].T)

  # remat is really used: the remat model's gradient program rematerialises (one `remat` per transformer block),
  # the plain one's does not
  jaxpr = lambda g, p: str(jax.make_jaxpr(jax.grad(lambda q: loss(g, q)))(p))
  blocks = sum(1 for path, _ in nnx.to_flat_state(p1) if "ln_1" in path and path[-1] == "scale")
  assert jaxpr(g2, p2).count("remat") == blocks > 0 and "remat" not in jaxpr(g1, p1)
  # jitted, as the trainer runs it (remat's recomputation only exists in a traced backward pass)
  v1, gr1 = jax.jit(jax.value_and_grad(lambda p: loss(g1, p)))(p1)
  v2, gr2 = jax.jit(jax.value_and_grad(lambda p: loss(g2, p)))(p2)
  assert float(v1) == pytest.approx(float(v2), rel=1e-6)
  for a, b in zip(jax.tree.leaves(gr1), jax.tree.leaves(gr2)):
    # the same arithmetic, fused differently when recomputed: equal to float32 rounding (gradients of order 10)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_text_pooling_reads_the_eot_token_and_ignores_padding():
  tokens = np.array([[2, 5, 6, 3, 0, 0], [2, 5, 6, 7, 8, 9]], np.int32)  # second: truncated, no EOT
  np.testing.assert_array_equal(np.asarray(eot_positions(tokens, eot_id=3)), [3, 5])
  m = build()
  images, toks = _inputs(b=2)
  # Changing tokens after EOT must not change the text embedding (causal attention, EOT pooling).
  altered = toks.copy()
  altered[:, -1] = 7
  encode_text = jitted(m, "encode_text")
  np.testing.assert_allclose(np.asarray(encode_text(toks)), np.asarray(encode_text(altered)), atol=1e-6)


def test_map_and_gap_pooling_and_named_sizes():
  images, tokens = _inputs()
  for pool in ("map", "gap"):
    assert jitted(build(pool=pool), "encode_image")(images).shape == (4, 64)
  spec = models.resolve_model_spec(model_cfg(size="ViT-B/16"))
  assert spec["image"] == dict(image_size=224, patch_size=16, width=768, depth=12, heads=12)
  assert spec["text"]["width"] == 512 and spec["text"]["depth"] == 12 and spec["text"]["heads"] == 8
  assert spec["text"]["context_length"] == 77
  assert models.resolve_model_spec(model_cfg(size="ViT-B/32"))["image"]["patch_size"] == 32
  with pytest.raises(ValueError, match="unknown model size"):
    models.resolve_model_spec(model_cfg(size="ViT-Q/7"))


def test_wrong_input_shapes_name_the_expected_shape():
  m = build()
  with pytest.raises(ValueError, match=r"expects images of shape \(batch, 16, 16, 3\)"):
    m.encode_image(np.zeros((2, 8, 8, 3), np.float32))
  with pytest.raises(ValueError, match=r"expects tokens of shape \(batch, 16\)"):
    m.encode_text(np.zeros((2, 5), np.int32))


# MERU reference values (methods.md §4.1, c = 1 and c = 0.5): an independent numpy restatement of
# facebookresearch/meru's meru/lorentz.py written for the notes, not ncjax's output (tests/README.md).
def test_lorentz_reference_values():
  v = np.array([[0.3, -0.4, 0.0], [1.0, 2.0, -2.0]], np.float32)
  np.testing.assert_allclose(lorentz.exp_map0(v, 1.0),
                             [[0.312657, -0.416876, 0], [3.339292, 6.678583, -6.678583]], atol=2e-5)
  x = lorentz.exp_map0(v, 1.0)
  t = lorentz.exp_map0(np.array([[0.1, -0.1, 0.05], [0.5, 1.0, -1.0]], np.float32), 1.0)
  np.testing.assert_allclose(lorentz.pairwise_inner(t, x, 1.0), [[-1.067108, -10.851501], [-3.022491, -2.352410]],
                             atol=1e-4)
  np.testing.assert_allclose(lorentz.pairwise_dist(t, x, 1.0), [[0.364337, 3.075321], [1.770665, 1.5]], atol=1e-4)
  # The saturated aperture is asin(1 - 1e-8) = pi/2 - 1.4e-4 in float64; in float32 1 - 1e-8 rounds to 1 and the
  # value is pi/2 (as in MERU's own fp32 run). Unsaturated entries match to 1e-5.
  aper = np.asarray(lorentz.half_aperture(t, 1.0))
  assert aper[0] == pytest.approx(1.570655, abs=1.5e-4)
  assert aper[1] == pytest.approx(0.094067, abs=1e-5)
  np.testing.assert_allclose(lorentz.oxy_angle(t, x, 1.0), [0.526246, 0.000141], atol=2e-4)
  assert float(lorentz.entailment_loss(t, x, 1.0)) == pytest.approx(0.0, abs=1e-6)
  # c = 0.5 (exp maps recomputed at that curvature).
  x5 = lorentz.exp_map0(v, 0.5)
  t5 = lorentz.exp_map0(np.array([[0.1, -0.1, 0.05], [0.5, 1.0, -1.0]], np.float32), 0.5)
  np.testing.assert_allclose(lorentz.pairwise_dist(t5, x5, 0.5), [[0.364171, 3.073014], [1.753465, 1.5]], atol=1e-4)
  aper5 = np.asarray(lorentz.half_aperture(t5, 0.5))
  assert aper5[0] == pytest.approx(1.570655, abs=1.5e-4) and aper5[1] == pytest.approx(0.158010, abs=1e-5)
  for c in (0.5, 1.0, 2.0):
    np.testing.assert_allclose(lorentz.hyperbolic_norm(lorentz.exp_map0(v, c), c), np.linalg.norm(v, axis=-1),
                               rtol=1e-5)
    np.testing.assert_allclose(lorentz.log_map0(lorentz.exp_map0(v, c), c), v, atol=1e-5)


def test_lorentz_geometry_in_the_two_tower():
  m = build(geometry="lorentz")
  images, tokens = _inputs()
  img, txt = jitted(m, "encode_image")(images), jitted(m, "encode_text")(tokens)
  assert img.shape == (4, 64)
  score = np.asarray(m.score(img, txt))
  assert (score <= -1.0 + 1e-5).all()  # <x, y>_L <= -1/c with c = 1
  sim = np.asarray(m.similarity(img, txt))
  assert (sim <= 1e-6).all()  # negative distances


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True), (True, True)])
def test_heads_major_attention_equals_jax_dot_product_attention(causal, masked):
  """layers.MultiHeadAttention computes heads-major (no transposes around its matmuls); it must equal the
  token-major reference (fused QKV -> split -> jax.nn.dot_product_attention -> out) with causal and key masks,
  including a row whose keys are all masked (uniform attention, finite)."""
  from flax import nnx
  from ncjax.models.layers import MultiHeadAttention
  b, n, w, h = 3, 7, 24, 3
  attn = MultiHeadAttention(w, h, dtype=jnp.float32, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  attn.qkv.bias[...] = jnp.asarray(rng.normal(size=(3 * w,)).astype(np.float32))
  attn.out.bias[...] = jnp.asarray(rng.normal(size=(w,)).astype(np.float32))
  x = jnp.asarray(rng.normal(size=(b, n, w)).astype(np.float32))
  key_mask = None
  if masked:
    key_mask = jnp.asarray(rng.random((b, n)) > 0.3).at[0].set(False).at[1, 0].set(True)
  qkv = (x @ attn.qkv.kernel[...] + attn.qkv.bias[...]).reshape(b, n, 3, h, w // h)
  ref = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=causal,
                                     mask=None if key_mask is None else key_mask[:, None, None, :])
  ref = ref.reshape(b, n, w) @ attn.out.kernel[...] + attn.out.bias[...]
  graphdef, state = nnx.split(attn)
  got = jax.jit(lambda st, m: nnx.merge(graphdef, st)(x, causal=causal, key_mask=m))(state, key_mask)
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5, atol=2e-5)
