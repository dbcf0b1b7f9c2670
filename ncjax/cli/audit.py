"""`ncjax audit`: which of my pairs are noisy? Every pair of a dataset scored by a trained run or a pretrained model,
ranked by suspicion, with a report to look at.

  ncjax audit --checkpoint=WORKDIR[:STEP] --output=DIR           (by default the pairs the run trained on)
  ncjax audit --checkpoint=WORKDIR --dataset=table:/data/mine.csv --split=train --output=DIR
  ncjax audit --init=open_clip:PATH --config=clip:data=table:/data/mine.csv --output=DIR

A pair's score is higher for a cleaner pair: the run's own per-sample clean scores (`method.eval_model(params,
state).clean_scores`: GSC's labels, Bayesian CL's weights, NCU's selection scores) when it keeps them and the pairs
are the ones it trained on, else the model's similarity of the pair (cosine for CLIP, the Lorentzian inner product
for MERU, the learned score of a region model). `--score=similarity|method` forces one.

Writes DIR/audit.csv (every pair, most suspicious first: rank, id, score, image, caption and — where the ground truth
is known, injected noise or a table's clean column — `clean`), DIR/scores.png (the score histogram, clean and noisy
apart when known), DIR/roc.png (when clean flags exist) and DIR/index.html: the most suspicious pairs as image
thumbnails (DIR/thumbs/) beside their captions, the score distribution and the ROC curve. On several processes every
process scores (the embeddings and per-sample state are gathered by ncjax.evals.common) and process 0 writes.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json

import jax
import numpy as np

from ncjax import config_lib, evaluation, fileio
from ncjax import data as data_lib
from ncjax.data.pipeline import TrainingPairs, clean_flags, training_pairs
from ncjax.evals import common, noise as noise_eval

SCORE_KINDS = ("auto", "similarity", "method")
THUMB = 96   # thumbnail side in pixels (small images are enlarged by an integer factor)


@dataclasses.dataclass
class AuditResult:
  scores: np.ndarray            # (N,) higher = cleaner, by pair id
  order: np.ndarray             # ids, most suspicious first
  clean: np.ndarray | None      # ground-truth clean flags where known
  score_kind: str               # 'similarity' or 'method:<name>'
  pairs: TrainingPairs
  info: dict

  def top_noisy_fraction(self, k: int = 100) -> float | None:
    """The fraction of truly noisy pairs among the k most suspicious (None without ground truth)."""
    if self.clean is None:
      return None
    top = self.order[:k]
    return float(np.mean(~self.clean[top])) if len(top) else float("nan")

  def auc(self) -> float | None:
    if self.clean is None:
      return None
    return noise_eval.roc_auc(self.scores, self.clean)


def _pairs_of_dataset(spec, dataset: str, split: str, data_dir: str, image_size: int) -> TrainingPairs:
  """Another dataset's pairs as they are (no injected noise); its own clean column, where it has one, is the truth."""
  s = data_lib.load_split(spec.on(dataset, data_dir), split, image_size)
  return TrainingPairs(s, s.caption_to_image, clean_flags(s, None), None, image_size, spec.normalization)


def _truth_known(pairs: TrainingPairs) -> bool:
  return pairs.noise_sha256 is not None or pairs.split.pair_clean is not None


