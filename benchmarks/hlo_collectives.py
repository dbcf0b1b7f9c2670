"""The collectives of a compiled program, read from its HLO text (benchmarks/pod_compile.py): each collective once
(the TPU compiler threads one through the fusions it overlaps with: merged by channel id), the bytes a chip receives
over rings, replica groups in mesh notation, loop bodies; and the data-parallel minimum a step must move."""

from __future__ import annotations

import re


_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1, "f64": 8, "s64": 8,
          "u64": 8, "s16": 2, "u16": 2, "f8e4m3fn": 1, "f8e5m2": 1}
_SHAPE = re.compile(r"\b(f32|bf16|f16|s32|u32|pred|s8|u8|f64|s64|u64|s16|u16)\[([\d,]*)\]")
_COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                         r"(-start)?\(")


def _shape_bytes(text: str) -> list[int]:
  out = []
  for dtype, dims in _SHAPE.findall(text):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    out.append(n * _BYTES[dtype])
  return out


def _group_size(line: str, default: int) -> int:
  # mesh['axis_0'=16,'axis_1'=16] {'axis_1'}, or with the devices' order between: mesh[...], device_ids=(...) {...}
  m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
  if m:
    sizes = dict((k.strip("' "), int(v)) for k, v in (kv.split("=") for kv in m.group(1).split(",")))
    group = 1
    for axis in filter(None, (a.strip("' ") for a in m.group(2).split(","))):
      group *= sizes[axis]
    return group
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)     # iota form [groups, size]<=[...]
  if m:
    return int(m.group(2))
  m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
  if m:
    return len(m.group(1).split(","))
  return default


def collectives(hlo: str, chips: int) -> list[dict]:
  """Every collective of an optimised HLO module (async ones counted at their start), with its result type, replica
  group size and the bytes one chip receives for it over a ring.

  One collective can appear many times in the text: the TPU compiler's async collective fusion threads a collective
  through the compute fusions that run while it is in flight (the CLIP step's all-gather of the text embeddings is
  copied into 111 fusions of the image tower's forward, each advancing the transfer: the same instruction, channel
  and chain, its partial result passed from fusion to fusion). Copies are merged by channel id; `pieces` counts
  them. Collectives inside a while loop's body are marked `in_loop` (they run once per iteration)."""
  by_channel: dict[str, dict] = {}
  out = []
  computation = ""
  loop_bodies = set(re.findall(r"body=(%?[\w.\-]+)", hlo))
  for line in hlo.splitlines():
    head = re.match(r"^\s*(?:ENTRY\s+)?(%?[\w.\-]+)\s.*\{\s*$", line)
    if head and "=" not in line.split("(")[0]:
      computation = head.group(1)
    m = _COLLECTIVE.search(line)
    if not m:
      continue
    result_type, kind, started = m.group(1), m.group(2), bool(m.group(3))
    sizes = _shape_bytes(result_type)
    if not sizes:
      continue
    g = _group_size(line, chips)
    if kind == "all-gather":
      full = sizes[-1] if started else sum(sizes)      # async: (operand, result) tuple; the result is gathered
      moved = full * (g - 1) / g
    elif kind == "all-reduce":
      full = sum(sizes)
      moved = 2 * full * (g - 1) / g
    elif kind == "reduce-scatter":
      full = (sizes[-1] if started else sum(sizes)) * g
      moved = full * (g - 1) / g
    elif kind == "all-to-all":
      full = sum(sizes)
      moved = full * (g - 1) / g
    else:
      full = sizes[-1] if started else sum(sizes)
      moved = full
    channel = re.search(r"channel_id=(\d+)", line)
    key = f"{kind}:{channel.group(1)}" if channel else f"{kind}:{line.split('=')[0].strip()}"
    if key in by_channel:
      by_channel[key]["pieces"] += 1
      continue
    op = re.search(r'op_name="([^"]*)"', line)
    entry = dict(kind=kind, name=line.split("=")[0].strip(), type=result_type.strip()[:120], group=g, bytes=full,
                 moved=moved, computation=computation, in_loop=computation in loop_bodies, pieces=1,
                 op_name=op.group(1) if op else "")
    by_channel[key] = entry
    out.append(entry)
  return out


# ---------------------------------------------------------------------------------------------------------------
# Minimum traffic and the measurement of one configuration

def gradient_bytes(abstract_params, compute_bytes: int = 2) -> float:
  """Bytes of one copy of the gradients as the step produces them before their reduction: a parameter the towers
  use in the compute dtype (dense and conv kernels, their biases, the projections) gets its gradient in that dtype
  — the weight-gradient product's output, which XLA reduces across chips before widening it — the rest (norms,
  embeddings, position tables, the logit scale) in float32."""
  import jax
  total = 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    name, parent = keys[-1], (keys[-2] if len(keys) > 1 else "")
    in_compute = name in ("kernel", "proj") or (name == "bias" and not parent.startswith("ln"))
    total += leaf.size * (compute_bytes if in_compute else 4)
  return total


def minimum_collective_bytes(abstract_params, *, chips: int, fsdp: int, global_batch: int, embed_dim: int,
                             grad_bytes: int = 2) -> dict:
  """The bytes a chip must receive per step in a data-parallel (x FSDP) step, over rings: the gradient reduction
  (an all-reduce over every chip: 2 (n-1)/n of the gradients; with FSDP a reduce-scatter over the fsdp axis and an
  all-reduce of the shards over the data axis), the global loss's one gather of an N x D embedding matrix (bf16)
  and the reduce-scatter of its float32 gradient — a loss whose rows stay split needs no more (the other
  direction's softmax reduces columns: N numbers) — and with FSDP the parameters gathered in the forward and again
  in the backward (bf16). `grad_bytes`: the bytes per element of the gradients the towers compute in bf16 (4 with
  `optim.grad_reduce='float32'`)."""
  n, f = chips, fsdp
  d = n // f
  g = gradient_bytes(abstract_params, grad_bytes)
  if f == 1:
    grads = 2 * (n - 1) / n * g
    params = 0.0
  else:
    grads = (f - 1) / f * g + 2 * (d - 1) / d * g / f
    import jax
    p_bf16 = sum(leaf.size * 2 for leaf in jax.tree.leaves(abstract_params))
    params = 2 * (f - 1) / f * p_bf16
  emb = global_batch * embed_dim
  loss = (n - 1) / n * (emb * 2 + emb * 4)
  return dict(gradients=grads, loss=loss, parameters=params, total=grads + loss + params)


def collective_total(cols: list[dict], loop_trips: int = 1) -> float:
  """Bytes a chip receives per step: each collective once, those inside a while loop `loop_trips` times."""
  return float(sum(c["moved"] * (loop_trips if c["in_loop"] else 1) for c in cols))
