"""`model.attention`: every implementation the CPU can run computes the einsum path's function (outputs and
gradients, with causal and key-padding masks, a fully masked row included; the fused TPU kernel through Pallas'
interpreter, on one device and under a mesh), the whole two-tower model and an
imported open_clip checkpoint give the same embeddings under each, 'auto' is resolved from the platform, and
'cudnn' from the platform, the compute dtype and the head size, with one clear line where it cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ncjax import errors, models
from ncjax.models import layers
from ncjax.models.layers import MultiHeadAttention, resolve_attention

CPU_KINDS = ("einsum", "recompute", "fused", "xla")
# cuDNN's fused kernel where the devices that compute are NVIDIA GPUs (run.sh's slice on a GPU host): half precision
# only, so it joins the bf16 comparison.
HALF_KINDS = ("xla", "recompute", "fused") + (("cudnn",) if jax.devices()[0].platform == "gpu" else ())


def _attention(kind: str, dtype=jnp.float32, width: int = 32, heads: int = 4):
  return MultiHeadAttention(width, heads, dtype=dtype, rngs=nnx.Rngs(3), attention=kind)


def _inputs(b=3, n=7, w=32):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(b, n, w)).astype(np.float32)
  key_mask = rng.random((b, n)) > 0.3
  key_mask[:, 0] = True
  key_mask[1] = False            # a row whose keys are all masked: attends uniformly, never NaN
  return jnp.asarray(x), jnp.asarray(key_mask)


def _run(kind, x, *, causal, key_mask, dtype=jnp.float32, pad_odd_tokens=None):
  module = _attention(kind, dtype)
  if pad_odd_tokens is not None:
    module.pad_odd_tokens = pad_odd_tokens
  graphdef, params = nnx.split(module, nnx.Param)

  def loss(p, x):
    y = nnx.merge(graphdef, p)(x, causal=causal, key_mask=key_mask)
    return jnp.sum(jnp.sin(y.astype(jnp.float32))), y

  (value, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
  return y, grads, value


@pytest.mark.parametrize("kind", ["xla", "recompute", "fused"])
@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True), (True, True)])
def test_each_kind_equals_the_einsum_path_with_masks_and_gradients(kind, causal, masked):
  x, key_mask = _inputs()
  key_mask = key_mask if masked else None
  y_ref, g_ref, _ = _run("einsum", x, causal=causal, key_mask=key_mask)
  y, g, _ = _run(kind, x, causal=causal, key_mask=key_mask)
  assert np.isfinite(np.asarray(y)).all()
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), atol=2e-6, rtol=0)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)
  if masked:   # the fully masked row is the mean of the values, as with every row's keys equal
    assert np.abs(np.asarray(y)[1]).max() > 0


def test_the_masks_matter():
  """The parity above compares something: masking changes the output, for both kinds alike."""
  x, key_mask = _inputs()
  for kind in CPU_KINDS:
    plain, _, _ = _run(kind, x, causal=False, key_mask=None)
    causal, _, _ = _run(kind, x, causal=True, key_mask=None)
    padded, _, _ = _run(kind, x, causal=False, key_mask=key_mask)
    assert np.abs(np.asarray(plain - causal)).max() > 1e-3
    assert np.abs(np.asarray(plain - padded)).max() > 1e-3
    # causal: the first token sees only itself, whatever the others are
    x2 = x.at[:, 1:].set(0.0)
    first, _, _ = _run(kind, x2, causal=True, key_mask=None)
    np.testing.assert_allclose(np.asarray(first)[:, 0], np.asarray(causal)[:, 0], atol=1e-6)


@pytest.mark.parametrize("causal,masked", [(False, False), (True, True)])
def test_an_odd_token_count_padded_for_cudnn_computes_the_same_function(causal, masked):
  """cuDNN trains only on even token counts, so its path pads an odd count by one token that the sequence lengths
  exclude (ViT-B/16's 197, CLIP text's 77). The padding is checked here through the same code on XLA's kernel:
  outputs and gradients equal the einsum path's, a fully masked row included."""
  x, key_mask = _inputs()   # 7 tokens
  key_mask = key_mask if masked else None
  y_ref, g_ref, _ = _run("einsum", x, causal=causal, key_mask=key_mask)
  y, g, _ = _run("xla", x, causal=causal, key_mask=key_mask, pad_odd_tokens=True)
  assert y.shape == x.shape
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), atol=2e-6, rtol=0)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", HALF_KINDS)
def test_bf16_compute_agrees_across_kinds(kind):
  x, key_mask = _inputs()
  y_ref, g_ref, _ = _run("einsum", x, causal=True, key_mask=key_mask, dtype=jnp.bfloat16)
  y, g, _ = _run(kind, x, causal=True, key_mask=key_mask, dtype=jnp.bfloat16)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(y_ref, np.float32), atol=3e-2, rtol=0)
  # the gradients too: the recomputing backward rounds the probabilities to bf16 where the einsum path's backward
  # keeps them in float32, which the bf16 compute already bounds
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, atol=3e-2 * max(1.0, np.abs(b).max()), rtol=0)


