"""The report of a web audit, read from its per-shard score files (ncjax.cli.web_audit writes them).

`write_report` (process 0, after every shard is scored): one scan of the score files keeps the `top` lowest
scores, a uniform sample of `sample` pairs (the smallest hashes of their ids: the same whatever the scan order) and
histograms of the scores (2^20 bins of their float32 bit patterns: the AUC against the data's clean flags, exact
up to ties inside a bin, and the score histogram, clean and noisy apart); the pairs shown are fetched with one
ranged read each (their byte range from the score file). Writes OUT/index.html (thumbnails under OUT/thumbs/),
OUT/scores.png, OUT/roc.png (with clean flags), OUT/suspects.csv, OUT/sample.csv and OUT/audit.json.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
import logging

import numpy as np

from ncjax import fileio
from ncjax.cli import audit
from ncjax.data.specs import WebSpec
from ncjax.data.web import dataset as web
from ncjax.data.web import score_files, store, subset

log = logging.getLogger("ncjax")

HIST_SHIFT = 12             # histogram bins: the score's ordered float32 key >> 12 (2^20 bins, ~2^-11 relative)
SAMPLE_SEED = 0x73616D70    # 'samp': the hash that picks the report's random sample


def _hash(ids: np.ndarray) -> np.ndarray:
  """splitmix64 of each id with SAMPLE_SEED: a uniform, order-free choice of the report's sample."""
  with np.errstate(over="ignore"):
    z = np.asarray(ids, np.uint64) + np.uint64(SAMPLE_SEED) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclasses.dataclass
class Summary:
  """What one scan of the score files keeps: bounded by `top` + `sample` rows and three histograms."""
  manifest: dict
  scored: int
  bad: int
  bad_examples: list
  hist: dict                # 'clean' / 'noisy' / 'unknown' -> counts over HIST_SHIFT-binned ordered keys
  suspects: list            # dict rows, lowest score first
  sample: list              # dict rows, in id order

  @property
  def has_truth(self) -> bool:
    return self.hist["clean"].sum() > 0 and self.hist["noisy"].sum() > 0

  def auc(self) -> float | None:
    """P(score of a clean pair > a noisy one's), ties (the same bin) counted half: Mann-Whitney on the histograms."""
    if not self.has_truth:
      return None
    c, n = self.hist["clean"].astype(np.float64), self.hist["noisy"].astype(np.float64)
    below = np.cumsum(n) - n
    return float(((below + n / 2) * c).sum() / (c.sum() * n.sum()))

  def bin_values(self) -> np.ndarray:
    """The score at each histogram bin's lower edge."""
    keys = (np.arange(len(self.hist["clean"]), dtype=np.uint64) << np.uint64(HIST_SHIFT)).astype(np.uint32)
    u = np.where(keys & np.uint32(0x80000000), keys & np.uint32(0x7FFFFFFF), ~keys)
    return u.astype(np.uint32).view(np.float32)


def summarize(out: str, top: int = 100, sample: int = 100) -> Summary:
  manifest = score_files.require_manifest(out)
  bins = 1 << (32 - HIST_SHIFT)
  hist = {k: np.zeros(bins, np.int64) for k in ("clean", "noisy", "unknown")}
  scored = bad = 0
  bad_examples, suspects, picked = [], [], []
  names = {(d, s): name for d, s, name, _, _ in score_files.shards_of(manifest)}
  for d, s, first, n, cols in score_files.scan(out, manifest, score_files.COLUMNS[1:]):
    scores = cols["score"]
    valid = ~np.isnan(scores)
    bad += int((~valid).sum())
    scored += int(valid.sum())
    for i in np.flatnonzero(~valid)[:max(0, 20 - len(bad_examples))]:
      bad_examples.append(dict(id=int(cols["id"][i]), shard=names[d, s], reason=cols["bad"][i]))
    keys = subset.ordered_keys(scores[valid]) >> np.uint32(HIST_SHIFT)
    clean = cols["clean"][valid]
    for label, sel in (("clean", clean == 1), ("noisy", clean == 0), ("unknown", clean < 0)):
      hist[label] += np.bincount(keys[sel], minlength=bins)

    def rows(where):
      return [dict(id=int(cols["id"][i]), key=cols["key"][i], score=float(scores[i]), offset=int(cols["offset"][i]),
                   length=int(cols["length"][i]), clean=int(cols["clean"][i]), dataset=d, shard=s,
                   position=int(cols["id"][i]) - first) for i in where]

    idx = np.flatnonzero(valid)
    if len(idx):
      low = idx[np.argsort(scores[idx], kind="stable")[:top]]
      suspects = sorted(suspects + rows(low), key=lambda r: (r["score"], r["id"]))[:top]
      h = _hash(cols["id"][idx])
      few = idx[np.argsort(h, kind="stable")[:sample]]
      picked = sorted(picked + [dict(r, hash=int(x)) for r, x in zip(rows(few), _hash(cols["id"][few]))],
                      key=lambda r: r["hash"])[:sample]
  picked.sort(key=lambda r: r["id"])
  return Summary(manifest, scored, bad, bad_examples, hist, suspects, picked)


