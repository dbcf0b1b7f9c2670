"""The README's Bayesian-CL evidence table: the three `loss.weights` settings and CLIP, trained on 40%-noisy digits
with the same schedule, evaluated by the default evaluators (zero-shot, retrieval rsum, noise-detection AUC of the
method's per-pair score), plus the last logged mean log w+ (the weights' scale drift).

  python -m benchmarks.bayes_evidence [--epochs 40] [--out docs/notes/bayes_evidence_cpu.md]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ROWS = (
    ("`paper` (b = 0)", "bayes", "weights=paper"),
    ("`unit_prior` (b₊ = 1 + a₊, b₋ = a₋: prior means 1)", "bayes", "weights=unit_prior"),
    ("`row_mean` (b = 0, weights divided by their row mean)", "bayes", "weights=row_mean"),
    ("CLIP (no weights), for reference", "clip", ""),
)


def run_row(config: str, arg: str, epochs: int, workdir: str) -> dict:
  arg = ",".join(x for x in ("noise=0.4", f"epochs={epochs}", arg) if x)
  cmd = [sys.executable, "-m", "ncjax.main", f"--config=configs/{config}.py:{arg}", f"--workdir={workdir}",
         "--cpu_devices=8", "--config.log.progress=False"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  if out.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
  latest = max(glob.glob(os.path.join(workdir, "eval", "step_*.json")),
               key=lambda p: int(os.path.basename(p)[5:-5]))
  with open(latest) as f:
    results = json.load(f)["results"]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    train_rows = [json.loads(l) for l in f if '"kind": "train"' in l]
  log_w = next((r["mean_log_w_pos"] for r in reversed(train_rows) if "mean_log_w_pos" in r), None)
  return dict(zeroshot=results["zeroshot"]["acc1"], rsum=results["retrieval"]["rsum"],
              auc=results["noise_detection"]["auc"], mean_log_w_pos=log_w)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--epochs", type=int, default=40)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  lines = ["| `loss.weights` | zero-shot | rsum | noise AUC | mean log w⁺ (last step) |", "|---|---|---|---|---|"]
  with tempfile.TemporaryDirectory() as tmp:
    for i, (label, config, arg) in enumerate(ROWS):
      r = run_row(config, arg, args.epochs, os.path.join(tmp, str(i)))
      log_w = "—" if r["mean_log_w_pos"] is None else f"{r['mean_log_w_pos']:.2f}"
      lines.append(f"| {label} | {100 * r['zeroshot']:.1f}% | {r['rsum']:.1f} | {r['auc']:.3f} | {log_w} |")
      print(lines[-1], flush=True)
  table = "\n".join(lines)
  print(table)
  if args.out:
    with open(args.out, "w") as f:
      f.write(f"# python -m benchmarks.bayes_evidence --epochs {args.epochs}\n\n{table}\n")


if __name__ == "__main__":
  main()
