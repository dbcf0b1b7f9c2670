"""`make demo`: the methods on the embedded digits data, on 8 simulated CPU devices.

Table 1, noisy correspondence: CLIP trained with 40% noisy captions and the robust methods.
Table 2, concept unlearning: forget the digit 'three' from a CLIP and a MERU trained on clean digits, with AC / HAC
and the fine-tuning baselines of the AC/HAC slides.

Table 3, noisy-correspondence retrieval on region features (the setting of NCR, GSC and DisNCL): SGRAF's backbone on
the embedded synthetic precomp data (12 regions x 64 features per image, captions naming the image's objects) with
40% of the captions shuffled: the hinge baseline, GSC on SGRAF and DisNCL, with a clean-caption hinge reference.

Table 1 reports zero-shot top-1 on the test split (class prompt ensemble), image->text and text->image R@1, and how
well each model's clean score separates the noisy training pairs (ROC-AUC against the ground-truth clean flags,
which the training losses never see); a clean-caption CLIP row is the reference. Table 2 reports R-acc / F-acc
(zero-shot with the slides' prompt), rsum and forget vs retain retrieval. Methods add rows through `ROWS` and
`CONCEPT_ROWS`.
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
  from ncjax import config_lib, main as main_lib, train
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
  evals = main_lib.final_evaluation(cfg, result, workdir)
  return cfg, evals, time.perf_counter() - t0, workdir


def run_row(name: str, config_name: str, arg: str, init: str | None = None, workdirs=None):
  cfg, evals, seconds, workdir = train_and_evaluate(name, config_name, arg, init, workdirs)
  det = evals.get("noise_detection", {})
  return dict(name=name, noise=cfg.noise.ratio, zeroshot=evals["zeroshot"]["acc1"],
              i2t=evals["retrieval"]["i2t_R@1"], t2i=evals["retrieval"]["t2i_R@1"],
              rsum=evals["retrieval"]["rsum"], auc=det.get("auc", float("nan")),
              precision=det.get("precision", float("nan")), recall=det.get("recall", float("nan")),
              seconds=seconds, workdir=workdir)


def _workdir(name: str) -> str:
  # Only [A-Za-z0-9_.-]: the path goes into a config argument ('init=...'), where a comma separates arguments.
  slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("%", "pct")).strip("_")
  return os.path.join(RESULTS_DIR, slug)


# (row name, config, config argument, row whose model it starts from)
ROWS = [
    ("CLIP (clean captions)", "clip", "noise=0.0", None),
    ("CLIP (40% noisy)", "clip", "noise=0.4", None),
    ("NCU unlearning", "ncu", "", "CLIP (40% noisy)"),
    ("Gradient ascent", "ncu", "method=ncu_ga", "CLIP (40% noisy)"),
    ("GSC", "gsc", "noise=0.4", None),
    ("Bayesian CL", "bayes", "noise=0.4", None),
]


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


def format_table(rows) -> str:
  return render_table(
      [("method", "left"), ("noise", "right"), ("zero-shot", "right"), ("i2t R@1", "right"), ("t2i R@1", "right"),
       ("rsum", "right"), ("noise AUC", "right"), ("forget P", "right"), ("forget R", "right"), ("time", "right")],
      [[r["name"], f"{r['noise']:.0%}", f"{100 * r['zeroshot']:.1f}%", f"{r['i2t']:.1f}%", f"{r['t2i']:.1f}%",
        f"{r['rsum']:.1f}", _num(r["auc"], ".3f"), _num(r["precision"], ".3f"), _num(r["recall"], ".3f"),
        f"{r['seconds']:.0f}s"] for r in rows])


def main():
  jax = _setup_jax()
  print(f"ncjax demo: digits image-caption pairs on {len(jax.devices())} simulated CPU devices", flush=True)
  t0 = time.perf_counter()
  rows, workdirs = [], {}
  for name, config_name, arg, init in ROWS:
    rows.append(run_row(name, config_name, arg, init, workdirs))
    workdirs[name] = rows[-1]["workdir"]
  concept_rows = run_concept_rows(workdirs)
  region_rows = run_region_rows()
  table = format_table(rows)
  concept_table = format_concept_table(concept_rows)
  region_table = format_region_table(region_rows)
  print("\nResults (digits test split: 359 images, 718 captions; noise AUC over the training pairs)\n")
  print(table)
  print("\nConcept unlearning: forget the digit 'three' (zero-shot with the slides' prompt 'a picture of a [CLASS]'; "
        "R-acc on the other nine classes, F-acc on threes; t2i R@1 of forget / retain test captions)\n")
  print(concept_table)
  print("\nNoisy-correspondence retrieval on region features (synthetic precomp test split: 200 images, 400 captions; "
        "SGRAF backbone, 12 epochs each)\n")
  print(region_table)
  os.makedirs(RESULTS_DIR, exist_ok=True)
  with open(os.path.join(RESULTS_DIR, "results.md"), "w") as f:
    f.write(table + "\n\n" + concept_table + "\n\n" + region_table + "\n")
  print("\nnoise AUC: ROC-AUC of each model's clean score for the training pairs (its similarity, or the method's own "
        "score) against the ground-truth clean flags, which no training loss sees. forget P/R: precision and recall of "
        "the pairs an unlearning method put in its forget set (each pair's last batch) as noisy. GSC's clean score is its "
        "soft label y, Bayesian CL's the weighted positive probability w+ s+ / (w+ s+ + sum w- s-).")
  pngs = sorted(os.path.join(r["workdir"], "eval", f) for r in rows + concept_rows + region_rows
                for f in os.listdir(os.path.join(r["workdir"], "eval")) if f.endswith(".png"))
  print("plots:\n  " + "\n  ".join(pngs))
  print(f"\ntotal {time.perf_counter() - t0:.0f}s; workdirs and results.md under {RESULTS_DIR}/")
  return 0


if __name__ == "__main__":
  sys.exit(main())
