"""Does noise-aware filtering beat plain CLIP-score filtering? The evidence table of docs/notes/web_filter_scenes_cpu.md.

The embedded scenes (ncjax/data/embedded/scenes.py: a caption fits only its own image, web data's regime) written as
img2dataset output with the noise *in the data*: NCR's caption shuffle over 40% of the 2,000 training pairs (noise
seed = the seed), each pair's .json carrying its clean flag (ground truth for the evaluation only), PNG images of
24 px (what tiny_scenes sees), four shards of 500. Per seed:

1. CLIP on all pairs (`clip:model=tiny_scenes`, batch 256, `--steps` steps as `num_steps`, the schedule spanning them);
2. the scorers: that noisy CLIP's cosine similarity; NCU's unlearned model from it (`ncu:setting=scenes`, its
   prompt and unlearning stages), its similarity; GSC trained on the same data (`gsc:setting=scenes`, as many steps
   as CLIP), its own soft labels (`--score=method`) — each an `ncjax audit` of the web data, whose AUC against the
   clean flags is the scorer's noise AUC;
3. CLIP trained on the pairs each scorer keeps (`ncjax filter --keep=0.6`: the clean fraction), and on the truly
   clean 60% (the oracle), for the same number of steps as on all pairs (more passes over fewer pairs);
4. every CLIP evaluated on the 400 held-out scenes: zero-shot (the large object's colour, 8 classes) and rsum.

5. (issue 46, `--rows=external`) the filter users actually run, DataComp's CLIP score: a scorer trained on *other*
   data, which has not memorised this pool's noisy captions — CLIP trained on 2,000 other scenes of the same domain
   with their true captions (ids from EXTERNAL_FIRST_ID, clean), for the same steps as the noisy CLIP; its
   similarity audited over the pool, the 60% it keeps trained on; and GSC's labels combined with it (the mean of the
   two scores' ranks).

Runs are skipped when their result exists (rerun the same command to continue after an interruption).

  .venv/bin/python -m benchmarks.web_filter_evidence --seeds=0,1,2 --steps=280 --workdir=/tmp/wfe \\
      --out=docs/notes/web_filter_scenes_cpu.md
  .venv/bin/python -m benchmarks.web_filter_evidence --rows=external --seeds=0,1,2 --workdir=/tmp/wfe
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = 0.6
NOISE = 0.4
SCORERS = (("clip", "CLIP similarity (the noisy CLIP)", "similarity"),
           ("ncu", "NCU's unlearned model (similarity)", "similarity"),
           ("gsc", "GSC's soft labels", "method"),
           ("gsc_sim", "GSC's model (similarity)", "similarity"))


def write_data(root: str, seed: int) -> dict:
  """Scenes' training pairs with NCR caption noise in the data, as img2dataset output, indexed."""
  from ncjax.data.embedded import scenes
  from ncjax.data.noise import make_noisy_index
  from ncjax.data.web import index as web_index
  from ncjax.data.web import synthetic as web_synthetic
  split = scenes.load("train", image_size=24)
  pixels = np.clip(np.round((split.images * 0.5 + 0.5) * 255), 0, 255).astype(np.uint8)
  noisy = make_noisy_index(split.caption_to_image, NOISE, seed)
  web_synthetic.write_pairs_img2dataset(root, pixels, split.captions, image_of=noisy.caption_to_image,
                                        clean=noisy.clean, per_shard=500)
  web_index.build_index(root, workers=1, clean_key="clean")
  return dict(pairs=len(split.captions), noisy=int((~noisy.clean).sum()))


EXTERNAL_FIRST_ID = 2_000_000   # scene ids of the external scorer's clean data: disjoint from train and test


def write_external_data(root: str, n: int = 2000) -> dict:
  """Other scenes of the same domain with their true captions (the external scorer's training data), indexed."""
  from ncjax.data.embedded import scenes
  from ncjax.data.web import index as web_index
  from ncjax.data.web import synthetic as web_synthetic
  pixels, captions = [], []
  for i in range(EXTERNAL_FIRST_ID, EXTERNAL_FIRST_ID + n):
    desc = scenes.scene(i)
    pixels.append(np.clip(np.round(scenes.render(desc, 24) * 255), 0, 255).astype(np.uint8))
    rng = np.random.Generator(np.random.PCG64([scenes.SEED, i, 1]))
    captions.append(scenes.caption(desc, int(rng.choice(len(scenes._FORMS))), rng))   # noqa: SLF001
  web_synthetic.write_pairs_img2dataset(root, np.stack(pixels), captions, image_of=np.arange(n),
                                        clean=np.ones(n, bool), per_shard=500)
  web_index.build_index(root, workers=1, clean_key="clean")
  return dict(pairs=n)