def test_the_recomputing_backward_keeps_no_tokens_by_tokens_array():
  """What 'recompute' is for: the forward leaves nothing of (tokens x tokens) for the backward, where autodiff of
  the einsum path keeps the float32 probabilities (jax's saved residuals of each, read off the jaxpr)."""
  from jax._src.ad_checkpoint import saved_residuals
  x, _ = _inputs(b=2, n=24, w=32)

  def residual_shapes(kind):
    module = _attention(kind)
    graphdef, params = nnx.split(module, nnx.Param)
    f = lambda p, x: jnp.sum(nnx.merge(graphdef, p)(x, causal=True))
    return [tuple(aval.shape) for aval, _ in saved_residuals(f, params, x)]

  # (batch, heads, tokens, tokens): the causal mask, (1, 1, tokens, tokens) booleans, is a constant of the program
  square = lambda shapes: [s for s in shapes if len(s) == 4 and s[:2] == (2, 4) and s[-1] == s[-2] == 24]
  assert square(residual_shapes("einsum"))          # the probabilities, kept by autodiff
  assert not square(residual_shapes("recompute"))
  assert not square(residual_shapes("fused"))


def _tiny_spec(attention: str, **kw):
  import ml_collections
  from ncjax.config_lib import base_config
  cfg = base_config().model
  cfg.update(dict(size="micro", attention=attention, **kw))
  return models.ModelSpec.from_config(ml_collections.ConfigDict(cfg.to_dict()))


def test_the_two_tower_model_gives_the_same_embeddings_under_each_kind():
  rng = np.random.default_rng(1)
  images = jnp.asarray(rng.normal(size=(4, 16, 16, 3)).astype(np.float32))
  tokens = jnp.asarray(np.concatenate([rng.integers(2, 50, size=(4, 9)), np.full((4, 7), 0)], 1).astype(np.int32))
  tokens = tokens.at[:, 8].set(1)   # an end-of-text token, then padding
  out = {}
  for kind in ("auto",) + CPU_KINDS:
    module = models.build_two_tower(_tiny_spec(kind), vocab_size=64, eot_id=1, seed=5)
    graphdef, params = nnx.split(module, nnx.Param)
    out[kind] = (params, jax.jit(lambda p: (nnx.merge(graphdef, p).encode_image(images),
                                            nnx.merge(graphdef, p).encode_text(tokens)))(params))
  ref_params, ref = out["einsum"]
  for kind, (params, emb) in out.items():
    # attention has no parameters of its own: the same seed gives the same tree, so checkpoints move between kinds
    assert jax.tree.structure(params) == jax.tree.structure(ref_params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(emb, ref):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)


def test_an_imported_open_clip_checkpoint_gives_the_same_embeddings_under_each_kind(tmp_path):
  import torch
  import reference_models as rm
  from ncjax import pretrained
  ref = rm.make_open_clip(rm.tiny_open_clip_cfg(True))
  path = str(tmp_path / "model.pt")
  torch.save(ref.state_dict(), path)
  images, tokens = rm.images_and_tokens()
  with torch.no_grad():
    ri = rm.normalise(ref.encode_image(rm.torch_nchw(images)).numpy())
    rt = rm.normalise(ref.encode_text(torch.from_numpy(tokens.astype(np.int64))).numpy())
  for kind in CPU_KINDS:
    model, _, _ = pretrained.load_model(f"openai:{path}", attention=kind)
    np.testing.assert_allclose(np.asarray(model.encode_image(images)), ri, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(model.encode_text(tokens)), rt, atol=1e-4, rtol=0)


