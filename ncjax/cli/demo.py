"""`make demo`: NC-bench on the embedded digits data, on 8 simulated CPU devices; `make demo-all` adds two tables.

`make demo` (ncjax.demo): every noisy-correspondence method on the same 40%-noisy digits captions (NCR's caption
shuffle), one seed, the same budget and evaluators as `ncjax ncbench` (configs/ncbench.py), with a clean-caption
CLIP reference: zero-shot top-1 on the test split (class prompt ensemble), retrieval rsum and R@1, how well each
method's clean score separates the noisy training pairs (ROC-AUC against the ground-truth clean flags, which no
training loss sees), and the share of CLIP's noise drop each method recovers. Compositions included: NCU with its
forget set from GSC's soft labels, and NCU unlearning the GSC model.

`make demo-all` (ncjax.demo --all) adds
  * concept unlearning: forget the digit 'three' from a CLIP and a MERU trained on clean digits, with AC / HAC and
    the fine-tuning baselines of the AC/HAC slides (R-acc / F-acc with the slides' prompt, rsum, forget vs retain
    retrieval);
  * noisy-correspondence retrieval on region features (the setting of NCR, GSC and DisNCL): SGRAF's backbone on
    the embedded synthetic precomp data with 40% of the captions shuffled — the hinge baseline, GSC on SGRAF and
    DisNCL, with a clean-caption hinge reference.
Methods add rows through `DEMO_METHODS`, `CONCEPT_ROWS` and `REGION_ROWS`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

from ncjax.logging_utils import render_table  # noqa: E402  (re-exported: the demo's and NC-bench's tables)

RESULTS_DIR = os.environ.get("NCJAX_DEMO_DIR", "demo_out")


def _setup_jax():
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  from ncjax import runtime
  runtime.configure_cpu_devices(8)
  import absl.logging
  absl.logging.set_verbosity(absl.logging.WARNING)
  return jax


def train_and_evaluate(name: str, config_name: str, arg: str, init: str | None = None, workdirs=None):
  """(config, evaluation results, seconds, workdir) of one demo run."""
  from ncjax import config_lib, evaluation, train
  if init is not None:  # start from an earlier row's model (unlearning methods)
    arg = f"{arg},init={workdirs[init]}" if arg else f"init={workdirs[init]}"
  cfg = config_lib.load_config_file(config_name, arg)
  with cfg.unlocked():
    cfg.log.progress = True
  workdir = _workdir(name)
  shutil.rmtree(workdir, ignore_errors=True)
  print(f"\n== {name}: {config_name}.py:{arg}", flush=True)
  t0 = time.perf_counter()
  result = train.train(cfg, workdir)
  evals = evaluation.final(cfg, result, workdir)
  return cfg, evals, time.perf_counter() - t0, workdir


def _workdir(name: str) -> str:
  # Only [A-Za-z0-9_.-]: the path goes into a config argument ('init=...'), where a comma separates arguments.
  slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("%", "pct")).strip("_")
  return os.path.join(RESULTS_DIR, slug)


# The NC-bench sweep `make demo` runs (configs/ncbench.py arguments): one seed at 40% noise, every digits method and
# two compositions, each method's own config budget; the clean-caption CLIP reference is NC-bench's default here.
DEMO_METHODS = "clip+oracle+ncu+gsc+bayes+ncu_gsc_forget+gsc_then_ncu"
DEMO_BENCH = f"noise=0.4,seeds=1,methods={DEMO_METHODS}"


def run_ncbench() -> dict:
  from ncjax import config_lib
  from ncjax.cli import ncbench
  cfg = config_lib.load_config_file("ncbench", DEMO_BENCH)
  workdir = os.path.join(RESULTS_DIR, "ncbench")
  print(f"\n== NC-bench: configs/ncbench.py:{DEMO_BENCH} -> {workdir}", flush=True)
  shutil.rmtree(workdir, ignore_errors=True)
  out = ncbench.run(cfg, workdir, log=lambda line: print(line, flush=True), show_table=False)   # in the summary
  out["workdir"] = workdir
  return out


# Concept unlearning (AC / HAC, slides' Tables 1-5): forget the digit "three" from models trained on clean digits.
# (row name, config, argument, row whose model it starts from); the starting models are trained first.
CONCEPT_START = [("CLIP (clean, start)", "clip", "noise=0.0", None), ("MERU (clean, start)", "meru", "", None)]
CONCEPT_ROWS = [
    ("O-C: original CLIP", "ac", "variant=original", "CLIP (clean, start)"),
    ("f-C: fine-tune all", "ac", "variant=all", "CLIP (clean, start)"),
    ("f-C-R: fine-tune retain", "ac", "variant=retain", "CLIP (clean, start)"),
    ("AC", "ac", "variant=calibrate", "CLIP (clean, start)"),
    ("O-M: original MERU", "hac", "variant=original", "MERU (clean, start)"),
    ("f-M: fine-tune all", "hac", "variant=all", "MERU (clean, start)"),
    ("f-M-R: fine-tune retain", "hac", "variant=retain", "MERU (clean, start)"),
    ("HAC-reg", "hac", "variant=calibrate", "MERU (clean, start)"),
]


# Region-feature retrieval (SGRAF backbone, configs' 'synthetic' preset, 12 epochs each).
REGION_ROWS = [
    ("SGRAF hinge (clean)", "sgraf", "noise=0.0"),
    ("SGRAF hinge (40% noisy)", "sgraf", "noise=0.4"),
    ("GSC on SGRAF", "gsc", "backbone=sgraf,noise=0.4"),
    ("DisNCL", "disncl", "noise=0.4"),
]


def run_region_rows() -> list[dict]:
  rows = []
  for name, config_name, arg in REGION_ROWS:
    cfg, evals, seconds, workdir = train_and_evaluate(name, config_name, arg)
    r, det = evals["retrieval"], evals.get("noise_detection", {})
    rows.append(dict(name=name, noise=cfg.noise.ratio, i2t=r["i2t_R@1"], t2i=r["t2i_R@1"], rsum=r["rsum"],
                     auc=det.get("auc", float("nan")), seconds=seconds, workdir=workdir))
  return rows


def format_region_table(rows) -> str:
  return render_table(
      [("method (region features)", "left"), ("noise", "right"), ("i2t R@1", "right"), ("t2i R@1", "right"),
       ("rsum", "right"), ("noise AUC", "right"), ("time", "right")],
      [[r["name"], f"{r['noise']:.0%}", f"{r['i2t']:.1f}%", f"{r['t2i']:.1f}%", f"{r['rsum']:.1f}",
        _num(r["auc"], ".3f"), f"{r['seconds']:.0f}s"] for r in rows])


def format_concept_table(rows) -> str:
  return render_table(
      [("method (forget: three)", "left"), ("R-acc", "right"), ("F-acc", "right"), ("rsum", "right"),
       ("forget t2i R@1", "right"), ("retain t2i R@1", "right"), ("time", "right")],
      [[r["name"], f"{100 * r['R_acc']:.1f}%", f"{100 * r['F_acc']:.1f}%", f"{r['rsum']:.1f}",
        f"{r['forget_t2i']:.1f}%", f"{r['retain_t2i']:.1f}%", f"{r['seconds']:.0f}s"] for r in rows])


def run_concept_rows(workdirs) -> list[dict]:
  for name, config_name, arg, init in CONCEPT_START:
    _, _, _, workdirs[name] = train_and_evaluate(name, config_name, arg, init, workdirs)
  rows = []
  for name, config_name, arg, init in CONCEPT_ROWS:
    _, evals, seconds, workdir = train_and_evaluate(name, config_name, arg, init, workdirs)
    u, r = evals["unlearning"], evals["retrieval"]
    rows.append(dict(name=name, R_acc=u["R_acc"], F_acc=u["F_acc"], rsum=r["rsum"],
                     forget_t2i=u["forget_t2i_R@1"], retain_t2i=u["retain_t2i_R@1"], seconds=seconds,
                     workdir=workdir))
  return rows


def _num(x, fmt):
  return "-" if x != x else format(x, fmt)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  everything = "--all" in argv
  jax = _setup_jax()
  print(f"ncjax demo: digits image-caption pairs on {len(jax.devices())} simulated CPU devices", flush=True)
  t0 = time.perf_counter()
  from ncjax.cli import ncbench
  bench = run_ncbench()
  sections = [("NC-bench on digits, 40% noisy captions (test split: 359 images, 718 captions; noise AUC over the "
               "training pairs; recovered: share of CLIP's drop from clean to noisy captions won back, zero-shot)",
               bench["table"] + "\n\n" + ncbench.legend(r["method"] for r in bench["records"]))]
  workdirs, pngs = {}, list(bench["plots"])
  if everything:
    concept_rows = run_concept_rows(workdirs)
    region_rows = run_region_rows()
    sections.append(("Concept unlearning: forget the digit 'three' (zero-shot with the slides' prompt 'a picture of a "
                     "[CLASS]'; R-acc on the other nine classes, F-acc on threes; t2i R@1 of forget / retain test "
                     "captions)", format_concept_table(concept_rows)))
    sections.append(("Noisy-correspondence retrieval on region features (synthetic precomp test split: 200 images, 400 "
                     "captions; SGRAF backbone, 12 epochs each)", format_region_table(region_rows)))
    pngs += sorted(os.path.join(r["workdir"], "eval", f) for r in concept_rows + region_rows
                   for f in os.listdir(os.path.join(r["workdir"], "eval")) if f.endswith(".png"))
  for title, table in sections:
    print(f"\n{title}\n\n{table}")
  os.makedirs(RESULTS_DIR, exist_ok=True)
  with open(os.path.join(RESULTS_DIR, "results.md"), "w") as f:
    f.write("\n\n".join(f"{title}\n\n{table}" for title, table in sections) + "\n")
  print("\nnoise AUC: ROC-AUC of each model's clean score for the training pairs (its similarity, or the method's own "
        "score: GSC's soft label y, Bayesian CL's weighted positive probability) against the ground-truth clean flags, "
        "which no training loss sees.")
  print("plots:\n  " + "\n  ".join(pngs))
  more = "" if everything else "; `make demo-all` adds concept unlearning (AC/HAC) and region-feature retrieval"
  print(f"\ntotal {time.perf_counter() - t0:.0f}s; workdirs and results.md under {RESULTS_DIR}/{more}")
  return 0


def run():
  """`python -m ncjax.demo` (and `make demo`): restarts itself once with huge pages first
  (ncjax.runtime.restart_with_huge_pages), then runs the demo."""
  from ncjax import runtime
  runtime.restart_with_huge_pages()
  return main()


if __name__ == "__main__":
  sys.exit(run())