def combined_filter(base: str, data: str, parts: list[str], path: str) -> None:
  """A filter keeping the KEEP fraction with the best mean rank over several audits' scores (a pair an audit could
  not score ranks last there)."""
  if os.path.exists(os.path.join(path, "manifest.json")):
    return
  from ncjax.data.web import dataset as web
  from ncjax.data.web import score_files, subset
  ds = web.open_dataset(data, clean_key="clean")
  ranks = []
  for part in parts:
    out = os.path.join(base, f"audit_{part}")
    score = np.full(ds.num_examples, -np.inf)
    for _, _, first, n, cols in score_files.scan(out, score_files.require_manifest(out), ["score"]):
      score[first:first + n] = np.nan_to_num(np.asarray(cols["score"], np.float64), nan=-np.inf)
    ranks.append(np.argsort(np.argsort(score, kind="stable"), kind="stable") / max(1, len(score) - 1))
  mean_rank = np.mean(ranks, axis=0)
  flags = np.zeros(ds.num_examples, bool)
  flags[np.argsort(-mean_rank, kind="stable")[:int(round(KEEP * ds.num_examples))]] = True
  subset.write_filter(path, [subset.dataset_identity(ds)], [subset.pack(flags)],
                      dict(keep=KEEP, min_score=None, per_dataset=False, combined=parts),
                      dict(kind="mean rank", parts=parts))


