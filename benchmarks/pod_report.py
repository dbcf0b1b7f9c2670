"""docs/notes/pod_compile_tpu.md from the records of benchmarks/pod_compile.py (`--note=FILE`)."""

from __future__ import annotations

import datetime

GIB = 1024 ** 3
FLOPS_TARGET = 1.15       # compiled FLOPs <= 1.15 x the analytic count
COLLECTIVE_TARGET = 1.25  # collective bytes <= 1.25 x the data-parallel minimum

LABELS = {"clip_vit_b16": "CLIP ViT-B/16", "clip_vit_l14": "CLIP ViT-L/14", "ncu_vit_b16": "NCU ViT-B/16 (stage 2)",
          "gsc_vit_b16": "GSC ViT-B/16", "clip_micro": "CLIP micro"}
# Slices by their chips. Google Cloud names v5p slices by TensorCores (two per chip): 128 v5p chips are a
# "v5p-256"; a v5e chip has one core, so "v5litepod-256" is 256 chips.
SLICE_LABELS = {"v5e256": "v5e-256", "v5p128": "v5p, 128 chips", "v5e4": "v5e-4", "cpu8": "8 simulated CPU devices"}
VARIANT_LABELS = {"": "", "einsum": ", attention=einsum", "recompute": ", attention=recompute",
                  "gradf32": ", grads summed in float32",
                  "no_attention_core": ", attention core removed (floor)"}
# The targets for CLIP ViT-B/16 on v5e-256 at 128 pairs per chip (issue 51)
BYTES_TARGET = 140e9          # XLA's bytes accessed per chip per step
BATCH_TARGET = 192            # the largest batch per chip as written, without remat
COPIES_TARGET = 2e9           # "no q/k/v layout copies": what is left is the parameters' and the loss's (~1 GB)


