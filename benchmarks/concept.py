"""Concept-unlearning benchmarks: the AC and HAC train steps against the CLIP and MERU steps (small config, global
batch 2048 = 1024 retain + 1024 forget pairs, simulated devices, same run)."""

from __future__ import annotations

from benchmarks import common


def _config(name: str, size: str, batch: int):
  from ncjax.config_lib import load_config_file
  if name in ("ac", "hac"):   # forget the synthetic captions that mention 'cat' (about a third)
    cfg = load_config_file(name, f"model={size},data=synthetic,batch={batch},classes=,keywords=cat,epochs=2")
  else:
    cfg = load_config_file(name, f"model={size},data=synthetic,batch={batch},noise=0,epochs=2")
  return cfg


def run(quick: bool = False) -> dict:
  size, batch = ("tiny", 256) if quick else ("small", 2048)
  times = {name: common.train_step_seconds(_config(name, size, batch)) for name in ("clip", "ac", "meru", "hac")}
  rows = [dict(method=m, seconds=times[m], vs_clip=times[m] / times["clip"],
               vs_meru=times[m] / times["meru"] if m in ("meru", "hac") else None) for m in times]
  print(f"\nTrain step, {size} config, global batch {batch}, simulated devices (AC / HAC: N retain + N forget)")
  print(common.table(rows, [("method", "method", "s"), ("seconds", "s/step", ".2f"), ("vs_clip", "vs CLIP", ".2f"),
                            ("vs_meru", "vs MERU", ".2f")]))
  payload = dict(size=size, batch=batch, rows=rows)
  common.write("concept", payload)
  return payload
