"""GSC on a user's own table (issue 46): rendered scenes written as a user would bring them — PNG files and a CSV
(path, caption, label, clean, split) with 40% of the training captions shuffled *in the data* and a clean flag per
pair — built with the README's table command (`python -m ncjax.data.build --dataset=web_pairs/custom_table`), then
trained with the default command of `configs/gsc.py` on it, against the recipe that command gave before 2026-11-26
(the digits preset's warm-up of half the run and its max_ratio indicator) and CLIP.

Data: 3,000 training scenes (ids 0..2999 of ncjax.data.embedded.scenes: instance-unique captions, one each) and the
400 test scenes (two captions each) as the held-out split; 48-px PNGs; NCR's caption shuffle (ratio 0.4, seed 0,
`noise.make_noisy_index`) applied to the table's training rows.

Runs (3 seeds; tiny_deep, batch 256, 40 epochs, 8 CPU devices; every run evaluated on the held-out split):
  gsc_default    configs/gsc.py:data=tfds:web_pairs/custom_table,model=tiny_deep   (now: the 'data' preset)
  gsc_before     the same with setting=digits (what the default command ran before: warm-up 20, max_ratio)
  clip           configs/clip.py:data=tfds:web_pairs/custom_table,model=tiny_deep,epochs=40

  .venv/bin/python -m benchmarks.scenes_table --out=/tmp/scenes_table [--seeds=0,1,2] [--only=gsc_default]
NC-bench on the same table (every method's default command; docs/notes/ncbench_scenes_table_cpu.md):
  .venv/bin/ncjax ncbench --config=configs/ncbench.py:data=tfds:web_pairs/custom_table,noise=0,seeds=3,\
methods=clip+gsc+ncu+bayes+siglip --config.bench.data_dir=/tmp/scenes_table/tfds --workdir=/tmp/nb_table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TRAIN, PX, NOISE = 3000, 48, 0.4

RUNS = {
    "gsc_default": ("gsc", "data=tfds:web_pairs/custom_table,model=tiny_deep"),
    "gsc_before": ("gsc", "data=tfds:web_pairs/custom_table,model=tiny_deep,setting=digits"),
    "clip": ("clip", "data=tfds:web_pairs/custom_table,model=tiny_deep,batch=256,epochs=40"),
}


def export(directory: str) -> dict:
  """The scenes as a user's CSV table and PNG files (see the module docstring); returns counts."""
  from PIL import Image
  from ncjax.data.embedded import scenes
  from ncjax.data.noise import make_noisy_index
  os.makedirs(os.path.join(directory, "imgs"), exist_ok=True)
  rows = []
  for split, ids, k in (("train", range(N_TRAIN), 1), ("test", range(scenes.TEST_ID_OFFSET,
                                                                   scenes.TEST_ID_OFFSET + scenes.NUM_TEST), 2)):
    for i in ids:
      desc = scenes.scene(i)
      path = os.path.join("imgs", f"{i}.png")
      pixels = (scenes.render(desc, PX) * 255).round().astype(np.uint8)
      Image.fromarray(pixels).save(os.path.join(directory, path))
      rng = np.random.Generator(np.random.PCG64([scenes.SEED, int(i), 1]))
      for form in rng.choice(len(scenes._FORMS), size=k, replace=False):   # noqa: SLF001 — the loader's captions
        rows.append(dict(path=path, caption=scenes.caption(desc, int(form), rng),
                         label=desc["objects"][0]["colour"], split=split))
  train = [r for r in rows if r["split"] == "train"]
  noisy = make_noisy_index(np.arange(len(train)), NOISE, seed=0)
  captions = [r["caption"] for r in train]
  for j, r in enumerate(train):   # row j keeps its image (and label) and, if chosen, takes another row's caption
    r["caption"] = captions[int(noisy.caption_to_image[j])]
    r["clean"] = int(noisy.caption_to_image[j] == j)
  for r in rows:
    r.setdefault("clean", 1)
  with open(os.path.join(directory, "pairs.csv"), "w") as f:
    f.write("path,caption,label,clean,split\n")
    for r in rows:
      f.write(f"{r['path']},\"{r['caption']}\",{r['label']},{r['clean']},{r['split']}\n")
  with open(os.path.join(directory, "names.txt"), "w") as f:
    f.write("\n".join(scenes.CLASS_NAMES) + "\n")
  return dict(train=len(train), test=len(rows) - len(train), noisy=int(len(train) - sum(r["clean"] for r in train)))