def score_pairs(*, checkpoint: str = "", step: int | None = None, init: str = "", config=None, dataset: str = "",
                split: str = "", data_dir: str = "", score: str = "auto") -> AuditResult:
  """Restore the model, build the pairs and score every one (collective on several processes)."""
  if score not in SCORE_KINDS:
    raise ValueError(f"--score must be one of {SCORE_KINDS}, got {score!r}")
  if bool(checkpoint) == bool(init):
    raise ValueError("audit needs --checkpoint=WORKDIR[:STEP] or --init=SPEC (one of them)")
  if checkpoint:
    if step is None:
      step = evaluation.latest_step(checkpoint)
    method, state, resolved, _meta, tokenizer, mesh = evaluation.restore_for_eval(checkpoint, step)
    own_data = not dataset
    info = dict(checkpoint=fileio.absolute(checkpoint), step=int(step), method=method.name)
  else:
    config = config if config is not None else config_lib.load_config_file("clip")
    method, state, resolved, tokenizer, mesh = evaluation.restore_pretrained(config, init)
    own_data = False
    info = dict(init=init, method=method.name)
  image_size = resolved.model.image_size
  if dataset:
    pairs = _pairs_of_dataset(resolved.input, dataset, split or "train", data_dir, image_size)
  else:
    spec = dataclasses.replace(resolved.input, split=split or resolved.input.split,
                               data_dir=data_dir or resolved.input.data_dir)
    own_data = own_data and not split
    pairs = training_pairs(spec, resolved.noise, image_size=image_size)
  eval_model = method.eval_model(state["params"], state.get("method_state") or None)
  n = pairs.num_examples
  kind = score
  if score == "auto":
    kind = "method" if eval_model.clean_scores is not None and own_data else "similarity"
  if kind == "method":
    if eval_model.clean_scores is None:
      raise ValueError(f"--score=method: {method.name} keeps no per-sample clean scores; use --score=similarity")
    if not own_data:
      raise ValueError("--score=method scores the run's own training pairs only (its per-sample state is indexed by "
                       "their ids); drop --dataset/--split or use --score=similarity")
    scores = common.host_values(eval_model.clean_scores[0])[:n].astype(np.float64)
    kind = f"method:{method.name}"
  else:
    scores = noise_eval.pair_scores(eval_model, pairs, tokenizer, resolved.input.eval_batch_size,
                                    mesh).astype(np.float64)
  order = np.argsort(scores, kind="stable")          # lowest score = most suspicious; ties: lower id first
  clean = np.asarray(pairs.clean, bool) if _truth_known(pairs) else None
  info.update(dataset=pairs.split.name, pairs=int(n), score=kind, noise_sha256=pairs.noise_sha256)
  return AuditResult(scores=scores, order=order, clean=clean, score_kind=kind, pairs=pairs, info=info)


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------
def _image_ref(pairs: TrainingPairs, image: int) -> str:
  paths = getattr(pairs.split.images, "paths", None)
  return str(paths[image]) if paths is not None else str(image)


def thumbnail(pairs: TrainingPairs, image: int):
  """A PIL thumbnail of one image of the pairs (None for region features): encoded images decoded; model-ready float
  arrays (the embedded datasets) stretched to their own range; small images enlarged by an integer factor."""
  from PIL import Image
  images = pairs.split.images
  if isinstance(images, np.ndarray):
    arr = np.asarray(images[image], np.float32)
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3):
      return None
    lo, hi = float(arr.min()), float(arr.max())
    arr = (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)
    im = Image.fromarray((arr * 255).round().astype(np.uint8).squeeze())
  elif getattr(images, "kind", "encoded") == "encoded":
    with Image.open(io.BytesIO(images.raw(image))) as f:
      im = f.convert("RGB")
  else:
    return None
  return fit_thumbnail(im.convert("RGB"))


