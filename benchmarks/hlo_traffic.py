"""Memory traffic of a compiled TPU program, read from its optimised HLO text: which arrays live in HBM, how many
bytes the top-level instructions move to and from there, and which part of the model moves them.

XLA's `cost_analysis()["bytes accessed"]` counts every operand and result of every top-level instruction, including
the arrays the TPU compiler keeps on chip: in the HLO a layout's memory space follows its tiling (`{1,0:T(8,128)
(2,1)S(1)}`, S(1) on chip; no S(n): HBM). `hbm_traffic` sums, per top-level instruction of the entry computation and
of the loop bodies it runs (each body `loop_trips` times), the bytes of its operands and results that live in HBM:
the HBM-resident estimate that benchmarks/pod_compile.py reports beside XLA's figure. An async copy or slice counts
its source read and its destination write once (at its start; its done moves nothing), a collective its operand
and the buffer it fills; tuples, bitcasts, parameters and constants move nothing. The tiles' padding counts (a
197-token axis occupies 200 or 256 slots of its tile): the shapes are the logical ones, so the padding is not in
this figure, which is then a lower bound of the real traffic on that account.

`PARTS` attributes each instruction by the named scopes of its `op_name` metadata (ncjax.models.layers labels a
block's layer norms, attention projections, attention core, MLP and residual adds), a top-level `copy` as a layout
copy whatever its origin, and the rest by what it is.
"""

from __future__ import annotations

import collections
import re

_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1, "f64": 8, "s64": 8,
          "u64": 8, "s16": 2, "u16": 2, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"\b(f32|bf16|f16|s32|u32|pred|s8|u8|f64|s64|u64|s16|u16|f8e4m3fn|f8e5m2)\[([\d,]*)\]"
                    r"(\{[^}]*\})?")
_MOVES_NOTHING = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "partition-id",
                  "replica-id", "opt-barrier", "iota"}
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

# (label, what decides it), in the order they are tried; the first that matches names the part.
PARTS = ("attention core", "attention projections", "mlp", "layer norm", "residual adds", "layout copies",
         "collectives", "patch embedding", "parameters and state", "optimizer", "other")


def arrays(type_text: str) -> list[tuple[int, bool]]:
  """(bytes, on chip) of every array in an HLO type (a tuple's leaves in order)."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(type_text):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    space = re.search(r"S\((\d+)\)", layout or "")
    out.append((n * _BYTES[dtype], bool(space) and space.group(1) != "0"))
  return out


def _split_type(rest: str) -> tuple[str, str]:
  """An instruction's right-hand side as (its result type, the rest): the type may be a nested tuple."""
  depth = 0
  for i, ch in enumerate(rest):
    if ch in "({":
      depth += 1
    elif ch in ")}":
      depth -= 1
    elif ch == " " and depth == 0:
      return rest[:i], rest[i + 1:]
  return rest, ""


def parse(hlo: str) -> tuple[dict[str, list[dict]], str]:
  """{computation name: its instructions}, the entry computation's name. An instruction: name, result type,
  opcode, operand names, the text after the opcode."""
  computations: dict[str, list[dict]] = {}
  current, entry = None, ""
  for line in hlo.splitlines():
    head = re.match(r"^(ENTRY\s+)?(%?[\w.\-]+)\s.*\{\s*$", line)
    if head and " = " not in line:
      current = head.group(2)
      computations[current] = []
      if head.group(1):
        entry = current
      continue
    text = line.strip()
    if current is None or " = " not in text or not text.startswith("%") and not text.startswith("ROOT"):
      continue
    name, rest = text.removeprefix("ROOT ").split(" = ", 1)
    result, tail = _split_type(rest)
    opcode = re.match(r"([\w\-]+)\((.*?)\)", tail)
    if opcode:
      computations[current].append(dict(name=name, type=result, op=opcode.group(1),
                                        operands=re.findall(r"%[\w.\-]+", opcode.group(2)), text=tail))
  return computations, entry


