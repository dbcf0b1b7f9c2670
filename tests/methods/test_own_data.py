"""The README's own-data walk: a labelled CSV with a clean column, built with a held-out split, then CLIP and GSC
trained briefly and evaluated on the held-out images (zero-shot on the labels, retrieval, noise detection)."""

import json
import subprocess
import sys

import numpy as np

import data_fixtures as fx
from helpers import make_config
from ncjax import main as cli, train


def test_own_labelled_table_from_build_to_an_evaluated_comparison(tmp_path):
  fx.write_labelled_table(str(tmp_path / "pairs"), n=36)
  build = [sys.executable, "-m", "ncjax.data.build", "--dataset=web_pairs/custom_table",
           f"--manual_dir={tmp_path / 'pairs'}", f"--data_dir={tmp_path / 'tfds'}", "--table=pairs.csv",
           "--separator=,", "--image_column=path", "--caption_column=caption", "--label_column=label",
           f"--class_names={tmp_path / 'pairs' / 'names.txt'}", "--clean_column=clean", "--holdout=0.25"]
  proc = subprocess.run(build, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = {}
  for name in ("clip", "gsc"):
    cfg = make_config(name, "data=tfds:web_pairs/custom_table,batch=8,epochs=1",
                      **{"input.data_dir": str(tmp_path / "tfds"), "input.augment": False})
    assert cfg.noise.kind == "none"            # the user's data: nothing injected by default
    with cfg.unlocked():
      cfg.evals = {"zeroshot": dict(type="zeroshot", templates="auto"),
                   "retrieval": dict(type="retrieval", plot=False),
                   "noise_detection": dict(type="noise_detection", plot=False)}
    workdir = tmp_path / name
    res = train.train(cfg, str(workdir))
    cli.check_final_evaluators(cfg, res.experiment)
    out = cli.final_evaluation(cfg, res, str(workdir))
    results[name] = out
    assert 0.0 <= out["zeroshot"]["acc1"] <= 1.0                     # on the held-out images' labels
    assert 0.0 <= out["retrieval"]["rsum"] <= 600.0
    det = out["noise_detection"]
    assert np.isfinite(det["auc"]) and 0.2 < det["noise_rate"] < 0.5   # from the table's clean column
    saved = json.loads((workdir / "eval" / f"step_{res.experiment.steps_per_epoch}.json").read_text())
    assert saved["results"]["noise_detection"]["auc"] == det["auc"]
  assert set(results) == {"clip", "gsc"}

  # NC-bench on the same table (the comparison a user of their own data runs): both methods on the table's own
  # (real) noise, the held-out split's evaluators, ROC curves from the table's clean column; a re-run skips both.
  from helpers import load_config
  from ncjax import ncbench
  bench = load_config("ncbench", "data=tfds:web_pairs/custom_table,noise=0,methods=clip+gsc,epochs=1,batch=8")
  assert bench.bench.reference == "" and bench.bench.model == ""     # a user's data: no clean reference
  with bench.unlocked():
    bench.bench.data_dir = str(tmp_path / "tfds")
  out = ncbench.run(bench, str(tmp_path / "bench"), log=lambda *_: None)
  assert [r["method"] for r in out["records"]] == ["clip", "gsc"]
  for r in out["records"]:
    assert 0.0 <= r["metrics"]["zeroshot/acc1"] <= 1.0 and np.isfinite(r["metrics"]["noise_detection/auc"])
  assert (tmp_path / "bench" / "roc_noise0.png").is_file() and "gsc" in out["table"]
  lines = []
  ncbench.run(bench, str(tmp_path / "bench"), log=lines.append)
  assert sum("done before" in line for line in lines) == 2