FINDINGS = """
## What the compiled programs say

1. **The "112 distinct all-gathers of the bf16[32768, 512] embeddings" are one.** The TPU compiler's async
   collective fusion threads a collective through the compute fusions that run while it is in flight: the text
   embeddings' all-gather (channel 1, chain 0) is copied into 111 fusions of the image tower's forward (QKV
   projections and the like), each advancing the transfer and passing the partly gathered buffer on. Per step a chip
   receives the embeddings once (31.9 MiB at 32k). This report merges a collective's copies by channel id and counts
   them (`pieces`).
2. **A logged metric cost as much as the loss's gather.** InfoNCE's text-to-image accuracy took `argmax` over the
   columns of the row-split logits: the compiler gathered every chip's per-column (value, index) candidates —
   f32 and s32 [8,388,608] all-gathers and a 16 MiB all-to-all, 80 MiB per chip per step, growing with the chip
   count. It is now computed from two column reductions (the column maximum and the first row attaining it): two
   all-reduces of N numbers, argmax's answer ties included (`contrastive.column_argmax_is_diagonal`).
3. **GSC moved 15x the minimum.** Its intra-modal logits A'B'^T multiplied the N x N structures: at N = 32,768 the
   compiler gathered a bf16 N x N matrix (2 GiB) and all-reduced its float32 gradient (8 GiB received per chip per
   step: 14.9x the minimum on v5e-256, 17.7x on v5p-128, and 2 N^3 FLOPs). With CLIP towers the structures are the
   embeddings' Gram matrices, so A'B'^T = (V M) T^T with M = V^T diag(y^2) T (D x D), and S_IM likewise
   (`gsc.batch_loss_gram`): nothing N x N is built; computing S in the same product as (V M) T^T makes T's gradient
   one all-reduce instead of two (1.26x / 1.30x before that, 1.09x / 1.13x after: CLIP's).
4. **What remains above the minimum** (1.09x on v5e-256, 1.13x on v5p-128 for CLIP): the text embeddings'
   gradient arrives by an all-reduce of the float32 N x 512 matrix followed by a slice (GSPMD's transpose of the
   gather it inserted), where a reduce-scatter would move half (127.5 against 63.8 MiB); on v5p-128 the forward
   gather is an all-reduce of a zero-padded buffer as well (63.5 against 31.9 MiB). A shard_map loss with an
   explicit all_gather (whose transpose is psum_scatter) would save these ~64-96 MiB per step — about 0.2 ms of ICI
   against an 80 ms step: left as is.
5. **Gradients are summed in bf16 by default.** The weights the towers use in bf16 get their gradients as bf16
   products, and XLA all-reduces those before widening them to the float32 parameters: half the bytes of a float32
   reduction (the minimum above counts them so), rounded in bf16 along the ring over every chip.
   `optim.grad_reduce=float32` forms the blocks' weight and bias gradients in float32 (the weight-gradient products
   output float32) so that they are summed in float32: its rows above (", grads summed in float32") give what that
   costs in collective bytes.
6. **Memory and traffic: attention fused into one kernel.** XLA computes attention as separate products
   and a softmax, so every block's (B x heads x 197 x 197) logits and probabilities go to HBM and back (238 MB in
   float32 per image block at 128 pairs per chip, the program's largest arrays), forward and backward, and the
   batched products made it copy q, k and v into other layouts. `model.attention='fused'` (what 'auto' picks on a
   TPU, `ncjax/models/fused_attention.py`) runs one Pallas kernel per (example, 128 lanes of heads): a whole row
   fits the kernel's memory at these lengths, so the logits, the float32 softmax and p v stay on chip, no
   statistics are kept between the passes, and the backward kernel recomputes the probabilities from q, k and v.
   The kernel reads token-major (B, tokens, width) q, k, v, two 64-wide heads per 128-lane block: its first version
   took heads-major (B, heads, tokens, 64) arrays, which a TPU stores lane-padded to 128, twice their size — and the
   kernel's operands and output are what the step keeps for the backward. Token-major blocks took the ViT-B/16 step
   at 128 pairs per v5e chip from 12.1 to 9.8 GiB at its peak and from 137 to 118 GB of XLA's bytes accessed, with
   the same compiler (the heads-major kernel's rows: docs/notes/pod_compile_tpu_2026-11-28-heads-major.md). The
   kernel runs in `shard_map` over the batch (a kernel is not partitioned by XLA). 'recompute' (the einsums, the
   backward recomputing the probabilities) was the TPU's choice before it; the sections below give each one's
   traffic by part, against the einsum attention where it was compiled and against a stand-in that removes the
   attention core entirely (the floor).
7. **Memory: what the step keeps for the backward, and what it copies.** With the heads-major kernel the largest
   ViT-B/16 batch per v5e chip as written was 168; `jax.checkpoint` policies that saved the blocks' matrix-product
   outputs and recomputed the layer norms and the activation reached 192, but raised XLA's bytes accessed from 137
   to 146-149 GB at 128 pairs, so none was adopted. The token-major kernel keeps 2.3 GiB less at 128 pairs and takes
   the batch to 224 with no policy. Two things measured on compiled blocks (ViT-B/16, 128 pairs, one v5e chip) and
   left as they are: a policy recomputing the MLP's activation changes nothing with CLIP's QuickGELU (the compiler
   already recomputes it from the first product: the same temporaries and bytes with and without), while with the
   exact GELU of MERU's towers it would keep 0.47 instead of 0.62 GiB per block and move 6.3 instead of 7.2 GB;
   and the layout copies above are the backward kernel's results. The projections' backward products take dq, dk
   and dv batch-minor (layout {0,2,1}: tokens major, the batch in the lanes, no tile padding for 197 tokens), so XLA
   relayouts the kernel's row-major results, three 39 MB arrays per block, in every block after the first (the
   first block's input is the step's own row-major array, and its kernel's results are used as written). Three ways to
   remove them were compiled (two ViT-B/16 blocks, 128 pairs, one v5e chip: 12.3 GB of XLA's bytes, 0.67 GB of it
   copies), and each moved more than it saved: padding the sequence to 200 tokens (the copies stay: 0.54 GB, 12.3
   GB in all); `jax.experimental.layout.with_layout_constraint` holding the residual stream row-major (the copies
   go: 0.02 GB, but 13.8 GB in all, as the projections and layer norms then relayout inside their fusions); and the
   residual stream as (B x 197, width) token rows, with the kernel reading 16 examples' rows per step (the copies
   go, but a block moves 6.7 instead of 6.6 GB). So the step keeps XLA's layouts and pays for the copies.
"""


