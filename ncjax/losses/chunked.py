"""Memory-lean forms of the N x N losses for very large global batches (32k and up).

The dense losses hold several N x N (or N x (N+1)) float32 arrays at once — logits, softmaxes, plans, targets and
their gradients — about 4.3 GB each at N = 32,768. Here every device keeps only its own rows: under a mesh the
computation runs in `shard_map` over the batch axes, the other side's embeddings are all-gathered (N x D), and
column statistics (log-sum-exps, marginals) are merged across devices with one reduction of an N-vector. Inside a
device the rows are processed in chunks of `chunk` rows by a `lax.scan` whose body is rematerialised
(`jax.checkpoint`), so the backward pass recomputes each chunk's logits instead of storing them: activation memory
is O(chunk x N) per device, and the only N^2 / devices array is NCU's transport kernel.

The values equal the dense losses (tests: 8 devices == 1 device == dense). Losses are written with the identities
  sum_ij T_ij (log T_ij - log softmax_row(Z)_ij) = sum T log T - sum T Z + sum_i r_i lse_row_i      (r = row sums)
so that one pass over the chunks yields every term, the column log-sum-exps merged after the pass.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ncjax.numerics import f32


@dataclasses.dataclass(frozen=True)
class _Axes:
  """Collectives over the batch axes inside shard_map, or the identity on one device."""
  names: tuple[str, ...] | None

  def psum(self, x):
    return x if self.names is None else jax.lax.psum(x, self.names)

  def pmax(self, x):
    return x if self.names is None else jax.lax.pmax(x, self.names)

  def gather(self, x):
    return x if self.names is None else jax.lax.all_gather(x, self.names, tiled=True)

  def offset(self, n_local: int):
    if self.names is None:
      return 0
    return jax.lax.axis_index(self.names) * n_local


def _run_sharded(fn: Callable, n: int, args, static_specs):
  """fn(axes, *args) with batch-sharded args (leading dim n) split over every mesh axis when a mesh is active and
  divides n; replicated args (spec None) passed whole. Outputs are replicated scalars / vectors."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or n % mesh.size or mesh.size == 1:
    return fn(_Axes(None), *args)
  names = tuple(mesh.axis_names)
  in_specs = tuple(P(names) if s == "rows" else P() for s in static_specs)
  inner = lambda *a: fn(_Axes(names), *a)
  return jax.shard_map(inner, in_specs=in_specs, out_specs=P(), check_vma=False)(*args)