def instruction_traffic(hlo: str, loop_trips: int = 1):
  """(instruction, bytes of every array it reads or writes, bytes of those in HBM, times it runs) of each
  top-level instruction that moves data. An async copy or slice (the compiler's prefetches into on-chip memory and
  its spills back) carries `source`: the instruction that produced what it moves."""
  computations, entry = parse(hlo)
  by_name = {i["name"]: i for body in computations.values() for i in body}
  types = {name: i["type"] for name, i in by_name.items()}

  def producer(name: str) -> dict | None:
    for _ in range(64):   # through tuples' elements, bitcasts and earlier copies to what computed the array
      ins = by_name.get(name)
      if ins is None or ins["op"] not in ("get-tuple-element", "bitcast", "copy-done", "slice-done", "copy-start",
                                          "slice-start") or not ins["operands"]:
        return ins
      name = ins["operands"][0]
    return None

  out = []

  def walk(name: str, times: int):
    for ins in computations.get(name, []):
      op = ins["op"]
      if op == "while":
        body = re.search(r"body=(%?[\w.\-]+)", ins["text"])
        if body:
          walk(body.group(1), times * loop_trips)
        continue
      if op in ("conditional", "call"):
        for group in re.findall(r"(?:to_apply|branch_computations|calls)=\{?([%\w.\-, ]+)\}?", ins["text"]):
          for callee in re.findall(r"%?[\w.\-]+", group):
            if callee in computations:
              walk(callee, times)
        continue
      if op in _MOVES_NOTHING or op.endswith("-done"):
        continue
      result = arrays(ins["type"])
      operands = [a for o in ins["operands"] for a in arrays(types.get(o, ""))]
      if (op in ("copy-start", "slice-start") or 'custom_call_target="ConcatBitcast"' in ins["text"]) \
          and ins["operands"]:
        ins = dict(ins, source=producer(ins["operands"][0]))
      if op == "copy-start":          # (destination, source alias, context): the copy reads its source once
        result = result[:1]
      elif op == "slice-start":       # ((source alias), destination, context): reads a slice of the source
        destination = result[-2] if len(result) >= 2 else result[-1]
        source_on_chip = operands[0][1] if operands else False
        result, operands = [destination], [(destination[0], source_on_chip)]
      elif op.endswith("-start") and op.removesuffix("-start") in _COLLECTIVES:
        result = result[-2:-1] if len(result) > 2 else result[-1:]
      moved = sum(b for b, _ in result + operands)
      in_hbm = sum(b for b, on_chip in result + operands if not on_chip)
      out.append((ins, moved, in_hbm, times))

  walk(entry, 1)
  return out


def part_of(ins: dict) -> str:
  """Which part of the model an instruction belongs to (PARTS), from its opcode and the named scopes of its
  `op_name`."""
  op = ins["op"]
  if "source" in ins:   # a prefetch, a spill or their reassembly on chip: the part of what it moves
    source = ins["source"]
    if source is None or source["op"] == "parameter":
      return "parameters and state"
    return part_of(source)
  name = re.search(r'op_name="([^"]*)"', ins["text"])
  name = name.group(1) if name else ""
  if op == "copy":
    return "layout copies"
  if op.removesuffix("-start") in _COLLECTIVES:
    return "collectives"
  for scope, label in (("attention_core", "attention core"), ("attention_projections", "attention projections"),
                       ("mlp", "mlp"), ("layer_norm", "layer norm"), ("residual", "residual adds")):
    if re.search(rf"\b{scope}\b", name):
      return label
  if "conv_general_dilated" in name:
    return "patch embedding"
  if name and "jvp(" not in name and "transpose(" not in name:
    return "optimizer"   # outside the loss's differentiation: the optimizer's update and the state's bookkeeping
  return "other"


def hbm_traffic(hlo: str, loop_trips: int = 1) -> dict:
  """{all_bytes, hbm_bytes, parts: {part: {hbm, all}}}: the bytes the top-level instructions move (every array /
  those in HBM), per step, and their split by part."""
  parts = {p: dict(hbm=0.0, all=0.0) for p in PARTS}
  total = hbm = 0.0
  for ins, moved, in_hbm, times in instruction_traffic(hlo, loop_trips):
    part = parts[part_of(ins)]
    part["hbm"] += in_hbm * times
    part["all"] += moved * times
    total += moved * times
    hbm += in_hbm * times
  return dict(all_bytes=total, hbm_bytes=hbm, parts={p: v for p, v in parts.items() if v["all"]})


def largest(hlo: str, n: int = 12) -> list[dict]:
  """The n top-level instructions that move the most HBM bytes: name, opcode, part, bytes."""
  counted = collections.Counter()
  info = {}
  for ins, _, in_hbm, times in instruction_traffic(hlo):
    counted[ins["name"]] += in_hbm * times
    info[ins["name"]] = ins
  return [dict(name=k, op=info[k]["op"], part=part_of(info[k]), hbm_bytes=v) for k, v in counted.most_common(n)]