def _over_capacity(results: dict) -> str:
  """A sentence on the accepted compiles whose memory analysis sums to more than the chip's HBM (none: '')."""
  over = [r for r in results.values() if isinstance(r, dict) and r.get("fits") and r.get("batch_per_chip")
          and "hbm_capacity" in r and r.get("peak_bytes", 0) > r["hbm_capacity"]]
  if not over:
    return ""
  r = max(over, key=lambda r: r["peak_bytes"] / r["hbm_capacity"])
  ratio = r["peak_bytes"] / r["hbm_capacity"]
  return (f" The compiler's own memory check decides what is accepted: near the largest accepted batches XLA's memory"
          f" analysis (arguments + outputs - aliased + temporaries + code) sums to more than the chip's HBM in"
          f" {len(over)} accepted compiles, up to {ratio:.2f}x ({LABELS.get(r['model'], r['model'])}"
          f"{' + remat' if r.get('remat') else ''} on {SLICE_LABELS.get(r['slice'], r['slice'])} at"
          f" {r['batch_per_chip']:,} pairs per chip: {r['peak_bytes'] / GIB:.1f} of {r['hbm_capacity'] / GIB:.0f}"
          f" GiB), so the analysis overstates the peak there.")


def _largest_accepted(results: dict, name: str, remat: bool):
  """(the largest per-chip batch any compile of this configuration was accepted at, its compiled / analytic FLOPs,
  the smallest batch above it that was refused) over every compile in the records."""
  import re
  accepted, refused = {}, []
  for key, r in results.items():
    m = re.fullmatch(re.escape(name) + r"_b(\d+)" + ("_remat" if remat else ""), key)
    if m and isinstance(r, dict):
      b = int(m.group(1))
      if r.get("fits"):
        accepted[b] = r["flops_compiled"] / r["flops_analytic"]
      else:
        refused.append(b)
  if not accepted:
    return None, None, None
  top = max(accepted)
  return top, accepted[top], min((b for b in refused if b > top), default=None)


def _main_records(results: dict) -> list[dict]:
  return [r for k, r in results.items() if isinstance(r, dict) and r.get("name") == k]


def pairs_per_second(r: dict, bound: str) -> float:
  seconds = r["seconds_compute"] + r["seconds_ici"] if bound == "compute" else r["step_seconds"]
  return r["global_batch"] / seconds


def chip_hours_per_billion(r: dict, bound: str) -> float:
  return r["chips"] * 1e9 / pairs_per_second(r, bound) / 3600


def _mesh(r: dict) -> str:
  return "data" if r["fsdp"] == 1 else f"data {r['chips'] // r['fsdp']} x fsdp {r['fsdp']}"


def step_label(r: dict) -> str:
  """The step's name in the tables: the model, its remat and its variant (a row that does not fit names them)."""
  return (LABELS.get(r["model"], r["model"]) + (" + remat" if r.get("remat") else "")
          + VARIANT_LABELS.get(r.get("variant", ""), f", {r.get('variant')}"))