def _chunks(x, chunk: int):
  """(n, ...) -> (n / chunk, chunk, ...); chunk is clamped to divide n."""
  n = x.shape[0]
  c = math.gcd(n, max(1, min(chunk, n)))
  return x.reshape((n // c, c) + x.shape[1:])


def _merge_lse(carry, block_max, block_sum):
  """Online column log-sum-exp: (max, sum exp(x - max)) merged with a new block's."""
  m, s = carry
  new_m = jnp.maximum(m, block_max)
  return new_m, s * jnp.exp(m - new_m) + block_sum * jnp.exp(block_max - new_m)


def _column_lse(axes: _Axes, m, s):
  """Merge per-device (max, sum) column statistics into the global column log-sum-exp."""
  gm = jax.lax.stop_gradient(axes.pmax(m))
  return gm + jnp.log(axes.psum(s * jnp.exp(m - gm)))


# ---------------------------------------------------------------------------------------------------------------
# Symmetric InfoNCE and the softmax-diagonal statistics
# ---------------------------------------------------------------------------------------------------------------
def _logit_pass(axes: _Axes, v_loc, t_all, scale, chunk: int):
  """One pass over the local rows: (row log-sum-exps (n_loc,), column (max, sum) stats (N,)). Rematerialised.

  The scale multiplies the gathered side before the matmul: XLA CPU mis-evaluates the log-sum-exp of
  `scale * (v @ t.T)` inside a loop body at huge scales (+-inf at e^30), while `v @ (scale * t).T` is exact."""
  ts = scale * t_all

  def body(carry, vc):
    z = vc @ ts.T
    row_lse = jax.nn.logsumexp(z, axis=1)
    bm = jax.lax.stop_gradient(jnp.max(z, axis=0))
    return _merge_lse(carry, bm, jnp.sum(jnp.exp(z - bm), axis=0)), row_lse

  n = t_all.shape[0]
  init = (jnp.full((n,), -jnp.inf, jnp.float32), jnp.zeros((n,), jnp.float32))
  (m, s), row = jax.lax.scan(jax.checkpoint(body), init, _chunks(v_loc, chunk))
  return row.reshape(-1), (m, s)


def _positive_lses(axes: _Axes, v_loc, t_loc, logit_scale, chunk: int):
  """(row log-sum-exps, column log-sum-exps of this device's own columns, positive logits) of this device's rows of
  Z = s V T^T, without the N x N matrix: what both InfoNCE and the softmax diagonals are made of."""
  scale = jnp.exp(f32(logit_scale))
  row_lse, (m, s) = _logit_pass(axes, v_loc, axes.gather(t_loc), scale, chunk)
  col_lse = _column_lse(axes, m, s)
  pos = scale * jnp.sum(v_loc * t_loc, axis=-1)
  own = jax.lax.dynamic_slice_in_dim(col_lse, axes.offset(v_loc.shape[0]), v_loc.shape[0])
  return row_lse, own, pos


def infonce(image_emb, text_emb, logit_scale, *, chunk: int = 1024):
  """CLIP's symmetric InfoNCE (same value and gradients as ncjax.losses.contrastive.infonce) with O(chunk x N)
  activation memory per device. Returns (loss, metrics)."""
  v, t = f32(image_emb), f32(text_emb)
  n = v.shape[0]

  def fn(axes, v_loc, t_loc, logit_scale):
    row_lse, own, pos = _positive_lses(axes, v_loc, t_loc, logit_scale, chunk)
    i2t = axes.psum(jnp.sum(row_lse - pos))
    t2i = axes.psum(jnp.sum(own - pos))
    return 0.5 * (i2t + t2i) / n, i2t / n, t2i / n

  loss, i2t, t2i = _run_sharded(fn, n, (v, t, logit_scale), ("rows", "rows", None))
  return loss, dict(loss_i2t=i2t, loss_t2i=t2i)


def softmax_diagonals(image_emb, text_emb, logit_scale, *, chunk: int = 1024):
  """(softmax_row(Z)_ii, softmax_col(Z)_ii) of Z = s V T^T without the N x N matrix (NCU's clean confidence)."""
  v, t = f32(image_emb), f32(text_emb)
  n = v.shape[0]

  def fn(axes, v_loc, t_loc, logit_scale):
    row_lse, own, pos = _positive_lses(axes, v_loc, t_loc, logit_scale, chunk)
    offset = axes.offset(v_loc.shape[0])
    row = jnp.zeros((n,), jnp.float32).at[offset + jnp.arange(v_loc.shape[0])].set(jnp.exp(pos - row_lse))
    col = jnp.zeros((n,), jnp.float32).at[offset + jnp.arange(v_loc.shape[0])].set(jnp.exp(pos - own))
    return axes.psum(row), axes.psum(col)

  return _run_sharded(fn, n, (jax.lax.stop_gradient(v), jax.lax.stop_gradient(t), logit_scale),
                      ("rows", "rows", None))


# ---------------------------------------------------------------------------------------------------------------
# NCU's stage-2 loss
# ---------------------------------------------------------------------------------------------------------------
def _scalings(axes: _Axes, kernel, a, b, eps, max_iterations, threshold, transposed: bool):
  """NCU's Sinkhorn iterations in scaling form on row-sharded kernel rows (n_loc, m).

  transposed=False: the image-side problem (rows = images): u (local) <- a / (K v), v <- b / (K^T u) (reduced).
  transposed=True: the text-side problem on the same kernel (rows = texts, K^T): u' <- b / (K^T v') (reduced),
  v' (local) <- a / (K u'). Returns (row-side scaling (local), column-side scaling (m,), iterations); the stopping
  rule is the public code's on the problem's own row scalings."""
  def scale(marginal, total):
    return jnp.where(total > 0, marginal / jnp.where(total > 0, total, 1.0), 0.0)

  kv = lambda v: jnp.matmul(kernel, v.astype(kernel.dtype), preferred_element_type=jnp.float32)
  ktu = lambda u: axes.psum(jnp.matmul(u.astype(kernel.dtype), kernel, preferred_element_type=jnp.float32))

  def change(new, old, reduce):
    live = (new > 0) & (old > 0)
    d = jnp.where(live, jnp.log(jnp.where(live, new, 1.0)) - jnp.log(jnp.where(live, old, 1.0)), 0.0)
    total = jnp.sum(jnp.abs(d))
    return eps * (axes.psum(total) if reduce else total)

  def body(carry):
    rows, cols, it, _ = carry
    if not transposed:
      rows_new = scale(a, kv(cols))
      cols_new = scale(b, ktu(rows_new))
      err = change(rows_new, rows, reduce=True)
    else:
      cols_new = scale(b, ktu(rows))          # u': the text problem's row scalings
      rows_new = scale(a, kv(cols_new))       # v': its column scalings (the images, local)
      err = change(cols_new, cols, reduce=False)
    return rows_new, cols_new, it + 1, err

  cond = lambda c: (c[2] < max_iterations) & (c[3] >= threshold)
  rows0, cols0 = jnp.ones_like(a), jnp.ones_like(b)
  rows, cols, it, _ = jax.lax.while_loop(cond, body, (rows0, cols0, jnp.asarray(0),
                                                      jnp.asarray(jnp.inf, jnp.float32)))
  return rows, cols, it


def transport_kl(image_emb, text_emb, neg_text_emb, logit_scale, forget_mask, options, *, chunk: int = 1024):
  """The two KL terms of NCU's stage-2 loss (as ncjax.losses.ncu.unlearning computes them with the kernel solver,
  one solve per side) with the transport kernel as the only N x (N+1) array (row-sharded) and the logits recomputed
  per chunk in the backward pass. Returns (L_img, L_txt, image-side iterations, text-side iterations)."""
  o = options
  solver = o.solver
  if not hasattr(solver, "kernel"):
    raise ValueError("the chunked NCU loss needs a kernel solver (loss.solver='kernel')")
  v, t, tn = f32(image_emb), f32(text_emb), f32(neg_text_emb)
  forget = jnp.asarray(forget_mask, bool)
  n = v.shape[0]

  def fn(axes, v_loc, t_loc, tn_loc, f_loc, logit_scale):
    n_loc = v_loc.shape[0]
    scale = jnp.exp(f32(logit_scale))
    t_all = axes.gather(t_loc)
    offset = axes.offset(n_loc)
    rows = jnp.arange(n_loc)
    d_loc = jnp.sum(v_loc * tn_loc, axis=-1)
    # Transport kernel of the local rows (no gradient): cost (1 - S_ext) / max, masked, exp(-cost / eps).
    sg = jax.lax.stop_gradient
    s_ext = jnp.concatenate([sg(v_loc) @ sg(t_all).T, sg(d_loc)[:, None]], axis=1)
    cmax = axes.pmax(jnp.max(1.0 - s_ext))
    own = jnp.zeros((n_loc, n + 1), bool).at[rows, offset + rows].set(True)
    neg_col = (jnp.arange(n + 1) == n)[None, :]
    mask = jnp.where(f_loc[:, None], ~own, ~neg_col)
    kernel = solver.kernel((1.0 - s_ext) / cmax, mask)
    del s_ext
    a, b = jnp.full((n_loc,), 1.0 / n, jnp.float32), jnp.full((n + 1,), 1.0 / (n + 1), jnp.float32)
    eps, its, thr = solver.epsilon, solver.max_iterations, solver.threshold
    u, vv, it_v = _scalings(axes, kernel, a, b, eps, its, thr, transposed=False)
    vt, ut, it_t = _scalings(axes, kernel, a, b, eps, its, thr, transposed=True)
    k32 = lambda k: k.astype(jnp.float32)
    kv = jnp.matmul(kernel, vv.astype(kernel.dtype), preferred_element_type=jnp.float32)          # (n_loc,)
    ktv = axes.psum(jnp.matmul(vt.astype(kernel.dtype), kernel, preferred_element_type=jnp.float32))  # (N+1,)
    eye_val = jnp.where(f_loc, 0.0, 1.0)
    # Row normalisers as safe reciprocals: an all-masked column (the negative when nothing is forgotten) has
    # K^T v' = 0, and dividing by a floor instead would overflow to inf and give 0 * inf = NaN.
    inv_kv = lambda x: jnp.where(x > 0, 1.0 / jnp.where(x > 0, x, 1.0), 0.0)
    inv_ktv = inv_kv(ktv)

    def targets(kc, rc, fc, ec, kvc, vtc):
      """Image-side rows and text-side columns of the targets for a chunk of local rows."""
      identity = jnp.zeros_like(kc).at[jnp.arange(kc.shape[0]), offset + rc].set(ec)
      identity = identity.at[:, n].set(jnp.where(fc, 1.0, 0.0))
      tv = o.kappa * kc * (vv[None, :] * inv_kv(kvc)[:, None]) + (1 - o.kappa) * identity
      tt = o.kappa * kc * (vtc[:, None] * inv_ktv[None, :]) + (1 - o.kappa) * identity
      return tv, tt

    # Column sums of the text-side targets (their rows), for normalisation and the log-sum-exp terms.
    def colsum_body(acc, xs):
      kc, rc, fc, ec, kvc, vtc = xs
      _, tt = targets(k32(kc), rc, fc, ec, kvc, vtc)
      return acc + jnp.sum(tt, axis=0), None

    chunked = lambda x: _chunks(x, chunk)
    xs = (chunked(kernel), chunked(rows), chunked(f_loc), chunked(eye_val), chunked(kv), chunked(vt))
    col_sum, _ = jax.lax.scan(colsum_body, jnp.zeros((n + 1,), jnp.float32), xs)
    col_sum = axes.psum(col_sum)
    norm_t = jnp.maximum(col_sum, 1e-30) if o.normalize_text_targets else jnp.ones_like(col_sum)

    def loss_body(carry, xs_g):
      (m, s, acc) = carry
      (kc, rc, fc, ec, kvc, vtc), vc, dc = xs_g
      tv, tt = targets(k32(kc), rc, fc, ec, kvc, vtc)
      tt = tt / norm_t[None, :]
      tv, tt = jax.lax.stop_gradient(tv), jax.lax.stop_gradient(tt)
      z = jnp.concatenate([vc @ ts_all.T, scale * dc[:, None]], axis=1)
      row_lse = jax.nn.logsumexp(z, axis=1)
      xlogx = lambda x: jnp.sum(jnp.where(x > 0, x * jnp.log(jnp.where(x > 0, x, 1.0)), 0.0))
      terms = jnp.stack([xlogx(tv) - jnp.sum(tv * z) + jnp.sum(jnp.sum(tv, axis=1) * row_lse),
                         xlogx(tt) - jnp.sum(tt * z)])
      bm = jax.lax.stop_gradient(jnp.max(z, axis=0))
      m, s = _merge_lse((m, s), bm, jnp.sum(jnp.exp(z - bm), axis=0))
      return (m, s, acc + terms), None

    ts_all = scale * t_all   # scaled before the matmul (see _logit_pass)
    init = (jnp.full((n + 1,), -jnp.inf, jnp.float32), jnp.zeros((n + 1,), jnp.float32), jnp.zeros((2,), jnp.float32))
    (m, s, acc), _ = jax.lax.scan(jax.checkpoint(loss_body), init, (xs, chunked(v_loc), chunked(d_loc)))
    col_lse = _column_lse(axes, m, s)
    txt_rows = col_sum / norm_t   # row sums of the text-side targets
    acc = axes.psum(acc)
    loss_img = acc[0] / n
    loss_txt = (acc[1] + jnp.sum(txt_rows * col_lse)) / (n + 1)
    return loss_img, loss_txt, it_v, it_t

  return _run_sharded(fn, n, (v, t, tn, forget, logit_scale), ("rows", "rows", "rows", "rows", None))
