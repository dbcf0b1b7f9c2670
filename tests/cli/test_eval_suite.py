"""`ncjax eval` as a suite: several datasets (an ImageFolder tree, a CSV pair table, the embedded digits, a built
Karpathy split named as CLIP_benchmark names it) over
every checkpoint of a run, one JSON per (checkpoint, dataset), a summary and a plot; --skip_existing; a suite file
with the user's class names and templates and a linear probe; dataset names as CLIP_benchmark writes them."""

import dataclasses
import json
import os

import numpy as np
import pytest
from PIL import Image

import cli_in_process
from helpers import tiny_clip_config
from ncjax import train
from ncjax.cli import eval_suite
from ncjax.data.embedded import digits


def _data(root):
  """An ImageFolder tree (val/<class>/*.png, 5 digits per class) and a pair table (40 captions, several per image)."""
  split = digits.load("test", image_size=32)
  img = ((split.images[..., 0] * 0.5 + 0.5) * 255).clip(0, 255).astype(np.uint8)
  for c in range(10):
    d = root / "folder" / "val" / digits.CLASS_NAMES[c]
    d.mkdir(parents=True)
    for j in np.flatnonzero(split.image_labels == c)[:5]:
      Image.fromarray(img[j]).convert("RGB").save(d / f"{j}.png")
  (root / "table" / "images").mkdir(parents=True)
  lines = ["filepath,title"]
  for k in range(40):
    j = split.caption_to_image[k]
    Image.fromarray(img[j]).convert("RGB").save(root / "table" / "images" / f"{j}.png")
    lines.append(f'images/{j}.png,"{split.captions[k]}"')
  (root / "table" / "pairs.csv").write_text("\n".join(lines) + "\n")