def fit_thumbnail(im):
  """A PIL image as a thumbnail of at most THUMB px: small images enlarged by an integer factor (pixels kept
  sharp), larger ones shrunk."""
  from PIL import Image
  w, h = im.size
  if max(w, h) < THUMB:
    factor = max(1, THUMB // max(w, h))
    return im.resize((w * factor, h * factor), Image.NEAREST)
  im.thumbnail((THUMB, THUMB), Image.BICUBIC)
  return im


def _plots(result: AuditResult, out: str) -> dict[str, str]:
  from ncjax.evals.plots import _pyplot
  plt = _pyplot()
  files = {}
  fig, ax = plt.subplots(figsize=(6, 3.6))
  bins = np.histogram_bin_edges(result.scores, bins=40)
  if result.clean is not None:
    ax.hist(result.scores[result.clean], bins=bins, alpha=0.6, label=f"clean ({int(result.clean.sum())})")
    ax.hist(result.scores[~result.clean], bins=bins, alpha=0.6, label=f"noisy ({int((~result.clean).sum())})")
    ax.legend()
  else:
    ax.hist(result.scores, bins=bins, alpha=0.8)
  ax.set_xlabel(f"score ({result.score_kind}; higher = cleaner)")
  ax.set_ylabel("pairs")
  ax.set_title(f"{result.info['dataset']}: {len(result.scores)} pairs")
  fig.tight_layout()
  fileio.save_figure(fig, fileio.join(out, "scores.png"), dpi=110)
  plt.close(fig)
  files["scores"] = "scores.png"
  if result.clean is not None and result.clean.any() and (~result.clean).any():
    from sklearn.metrics import roc_curve
    fpr, tpr, _ = roc_curve(result.clean, result.scores)
    files["roc"] = save_roc(out, fpr, tpr, result.auc())
  return files


def save_roc(out: str, fpr, tpr, auc: float) -> str:
  """OUT/roc.png: the score as a clean-vs-noisy detector (both audits' reports)."""
  from ncjax.evals.plots import _pyplot
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(4.2, 4.2))
  ax.plot(fpr, tpr, label=f"AUC {auc:.3f}")
  ax.plot([0, 1], [0, 1], "k--", lw=0.8)
  ax.set_xlabel("noisy pairs called clean (FPR)")
  ax.set_ylabel("clean pairs called clean (TPR)")
  ax.set_title("clean vs noisy by score")
  ax.legend(loc="lower right")
  fig.tight_layout()
  fileio.save_figure(fig, fileio.join(out, "roc.png"), dpi=110)
  plt.close(fig)
  return "roc.png"


_STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
table.facts td { padding: 2px 12px 2px 0; }
.pairs { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 10px; }
.pair { display: flex; align-items: center; gap: 12px; border: 1px solid #ddd; border-radius: 6px; padding: 8px; }
.rank { width: 40px; color: #666; font-size: 13px; }
img.thumb { display: block; flex: none; image-rendering: pixelated; }
.nothumb { width: %dpx; color: #888; font-size: 12px; }
.caption { font-size: 14px; }
.meta { color: #777; font-size: 11px; margin-top: 4px; }
.flag { padding: 1px 6px; border-radius: 4px; font-size: 11px; color: #222; }
.flag.clean { background: #d8f0d8; } .flag.noisy { background: #f6d5d5; }
figure { display: inline-block; vertical-align: top; margin: 0 24px 12px 0; }
img.plot { height: 300px; }
figcaption { color: #666; font-size: 12px; max-width: 420px; }
""" % THUMB


def pair_cell(out: str, name: str, rank: int, thumb, alt: str, no_image: str, caption: str, score: float,
              clean: bool | None, where: str) -> str:
  """One pair of an audit page: its thumbnail written to OUT/`name` (when there is one), the caption, the score, the
  clean/noisy flag where the truth is known and where the pair lives."""
  if thumb is not None:
    b = io.BytesIO()
    thumb.save(b, format="PNG")
    fileio.write_bytes(fileio.join(out, name), b.getvalue())
    picture = (f'<img class="thumb" src="{name}" width="{thumb.size[0]}" height="{thumb.size[1]}" '
               f'alt="{html.escape(alt)}">')
  else:
    picture = f'<div class="nothumb">{html.escape(no_image)}</div>'
  flag = {True: '<span class="flag clean">clean</span>', False: '<span class="flag noisy">noisy</span>'}.get(clean, "")
  return (f'<div class="pair"><div class="rank">#{rank}</div>{picture}<div class="text">'
          f'<div class="caption">{html.escape(caption)}</div>'
          f'<div class="meta">score {score:.4g} {flag}</div>'
          f'<div class="meta">{html.escape(where)}</div></div></div>')


def report_page(title: str, facts: list[tuple[str, str]], files: dict[str, str], legends: dict[str, str],
                intro: str, sections: list[tuple[str, str]], tail: str = "") -> str:
  """An audit's index.html (embedded and web data alike): the facts, the score plots (`files`: name -> file, each
  with its legend), then each (heading, HTML of pair cells) section as a grid of pairs."""
  figures = "".join(f'<figure><img class="plot" src="{f}" alt="{k}"><figcaption>{legends[k]}</figcaption></figure>'
                    for k, f in files.items())
  rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
  body = "".join(f'<h2>{html.escape(heading)}</h2>\n<div class="pairs">\n{cells}\n</div>\n'
                 for heading, cells in sections)
  return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
          f'<style>{_STYLE}</style></head><body>\n<h1>Which pairs are noisy?</h1>\n'
          f'<table class="facts">{rows}</table>\n'
          f'{intro}\n<h2>Score distribution</h2>\n{figures}\n{body}{tail}</body></html>\n')


def write_report(result: AuditResult, out: str, top: int = 100) -> dict[str, str]:
  """audit.csv, scores.png, roc.png (with ground truth), thumbs/*.png and index.html under `out` (local or gs://)."""
  pairs = result.pairs
  c2i = np.asarray(pairs.caption_to_image)
  captions = pairs.split.captions
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(["rank", "id", "score", "image", "caption"] + (["clean"] if result.clean is not None else []))
  for rank, i in enumerate(result.order, 1):
    row = [rank, int(i), f"{result.scores[i]:.6g}", _image_ref(pairs, int(c2i[i])), captions[i]]
    if result.clean is not None:
      row.append(int(result.clean[i]))
    w.writerow(row)
  fileio.write_text(fileio.join(out, "audit.csv"), buf.getvalue())
  files = _plots(result, out)
  shown = result.order[:top]
  cells = []
  for rank, i in enumerate(shown, 1):
    image = int(c2i[i])
    clean = None if result.clean is None else bool(result.clean[i])
    cells.append(pair_cell(out, f"thumbs/{rank:05d}_{int(i)}.png", rank, thumbnail(pairs, image),
                           f"image {image}", "no image (features)", captions[i], float(result.scores[i]), clean,
                           f"pair {int(i)} · image {_image_ref(pairs, image)}"))
  fraction = result.top_noisy_fraction(len(shown))
  facts = [("data", result.info["dataset"]), ("pairs", f"{len(result.scores):,}"),
           ("model", result.info.get("checkpoint", result.info.get("init", "")) +
            (f" (step {result.info['step']})" if "step" in result.info else "")),
           ("method", result.info["method"]), ("score", f"{result.score_kind} (higher = cleaner)")]
  if result.clean is not None:
    facts += [("noisy pairs (ground truth)", f"{int((~result.clean).sum()):,} ({np.mean(~result.clean):.1%})"),
              (f"truly noisy among the {len(shown)} most suspicious", f"{fraction:.1%}"),
              ("ROC-AUC (clean vs noisy)", f"{result.auc():.4f}")]
  legends = dict(scores="scores of every pair (clean and noisy apart where the ground truth is known)",
                 roc="ROC curve: the score as a clean-vs-noisy detector")
  page = report_page(f"ncjax audit: {result.info['dataset']}", facts, files, legends,
                     '<p>Every pair is in <a href="audit.csv">audit.csv</a>, most suspicious first.</p>',
                     [(f"The {len(shown)} most suspicious pairs", "".join(cells))])
  fileio.write_text(fileio.join(out, "index.html"), page)
  summary = dict(result.info, top=len(shown), top_noisy_fraction=fraction, auc=result.auc(),
                 noise_rate=None if result.clean is None else float(np.mean(~result.clean)))
  fileio.write_text(fileio.join(out, "audit.json"), json.dumps(summary, indent=1))
  return dict(csv=fileio.join(out, "audit.csv"), html=fileio.join(out, "index.html"), **{
      k: fileio.join(out, f) for k, f in files.items()})


def run(output: str, *, top: int = 100, **kwargs) -> AuditResult:
  """Score (every process) and write the report (process 0)."""
  result = score_pairs(**kwargs)
  if jax.process_index() == 0:
    files = write_report(result, output, top=top)
    line = f"audit of {result.info['pairs']:,} pairs ({result.score_kind}): {files['html']}, {files['csv']}"
    if result.clean is not None:
      line += (f"; truly noisy among the {min(top, len(result.order))} most suspicious: "
               f"{result.top_noisy_fraction(top):.1%} (noise rate {np.mean(~result.clean):.1%}, AUC "
               f"{result.auc():.4f})")
    print(line, flush=True)
  return result
