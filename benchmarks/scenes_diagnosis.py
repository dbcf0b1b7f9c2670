"""Why the methods help little on the embedded `scenes` (issue 36): per-epoch curves of what each method detects and
what the model memorises, on scenes at 40% caption noise, in NC-bench's budget (tiny_scenes, batch 256, 7 steps an
epoch) — and the Bayesian CL experiment (its weight options against CLIP).

Runs (each seed; checkpoints at every epoch's end, every one kept):
  clip60       CLIP on the noisy pairs, 60 epochs
  gsc60        GSC's scenes preset, 60 epochs (label updates from epoch 30: warmup = epochs // 2, the preset's)
  gsc60_w0     the same with the public code's warmup = 0 (label updates from the end of epoch 0)
  oracle60     CLIP on the clean 60% only (`train_on=clean`: the noise known), the same 420 steps: what a perfect
               filter reaches here (NC-bench's `oracle` row)
  ncu_from20   NCU (its scenes preset: 12 prompt + 16 unlearning epochs) from clip60's epoch-20 checkpoint
  ncu_from60   NCU from clip60's last checkpoint
  bayes_*      Bayesian CL, 20 epochs, weights 'unit_prior' / 'prior' (Ga(a, a), ignoring s) / 'paper' with a fixed
               temperature of 1 and of 0.07; clip20 beside them
Curves, from the checkpoints (analyse): the noise-detection AUC (clean pairs ranked above noisy ones) of CLIP's own
cosine of each training pair (eval mode), of GSC's y_CM ('pred'), S_IM ('topo') and labels y, and of the GMM's
posterior refitted on each epoch's normalised S_IM (its two components' means, spreads and weights); NCU's
confidence AUC and the precision of its forget set; memorisation — the share of noisy training captions whose own
(wrong) image is their nearest training image; the held-out rsum and zero-shot accuracy every 10 epochs. For Bayesian
CL, the share of the positive pull, sum(1 - p+) over noisy pairs / over all (p+ the weighted softmax probability of
the positive, recorded by the method at each pair's last step), and its clean score's AUC, recorded and recomputed
from the final model in eval mode (both directions, 8 draws).

  .venv/bin/python -m benchmarks.scenes_diagnosis --out=/tmp/scenes_diag [--seeds=0,1,2] [--only=clip60,gsc60]
  .venv/bin/python -m benchmarks.scenes_diagnosis --out=/tmp/scenes_diag --analyse     # curves, tables, plots
  .venv/bin/python -m benchmarks.scenes_diagnosis --out=/tmp/scenes_diag --report      # tables and plots again
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SPE = 2000 // 256   # 7 steps an epoch

RUNS = {
    "clip60": ("clip", "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=60", {}),
    "gsc60": ("gsc", "data=scenes,noise=0.4,batch=256,epochs=60", {}),
    "gsc60_w0": ("gsc", "data=scenes,noise=0.4,batch=256,epochs=60,warmup=0", {}),
    "oracle60": ("clip", "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=60,train_on=clean", {}),
    "ncu_from20": ("ncu", "data=scenes,noise=0.4", {"init": ("clip60", 20)}),
    "ncu_from60": ("ncu", "data=scenes,noise=0.4", {"init": ("clip60", 60)}),
    "clip20": ("clip", "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=20", {}),
    "bayes_unit_prior": ("bayes", "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=20,weights=unit_prior",
                         {}),
    "bayes_prior": ("bayes", "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=20,weights=prior", {}),
    "bayes_paper_tau1": ("bayes", "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=20,weights=paper,tau=1",
                         {}),
    "bayes_paper_tau007": ("bayes",
                           "data=scenes,model=tiny_scenes,noise=0.4,batch=256,epochs=20,weights=paper,tau=0.07", {}),
}


def _config(name: str, seed: int, out: str):
  from ncjax import config_lib
  config_name, arg, extra = RUNS[name]
  if "init" in extra:
    run, epoch = extra["init"]
    arg += f",init={os.path.join(out, f'{run}_seed{seed}', 'checkpoints', str(epoch * SPE))}"
  cfg = config_lib.load_config_file(config_name, arg)
  with cfg.unlocked():
    cfg.seed = cfg.noise.seed = cfg.input.shuffle_seed = seed
    cfg.log.progress = False
    cfg.ckpt.every_steps = SPE
    cfg.ckpt.keep = 0
    cfg.ckpt.async_save = False
    config_lib.add_default_evals(cfg)
    cfg.evals.noise_detection.every_steps = SPE
    cfg.evals.retrieval.every_steps = 10 * SPE
    cfg.evals.zeroshot.every_steps = 10 * SPE
  return cfg


def train_runs(out: str, seeds, only=None) -> None:
  from ncjax import evaluation, train
  for seed in seeds:
    for name in RUNS:
      if only and name not in only:
        continue
      workdir = os.path.join(out, f"{name}_seed{seed}")
      if os.path.isfile(os.path.join(workdir, "done.json")):
        continue
      cfg = _config(name, seed, out)
      t = time.time()
      trainer = train.Trainer(cfg, workdir)
      result = trainer.run(evaluate=evaluation.periodic_hook(cfg, trainer))
      final = evaluation.final(cfg, result, workdir)
      with open(os.path.join(workdir, "done.json"), "w") as f:
        json.dump(dict(results=final, seconds=time.time() - t), f)
      print(f"{name} seed {seed}: {time.time() - t:.0f} s", {k: {m: round(v, 4) for m, v in r.items()
                                                                 if isinstance(v, float) and m in (
                                                                     "acc1", "rsum", "auc")} for k, r in final.items()},
            flush=True)


# ---------------------------------------------------------------------------------------------------------------
# analysis, from the checkpoints
# ---------------------------------------------------------------------------------------------------------------
def _auc(clean, score) -> float:
  from sklearn.metrics import roc_auc_score
  return float(roc_auc_score(np.asarray(clean, bool), np.asarray(score, np.float64)))


def _steps(workdir: str) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _training_pairs(workdir: str):
  """(the run's noisy training pairs as its config rebuilds them, its tokenizer, its resolved config)."""
  from ncjax import evaluation
  from ncjax.data.pipeline import training_pairs
  _, _, resolved, _, tokenizer, _ = evaluation.restore_for_eval(workdir, _steps(workdir)[-1])
  pairs = training_pairs(resolved.input, resolved.noise, image_size=resolved.model.image_size)
  return pairs, tokenizer, resolved


def _embed_pairs(workdir: str, step: int, pairs, tokenizer):
  import jax
  from ncjax import evaluation
  method, state, resolved, _, _, _ = evaluation.restore_for_eval(workdir, step)
  em = method.eval_model(state["params"], state.get("method_state"))
  images = np.asarray(pairs.images()[np.arange(pairs.split.num_images)])
  img = np.asarray(jax.jit(em.encode_image)(images))
  txt = np.asarray(jax.jit(em.encode_text)(np.asarray(pairs.token_ids(tokenizer))))
  return img, txt, state, em


def _memorised(img, txt, caption_to_image, clean) -> float:
  """The share of noisy captions whose paired (wrong) image is their nearest training image."""
  sim = txt @ img.T
  nearest = sim.argmax(axis=1)
  noisy = ~np.asarray(clean, bool)
  return float(np.mean(nearest[noisy] == caption_to_image[noisy]))


def _gmm_stats(topo, valid):
  """GSC's label-update GMM (the public code's sklearn settings) refitted on the min-max normalised S_IM of the valid
  examples: its components' means, standard deviations and weights (low-mean component first), and the posterior
  of the larger-mean one."""
  from sklearn.mixture import GaussianMixture
  x = np.asarray(topo, np.float64)[valid]
  x = (x - x.min()) / max(x.max() - x.min(), 1e-12)
  g = GaussianMixture(2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=0).fit(x.reshape(-1, 1))
  order = np.argsort(g.means_.ravel())
  post = g.predict_proba(x.reshape(-1, 1))[:, order[1]]
  return dict(means=g.means_.ravel()[order].tolist(), stds=np.sqrt(g.covariances_.ravel())[order].tolist(),
              weights=g.weights_[order].tolist()), post


def analyse_run(workdir: str, every: int = 1) -> dict:
  """The curves of one run, from every `every`-th epoch's checkpoint (and the last)."""
  pairs, tokenizer, resolved = _training_pairs(workdir)
  clean = np.asarray(pairs.clean, bool)
  n = len(clean)
  method = resolved.config.method.name
  rows = []
  steps = _steps(workdir)
  for step in steps:
    if step != steps[-1] and (step // SPE) % every:
      continue
    img, txt, state, em = _embed_pairs(workdir, step, pairs, tokenizer)
    c2i = np.asarray(pairs.caption_to_image)
    cosine = np.sum(img[c2i] * txt, axis=1) if img.ndim == 2 else None
    row = dict(step=step, epoch=step / SPE)
    if cosine is not None:
      row["auc_cosine"] = _auc(clean, cosine)
      row["memorised_noisy"] = _memorised(img, txt, c2i, clean)
    ms = state.get("method_state") or {}
    if method == "gsc":
      st = ms["model"]
      for key in ("pred", "topo", "y", "pred_target", "topo_target"):
        v = np.asarray(st[key])[:n]
        row[f"auc_{key}"] = _auc(clean, v) if np.std(v) > 0 else 0.5
        row[f"mean_{key}_clean"], row[f"mean_{key}_noisy"] = float(v[clean].mean()), float(v[~clean].mean())
      gm, post = _gmm_stats(np.asarray(st["topo"])[:n], np.ones(n, bool))
      row.update(gmm=gm, auc_gmm_posterior=_auc(clean, post))
    elif method == "bayes":
      p = np.asarray(ms["p_pos"])[:n]
      row["auc_p_pos_recorded"] = _auc(clean, p)
      pull = 1.0 - p
      row["pull_share_noisy"] = float(pull[~clean].sum() / max(pull.sum(), 1e-12))
    elif method in ("ncu", "ncu_ga"):
      keys = {k: np.asarray(v)[:n] for k, v in ms.items() if np.ndim(v) == 1 and np.shape(v)[0] >= n}
      for k, v in keys.items():
        if v.dtype == bool or set(np.unique(v)) <= {0, 1}:
          flag = v.astype(bool)
          row[f"{k}_count"] = int(flag.sum())
          row[f"{k}_precision_noisy"] = float((~clean[flag]).mean()) if flag.any() else float("nan")
        elif np.std(v) > 0:
          row[f"auc_{k}"] = _auc(clean, v)
    if method in ("clip", "bayes"):   # CLIP's positive pull in eval mode, batches of 256 of the training pairs
      row["pull_share_noisy_eval"] = _pull_share_eval(img, txt, c2i, clean, resolved)
    rows.append(row)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals_rows = [r for r in map(json.loads, f) if r.get("kind") == "eval"]
  held_out = [dict(step=r["step"], epoch=r["step"] / SPE, **{k: r[k] for k in r if k.startswith(
      ("retrieval/rsum", "zeroshot/acc1", "noise_detection/auc"))}) for r in evals_rows]
  out = dict(workdir=workdir, method=method, curves=rows, held_out=held_out)
  if method == "bayes":
    out["eval_mode_auc"] = _bayes_eval_auc(workdir, pairs, tokenizer, clean)
  return out


def _pull_share_eval(img, txt, c2i, clean, resolved, batch: int = 256) -> float:
  """sum(1 - p+) over noisy pairs / over all, p+ the (unweighted) softmax probability of each pair's positive in a
  fixed partition of the training pairs into batches of 256, both directions averaged."""
  scale = np.exp(float(np.log(1 / 0.07)))
  rng = np.random.default_rng(0)
  order = rng.permutation(len(c2i))
  pull = np.zeros(len(c2i))
  for k in range(0, len(order) - batch + 1, batch):
    idx = order[k:k + batch]
    logits = scale * img[c2i[idx]] @ txt[idx].T
    p_i2t = np.exp(np.diag(logits) - np.log(np.exp(logits).sum(axis=1)))
    p_t2i = np.exp(np.diag(logits) - np.log(np.exp(logits).sum(axis=0)))
    pull[idx] = 1 - (p_i2t + p_t2i) / 2
  seen = pull > 0
  return float(pull[seen & ~clean].sum() / max(pull[seen].sum(), 1e-12))


def _bayes_eval_auc(workdir: str, pairs, tokenizer, clean, draws: int = 8, batch: int = 256) -> dict:
  """Bayesian CL's clean score from the final model in eval mode: p+ of each training pair in fixed batches of 256,
  both directions, averaged over `draws` Gibbs draws — beside the recorded one (each pair's last training step)."""
  import jax
  import jax.numpy as jnp
  from ncjax.losses import bayes as bayes_loss
  from ncjax.methods.bayes import sample_weights
  step = _steps(workdir)[-1]
  img, txt, state, em = _embed_pairs(workdir, step, pairs, tokenizer)
  method_options = _method_options(workdir)
  c2i = np.asarray(pairs.caption_to_image)
  tau = method_options.tau
  scale = 1.0 / tau if tau else float(np.exp(np.asarray(state["params"]["model"]["logit_scale"])))

  @jax.jit   # one program: run eagerly, the Gibbs sampler's loops compiled anew at every call and each executable's
  def p_pos(key, lg):   # code stayed mapped until the process ran out of memory maps (LLVM: cannot allocate)
    _, wp, wn = sample_weights(key, lg, method_options)
    return bayes_loss.effective_positive_probability(lg, wp, wn)

  order = np.random.default_rng(0).permutation(len(c2i))
  score = np.zeros(len(c2i))
  for k in range(0, len(order) - batch + 1, batch):
    idx = order[k:k + batch]
    logits = jnp.asarray(scale * img[c2i[idx]] @ txt[idx].T, jnp.float32)
    acc = np.zeros(len(idx))
    for d in range(draws):
      key = jax.random.PRNGKey(1000 * k + d)
      for direction, lg in enumerate((logits, logits.T)):
        acc += np.asarray(p_pos(jax.random.fold_in(key, direction), lg))
    score[idx] = acc / (2 * draws)
  seen = score > 0
  recorded = np.asarray(state["method_state"]["p_pos"])[:len(clean)]
  return dict(eval_mode=_auc(clean[seen], score[seen]), recorded=_auc(clean, recorded))


def _method_options(workdir: str):
  from ncjax import evaluation
  _, _, resolved, _, _, _ = evaluation.restore_for_eval(workdir, _steps(workdir)[-1])
  return resolved.options


def analyse(out: str, only: set[str] = frozenset(), every: int = 1) -> dict:
  """Every finished run's curves (those of `only`'s runs when given), cached per run."""
  results = {}
  for name in sorted(os.listdir(out)):
    workdir = os.path.join(out, name)
    if not os.path.isfile(os.path.join(workdir, "done.json")) or (only and name.rsplit("_seed", 1)[0] not in only):
      continue
    cached = os.path.join(workdir, "analysis.json")   # a run is analysed once (delete the file to redo it)
    if os.path.isfile(cached):
      with open(cached) as f:
        results[name] = json.load(f)
      continue
    t = time.time()
    results[name] = analyse_run(workdir, every)
    with open(os.path.join(workdir, "done.json")) as f:
      results[name]["final"] = json.load(f)["results"]
    with open(cached, "w") as f:
      json.dump(results[name], f, indent=1, default=float)
    print(f"analysed {name} ({time.time() - t:.0f} s)", flush=True)
  with open(os.path.join(out, "diagnosis.json"), "w") as f:
    json.dump(results, f, indent=1, default=float)
  return results


# ---------------------------------------------------------------------------------------------------------------
# report: tables and figures over seeds
# ---------------------------------------------------------------------------------------------------------------
def _by_run(results: dict) -> dict[str, list[dict]]:
  runs: dict[str, list[dict]] = {}
  for name, r in sorted(results.items()):
    runs.setdefault(name.rsplit("_seed", 1)[0], []).append(r)
  return runs


def _mean_std(values) -> str:
  v = np.asarray([x for x in values if x is not None], np.float64)
  if not len(v):
    return "-"
  return f"{v.mean():.3f} ± {v.std():.3f}" if abs(v.mean()) < 10 else f"{v.mean():.1f} ± {v.std():.1f}"


def _final(r: dict, evaluator: str, key: str):
  return r["final"].get(evaluator, {}).get(key)


def _curve(r: dict, key: str):
  pts = [(row["epoch"], row[key]) for row in r["curves"] if key in row]
  return np.asarray(pts, np.float64).reshape(-1, 2)


def report(out: str) -> str:
  """docs-ready markdown (tables over seeds) and scenes_curves.png / scenes_bayes.png beside diagnosis.json."""
  with open(os.path.join(out, "diagnosis.json")) as f:
    runs = _by_run(json.load(f))
  lines = ["| run | seeds | rsum | zero-shot acc1 | noise AUC (final model) | memorised noisy (final) |",
           "|---|---|---|---|---|---|"]
  for name, rs in runs.items():
    mem = [(r["curves"][-1].get("memorised_noisy") if r["curves"] else None) for r in rs]
    lines.append(f"| {name} | {len(rs)} | {_mean_std(_final(r, 'retrieval', 'rsum') for r in rs)} | "
                 f"{_mean_std(_final(r, 'zeroshot', 'acc1') for r in rs)} | "
                 f"{_mean_std(_final(r, 'noise_detection', 'auc') for r in rs)} | {_mean_std(mem)} |")
  peaks = []
  for name in ("clip60", "clip20", "gsc60", "gsc60_w0"):
    for r in runs.get(name, []):
      c = _curve(r, "auc_cosine")
      if len(c):
        k = int(np.argmax(c[:, 1]))
        peaks.append((name, c[k, 0], c[k, 1], c[-1, 1]))
  if peaks:
    lines += ["", "| run | epoch of peak cosine AUC | peak | last |", "|---|---|---|---|"]
    lines += [f"| {n} | {e:.0f} | {p:.3f} | {last:.3f} |" for n, e, p, last in peaks]
  bayes = {k: v for k, v in runs.items() if k.startswith("bayes_")}
  if bayes:
    lines += ["", "| Bayesian CL weights | rsum | acc1 | AUC of p+ (recorded) | AUC of p+ (eval mode, 8 draws) | "
              "noisy share of the positive pull |", "|---|---|---|---|---|---|"]
    for name, rs in {**bayes, "clip20": runs.get("clip20", [])}.items():
      rec = [r.get("eval_mode_auc", {}).get("recorded") for r in rs]
      ev = [r.get("eval_mode_auc", {}).get("eval_mode") for r in rs]
      pull = [r["curves"][-1].get("pull_share_noisy", r["curves"][-1].get("pull_share_noisy_eval"))
              for r in rs if r["curves"]]
      lines.append(f"| {name} | {_mean_std(_final(r, 'retrieval', 'rsum') for r in rs)} | "
                   f"{_mean_std(_final(r, 'zeroshot', 'acc1') for r in rs)} | {_mean_std(rec)} | {_mean_std(ev)} | "
                   f"{_mean_std(pull)} |")
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out, "tables.md"), "w") as f:
    f.write(text)
  _figures(out, runs)
  return text