def _cli(args: list[str], log: str) -> float:
  t = time.time()
  with open(log, "w") as f:
    out = subprocess.run([sys.executable, "-m", "ncjax.main", *args, "--cpu_devices=8"], cwd=ROOT, stdout=f,
                         stderr=subprocess.STDOUT, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  if out.returncode:
    with open(log) as f:
      raise RuntimeError(f"{' '.join(args)} failed:\n{f.read()[-3000:]}")
  return time.time() - t


def common_flags(seed: int) -> list[str]:
  return [f"--config.seed={seed}", f"--config.input.shuffle_seed={seed}", "--config.input.normalization=siglip",
          "--config.input.augment=False", "--config.input.web.clean_key=clean", "--config.log.progress=False",
          "--config.ckpt.every_minutes=0"]


EVALS = ["--config.evals.zeroshot.enabled=True", "--config.evals.zeroshot.dataset=scenes",
         "--config.evals.retrieval.enabled=True", "--config.evals.retrieval.dataset=scenes"]


def train(workdir: str, config: str, seed: int, *extra, evals: bool = True) -> dict:
  """A run (skipped when its final evaluation exists); its last eval results and wall time."""
  done = os.path.join(workdir, "done.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)
  seconds = _cli(["train", f"--config={config}", f"--workdir={workdir}", *common_flags(seed),
                  *(EVALS if evals else []), *extra], workdir + ".log")
  out = dict(seconds=seconds)
  if evals:
    latest = max(glob.glob(os.path.join(workdir, "eval", "step_*.json")),
                 key=lambda p: int(os.path.basename(p)[5:-5]))
    with open(latest) as f:
      results = json.load(f)["results"]
    out.update(zeroshot=results["zeroshot"]["acc1"], rsum=results["retrieval"]["rsum"],
               step=int(os.path.basename(latest)[5:-5]))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rates = [r["examples_per_sec"] for r in map(json.loads, f) if r.get("kind") == "train" and
             "examples_per_sec" in r]
  out["examples_per_s"] = float(np.median(rates)) if rates else None
  with open(done, "w") as f:
    json.dump(out, f)
  return out


def audit(run: str, out: str, score: str, seed: int, dataset: str = "") -> dict:
  path = os.path.join(out, "audit.json")
  if not os.path.exists(path):
    seconds = _cli(["audit", f"--checkpoint={run}", f"--output={out}", f"--score={score}", "--progress_every=0",
                    "--top=100", "--sample=50", *([f"--dataset={dataset}"] if dataset else [])], out + ".log")
    with open(out + ".log") as f:
      rate = [line for line in f if "pairs/s" in line]
    with open(path) as f:
      result = json.load(f)
    result.update(seconds=seconds, progress=rate[-1].strip() if rate else "")
    with open(path, "w") as f:
      json.dump(result, f, indent=1)
  with open(path) as f:
    return json.load(f)


def oracle_filter(data: str, path: str) -> None:
  """The truly clean pairs (the data's own flags) as a filter."""
  if os.path.exists(os.path.join(path, "manifest.json")):
    return
  from ncjax.data.web import dataset as web
  from ncjax.data.web import subset
  ds = web.open_dataset(data, clean_key="clean")
  flags = ds.clean_flags(np.arange(ds.num_examples))
  subset.write_filter(path, [subset.dataset_identity(ds)], [subset.pack(flags)], dict(keep=None, min_score=None,
                      per_dataset=False, oracle=True), dict(kind="ground truth"))


def run_external(base: str, seed: int, steps: int) -> dict:
  """Step 5: the external scorer, alone and combined with GSC's labels (GSC and its audit as in run_seed)."""
  os.makedirs(base, exist_ok=True)
  data, external = os.path.join(base, "data"), os.path.join(base, "external")
  if not os.path.exists(os.path.join(data, "_ncjax_index", "manifest.json")):
    write_data(data, seed)
  if not os.path.exists(os.path.join(external, "_ncjax_index", "manifest.json")):
    write_external_data(external)
  web = f"web:{data}"
  clip_cfg = f"clip:model=tiny_scenes,data={web},batch=256"
  scorer = train(os.path.join(base, "clip_external_scorer"), f"clip:model=tiny_scenes,data=web:{external},batch=256",
                 seed, f"--config.num_steps={steps}", evals=False)
  gsc = train(os.path.join(base, "gsc"), f"gsc:setting=scenes,data={web}", seed, f"--config.num_steps={steps}")
  audits = dict(external=audit(os.path.join(base, "clip_external_scorer"), os.path.join(base, "audit_external"),
                               "similarity", seed, dataset=web),
                gsc=audit(os.path.join(base, "gsc"), os.path.join(base, "audit_gsc"), "method", seed))
  rows = {}
  filt = os.path.join(base, "filter_external")
  if not os.path.exists(os.path.join(filt, "manifest.json")):
    _cli(["filter", f"--scores={os.path.join(base, 'audit_external')}", f"--keep={KEEP}", f"--output={filt}"],
         filt + ".log")
  rows["external"] = train(os.path.join(base, "clip_external"), clip_cfg, seed, f"--config.num_steps={steps}",
                           f"--config.input.web.filter={filt}")
  combined_filter(base, data, ["gsc", "external"], os.path.join(base, "filter_gsc_external"))
  rows["gsc_external"] = train(os.path.join(base, "clip_gsc_external"), clip_cfg, seed, f"--config.num_steps={steps}",
                               f"--config.input.web.filter={os.path.join(base, 'filter_gsc_external')}")
  return dict(rows=rows, audits=audits, scorer=scorer, gsc=gsc)


def external_table(results: dict) -> str:
  seeds = sorted(results)
  lines = [f"Seeds: {', '.join(map(str, seeds))} (mean ± standard deviation over seeds).", "",
           "| CLIP trained on | scorer's noise AUC | truly noisy among its 100 most suspicious | pairs | zero-shot % | "
           "rsum |", "|---|---|---|---|---|---|"]
  r = lambda key: [results[s]["rows"][key] for s in seeds]
  a = [results[s]["audits"]["external"] for s in seeds]
  lines.append(f"| the 60% kept by an external CLIP's similarity (trained on 2,000 other clean scenes, same steps) | "
               f"{_mean_sd([x['auc'] for x in a])} | {_pct([x['top_noisy_fraction'] for x in a])} | 1,200 | "
               f"{_pct([x['zeroshot'] for x in r('external')])} | {_num([x['rsum'] for x in r('external')])} |")
  lines.append(f"| the 60% kept by GSC's labels and the external CLIP's similarity (mean rank) | - | - | 1,200 | "
               f"{_pct([x['zeroshot'] for x in r('gsc_external')])} | "
               f"{_num([x['rsum'] for x in r('gsc_external')])} |")
  return "\n".join(lines)


def run_seed(base: str, seed: int, steps: int) -> dict:
  os.makedirs(base, exist_ok=True)
  data = os.path.join(base, "data")
  if not os.path.exists(os.path.join(data, "_ncjax_index", "manifest.json")):
    write_data(data, seed)
  web = f"web:{data}"
  clip_cfg = f"clip:model=tiny_scenes,data={web},batch=256"
  rows = {"all": train(os.path.join(base, "clip_all"), clip_cfg, seed, f"--config.num_steps={steps}")}
  ncu = train(os.path.join(base, "ncu"), f"ncu:setting=scenes,data={web},init={os.path.join(base, 'clip_all')}",
              seed)
  gsc = train(os.path.join(base, "gsc"), f"gsc:setting=scenes,data={web}", seed, f"--config.num_steps={steps}")
  runs = dict(clip=os.path.join(base, "clip_all"), ncu=os.path.join(base, "ncu"), gsc=os.path.join(base, "gsc"),
              gsc_sim=os.path.join(base, "gsc"))
  audits = {}
  for name, _, score in SCORERS:
    audits[name] = audit(runs[name], os.path.join(base, f"audit_{name}"), score, seed)
    filt = os.path.join(base, f"filter_{name}")
    if not os.path.exists(os.path.join(filt, "manifest.json")):
      _cli(["filter", f"--scores={os.path.join(base, f'audit_{name}')}", f"--keep={KEEP}", f"--output={filt}"],
           filt + ".log")
    rows[name] = train(os.path.join(base, f"clip_{name}"), clip_cfg, seed, f"--config.num_steps={steps}",
                       f"--config.input.web.filter={filt}")
  oracle_filter(data, os.path.join(base, "filter_oracle"))
  rows["oracle"] = train(os.path.join(base, "clip_oracle"), clip_cfg, seed, f"--config.num_steps={steps}",
                         f"--config.input.web.filter={os.path.join(base, 'filter_oracle')}")
  return dict(rows=rows, audits=audits, ncu=ncu, gsc=gsc)


def _mean_sd(values) -> str:
  v = np.asarray([x for x in values if x is not None], np.float64)
  if not len(v):
    return "-"
  return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v.mean():.3f}"


def _pct(values) -> str:
  v = 100 * np.asarray(values, np.float64)
  return f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v.mean():.1f}"


