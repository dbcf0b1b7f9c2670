"""`make bench`: every benchmark suite, in one process on 8 simulated devices (or the accelerator if present)."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--suites", default="foundation,data,eval_input,checkpoint,tokenizer,ncu,steps,gsc_bayes,scale,"
                      "region",
                      help="comma-separated suites to run")
  parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run of the benchmarks)")
  parser.add_argument("--methods", default="", help="steps suite only: config names to time beside CLIP "
                      "(e.g. bayes,gsc); default every method")
  args = parser.parse_args(argv)
  from ncjax import runtime
  # Simulated devices only matter on a CPU-only host; on an accelerator the default backend is the accelerator.
  runtime.configure_cpu_devices(int(os.environ.get("NCJAX_BENCH_CPU_DEVICES", "8")))
  import absl.logging
  absl.logging.set_verbosity(absl.logging.WARNING)
  from benchmarks import (checkpoint, common, data, eval_input, foundation, gradcache, gsc_bayes, ncu, region, scale,
                          steps, tokenizer)
  suites = {"foundation": foundation.run, "data": data.run, "eval_input": eval_input.run,
            "checkpoint": checkpoint.run,
            "tokenizer": tokenizer.run, "ncu": ncu.run,
            "steps": steps.run, "gsc_bayes": gsc_bayes.run, "scale": scale.run,
            "region": region.run, "gradcache": gradcache.run}
  from benchmarks import web_data
  suites["web_data"] = web_data.run   # synthetic img2dataset output of 1M and 10M pairs (--quick: 100k and 1M)
  from benchmarks import web_store
  suites["web_store"] = web_store.run   # gs:// on a local GCS server behind a latency proxy
  from benchmarks import web_audit
  from benchmarks import web_noise
  suites["web_noise"] = web_noise.run   # injected noise as the loss sees it, per pair and in blocks (order code only)
  suites["web_audit"] = web_audit.run   # scoring web pairs on 1 and 2 processes, choosing a filter, filtered training
  for name in args.suites.split(","):
    if name not in suites:
      raise SystemExit(f"unknown suite {name!r}; suites: {sorted(suites)}")
    print(f"\n######## {name}")
    suites[name](quick=args.quick, **({"methods": args.methods} if name == "steps" else {}))
  print(f"\nmarkdown summary: {common.markdown_summary()}")
  return 0


if __name__ == "__main__":
  from ncjax import runtime
  runtime.restart_with_huge_pages()
  sys.exit(main())
