"""Analytic FLOP counts of a train step: what model FLOPs utilisation (MFU) and the compiled programs' own counts are
measured against (benchmarks/pod_compile.py, benchmarks/accelerator/).

Counted: the matrix products of both towers (2 FLOPs per multiply-add), forward and backward — a product's backward
is two products of its size, one for each operand's gradient, and one where an operand needs none (the pixels under
the patch embedding, the weights of frozen blocks) — and the global loss's N x N (or N x (N+1)) similarity products.
Not counted: element-wise work (norms, softmax, activations, the optimiser: a few percent of a ViT's step, which
XLA's cost analysis does count) and NCU's Sinkhorn iterations (element-wise over the N x (N+1) plan, see
`sinkhorn_flops`). The "model FLOPs" of MFU exclude rematerialisation's recomputed forward; `remat=True` adds it
(the hardware FLOPs the step then executes).

ViT-B/16 CLIP: 41.09 GFLOP per pair forward (image 35.13, text 5.96); a step, at a global batch of 32,768, 123.13
GFLOP per pair (3 x the forward, less the pixels' gradient, plus the loss); ViT-L/14: 175.33 forward, 525.82 a step.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TowerShape:
  tokens: int
  width: int
  depth: int
  mlp_dim: int
  in_proj: int        # FLOPs of the tower's input projection per example (patch embedding), forward
  out_dim: int        # the embedding size of the final projection


def _tower(towers: dict, kind: str, embed_dim: int, pool: str = "tok") -> TowerShape:
  t = towers[kind]
  width = int(t["width"])
  mlp = int(t.get("mlp_dim") or 4 * width)
  if kind == "image":
    grid = int(t["image_size"]) // int(t["patch_size"])
    patches = grid * grid
    tokens = patches + (1 if pool == "tok" else 0)
    in_proj = 2 * patches * int(t["patch_size"]) ** 2 * int(t.get("channels") or 3) * width
  else:
    tokens, in_proj = int(t["context_length"]), 0   # the token embedding is a lookup
  return TowerShape(tokens=tokens, width=width, depth=int(t["depth"]), mlp_dim=mlp, in_proj=in_proj,
                    out_dim=embed_dim)


def block_forward_flops(tokens: int, width: int, mlp_dim: int) -> tuple[float, float]:
  """(weight products, activation products) of one transformer block's forward per example: QKV, output projection
  and MLP multiply activations by weights; the attention logits and the attention-weighted values multiply two
  activations (the full T x T square: the causal text tower computes it whole too)."""
  weights = 2 * tokens * width * (3 * width + width + 2 * mlp_dim)
  activations = 2 * 2 * tokens * tokens * width
  return float(weights), float(activations)


def tower_flops(shape: TowerShape, *, frozen_blocks: int = 0, remat: bool = False, passes: int = 1) -> dict:
  """Forward and forward+backward FLOPs of one tower per example. `frozen_blocks`: the first blocks' weights get
  no gradient (their activations still do); `passes`: the tower runs that many times per example (NCU's text tower
  encodes the caption and its negative)."""
  w, a = block_forward_flops(shape.tokens, shape.width, shape.mlp_dim)
  head = 2.0 * shape.width * shape.out_dim
  forward = shape.depth * (w + a) + shape.in_proj + head
  trainable = shape.depth - frozen_blocks
  backward = (trainable * 2 * (w + a) + frozen_blocks * (w + 2 * a)  # a frozen block: no weight gradient
              + shape.in_proj                                        # patch embedding: no gradient for the pixels
              + 2 * head)
  recompute = shape.depth * (w + a) if remat else 0.0
  return dict(forward=passes * forward, step=passes * (forward + backward + recompute))


def loss_flops(global_batch: int, embed_dim: int, method: str) -> float:
  """The similarity products of the global loss per example, forward and backward (3x): N x N logits for CLIP /
  SigLIP; GSC adds its intra-modal logits A'B'^T in their D x D form ((V M) T^T: one more N x N x D product;
  ncjax.losses.gsc.batch_loss_gram); NCU's stage 2 the N x (N+1) extended similarity."""
  n, e = global_batch, embed_dim
  products = {"clip": 1, "siglip": 1, "bayes": 1, "gsc": 2, "ncu": 1, "meru": 1}.get(method, 1)
  return 3.0 * products * 2 * n * e


def sinkhorn_flops(global_batch: int, iterations: int = 100) -> float:
  """Element-wise work of NCU's two masked Sinkhorn solves per step (not in the model FLOPs): per iteration and
  side, one pass over the N x (N+1) plan for each marginal, ~4 operations per entry (add, subtract, exp, sum)."""
  n = global_batch
  return 2 * iterations * 2 * 4.0 * n * (n + 1)


def train_step_flops(spec, global_batch: int, *, method: str = "clip", remat: bool = False,
                     frozen_text_blocks: int | None = None) -> float:
  """Model FLOPs of one train step over the global batch for a two-tower `spec` (ncjax.models.ModelSpec).
  method: 'clip' (also 'siglip', 'bayes', 'meru': the same products), 'gsc' (+ the two structure products), 'ncu'
  (stage 2: the text tower over caption and negative caption, its first `frozen_text_blocks` blocks frozen — the
  public script freezes 5 — and the extended similarity)."""
  towers = spec.towers
  embed = int(towers["embed_dim"])
  image = tower_flops(_tower(towers, "image", embed, spec.pool), remat=remat)
  if method == "ncu":
    frozen = 5 if frozen_text_blocks is None else frozen_text_blocks
    text = tower_flops(_tower(towers, "text", embed), frozen_blocks=frozen, remat=remat, passes=2)
  else:
    text = tower_flops(_tower(towers, "text", embed), remat=remat)
  per_example = image["step"] + text["step"] + loss_flops(global_batch, embed, method)
  return per_example * global_batch


def forward_flops_per_example(spec) -> dict:
  """{'image', 'text'}: each tower's forward FLOPs per example (the documented per-pair counts)."""
  towers = spec.towers
  embed = int(towers["embed_dim"])
  return dict(image=tower_flops(_tower(towers, "image", embed, spec.pool))["forward"],
              text=tower_flops(_tower(towers, "text", embed))["forward"])