def fetch_pairs(rows: list[dict], datasets) -> list[tuple[bytes | None, str]]:
  """(image bytes, caption) of each row: one ranged read per pair where its byte range is known (all in flight at
  once), else through the index, else streamed from its shard."""
  reader = store.RangeReader(datasets[0].policy if datasets else None)
  out: list = [None] * len(rows)
  ranges, where = [], []
  for k, r in enumerate(rows):
    ds = datasets[r["dataset"]]
    if r["offset"] >= 0 and r["length"] > 0:
      ranges.append(store.Range(ds.shards[r["shard"]], r["offset"], r["offset"] + r["length"],
                                ds.version_of(r["shard"])))
      where.append(k)
    else:
      sample = (ds.read(int(ds.starts[r["shard"]] + r["position"])) if ds.index is not None
                else next(iter(ds.iter_shard(r["shard"], r["position"], r["position"] + 1))))
      out[k] = (sample.image, sample.caption or "")
  try:
    for k, data in zip(where, reader.read(ranges) if ranges else []):
      parsed = list(web.iter_samples(io.BytesIO(data)))
      sample = web.make_sample(rows[k]["id"], parsed[0][0], parsed[0][3], datasets[rows[k]["dataset"]].caption_key) \
          if parsed else web.Sample(rows[k]["id"], bad="unreadable")
      out[k] = (sample.image, sample.caption or "")
  finally:
    reader.close()
    for ds in datasets:   # the random-access readers `ds.read` opened
      ds.close()
  return out


def thumbnail(data: bytes | None):
  """A PIL thumbnail of encoded image bytes (small images enlarged by an integer factor), None if they do not
  decode."""
  from PIL import Image
  if not data:
    return None
  try:
    with Image.open(io.BytesIO(data)) as f:
      im = f.convert("RGB")
  except Exception:  # noqa: BLE001 — any undecodable bytes: no thumbnail
    return None
  return audit.fit_thumbnail(im)


def _plots(summary: Summary, out: str, kind: str) -> dict:
  from ncjax.evals.plots import _pyplot
  plt = _pyplot()
  values = summary.bin_values()
  files = {}
  used = np.flatnonzero(sum(summary.hist.values()))
  if not len(used):
    return files
  lo, hi = float(values[used[0]]), float(values[min(used[-1] + 1, len(values) - 1)])
  edges = np.linspace(lo, hi if hi > lo else lo + 1e-6, 41)
  fig, ax = plt.subplots(figsize=(6, 3.6))
  for label in ("clean", "noisy", "unknown"):
    counts = summary.hist[label]
    if counts.sum():
      coarse, _ = np.histogram(values[used], bins=edges, weights=counts[used])
      ax.stairs(coarse, edges, fill=True, alpha=0.55, label=f"{label} ({int(counts.sum()):,})")
  ax.legend()
  ax.set_xlabel(f"score ({kind}; higher = cleaner)")
  ax.set_ylabel("pairs")
  ax.set_title(f"{summary.scored:,} pairs scored")
  fig.tight_layout()
  fileio.save_figure(fig, fileio.join(out, "scores.png"), dpi=110)
  plt.close(fig)
  files["scores"] = "scores.png"
  if summary.has_truth:
    c, n = summary.hist["clean"][::-1], summary.hist["noisy"][::-1]   # from the highest score down
    tpr, fpr = np.concatenate([[0], np.cumsum(c) / c.sum()]), np.concatenate([[0], np.cumsum(n) / n.sum()])
    files["roc"] = audit.save_roc(out, fpr, tpr, summary.auc())
  return files


def _csv(rows: list[dict], captions: list[str]) -> str:
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(["rank", "id", "key", "score", "clean", "shard", "caption"])
  for rank, (r, cap) in enumerate(zip(rows, captions), 1):
    w.writerow([rank, r["id"], r["key"], f"{r['score']:.6g}", r["clean"], r["shard_name"], cap])
  return buf.getvalue()