def test_suite_over_checkpoints_with_skip_existing_and_a_suite_file(tmp_path, built, monkeypatch):
  run = tmp_path / "run"
  # 20 steps: a model whose zero-shot predictions depend on the prompts (after 2 steps every class prompt picked the
  # same class, whatever the names and templates)
  train.train(tiny_clip_config(total_steps=20, **{"ckpt.every_steps": 10}), str(run))
  _data(tmp_path)
  out = tmp_path / "out"
  folder, table = tmp_path / "folder", tmp_path / "table" / "pairs.csv"
  # the CLI's `main(argv)` in this process, on its 8 devices: the evaluation programs it compiles are the ones the
  # suite runs below compile again (a real `python -m ncjax.main eval` exits 0 in
  # tests/train/test_multiprocess_evaluation.py, and a suite in real processes in the slow test at the end)
  res = cli_in_process.run(["eval", f"--checkpoints={run}",
                            f"--datasets=image_folder:{folder}@val,table:{table},digits,flickr30k",
                            f"--data_dir={built['data_dir']}", f"--output={out}", "--num_workers=2"],
                           cwd=str(tmp_path))
  assert res.returncode == 0, res.stderr[-3000:]
  files = {"image_folder_folder_val.json", "table_pairs.csv_test.json", "digits_test.json", "flickr30k_test.json"}
  for step in (10, 20):   # one JSON per (checkpoint, dataset)
    assert set(os.listdir(out / f"run_step{step}")) == files
  record = json.loads((out / "run_step20" / "table_pairs.csv_test.json").read_text())
  assert record["step"] == 20 and record["workdir"] == str(run) and set(record["tasks"]) == {"retrieval"}
  assert record["records"][0]["task"] == "zeroshot_retrieval" and "image_retrieval_recall@5" in \
      record["records"][0]["metrics"]   # CLIP_benchmark's keys
  karpathy = json.loads((out / "run_step10" / "flickr30k_test.json").read_text())   # built Karpathy split, by alias
  assert karpathy["resolved_dataset"] == "tfds:karpathy/flickr30k" and "rsum" in karpathy["tasks"]["retrieval"]
  folder_zs = json.loads((out / "run_step20" / "image_folder_folder_val.json").read_text())["tasks"]["zeroshot"]
  assert {"acc1", "acc5", "mean_per_class_recall"} <= set(folder_zs)
  summary = (out / "summary.md").read_text().splitlines()
  assert len(summary) == 4 and summary[2].startswith("| run_step10 ") and "digits@test zeroshot acc1" in summary[0]
  assert (out / "summary.csv").read_text().count("\n") == 9 and (out / "summary.png").stat().st_size > 10_000

  # a suite file: the folder again, now with the user's class names and templates and a linear probe; with
  # skip_existing the zero-shot result already there is kept and only the probe runs. The probe fits with
  # scikit-learn (an evaluator option the suite file passes on): the evaluator's path is the same, and its JAX
  # L-BFGS (1,000 iterations for each of 16 C values on these separable features, 12 s here) is checked against
  # scikit-learn in tests/evals/test_evals.py.
  (tmp_path / "names.txt").write_text("\n".join(f"digit {n}" for n in digits.CLASS_NAMES) + "\n")
  (tmp_path / "templates.txt").write_text("a photo of the number {c}.\nthe digit {}.\n")
  (tmp_path / "suite.json").write_text(json.dumps([dict(
      dataset=f"image_folder:{folder}", split="val", tasks=["zeroshot", "linear_probe"], train_split="val",
      protocol="sklearn", classnames=str(tmp_path / "names.txt"), templates=str(tmp_path / "templates.txt"))]))
  entries = eval_suite.load_suite_file(str(tmp_path / "suite.json"))
  models = eval_suite.models_of([(str(run), 20)], None)
  # the zero-shot result on disk stamped: a kept one keeps the stamp, a recomputed one cannot have it (this 20-step
  # model scores the folder the same under the CLI's prompts and the file's: values alone would not tell)
  result_file = out / "run_step20" / "image_folder_folder_val.json"
  stamped_zs = dict(folder_zs, acc1=0.123456)
  result_file.write_text(json.dumps(dict(json.loads(result_file.read_text()), tasks=dict(zeroshot=stamped_zs))))
  # The suites below write their summaries as the CLI's did (checked above) and draw their summary.png again: not
  # drawn here, their plot's table recorded instead (one per suite run).
  plotted = []
  monkeypatch.setattr(eval_suite, "_plot", lambda models, columns, table, path: plotted.append(table))
  # The probe's inputs and result recorded as the evaluator calls ncjax.evals.linear_probe.linear_probe (checked
  # below against the checkpoint's own features computed here; the function itself against scikit-learn in
  # tests/evals/test_evals.py): the same fit again here would only repeat it.
  from ncjax.evals import linear_probe as lp
  probes, fit_probe = [], lp.linear_probe
  monkeypatch.setattr(lp, "linear_probe", lambda *args, **kwargs: probes.append(
      (args, kwargs, fit_probe(*args, **kwargs))) or probes[-1][2])
  from threadpoolctl import threadpool_limits
  with threadpool_limits(limits=1, user_api="blas"):   # tiny products (tests/evals/test_evals.py says why)
    rows = eval_suite.run_suite(entries, models, str(out), skip_existing=True, workers=2)
  kept = json.loads((out / "run_step20" / "image_folder_folder_val.json").read_text())
  assert kept["tasks"]["zeroshot"] == stamped_zs
  assert {(r["task"], r["model"], r["main"] if r["task"] == "zeroshot" else 0) for r in rows} == {
      ("zeroshot", "run_step20", 0.123456), ("linear_probe", "run_step20", 0)}
  # everything done: the checkpoint is not restored again

  def restore_refused(*args, **kwargs):
    raise AssertionError("a checkpoint whose every dataset is done was restored")

  with monkeypatch.context() as patched:
    patched.setattr(eval_suite, "_restore", restore_refused)
    again = eval_suite.run_suite(entries, models, str(out), skip_existing=True)
  assert [r["main"] for r in again] == [r["main"] for r in rows]
  # without skip_existing the user's class names and templates make the classifier: the prompts the text tower
  # encodes are exactly `template.format(name)` of the user's files, and the accuracies are those recomputed here
  # from the checkpoint's own embeddings with those names and templates (top-5 too: this 20-step model puts every
  # folder image in one class, so top-1 alone cannot tell prompt sets apart; top-5 can, checked on the folder's own
  # names with CLIP's templates)
  from ncjax.tokenizers import WordTokenizer
  encoded, original = [], WordTokenizer.encode

  def recording(self, texts, *args, **kwargs):
    encoded.extend(texts)
    return original(self, texts, *args, **kwargs)

  monkeypatch.setattr(WordTokenizer, "encode", recording)
  # (zero-shot only: the linear probe ran above and does not read the prompts)
  zero_shot_only = [dataclasses.replace(entries[0], tasks=("zeroshot",), options={
      k: v for k, v in entries[0].options.items() if k not in ("train_split", "protocol")})]
  user = eval_suite.run_suite(zero_shot_only, models, str(tmp_path / "out_user"), workers=2)
  names = tuple(f"digit {n}" for n in digits.CLASS_NAMES)
  templates = ("a photo of the number {}.", "the digit {}.")
  prompts = [t.format(c) for c in names for t in templates]
  assert [p for p in encoded if p.startswith(("a photo of the number digit", "the digit digit"))] == prompts
  zs = json.loads((tmp_path / "out_user" / "run_step20" / "image_folder_folder_val.json").read_text())
  got = zs["tasks"]["zeroshot"]
  (mine, theirs), (features, labels) = _zero_shot(run, folder, [(names, templates), (tuple(digits.CLASS_NAMES), None)])
  # the probe's result is scikit-learn's protocol on the checkpoint's own pre-projection features (computed here):
  # the evaluator's one fit took those features and labels, split as the protocol splits them, and its result is
  # the one kept on disk
  (args, kwargs, probe), = probes
  fit, held_out = lp.train_val_split(len(features))
  for given, expected in zip(args, (features[fit], labels[fit], features[held_out], labels[held_out], features,
                                    labels)):
    np.testing.assert_allclose(given, expected, rtol=0, atol=1e-5)
  assert args[6:] == (10,) and kwargs == dict(protocol="sklearn")
  assert kept["tasks"]["linear_probe"] == pytest.approx(probe, abs=1e-6), (kept["tasks"]["linear_probe"], probe)
  assert mine != theirs, (mine, theirs)
  assert (got["acc1"], got["acc5"], got["mean_per_class_recall"]) == pytest.approx(mine, abs=1e-6), (got, mine)
  assert {r["task"] for r in user} == {"zeroshot"}
  assert len(plotted) == 3 and list(plotted[-1].values()) == [got["acc1"]]


