"""Permutations of [0, n) evaluated on demand: position -> value and back, in O(1) memory for any n.

A web-scale run cannot hold an N-long permutation per epoch (400M int64 = 3.2 GB per process), so the web path's
epoch order and its injected noise are bijections computed where they are needed: a balanced Feistel network of
`ROUNDS` rounds over the smallest power-of-four domain >= n (2h bits, two h-bit halves), restricted to [0, n) by
cycle walking (a value that lands outside [0, n) is permuted again until it lands inside: still a bijection of
[0, n), expected < 4 applications). The round keys come from numpy's SeedSequence over (seed, *tags), so two
permutations with different tags are independent; the round function is a 64-bit integer mixer (multiply,
xor-shift). Vectorised over numpy arrays; `inverse` undoes `__call__` exactly.

Why not grain's MapDataset.shuffle (also Feistel-style and on demand): the order of every run is recorded in its
checkpoints and results, and must not change with a grain upgrade; the noise also needs the inverse.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_TAG = 0x7065726D   # ASCII 'perm'
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
  """A 64-bit mixer of (x, key) (splitmix64's finaliser applied to x * M1 + key)."""
  z = x * _M1 + key
  z = (z ^ (z >> np.uint64(30))) * _M2
  z = (z ^ (z >> np.uint64(27))) * _M3
  return z ^ (z >> np.uint64(31))


class Permutation:
  """A pseudorandom bijection of [0, n): `p(i)` (array or int) and `p.inverse(j)`."""

  def __init__(self, n: int, seed: int, *tags: int):
    n = int(n)
    if n < 1:
      raise ValueError(f"a permutation needs n >= 1, got {n}")
    self.n = n
    bits = max(2, int(n - 1).bit_length())
    self.half = (bits + 1) // 2
    self.mask = np.uint64((1 << self.half) - 1)
    entropy = [int(seed) & 0xFFFFFFFF, int(seed) >> 32, *[int(t) for t in tags], _TAG]
    self.keys = np.random.SeedSequence(entropy).generate_state(ROUNDS, dtype=np.uint64)

  def _forward(self, x: np.ndarray) -> np.ndarray:
    h, mask = np.uint64(self.half), self.mask
    left, right = x >> h, x & mask
    for k in self.keys:
      left, right = right, left ^ (_mix(right, k) & mask)
    return (left << h) | right

  def _backward(self, y: np.ndarray) -> np.ndarray:
    h, mask = np.uint64(self.half), self.mask
    left, right = y >> h, y & mask
    for k in self.keys[::-1]:
      left, right = right ^ (_mix(left, k) & mask), left
    return (left << h) | right

  def _walk(self, values, step) -> np.ndarray | int:
    scalar = np.ndim(values) == 0
    x = np.atleast_1d(np.asarray(values)).astype(np.int64)
    if x.size and (x.min() < 0 or x.max() >= self.n):
      raise IndexError(f"positions outside [0, {self.n}): {x[(x < 0) | (x >= self.n)][:5].tolist()}")
    with np.errstate(over="ignore"):
      y = step(x.astype(np.uint64))
      out = y >= np.uint64(self.n)
      while out.any():   # cycle walking: stays a bijection of [0, n)
        y[out] = step(y[out])
        out = y >= np.uint64(self.n)
    y = y.astype(np.int64)
    return int(y[0]) if scalar else y

  def __call__(self, positions):
    return self._walk(positions, self._forward)

  def inverse(self, values):
    return self._walk(values, self._backward)