def write_report(out: str, datasets=None, top: int = 100, sample: int = 100, web_spec: WebSpec | None = None) -> dict:
  """OUT/index.html and its files from OUT/scores (process 0). Returns audit.json's summary."""
  summary = summarize(out, top, sample)
  manifest = summary.manifest
  if datasets is None:
    w = web_spec or WebSpec()
    policy = store.RetryPolicy(deadline_s=float(w.io_deadline_s), request_timeout_s=float(w.request_timeout_s))
    fileio.bound_requests(policy.request_timeout_s)
    datasets = [web.open_dataset(d["root"], caption_key=w.caption_key, cache_dir=w.cache_dir, policy=policy,
                                 cache_bytes=w.cache_bytes) for d in manifest["datasets"]]
  for r in summary.suspects + summary.sample:
    r["shard_name"] = manifest["datasets"][r["dataset"]]["shards"][r["shard"]]
  fetched = fetch_pairs(summary.suspects + summary.sample, datasets)
  kind = manifest["scorer"]["kind"]
  files = _plots(summary, out, kind)
  captions = [c for _, c in fetched]
  fileio.write_text(fileio.join(out, "suspects.csv"), _csv(summary.suspects, captions[:len(summary.suspects)]))
  fileio.write_text(fileio.join(out, "sample.csv"), _csv(summary.sample, captions[len(summary.suspects):]))

  def cells(rows, pairs, tag):
    return "".join(audit.pair_cell(out, f"thumbs/{tag}_{rank:05d}_{r['id']}.png", rank, thumbnail(image),
                                   f"pair {r['id']}", "no image", caption, float(r["score"]),
                                   None if r["clean"] < 0 else bool(r["clean"]),
                                   f"pair {r['id']} · {r['shard_name']} · key {r['key']}")
                   for rank, (r, (image, caption)) in enumerate(zip(rows, pairs), 1))

  n_sus = len(summary.suspects)
  suspects_html = cells(summary.suspects, fetched[:n_sus], "suspect")
  sample_html = cells(summary.sample, fetched[n_sus:], "sample")
  scorer = manifest["scorer"]
  noisy_top = [r["clean"] == 0 for r in summary.suspects if r["clean"] >= 0]
  facts = [("data", ", ".join(d["root"] for d in manifest["datasets"])),
           ("pairs", f"{manifest['num_examples']:,} ({summary.scored:,} scored, {summary.bad:,} bad records)"),
           ("model", scorer.get("checkpoint", scorer.get("init", "")) +
            (f" (step {scorer['step']})" if "step" in scorer else "")),
           ("score", f"{kind} (higher = cleaner)")]
  auc = summary.auc()
  if summary.has_truth:
    noisy = int(summary.hist["noisy"].sum())
    facts += [("noisy pairs (the data's clean flags)", f"{noisy:,} ({noisy / max(1, summary.scored):.1%})"),
              (f"truly noisy among the {len(noisy_top)} most suspicious", f"{np.mean(noisy_top):.1%}"),
              ("ROC-AUC (clean vs noisy)", f"{auc:.4f}")]
  legends = dict(scores="scores of every pair (clean and noisy apart where the data's flags are known)",
                 roc="ROC curve: the score as a clean-vs-noisy detector")
  bad_html = "".join(f"<li>pair {b['id']} ({html.escape(b['shard'])}): {html.escape(b['reason'])}</li>"
                     for b in summary.bad_examples)
  page = audit.report_page(
      "ncjax audit of web data", facts, files, legends,
      '<p>Every pair\'s score is in the per-shard files under <code>scores/</code>; the pairs below are in\n'
      '<a href="suspects.csv">suspects.csv</a> and <a href="sample.csv">sample.csv</a>.</p>',
      [(f"The {n_sus} most suspicious pairs", suspects_html),
       (f"A random sample of {len(summary.sample)} pairs", sample_html)],
      tail=f"<h2>Bad records: {summary.bad:,}</h2>\n<ul>{bad_html}</ul>\n")
  fileio.write_text(fileio.join(out, "index.html"), page)
  result = dict(scorer=scorer, datasets=[d["root"] for d in manifest["datasets"]], pairs=manifest["num_examples"],
                scored=summary.scored, bad=summary.bad, auc=auc, top=n_sus,
                top_noisy_fraction=float(np.mean(noisy_top)) if noisy_top else None,
                noise_rate=(float(summary.hist["noisy"].sum() / max(1, summary.scored)) if summary.has_truth
                            else None))
  fileio.write_text(fileio.join(out, "audit.json"), json.dumps(result, indent=1))
  return result
