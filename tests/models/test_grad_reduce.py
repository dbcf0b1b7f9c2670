"""`optim.grad_reduce`: the dtype a bf16 model's weight gradients are formed and summed across devices in. 'bf16'
(the products' own dtype; half the bytes on the wire) or 'float32' (`ncjax.models.layers.project`): the same
function and gradients within bf16's rounding, float32 sums where the batch is summed, and the weight gradients'
products formed in float32."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ncjax import errors
from ncjax.models.layers import ResidualBlock, Transformer


def _grads(dtype, grad_reduce, x):
  stack = Transformer(32, 2, 4, rngs=nnx.Rngs(7), dtype=dtype, grad_reduce=grad_reduce)
  graphdef, params = nnx.split(stack, nnx.Param)
  loss = lambda p, x: jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x, causal=True).astype(jnp.float32)))
  return graphdef, params, loss, jax.jit(jax.value_and_grad(loss))(params, x)


def _x(b=64, n=16):
  return jnp.asarray(np.random.default_rng(0).normal(size=(b, n, 32)).astype(np.float32))


def test_float32_compute_is_the_same_function_and_gradient_under_both():
  x = _x(8, 7)
  _, _, _, (v1, g1) = _grads(jnp.float32, "bf16", x)
  _, _, _, (v2, g2) = _grads(jnp.float32, "float32", x)
  np.testing.assert_allclose(float(v2), float(v1), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=5e-5, rtol=1e-5)


def test_bf16_compute_sums_the_bias_gradients_in_float32():
  """A bias's gradient is a sum over every token of the batch (64 x 16 here): summed in bf16 it carries bf16's
  rounding of a 1,024-term sum, in float32 only that of its terms. Against the float32 model's gradient the
  'float32' mode's bias gradients are closer, and every gradient stays within bf16's noise."""
  x = _x()
  _, _, _, (_, ref) = _grads(jnp.float32, "bf16", x)
  _, _, _, (_, g16) = _grads(jnp.bfloat16, "bf16", x)
  _, _, _, (_, g32) = _grads(jnp.bfloat16, "float32", x)
  flat = lambda g: {jax.tree_util.keystr(k): np.asarray(v, np.float64) for k, v in
                    jax.tree_util.tree_flatten_with_path(g)[0]}
  ref, g16, g32 = flat(ref), flat(g16), flat(g32)
  biases = [k for k in ref if k.endswith("['bias'].value") and "ln_" not in k]
  err = lambda g, k: np.abs(g[k] - ref[k]).max() / np.abs(ref[k]).max()
  assert len(biases) == 8
  assert np.mean([err(g32, k) for k in biases]) < 0.7 * np.mean([err(g16, k) for k in biases])
  assert max(err(g32, k) for k in ref) < 0.05


def test_the_weight_gradients_are_formed_in_the_chosen_dtype():
  """In the program's products: 'float32' adds one bf16 x bf16 -> float32 product per weight of the block (q, k, v,
  the output projection, the MLP's two: 6), its weight gradients; 'bf16' forms them in bf16 (where XLA sums
  them across devices before widening: benchmarks/pod_compile.py's TPU program shows the all-reduces' dtypes)."""
  x = _x(16, 8)

  def widening_products(grad_reduce):
    block = ResidualBlock(32, 4, 128, act="quick_gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(1),
                          grad_reduce=grad_reduce)
    graphdef, params = nnx.split(block, nnx.Param)
    loss = lambda p, x: jnp.sum(nnx.merge(graphdef, p)(x).astype(jnp.float32) ** 2)
    text = jax.jit(jax.grad(loss)).lower(params, x).as_text()
    return len(re.findall(r"dot_general.*:\s*\(tensor<[^>]*xbf16>, tensor<[^>]*xbf16>\) -> tensor<[^>]*xf32>", text))

  assert widening_products("float32") - widening_products("bf16") == 6


def test_an_unknown_choice_is_one_line():
  with pytest.raises(errors.ConfigurationError, match="unknown optim.grad_reduce 'fp8'"):
    ResidualBlock(32, 4, 128, act="quick_gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(1), grad_reduce="fp8")