def _zero_shot(run, folder, prompt_sets):
  """For each (class names, templates) of `prompt_sets`: (top-1 accuracy, top-5 accuracy, mean per-class recall) of
  checkpoint 20 of `run` on the folder's val images, recomputed from embeddings computed once: tests/recompute.py's
  prompt ensemble over `templates` (None: CLIP's 80 ImageNet templates, what an image folder gets by default); and
  (the images' pre-projection features, their labels), what a linear probe fits."""
  import jax
  import ml_collections
  import recompute
  from ncjax import data as data_lib, experiment
  from ncjax.evals import zeroshot
  em, img, _, split, tokenizer, config = recompute.checkpoint_embeddings(
      str(run), 20, ml_collections.ConfigDict(dict(dataset=f"image_folder:{folder}", data_dir="")), "val")
  labels = np.asarray(split.image_labels)
  image_size = experiment.resolve(config).model.image_size
  images = data_lib.eval_images(split, image_size, config.input.normalization, config.input.resize)
  features = np.asarray(jax.jit(em.image_features)(np.asarray(images[np.arange(split.num_images)])))
  out = []
  for class_names, templates in prompt_sets:
    weights = recompute.zero_shot_weights(em, tokenizer, class_names, templates or zeroshot.templates_for("imagenet80"))
    logits = img @ weights.T
    pred = np.argmax(logits, axis=1)
    top5 = np.argsort(-logits, axis=1)[:, :5]
    recalls = [float(np.mean(pred[labels == c] == c)) for c in np.unique(labels)]
    out.append((float(np.mean(pred == labels)), float(np.mean([y in t for y, t in zip(labels, top5)])),
                float(np.mean(recalls))))
  return out, (features, labels)


def test_user_class_names_and_templates_reach_the_classifier(tmp_path):
  from ncjax.evals import zeroshot
  (tmp_path / "t.txt").write_text("a {c} here.\n\nthe {}.\n")
  assert zeroshot.templates_for(str(tmp_path / "t.txt")) == ("a {} here.", "the {}.")
  (tmp_path / "bench.json").write_text(json.dumps({"cifar10": ["x {c}."], "other": ["y {c}."]}))
  assert zeroshot.templates_for(str(tmp_path / "bench.json"), "tfds:cifar10") == ("x {}.",)
  assert zeroshot.templates_for("cifar100")[0] == "a photo of a {}."   # CLIP_benchmark's, shipped
  assert zeroshot.class_names_for("imagenet1k", "image_folder:/in1k", ())[:2] == ("tench", "goldfish")
  (tmp_path / "n.txt").write_text("a\nb\n")
  assert zeroshot.class_names_for(str(tmp_path / "n.txt"), "x", ("0", "1")) == ("a", "b")
  with pytest.raises(ValueError, match="gives 2 names for the 3 classes"):
    zeroshot.class_names_for(str(tmp_path / "n.txt"), "x", ("0", "1", "2"))
  (tmp_path / "bad.txt").write_text("no placeholder\n")
  with pytest.raises(ValueError, match="must hold"):
    zeroshot.templates_for(str(tmp_path / "bad.txt"))