def _row(r: dict) -> str:
  if not r.get("fits", True) and "flops_compiled" not in r:
    needed = r.get("error", "").split("temporaries (")[-1].split("G)")[0]
    why = f"{float(needed):.1f} GiB of temporaries" if needed.replace(".", "").isdigit() else r.get("error", "")[:80]
    return (f"| {step_label(r)} | {SLICE_LABELS.get(r['slice'], r['slice'])} | {_mesh(r)} | "
            f"{r['batch_per_chip']} | **does not fit** ({why}) |" + " |" * 8)
  flops = r["flops_compiled"] / r["flops_analytic"]
  col = r["collective_bytes"] / r["collective_bytes_min"]
  resident = r.get("hbm_resident_bytes")
  return (f"| {step_label(r)} | {SLICE_LABELS.get(r['slice'], r['slice'])} | "
          f"{_mesh(r)} | "
          f"{r['batch_per_chip']} | {r['params'] / 1e6:.1f} | {r['flops_compiled'] / 1e12:.2f} / "
          f"{r['flops_analytic'] / 1e12:.2f} = **{flops:.3f}** | {r['collective_bytes'] / GIB:.3f} / "
          f"{r['collective_bytes_min'] / GIB:.3f} = **{col:.2f}** | {r['peak_bytes'] / GIB:.2f} of "
          f"{r['hbm_capacity'] / GIB:.0f} | {r['hbm_bytes'] / 1e9:.0f} / "
          f"{(resident or 0) / 1e9:.0f} | {1e3 * r['seconds_compute']:.0f} / {1e3 * r['seconds_hbm']:.0f} / "
          f"{1e3 * r.get('seconds_hbm_resident', 0):.0f} / {1e3 * r['seconds_ici']:.1f} | "
          f"{100 * r['mfu_compute_bound']:.0f}% / {100 * r['mfu']:.0f}% / {100 * r.get('mfu_hbm_resident', 0):.0f}% | "
          f"{r['compile_seconds']:.0f} |")


