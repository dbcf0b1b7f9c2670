"""docs/notes/pod_compile_tpu.md from the records of benchmarks/pod_compile.py (`--note=FILE`)."""

from __future__ import annotations

import datetime

GIB = 1024 ** 3
FLOPS_TARGET = 1.15       # compiled FLOPs <= 1.15 x the analytic count
COLLECTIVE_TARGET = 1.25  # collective bytes <= 1.25 x the data-parallel minimum

LABELS = {"clip_vit_b16": "CLIP ViT-B/16", "clip_vit_l14": "CLIP ViT-L/14", "ncu_vit_b16": "NCU ViT-B/16 (stage 2)",
          "gsc_vit_b16": "GSC ViT-B/16", "clip_micro": "CLIP micro"}
SLICE_LABELS = {"v5e256": "v5e-256", "v5p128": "v5p-128", "v5e4": "v5e-4", "cpu8": "8 simulated CPU devices"}


def _main_records(results: dict) -> list[dict]:
  return [r for k, r in results.items() if isinstance(r, dict) and r.get("name") == k]


def pairs_per_second(r: dict, bound: str) -> float:
  seconds = r["seconds_compute"] + r["seconds_ici"] if bound == "compute" else r["step_seconds"]
  return r["global_batch"] / seconds


def chip_hours_per_billion(r: dict, bound: str) -> float:
  return r["chips"] * 1e9 / pairs_per_second(r, bound) / 3600


def _mesh(r: dict) -> str:
  return "data" if r["fsdp"] == 1 else f"data {r['chips'] // r['fsdp']} x fsdp {r['fsdp']}"


def _row(r: dict) -> str:
  if not r.get("fits", True) and "flops_compiled" not in r:
    return (f"| {LABELS.get(r['model'], r['model'])} | {SLICE_LABELS.get(r['slice'], r['slice'])} | {r['mesh']} | "
            f"{r['batch_per_chip']} | does not fit: {r.get('error', '')[:80]} |" + " |" * 9)
  flops = r["flops_compiled"] / r["flops_analytic"]
  col = r["collective_bytes"] / r["collective_bytes_min"]
  return (f"| {LABELS.get(r['model'], r['model'])} | {SLICE_LABELS.get(r['slice'], r['slice'])} | "
          f"{_mesh(r)} | "
          f"{r['batch_per_chip']} | {r['params'] / 1e6:.1f} | {r['flops_compiled'] / 1e12:.2f} / "
          f"{r['flops_analytic'] / 1e12:.2f} = **{flops:.3f}** | {r['collective_bytes'] / GIB:.3f} / "
          f"{r['collective_bytes_min'] / GIB:.3f} = **{col:.2f}** | {r['peak_bytes'] / GIB:.2f} of "
          f"{r['hbm_capacity'] / GIB:.0f} | {1e3 * r['seconds_compute']:.0f} / {1e3 * r['seconds_hbm']:.0f} / "
          f"{1e3 * r['seconds_ici']:.1f} | {100 * r['mfu_compute_bound']:.0f}% / {100 * r['mfu']:.0f}% | "
          f"{r['compile_seconds']:.0f} |")


