"""Full train steps of every method against the CLIP step: same model size, global batch and devices, one run.

NCU is timed in its unlearning stage (the masked-OT loss plus its negative-prompt text pass), AC / HAC on batches
of N retain + N forget pairs (the same global batch), HAC and MERU on MERU's geometry.
"""

from __future__ import annotations

from benchmarks import common

# method -> (config file, arguments beyond model/data/batch)
METHODS = {
    "CLIP": ("clip", "noise=0"), "SigLIP": ("siglip", "noise=0"), "GSC": ("gsc", "noise=0"),
    "Bayesian CL": ("bayes", "noise=0"), "NCU (stage 2)": ("ncu", "noise=0,epochs_prompt=0"),
    "MERU": ("meru", "noise=0"), "AC": ("ac", "classes=,keywords=cat"), "HAC-reg": ("hac", "classes=,keywords=cat"),
}


def _config(config_name: str, arg: str, size: str, batch: int):
  from ncjax.config_lib import load_config_file
  cfg = load_config_file(config_name, f"model={size},data=synthetic,batch={batch},epochs=2,{arg}")
  with cfg.unlocked():
    cfg.method.init_from = "random"   # step timing: any weights serve (the unlearning methods refuse none otherwise)
    if config_name == "ncu":
      cfg.method.frozen_text_blocks = 1
  return cfg


def run(quick: bool = False, methods: str = "") -> dict:
  """methods: comma-separated config names (e.g. 'bayes,gsc') to time beside CLIP; empty: every method."""
  size, batch = ("tiny", 256) if quick else ("small", 2048)
  wanted = {m.strip() for m in methods.split(",") if m.strip()}
  unknown = wanted - {config_name for config_name, _ in METHODS.values()}
  if unknown:
    raise SystemExit(f"unknown --methods {sorted(unknown)}; known: {sorted(c for c, _ in METHODS.values())}")
  rows = []
  for name, (config_name, arg) in METHODS.items():
    if wanted and config_name != "clip" and config_name not in wanted:
      continue
    sec = common.train_step_seconds(_config(config_name, arg, size, batch))
    rows.append(dict(method=name, seconds=sec))
  clip = rows[0]["seconds"]
  for r in rows:
    r["vs_clip"] = r["seconds"] / clip
  payload = dict(size=size, batch=batch, rows=rows)
  common.write("steps", payload)
  common.report(f"Train step, {size} config, global batch {batch}, simulated devices: every method vs CLIP", rows,
                [("method", "method", "s"), ("seconds", "s/step", ".2f"), ("vs_clip", "vs CLIP", ".2f")])
  return payload