def _figures(out: str, runs: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  styles = dict(clip60=("CLIP", "tab:gray"), gsc60=("GSC preset (labels from epoch 30)", "tab:red"),
                gsc60_w0=("GSC, warm-up 0 (public code)", "tab:blue"))
  for name, (label, color) in styles.items():
    for k, r in enumerate(runs.get(name, [])):
      c = _curve(r, "auc_cosine")
      axes[0].plot(c[:, 0], c[:, 1], color=color, alpha=0.8, label=label if k == 0 else None)
      m = _curve(r, "memorised_noisy")
      axes[1].plot(m[:, 0], m[:, 1], color=color, alpha=0.8, label=label if k == 0 else None)
      if name != "clip60":
        y = _curve(r, "auc_y")
        axes[0].plot(y[:, 0], y[:, 1], color=color, ls=":", alpha=0.8, label=f"{label}: labels y" if k == 0 else None)
      h = np.asarray([(row["epoch"], row.get("retrieval/rsum", np.nan)) for row in r["held_out"]
                      if "retrieval/rsum" in row], np.float64).reshape(-1, 2)
      axes[2].plot(h[:, 0], h[:, 1], color=color, marker="o", alpha=0.8, label=label if k == 0 else None)
  axes[0].set(title="noise detection on the training pairs", xlabel="epoch", ylabel="AUC (clean above noisy)")
  axes[1].set(title="memorisation", xlabel="epoch", ylabel="noisy captions nearest their wrong image")
  axes[2].set(title="held-out retrieval", xlabel="epoch", ylabel="rsum")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("scenes, 40% caption noise, tiny_scenes, batch 256 (7 steps an epoch)")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "scenes_curves.png"), dpi=110)
  plt.close(fig)