def test_dataset_specs_aliases_and_tasks():
  entries = eval_suite.parse_datasets("cifar10,image_folder:/data/in1k@val,flickr30k", tasks="auto,linear_probe")
  assert [(e.resolved_dataset, e.split, e.tasks) for e in entries] == [
      ("tfds:cifar10", "test", ("auto", "linear_probe")), ("image_folder:/data/in1k", "val", ("auto", "linear_probe")),
      ("tfds:karpathy/flickr30k", "test", ("auto", "linear_probe"))]
  assert eval_suite.DATASET_ALIASES["imagenet1k"] == "tfds:imagenet2012"
  assert [e.slug for e in entries] == ["cifar10_test", "image_folder_in1k_val", "flickr30k_test"]
  with pytest.raises(ValueError, match="unknown task"):
    eval_suite.parse_datasets("digits", tasks="zero_shot")
  split = digits.load("test")
  assert eval_suite.entry_tasks(entries[0], split) == ["zeroshot", "linear_probe"]
  split.image_labels = None
  assert eval_suite.entry_tasks(eval_suite.SuiteEntry("x"), split) == ["retrieval"]
  with pytest.raises(ValueError, match="needs class labels"):
    eval_suite.entry_tasks(entries[0], split)


def test_suite_on_a_pretrained_model(tmp_path, monkeypatch):
  # a reduced random CLIP in OpenAI's layout (1 + 1 layers: the import's parity with PyTorch is tests/models/
  # test_pretrained.py's), evaluated as it is (no training), serially decoded
  import torch
  import reference_models as rm
  from helpers import load_config
  path = tmp_path / "ViT-tiny.pt"
  reference = rm.make_open_clip(rm.tiny_open_clip_cfg(True, image_size=16, patch=4, vlayers=1, tlayers=1))
  torch.save(reference.state_dict(), path)
  _data(tmp_path)
  models = eval_suite.models_of(None, f"openai:{path}")
  assert [m.label for m in models] == ["openai_ViT-tiny"]
  entries = [eval_suite.SuiteEntry(f"image_folder:{tmp_path / 'folder'}", "val", ("auto", "retrieval"),
                                   options=dict(templates="single"))]
  plotted = []   # summary.png is drawn in the test above; here its table is recorded instead
  monkeypatch.setattr(eval_suite, "_plot", lambda models, columns, table, path: plotted.append(models))
  rows = eval_suite.run_suite(entries, models, str(tmp_path / "out"), config=load_config("clip"), workers=0)
  assert plotted == [["openai_ViT-tiny"]]
  assert [(r["model"], r["task"]) for r in rows] == [("openai_ViT-tiny", "zeroshot"), ("openai_ViT-tiny", "retrieval")]
  record = json.loads((tmp_path / "out" / "openai_ViT-tiny" / "image_folder_folder_val.json").read_text())
  assert record["init"] == f"openai:{path}" and set(record["tasks"]) == {"zeroshot", "retrieval"}


@pytest.mark.slow   # four multi-process evaluations
def test_suite_on_two_processes_equals_one(tmp_path):
  import multiprocess
  run = tmp_path / "run"
  train.train(tiny_clip_config(total_steps=2), str(run))
  _data(tmp_path)
  datasets = f"--datasets=image_folder:{tmp_path / 'folder'}@val,table:{tmp_path / 'table' / 'pairs.csv'},digits"
  results = {}
  for processes, devices in ((2, 4), (1, 8)):
    out = tmp_path / f"out_{processes}"
    logs = str(tmp_path / f"logs_{processes}")
    args = ["eval", f"--checkpoints={run}:latest", datasets, f"--output={out}"]
    codes = multiprocess.run(args, processes=processes, devices=devices, log_dir=logs)
    assert set(codes) == {0}, multiprocess.logs(logs)
    results[processes] = {f: json.loads((out / "run_step2" / f).read_text())["tasks"]
                          for f in os.listdir(out / "run_step2")}
    again = multiprocess.run(args + ["--skip_existing"], processes=processes, devices=devices,
                             log_dir=logs + "_again")
    assert set(again) == {0} and "every dataset done already" in multiprocess.logs(logs + "_again")
  assert results[2].keys() == results[1].keys() and len(results[1]) == 3
  for name, tasks in results[2].items():
    for task, metrics in tasks.items():
      for key, value in metrics.items():
        if isinstance(value, float):    # rank metrics may move by one near-tied query (a 2-step model)
          if key == "rsum":
            tol = 12.0                   # six percentages over 20-50 queries
          elif key.endswith(("medr", "meanr")):
            tol = 1.0
          elif "R@" in key and not key.startswith(("text_", "image_")):
            tol = 2.5                    # percent: one query of 40-50
          else:
            tol = 0.03                   # fractions and accuracies: one of 40-50
          assert results[1][name][task][key] == pytest.approx(value, abs=tol), (name, task, key)