def markdown(results: dict, *, versions: str = "", missing=()) -> str:
  """The note. `missing`: planned rows and searches with no record (named in the note, never dropped silently)."""
  rows = _main_records(results)
  out = ["# A TPU pod's train step, compiled here for its chips (never run)\n",
         f"`python -m benchmarks.pod_compile --note=docs/notes/pod_compile_tpu.md` with libtpu "
         f"(`pip install 'ncjax[tpu]'`), {datetime.date.today().isoformat()}{versions}. Each row is ncjax's own "
         f"train step (the trainer's StageProgram of the method, bf16 towers, float32 parameters, AdamW, the "
         f"attention `model.attention='auto'` picks on a TPU: 'fused') for a global batch of 32,768 pairs, "
         f"lowered from abstract inputs and compiled by the TPU "
         f"compiler for the slice's chips. Per chip: the compiler's FLOPs against the analytic count "
         f"(`benchmarks/flops.py`: the towers' matrix products, forward and backward, and the loss's similarity "
         f"products; ViT-B/16 123.13 GFLOP per pair), the bytes its collectives receive over rings against the "
         f"data-parallel minimum (the gradients' reduction in the dtype the program reduces them in — bf16 for "
         f"the weights the towers use in bf16, float32 for the rest — plus one bf16 gather of an N x D "
         f"embedding matrix and the reduce-scatter of its float32 gradient; with FSDP plus the parameters "
         f"gathered twice; collectives inside NCU's Sinkhorn loops counted 100 times, its iteration limit), XLA's "
         f"memory analysis (arguments + outputs − aliased + temporaries + code) against "
         f"the chip's HBM, and a roofline: compute at the chip's bf16 peak / HBM traffic at its bandwidth for "
         f"XLA's bytes-accessed estimate and for the HBM-resident estimate / collectives at its ICI bandwidth (v5e: "
         f"197 TFLOP/s, 16 GiB, 819 GB/s, 400 GB/s; v5p: 459 TFLOP/s, 95 GiB, 2,765 GB/s, 600 GB/s — Google "
         f"Cloud's TPU v5e and v5p pages; its slice names count TensorCores, so the 128-chip v5p slice here is its "
         f"v5p-256). XLA's bytes accessed count every top-level instruction's operands and result, on-chip "
         f"buffers included; the HBM-resident estimate (`benchmarks/hlo_traffic.py`) counts only the arrays whose "
         f"layout places them in HBM (no `S(1)` memory space), at their logical sizes. MFU: the model FLOPs (no "
         f"recomputation) over the compute-bound time (compute + ICI) / over the time with XLA's HBM estimate "
         f"(max(compute, HBM) + ICI) / with the HBM-resident estimate. With remat the analytic count adds one "
         f"recomputed forward of every block (an upper bound: XLA recomputes less).\n",
         "| step | slice | mesh | pairs/chip | params (M) | TFLOP/chip compiled / analytic | collective GiB/chip "
         "/ minimum | peak GiB of HBM | GB/chip: XLA bytes / HBM-resident | ms: compute / HBM (XLA) / HBM "
         "(resident) / ICI | MFU: compute-bound / HBM (XLA) / HBM (resident) | compile s |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  out += [_row(r) for r in rows]
  if missing:
    out.append(f"\n**Not compiled in this run** ({len(missing)}: each compile takes 3-10 minutes of this machine's two "
               f"cores): " + ", ".join(f"`{n}`" for n in missing) + ". Their rows from earlier runs, with the "
               "attention then in use, are in docs/notes/pod_compile_tpu_2026-11-28-heads-major.md (the fused "
               "kernel's first, heads-major version), docs/notes/pod_compile_tpu_2026-11-27.md ('recompute') and "
               "docs/notes/pod_compile_tpu_2026-11-26.md (einsum).")
  misses = []
  for r in rows:
    if "flops_compiled" not in r:
      continue
    if r["flops_compiled"] / r["flops_analytic"] > FLOPS_TARGET:
      misses.append(f"- {r['name']}: compiled FLOPs {r['flops_compiled'] / r['flops_analytic']:.2f}x the analytic "
                    f"count (target {FLOPS_TARGET}x)")
    if r["collective_bytes"] / r["collective_bytes_min"] > COLLECTIVE_TARGET:
      top = ", ".join(f"{c['kind']} {c['type'].split('{')[0]} {c['moved'] / 2 ** 20:.0f} MiB ({c['op_name'][-40:]})"
                      for c in r["collectives"][:3])
      misses.append(f"- {r['name']}: collectives {r['collective_bytes'] / r['collective_bytes_min']:.2f}x the "
                    f"minimum (target {COLLECTIVE_TARGET}x); largest: {top}")
    if not r.get("fits", True):
      misses.append(f"- {r['name']}: {r['peak_bytes'] / GIB:.2f} GiB does not fit the chip's "
                    f"{r['hbm_capacity'] / GIB:.0f} GiB")
  out.append("\n**Targets** (compiled FLOPs <= 1.15x analytic; collective bytes <= 1.25x the minimum; ViT-B/16 at "
             "128 pairs per chip fits a v5e chip): " + ("every row meets them." if not misses else
                                                        "missed by\n" + "\n".join(misses)))
  out += traffic_sections(results, rows)
  search = {k[: -len("_max_batch")]: v for k, v in results.items() if k.endswith("_max_batch")}
  if search:
    out += ["\n## The largest per-chip batch (data-parallel)\n",
            "As written: the largest multiple of 8 the compiler accepts without adding FLOPs (no more per pair than "
            "at the smallest batch it accepts, +2%). Past it the TPU compiler still accepts larger batches by "
            "rematerialising on its own (the FLOPs column: compiled against analytic at the largest batch it accepted) "
            "and refuses beyond the last column's batch. Searched by compiling: anchors at 128, 512 "
            "and 1,024 pairs per chip (halving below 128 until a batch is accepted, without remat with at most "
            "1.05x the analytic FLOPs), then bisection from where the temporaries' fitted curve meets the HBM."
            + _over_capacity(results) + "\n",
            "| step | slice | as written: largest (first not) | largest compiled, with the compiler's recompute "
            "(FLOPs; refused at) | remat, as written: largest (first not) | remat, largest compiled (FLOPs; refused "
            "at) |",
            "|---|---|---|---|---|---|"]
    for name, v in search.items():
      model, slice_name = name.rsplit("_", 2)[0], name.rsplit("_", 2)[1]
      cells = []
      for remat in ("False", "True"):
        r = v.get(remat) or {}
        if not r:
          cells += ["not searched in this run", "-"]
          continue
        cells.append(f"{r.get('max_batch')} ({r.get('first_not_as_written')})")
        largest, ratio, refused = _largest_accepted(results, name, remat == "True")
        refusal = f"refused at {refused}" if refused else "no refusal compiled"
        cells.append(f">= {largest} ({ratio:.2f}x; {refusal})" if largest else "-")
      out.append(f"| {LABELS.get(model, model)} | {SLICE_LABELS.get(slice_name, slice_name)} | "
                 + " | ".join(cells) + " |")
  out += ["\n## What a run costs (at the rows above)\n",
          "Pairs per second of the slice and chip-hours per billion pairs seen, at the compute-bound time and at the "
          "time with XLA's HBM estimate (the truth lies between; a run on the slice decides).\n",
          "| step | slice | mesh | pairs/s (compute-bound / HBM est.) | chip-hours per 1e9 pairs |",
          "|---|---|---|---|---|"]
  for r in rows:
    if "flops_compiled" not in r:
      continue
    out.append(f"| {step_label(r)} | {SLICE_LABELS.get(r['slice'], r['slice'])} | {_mesh(r)} | "
               f"{pairs_per_second(r, 'compute'):,.0f} / {pairs_per_second(r, 'hbm'):,.0f} | "
               f"{chip_hours_per_billion(r, 'compute'):,.0f} / {chip_hours_per_billion(r, 'hbm'):,.0f} |")
  out.append(FINDINGS)
  first = next((r for r in rows if r.get("model") == "clip_vit_b16" and r.get("slice") == "v5e256"
                and r.get("mesh") == "data" and "collectives" in r), None)
  if first:
    out += ["\n## The collectives of CLIP ViT-B/16 on v5e-256, data-parallel\n",
            "| kind | result | pieces | MiB received per chip | op |", "|---|---|---|---|---|"]
    for c in first["collectives"][:10]:
      out.append(f"| {c['kind']} | `{c['type'].split('{')[0]}` | {c['pieces']} | {c['moved'] / 2 ** 20:.1f} | "
                 f"`{c['op_name'][-60:]}` |")
  return "\n".join(out) + "\n"


def _find(rows, model="clip_vit_b16", slice_name="v5e256", variant=""):
  return next((r for r in rows if r.get("model") == model and r.get("slice") == slice_name and r.get("mesh") == "data"
               and not r.get("remat") and r.get("variant", "") == variant and "flops_compiled" in r), None)


def traffic_sections(results: dict, rows: list[dict]) -> list[str]:
  """Where CLIP ViT-B/16's bytes go on v5e-256 (per part, each variant) and issue 51's targets against the
  default row."""
  base = _find(rows)
  variants = [(v, _find(rows, variant=v)) for v in ("", "recompute", "einsum", "no_attention_core")]
  variants = [(v, r) for v, r in variants if r is not None and r.get("hbm_parts")]
  out = []
  if variants:
    from benchmarks.hlo_traffic import PARTS
    heads = [f"{VARIANT_LABELS[v].lstrip(', ') or 'default (fused)'}: HBM-resident / all" for v, _ in variants]
    out += ["\n## Where the bytes go: CLIP ViT-B/16, v5e-256, 128 pairs per chip\n",
            "GB per chip per step by part of the model (`benchmarks/hlo_traffic.py`: the named scopes of each "
            "instruction's `op_name`; the compiler's prefetches and spills count with what they move; 'all' counts "
            "on-chip arrays too, as XLA's bytes accessed do).\n",
            "| part | " + " | ".join(heads) + " |", "|---|" + "---|" * len(variants)]
    for part in PARTS:
      cells = [(r["hbm_parts"].get(part) or {}) for _, r in variants]
      if not any(c for c in cells):
        continue
      out.append(f"| {part} | " + " | ".join(f"{c.get('hbm', 0) / 1e9:.1f} / {c.get('all', 0) / 1e9:.1f}"
                                               for c in cells) + " |")
    out.append("| **total** (XLA's bytes accessed) | " + " | ".join(
        f"**{r['hbm_resident_bytes'] / 1e9:.1f} / {r['operand_bytes'] / 1e9:.1f}** ({r['hbm_bytes'] / 1e9:.0f})"
        for _, r in variants) + " |")
  if base:
    search = (results.get("clip_vit_b16_v5e256_data_max_batch") or {}).get("False") or {}
    largest = search.get("max_batch")
    reference = _find(rows, variant="einsum")
    checks = [
        ("XLA's bytes accessed", f"{base['hbm_bytes'] / 1e9:.0f} GB per chip per step",
         f"<= {BYTES_TARGET / 1e9:.0f} GB", base["hbm_bytes"] <= BYTES_TARGET),
        ("HBM-resident estimate at 819 GB/s vs compute",
         f"{1e3 * base.get('seconds_hbm_resident', 0):.0f} ms vs {1e3 * base['seconds_compute']:.0f} ms",
         "no longer than compute", base.get("seconds_hbm_resident", 1e9) <= base["seconds_compute"]),
        ("compiled FLOPs / analytic", f"{base['flops_compiled'] / base['flops_analytic']:.3f}",
         f"<= {FLOPS_TARGET}", base["flops_compiled"] / base["flops_analytic"] <= FLOPS_TARGET),
        ("collectives / minimum", f"{base['collective_bytes'] / base['collective_bytes_min']:.2f}",
         f"<= {COLLECTIVE_TARGET}", base["collective_bytes"] / base["collective_bytes_min"] <= COLLECTIVE_TARGET),
        ("largest batch per chip as written, no remat", str(largest) if largest else "not searched",
         f">= {BATCH_TARGET}", bool(largest) and largest >= BATCH_TARGET),
    ]
    copies = base.get("hbm_parts", {}).get("layout copies")
    if copies:
      checks.append(("layout copies (XLA's count; HBM-resident)",
                     f"{copies['all'] / 1e9:.1f} GB ({copies['hbm'] / 1e9:.1f})",
                     f"none (<= {COPIES_TARGET / 1e9:.0f} GB)", copies["all"] <= COPIES_TARGET))
    out += ["\n## Issue 51's targets for this row\n",
            "| target | measured | wanted | met |", "|---|---|---|---|"]
    out += [f"| {name} | {value} | {wanted} | {'yes' if ok else '**no**'} |" for name, value, wanted, ok in checks]
    if reference:
      out.append(f"\nThe einsum attention at the same configuration: {reference['hbm_bytes'] / 1e9:.0f} GB of XLA's "
                 f"bytes accessed, {reference['hbm_resident_bytes'] / 1e9:.0f} GB HBM-resident, peak "
                 f"{reference['peak_bytes'] / GIB:.2f} GiB (the default: {base['peak_bytes'] / GIB:.2f} GiB).")
  return out


def readme_table(results: dict) -> str:
  """The README's per-chip summary: one row per main configuration."""
  out = ["| step | slice, mesh | pairs/chip | peak HBM | FLOPs compiled / analytic | collectives / minimum | "
         "step ms (compute-bound / with HBM est.) | pairs/s of the slice | chip-hours per 1e9 pairs |",
         "|---|---|---|---|---|---|---|---|---|"]
  for r in _main_records(results):
    label = step_label(r)
    where = f"{SLICE_LABELS.get(r['slice'], r['slice'])}, {_mesh(r)}"
    if "flops_compiled" not in r:
      needed = r.get("error", "").split("temporaries (")[-1].split("G)")[0]
      out.append(f"| {label} | {where} | {r['batch_per_chip']} | **does not fit** ({float(needed):.1f} GiB of "
                 f"temporaries) | | | | | |")
      continue
    compute = r["seconds_compute"] + r["seconds_ici"]
    over = " (the compiler accepts it)" if r["peak_bytes"] > r["hbm_capacity"] else ""
    out.append(f"| {label} | {where} | {r['batch_per_chip']} | {r['peak_bytes'] / GIB:.1f} of "
               f"{r['hbm_capacity'] / GIB:.0f} GiB{over} | {r['flops_compiled'] / r['flops_analytic']:.2f}x | "
               f"{r['collective_bytes'] / r['collective_bytes_min']:.2f}x | {1e3 * compute:.0f} / "
               f"{1e3 * r['step_seconds']:.0f} | {pairs_per_second(r, 'compute'):,.0f} / "
               f"{pairs_per_second(r, 'hbm'):,.0f} | {chip_hours_per_billion(r, 'compute'):,.0f} / "
               f"{chip_hours_per_billion(r, 'hbm'):,.0f} |")
  return "\n".join(out)