def markdown(results: dict, *, versions: str = "") -> str:
  rows = _main_records(results)
  out = [f"# A TPU pod's train step, compiled here for its chips (never run)\n",
         f"`python -m benchmarks.pod_compile --note=docs/notes/pod_compile_tpu.md` with libtpu "
         f"(`pip install 'ncjax[tpu]'`), {datetime.date.today().isoformat()}{versions}. Each row is ncjax's own "
         f"train step (the trainer's StageProgram of the method, bf16 towers, float32 parameters, AdamW, einsum "
         f"attention) for a global batch of 32,768 pairs, lowered from abstract inputs and compiled by the TPU "
         f"compiler for the slice's chips. Per chip: the compiler's FLOPs against the analytic count "
         f"(`benchmarks/flops.py`: the towers' matrix products, forward and backward, and the loss's similarity "
         f"products; ViT-B/16 123.13 GFLOP per pair), the bytes its collectives receive over rings against the "
         f"data-parallel minimum (the gradients' reduction in the dtype the program reduces them in — bf16 for "
         f"the weights the towers use in bf16, float32 for the rest — plus one bf16 gather of an N x 512 "
         f"embedding matrix and the reduce-scatter of its float32 gradient; with FSDP plus the parameters "
         f"gathered twice), XLA's memory analysis (arguments + outputs − aliased + temporaries + code) against "
         f"the chip's HBM, and a roofline: compute at the chip's bf16 peak / HBM traffic at its bandwidth for "
         f"XLA's bytes-accessed estimate / collectives at its ICI bandwidth (v5e: 197 TFLOP/s, 16 GiB, 819 GB/s, "
         f"400 GB/s; v5p: 459 TFLOP/s, 95 GiB, 2,765 GB/s, 600 GB/s — Google Cloud's TPU v5e and v5p pages). "
         f"MFU: the analytic FLOPs over the compute-bound time (compute + ICI) / over the time with XLA's HBM "
         f"estimate (max(compute, HBM) + ICI).\n",
         "| step | slice | mesh | pairs/chip | params (M) | TFLOP/chip compiled / analytic | collective GiB/chip "
         "/ minimum | peak GiB of HBM | ms: compute / HBM (XLA est.) / ICI | MFU: compute-bound / with HBM "
         "est. | compile s |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
  out += [_row(r) for r in rows]
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
  search = {k[: -len("_max_batch")]: v for k, v in results.items() if k.endswith("_max_batch")}
  if search:
    out += ["\n## The largest per-chip batch that fits (data-parallel)\n",
            "Peak memory is a + s b + q b^2 in the per-chip batch b (the loss's logits: b rows against the global "
            "chips x b), fitted through compiles at 64, 128 and 256 pairs per chip; the prediction, rounded down to "
            "a multiple of 8, is compiled to confirm (8 less until the compiler accepts it).\n",
            "| step | slice | no remat: largest / predicted | remat (each block recomputed): largest / predicted |",
            "|---|---|---|---|"]
    for name, v in search.items():
      model, slice_name = name.rsplit("_", 2)[0], name.rsplit("_", 2)[1]
      cells = []
      for remat in ("False", "True"):
        s = v.get(remat, {})
        cells.append(f"{s.get('max_batch')} / {s.get('predicted', float('nan')):.0f}" if s else "-")
      out.append(f"| {LABELS.get(model, model)} | {SLICE_LABELS.get(slice_name, slice_name)} | {cells[0]} | "
                 f"{cells[1]} |")
  out += ["\n## What a run costs (at the rows above)\n",
          "Pairs per second of the slice and chip-hours per billion pairs seen, at the compute-bound time and at the "
          "time with XLA's HBM estimate (the truth lies between; a run on the slice decides).\n",
          "| step | slice | mesh | pairs/s (compute-bound / HBM est.) | chip-hours per 1e9 pairs |", "|---|---|---|---|---|"]
  for r in rows:
    if "flops_compiled" not in r:
      continue
    out.append(f"| {LABELS.get(r['model'], r['model'])} | {SLICE_LABELS.get(r['slice'], r['slice'])} | {_mesh(r)} | "
               f"{pairs_per_second(r, 'compute'):,.0f} / {pairs_per_second(r, 'hbm'):,.0f} | "
               f"{chip_hours_per_billion(r, 'compute'):,.0f} / {chip_hours_per_billion(r, 'hbm'):,.0f} |")
  first = next((r for r in rows if r.get("model") == "clip_vit_b16" and r.get("slice") == "v5e256"
                and r.get("mesh") == "data" and "collectives" in r), None)
  if first:
    out += ["\n## The collectives of CLIP ViT-B/16 on v5e-256, data-parallel\n",
            "| kind | result | pieces | MiB received per chip | op |", "|---|---|---|---|---|"]
    for c in first["collectives"][:10]:
      out.append(f"| {c['kind']} | `{c['type'].split('{')[0]}` | {c['pieces']} | {c['moved'] / 2 ** 20:.1f} | "
                 f"`{c['op_name'][-60:]}` |")
  return "\n".join(out) + "\n"