def training_curves(out: str, runs=("clip60", "gsc60", "gsc60_w0", "ncu_from20", "ncu_from60")) -> str:
  """scenes_training_curves.png from the runs' own metrics.jsonl (no checkpoint is read): the noise-detection AUC of
  each method's clean score on the training pairs every epoch (CLIP: its cosine; GSC: its labels; NCU: its
  unlearned model's cosine), and the held-out rsum every 10 epochs; seeds drawn thin, their mean thick."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  for k, run in enumerate(runs):
    series = []
    for name in sorted(os.listdir(out)):
      if name.rsplit("_seed", 1)[0] != run or not os.path.isfile(os.path.join(out, name, "done.json")):
        continue
      with open(os.path.join(out, name, "metrics.jsonl")) as f:
        ev = [r for r in map(json.loads, f) if r.get("kind") == "eval"]
      series.append(ev)
    for ax, key in zip(axes, ("noise_detection/auc", "retrieval/rsum")):
      curves = [np.asarray([(r["step"] / SPE, r[key]) for r in ev if key in r]) for ev in series]
      curves = [c for c in curves if len(c)]
      for c in curves:
        ax.plot(c[:, 0], c[:, 1], color=f"C{k}", alpha=0.3, lw=0.8)
      if curves:
        m = min(len(c) for c in curves)
        mean = np.mean([c[:m, 1] for c in curves], axis=0)
        ax.plot(curves[0][:m, 0], mean, color=f"C{k}", lw=2, label=f"{run} ({len(curves)} seed(s))")
  axes[0].set(xlabel="epoch", ylabel="noise AUC on the training pairs", ylim=(0.45, 1.0))
  axes[1].set(xlabel="epoch", ylabel="held-out rsum")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("scenes, 40% caption noise (tiny_scenes, batch 256, 7 steps an epoch)")
  fig.tight_layout()
  path = os.path.join(out, "scenes_training_curves.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--seeds", default="0")
  p.add_argument("--only", default="")
  p.add_argument("--analyse", action="store_true")
  p.add_argument("--every", type=int, default=1, help="analyse: every N-th epoch's checkpoint (and the last)")
  p.add_argument("--report", action="store_true", help="tables.md and the figures from diagnosis.json")
  p.add_argument("--curves", action="store_true", help="scenes_training_curves.png from the runs' metrics.jsonl")
  args = p.parse_args(argv)
  from ncjax import runtime
  runtime.configure_cpu_devices(8)
  import absl.logging
  absl.logging.set_verbosity(absl.logging.WARNING)
  if args.curves:
    print(training_curves(args.out))
  elif args.report:
    print(report(args.out))
  elif args.analyse:
    analyse(args.out, set(filter(None, args.only.split(","))), args.every)
    print(report(args.out))
  else:
    train_runs(args.out, [int(s) for s in args.seeds.split(",")], set(filter(None, args.only.split(","))))
  return 0


if __name__ == "__main__":
  sys.exit(main())