def build(table: str, data_dir: str) -> None:
  cmd = [sys.executable, "-m", "ncjax.data.build", "--dataset=web_pairs/custom_table", f"--manual_dir={table}",
         f"--data_dir={data_dir}", "--table=pairs.csv", "--separator=,", "--image_column=path",
         "--caption_column=caption", "--label_column=label", f"--class_names={os.path.join(table, 'names.txt')}",
         "--clean_column=clean", "--split_column=split"]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])


def train_runs(out: str, data_dir: str, seeds, only=None) -> None:
  for seed in seeds:
    for name, (config, arg) in RUNS.items():
      if only and name not in only:
        continue
      workdir = os.path.join(out, f"{name}_seed{seed}")
      if os.path.isfile(os.path.join(workdir, "done.json")):
        continue
      t = time.time()
      cmd = [sys.executable, "-m", "ncjax.main", "train", f"--config=configs/{config}.py:{arg}",
             f"--config.input.data_dir={data_dir}", f"--config.seed={seed}", f"--config.input.shuffle_seed={seed}",
             "--config.log.progress=False", "--config.ckpt.keep=1", "--cpu_devices=8", f"--workdir={workdir}"]
      proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
      if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
      final = _final_metrics(workdir)
      notes = [line for line in proc.stderr.splitlines() if "data-derived setting" in line]
      with open(os.path.join(workdir, "done.json"), "w") as f:
        json.dump(dict(results=final, seconds=time.time() - t, notes=notes), f)
      print(f"{name} seed {seed}: {time.time() - t:.0f} s {final}", *notes, sep="\n  ", flush=True)


def _final_metrics(workdir: str) -> dict:
  """The final evaluation's zero-shot top-1, rsum and noise-detection AUC (eval/step_<last>.json)."""
  steps = sorted(int(n[5:-5]) for n in os.listdir(os.path.join(workdir, "eval"))
                 if n.startswith("step_") and n.endswith(".json"))
  with open(os.path.join(workdir, "eval", f"step_{steps[-1]}.json")) as f:
    records = json.load(f)["records"]
  out = {}
  for r in records:
    for key, metric in (("noise_detection", "auc"), ("retrieval", "rsum"), ("zeroshot", "acc1")):
      if r["evaluator"] == key and metric in r["metrics"]:
        out[f"{key}/{metric}"] = float(r["metrics"][metric])
  return out


def report(out: str, seeds) -> list[dict]:
  rows = []
  for name in RUNS:
    runs = []
    for seed in seeds:
      workdir = os.path.join(out, f"{name}_seed{seed}")
      if os.path.isfile(os.path.join(workdir, "done.json")):
        runs.append(_final_metrics(workdir))
    if not runs:
      continue
    row = dict(run=name, seeds=len(runs))
    for key in ("zeroshot/acc1", "retrieval/rsum", "noise_detection/auc"):
      values = np.asarray([r.get(key, np.nan) for r in runs], np.float64)   # (nan: CLIP has no noise AUC here)
      row[key] = (float(np.nanmean(values)), float(np.nanstd(values)))
    rows.append(row)
  print("| run | seeds | zero-shot % | rsum | noise AUC |\n|---|---|---|---|---|")
  for r in rows:
    z, s, a = r["zeroshot/acc1"], r["retrieval/rsum"], r["noise_detection/auc"]
    print(f"| {r['run']} | {r['seeds']} | {100 * z[0]:.1f} ± {100 * z[1]:.1f} | {s[0]:.1f} ± {s[1]:.1f} | "
          f"{a[0]:.3f} ± {a[1]:.3f} |")
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--out", required=True)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--only", default="")
  p.add_argument("--report", action="store_true")
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  table, data_dir = os.path.join(args.out, "table"), os.path.join(args.out, "tfds")
  if not args.report:
    if not os.path.isfile(os.path.join(table, "pairs.csv")):
      print("exported", export(table), flush=True)
    if not os.path.isdir(data_dir):
      build(table, data_dir)
    train_runs(args.out, data_dir, seeds, [x for x in args.only.split(",") if x])
  report(args.out, seeds)
  return 0


if __name__ == "__main__":
  sys.exit(main())