def _num(values) -> str:
  v = np.asarray(values, np.float64)
  return f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v.mean():.1f}"


def table(results: dict) -> str:
  seeds = sorted(results)
  lines = [f"Seeds: {', '.join(map(str, seeds))} (mean ± standard deviation over seeds).", "",
           "| CLIP trained on | scorer's noise AUC | truly noisy among its 100 most suspicious | pairs | zero-shot % | "
           "rsum |", "|---|---|---|---|---|---|"]

  def row(label, key, auc=None, top=None, pairs="2,000"):
    r = [results[s]["rows"][key] for s in seeds]
    lines.append(f"| {label} | {auc or '-'} | {top or '-'} | {pairs} | {_pct([x['zeroshot'] for x in r])} | "
                 f"{_num([x['rsum'] for x in r])} |")

  row("all pairs (40% noisy)", "all")
  for name, label, _ in SCORERS:
    a = [results[s]["audits"][name] for s in seeds]
    row(f"the 60% kept by {label}", name, _mean_sd([x["auc"] for x in a]),
        _pct([x["top_noisy_fraction"] for x in a]), "1,200")
  row("the truly clean 60% (oracle)", "oracle", pairs="1,2xx")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--steps", type=int, default=280)
  p.add_argument("--workdir", default="/tmp/web_filter_evidence")
  p.add_argument("--out", default="")
  p.add_argument("--rows", default="all", choices=("all", "external"),
                 help="external: only step 5 (the external scorer and its combination with GSC's labels)")
  args = p.parse_args(argv)
  results = {}
  run = run_external if args.rows == "external" else run_seed
  for seed in [int(s) for s in args.seeds.split(",") if s]:
    t = time.time()
    results[seed] = run(os.path.join(args.workdir, f"seed{seed}"), seed, args.steps)
    print(f"seed {seed}: {time.time() - t:.0f} s", json.dumps(results[seed], default=str)[:2000], flush=True)
    name = "results.json" if args.rows == "all" else "results_external.json"
    with open(os.path.join(args.workdir, name), "w") as f:
      json.dump(results, f, indent=1)
  text = external_table(results) if args.rows == "external" else table(results)
  print(text)
  if args.out:
    with open(args.out, "a") as f:
      f.write(text + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