def test_auto_picks_the_fused_kernel_on_a_tpu_and_einsum_elsewhere(monkeypatch):
  """'auto' never picks cuDNN: on an H100 the einsum path ran CLIP ViT-B/16 1.33x as fast (docs/notes/
  accelerator_h100.md); cuDNN is asked for by name."""
  bf16, f32 = jnp.bfloat16, jnp.float32
  for dtype, head_dim in ((bf16, 64), (jnp.float16, 128), (f32, 64), (bf16, 160), (bf16, 36)):
    assert resolve_attention("auto", dtype=dtype, head_dim=head_dim, platform="gpu") == "einsum"
    assert resolve_attention("auto", dtype=dtype, head_dim=head_dim, platform="tpu") == "fused"
    assert resolve_attention("auto", dtype=dtype, head_dim=head_dim, platform="cpu") == "einsum"
  assert resolve_attention("cudnn", dtype=bf16, head_dim=64, platform="gpu") == "cudnn"
  assert resolve_attention("xla", dtype=f32, head_dim=36, platform="cpu") == "xla"
  # without a platform, JAX's default backend decides (whatever this process's is)
  for platform, expected in (("cpu", "einsum"), ("gpu", "einsum"), ("tpu", "fused")):
    monkeypatch.setattr(jax, "default_backend", lambda platform=platform: platform)
    assert resolve_attention("auto", dtype=bf16, head_dim=64) == expected
  # the model resolves per tower
  assert models.attention_kinds(_tiny_spec("auto", dtype="bfloat16"), platform="tpu") == {"image": "fused",
                                                                                          "text": "fused"}
  assert models.attention_kinds(_tiny_spec("cudnn", dtype="bfloat16"), platform="gpu") == {"image": "cudnn",
                                                                                           "text": "cudnn"}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(platform="cpu", dtype=jnp.bfloat16, head_dim=64), "needs an NVIDIA GPU"),
    (dict(platform="gpu", dtype=jnp.float32, head_dim=64), "model.dtype=bfloat16"),
    (dict(platform="gpu", dtype=jnp.bfloat16, head_dim=256), "head sizes"),
])
def test_cudnn_where_it_cannot_run_is_one_line_naming_why(kwargs, needle, monkeypatch):
  with pytest.raises(errors.ConfigurationError) as e:
    resolve_attention("cudnn", **kwargs)
  assert needle in str(e.value) and "model.attention='auto'" in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(errors.ConfigurationError, match="unknown model.attention 'flash'"):
    resolve_attention("flash", dtype=jnp.float32, head_dim=64)
  # in a process computing on the CPU, a model asking for cuDNN is refused when it is built, not deep inside XLA
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  with pytest.raises(errors.ConfigurationError, match="needs an NVIDIA GPU"):
    models.build_two_tower(_tiny_spec("cudnn", dtype="bfloat16"), vocab_size=64, eot_id=1)
  assert layers.CUDNN_MAX_HEAD_DIM == 128


def test_the_recomputing_block_gives_the_einsum_blocks_values_and_gradients():
  """A whole residual stack under 'recompute' is the einsum stack's function, gradients included."""
  from ncjax.models.layers import Transformer
  x, key_mask = _inputs()
  out = {}
  for kind in ("einsum", "recompute"):
    stack = Transformer(32, 2, 4, rngs=nnx.Rngs(7), attention=kind)
    graphdef, params = nnx.split(stack, nnx.Param)

    def loss(p, x):
      return jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x, causal=True, key_mask=key_mask)))

    out[kind] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
  (v_ref, g_ref), (v, g) = out["einsum"], out["recompute"]
  np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("width,heads", [(128, 2), (256, 4), (256, 2), (96, 2)])
def test_the_fused_kernel_reads_whole_heads_in_128_lane_blocks(width, heads):
  """The kernel's grid steps over token-major columns: two 64-wide heads per 128-lane block (128 / 2: one step;
  256 / 4: two), a 128-wide head per block (256 / 2), the whole width where no head-aligned block of 128 lanes
  divides it (96 / 2: 48-wide heads); each equals the einsum path, causal, gradients included."""
  from ncjax.models import fused_attention
  head_dim = width // heads
  assert fused_attention._lanes(width, head_dim) == {(128, 2): 128, (256, 4): 128, (256, 2): 128,
                                                     (96, 2): 96}[width, heads]
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, width)).astype(np.float32))
  out = {}
  for kind in ("einsum", "fused"):
    graphdef, params = nnx.split(_attention(kind, width=width, heads=heads), nnx.Param)
    loss = lambda p, x: jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x, causal=True)))
    out[kind] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
  for a, b in zip(jax.tree.leaves(out["fused"]), jax.tree.leaves(out["einsum"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


def test_the_fused_kind_runs_its_kernel_where_it_can_and_per_device_under_a_mesh(devices):
  """'fused' runs the Pallas kernel for unmasked and causal attention (a key mask takes the recomputing einsums),
  and under a mesh each device's examples through it in shard_map: 8 devices equal 1, gradients included."""
  x, key_mask = _inputs(b=8)
  module = _attention("fused")
  graphdef, params = nnx.split(module, nnx.Param)

  def loss(p, x, causal, key_mask):
    return jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x, causal=causal, key_mask=key_mask)))

  kernels = lambda causal, mask: str(jax.make_jaxpr(jax.grad(loss), static_argnums=(2,))(
      params, x, causal, mask)).count("pallas_call")
  assert kernels(False, None) == kernels(True, None) == 2        # forward and backward
  assert kernels(False, key_mask) == 0
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=(2, 3))
  one = step(params, x, True, None)
  mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("data", "fsdp"))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  with jax.set_mesh(mesh):
    jaxpr = str(jax.make_jaxpr(jax.grad(loss), static_argnums=(2,))(params, x, True, None))
    eight = step(params, jax.device_put(x, rows), True, None)
  assert "shard_map" in jaxpr
  for a, b in zip(jax.tree.leaves(eight), jax.tree.leaves(one)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)   # (summed in another order)
