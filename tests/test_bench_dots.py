"""benchmarks.foundation's reading of a compiled program's matrix products (the step's matmul ceiling)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import foundation


def test_program_dots_finds_every_product_with_its_shapes_and_count():
  def f(x, w, q, k):
    h = jnp.tanh(x @ w) @ w.T                          # two plain products, one through a transposed operand
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k)       # a batched one (attention's)
    return h.sum() + logits.sum()

  args = (jnp.ones((64, 16)), jnp.ones((16, 16)), jnp.ones((2, 3, 5, 4)), jnp.ones((2, 3, 5, 4)))
  dots = foundation.program_dots(jax.jit(f).lower(*args).compile().as_text())
  assert sum(d["count"] for d in dots) == 3
  plain = [d for d in dots if not d["batch"][0]]
  batched = [d for d in dots if d["batch"][0]]
  assert len(batched) == 1 and batched[0]["count"] == 1
  assert batched[0]["lhs"] == (2, 3, 5, 4) and batched[0]["batch"] == ((0, 1), (0, 1))
  assert sum(d["count"] for d in plain) == 2
  assert all(d["dtype"] == "f32" and 64 in d["lhs"] + d["rhs"] for d in plain)


def test_dot_ceiling_counts_each_product_once_per_partition():
  def f(x, w):
    return (x @ w).sum()

  text = jax.jit(f).lower(jnp.ones((128, 32)), jnp.ones((32, 8))).compile().as_text()
  one, four = foundation.dot_ceiling(text, partitions=1), foundation.dot_ceiling(text, partitions=4)
  assert one["plain_flops"] == 2 * 128 * 32 * 8 and four["plain_flops"] == 4 * one["plain_flops"]
  assert one["batched_flops"] == 0 and one["batched_flops_per_sec"] is None
  assert one["plain_seconds"] > 0 and one["plain_flops_per_sec"] > 0
