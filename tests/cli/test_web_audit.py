"""`ncjax audit` of web data and `ncjax filter` (ncjax.cli.web_audit): every pair of img2dataset output scored once, its
score recomputed here from the model and the decoded pair; the records training skips are the ones counted bad;
the report's suspects, sample, AUC and thumbnails from the score files; 2 processes score pair by pair as 1; a run
SIGKILLed mid-shard resumes to the same files; a filter trains exactly on the kept ids (recorded) in every read
mode, resumes bitwise and refuses a resume with another filter; gs:// on a real GCS server end to end; a GSC run's
own labels as score files on 2 processes (slow)."""

import csv
import html.parser
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cli_in_process
from helpers import ROOT, assert_trees_equal, tiny_clip_config
import multiprocess
from ncjax import errors, evaluation, experiment, fileio, train
from ncjax.cli import web_audit
from ncjax.data.web import dataset as web
from ncjax.data.web import decode as web_decode
from ncjax.data.web import index as web_index
from ncjax.data.web import pipeline as web_pipeline
from ncjax.data.web import score_files, subset
from ncjax.data.web import synthetic as web_synthetic
from ncjax.tokenizers import TokenizerSpec

SIZES = [90, 150, 70, 130, 60]          # 500 pairs in unequal shards
BAD = dict(corrupt_images=(7, 333), truncate_shards=(2,), invalid_utf8=(100,))
PLUGINS = os.path.join(ROOT, "tests", "plugins")


def _write(root):
  web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=16, pool=8, clean_key="clean",
                                  noisy_every=4, **BAD)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
  """Web data with bad records of every kind and the data's own clean flags, a CLIP run of 3 steps on it, and
  that run's audit of it (one process, 8 devices)."""
  base = tmp_path_factory.mktemp("webaudit")
  root = str(base / "web")
  _write(root)
  web_index.build_index(root, workers=1)
  cfg = tiny_clip_config(arg="batch=32,epochs=1", total_steps=3, **{
      "input.dataset": f"web:{root}", "input.web.clean_key": "clean", "input.eval_batch_size": 64})
  run = str(base / "run")
  train.train(cfg, run)
  out = str(base / "audit")
  result = web_audit.run(out, checkpoint=run, top=8, sample=6, progress_every=0)
  return dict(base=base, root=root, run=run, out=out, result=result, cfg=cfg)


def _files(out) -> dict:
  """{column: values over every pair in id order} from the score files, and the files' bytes by name."""
  manifest = score_files.require_manifest(out)
  cols = {c: [] for c in score_files.COLUMNS}
  for _, _, _, _, got in score_files.scan(out, manifest, score_files.COLUMNS[1:]):
    for c in cols:
      cols[c].extend(list(got[c]))
  return {c: np.asarray(v) if c not in ("key", "bad") else v for c, v in cols.items()}


def _raw(out) -> dict:
  manifest = score_files.require_manifest(out)
  return {name: fileio.read_bytes(score_files.shard_file(out, d, name))
          for d, _, name, _, _ in score_files.shards_of(manifest)}


def _training_bad_ids(root, cfg) -> set:
  """The ids whose records the training decoder rejects (its crop and transform, not the audit's)."""
  ds = web.open_dataset(root)
  exp_tokenizer = web_pipeline.web_tokenizer(TokenizerSpec("word", 16), experiment.input_spec(cfg.input).web, [ds])
  settings = web_decode.DecodeSettings(16, "openai", True, (0.9, 1.0))
  bad = set()
  for s in range(len(ds.shards)):
    for x in ds.iter_shard(s):
      try:
        web_decode.make_example(web_decode.ExampleSpec(x.id, x.caption, x.image, (0, 0, x.id), True, x.bad),
                                settings, exp_tokenizer)
      except web_decode.BadExample:
        bad.add(x.id)
  return bad


class _Refs(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.refs = []

  def handle_starttag(self, tag, attrs):
    self.refs += [(tag, v) for k, v in attrs if k in ("src", "href")]


def test_every_web_pair_is_scored_once_as_the_model_scores_it_bad_records_as_training_counts_them(scored):
  out, root = scored["out"], scored["root"]
  cols = _files(out)
  n = sum(SIZES)
  np.testing.assert_array_equal(cols["id"], np.arange(n))                 # every pair once, in id order
  bad = {int(i) for i, b in zip(cols["id"], cols["bad"]) if b}
  assert bad == _training_bad_ids(root, scored["cfg"])                    # the records training skips
  assert 7 in bad and 333 in bad and 100 in bad and len(bad) > 10         # an image, a caption, a cut tar's tail
  assert np.isnan(cols["score"][sorted(bad)]).all() and not np.isnan(np.delete(cols["score"], sorted(bad))).any()
  ds = web.open_dataset(root)
  samples = {x.id: x for s in range(len(ds.shards)) for x in ds.iter_shard(s)}
  assert [samples[i].key for i in range(n) if i not in bad] == [k for i, k in enumerate(cols["key"]) if i not in bad]
  # clean flags as the data's .json has them
  assert [int(cols["clean"][i]) for i in range(n) if i not in bad] == \
      [int(samples[i].json()["clean"]) for i in range(n) if i not in bad]
  # each byte range reads that very sample again
  for i in (0, 89, 90, 260, 499):
    with open(ds.shards[int(ds.locate(i)[0][()])], "rb") as f:
      f.seek(int(cols["offset"][i]))
      data = f.read(int(cols["length"][i]))
    assert next(web.iter_samples(__import__("io").BytesIO(data)))[0] == samples[i].key
  # every score recomputed: the restored model's cosine of the pair, decoded with the evaluation transform
  method, state, resolved, _, tokenizer, _ = evaluation.restore_for_eval(scored["run"], 3)
  ok = [i for i in range(n) if i not in bad]
  images = np.stack([web_decode.decode_eval(samples[i].image, 16, "openai") for i in ok])
  tokens = tokenizer.encode([samples[i].caption for i in ok])
  params = jax.device_get(state["params"])

  @jax.jit   # one program on one device (eager, every operation of both towers compiled on its own: seconds)
  def cosines(params, images, tokens):
    model = method.model_for_eval(params)
    return jnp.sum(model.encode_image(images) * model.encode_text(tokens), axis=-1)

  expected = np.asarray(cosines(params, jnp.asarray(images), jnp.asarray(tokens)))
  np.testing.assert_allclose(cols["score"][ok], expected, atol=2e-5, rtol=0)
  assert np.std(expected) > 1e-3                                            # the pairs' scores differ


def test_the_report_shows_the_lowest_scores_and_a_sample_with_thumbnails_and_the_auc(scored):
  from sklearn.metrics import roc_auc_score
  out, result = scored["out"], scored["result"]
  cols = _files(out)
  valid = ~np.isnan(cols["score"])
  known = valid & (cols["clean"] >= 0)
  exact = roc_auc_score(cols["clean"][known], cols["score"][known])
  assert result["auc"] == pytest.approx(exact, abs=2e-3)
  with open(os.path.join(out, "suspects.csv"), newline="") as f:
    suspects = list(csv.DictReader(f))
  lowest = np.argsort(np.where(valid, cols["score"], np.inf), kind="stable")[:8]
  assert [int(r["id"]) for r in suspects] == lowest.tolist()
  with open(os.path.join(out, "sample.csv"), newline="") as f:
    sample = [int(r["id"]) for r in csv.DictReader(f)]
  assert len(sample) == 6 and sample == sorted(sample) and valid[sample].all()
  parser = _Refs()
  parser.feed(open(os.path.join(out, "index.html")).read())
  missing = [ref for _, ref in parser.refs if not os.path.isfile(os.path.join(out, ref))]
  assert not missing, missing
  thumbs = [ref for tag, ref in parser.refs if tag == "img" and ref.startswith("thumbs/")]
  assert len(thumbs) == 14 and {"scores.png", "roc.png"} <= set(os.listdir(out))
  ds = web.open_dataset(scored["root"])
  from PIL import Image
  with Image.open(os.path.join(out, thumbs[0])) as im:   # the first suspect's own image, enlarged
    first = ds.read(int(suspects[0]["id"]))
    with Image.open(__import__("io").BytesIO(first.image)) as src:
      assert im.size == (96, 96) and src.size == (16, 16)
  assert suspects[0]["caption"] == first.caption


def test_an_audit_into_another_scorers_output_and_method_scores_of_clip_are_refused(scored, tmp_path):
  scorer = web_audit.restore(checkpoint=scored["run"])
  with pytest.raises(errors.ConfigurationError, match="keeps no per-sample clean scores"):
    web_audit.score_web(str(tmp_path / "m"), scorer, score="method", progress_every=0)
  other = str(tmp_path / "other")
  os.makedirs(score_files.scores_dir(other))
  manifest = score_files.require_manifest(scored["out"])
  manifest = dict(manifest, scorer=dict(manifest["scorer"], step=1), scorer_digest="x")
  fileio.write_text(os.path.join(score_files.scores_dir(other), "manifest.json"), __import__("json").dumps(manifest))
  with pytest.raises(errors.ConfigurationError, match="holds the scores of another scorer"):
    web_audit.score_web(other, scorer, progress_every=0)


def _audit_cli(run, out, processes, devices, logs, extra_env=None, *extra):
  return multiprocess.start(["audit", f"--checkpoint={run}", f"--output={out}", "--top=8", "--sample=6",
                             "--progress_every=0.5", *extra], processes=processes, devices=devices, log_dir=logs,
                            extra_env=extra_env)


def test_two_processes_score_every_pair_as_one_process_does(scored, tmp_path):
  out, logs = str(tmp_path / "two"), str(tmp_path / "logs")
  codes = multiprocess.wait(_audit_cli(scored["run"], out, 2, 4, logs), timeout=600)
  assert codes == [0, 0], multiprocess.logs(logs)
  text = multiprocess.logs(logs)
  assert "process 0/2:" in text and "process 1/2:" in text and "pairs/s, ETA" in text
  one, two = _files(scored["out"]), _files(out)
  for c in ("id", "key", "bad", "offset", "length", "clean"):   # the same pair under the same id
    assert list(one[c]) == list(two[c]), c
  np.testing.assert_allclose(two["score"], one["score"], atol=1e-6, rtol=0, equal_nan=True)
  # each process scored its own shards only (shard g by process g mod 2: 90 + 70 + 60 and 150 + 130 pairs)
  assert "process 0/2: 220 of 220 pairs" in text and "process 1/2: 280 of 280 pairs" in text


def test_an_audit_killed_mid_shard_resumes_to_the_same_files(scored, tmp_path, monkeypatch):
  out, logs, marks = str(tmp_path / "killed"), str(tmp_path / "logs"), str(tmp_path / "decoded.txt")
  env = dict(NCJAX_SLOW_DECODE_S="0.4", NCJAX_DECODE_LOG=marks)
  plugin = f"--plugins={os.path.join(PLUGINS, 'slow_scoring.py')}"
  procs = _audit_cli(scored["run"], out, 1, 8, logs, env, plugin)
  first = score_files.shard_file(out, 0, "00000.tar")
  t0 = time.time()
  # the first shard's file written and a batch of the second decoded: the kill lands inside the second shard
  while not (os.path.exists(first) and os.path.exists(marks) and
             any(int(line.split()[0]) >= 90 for line in open(marks))):
    assert procs[0].poll() is None and time.time() - t0 < 300, multiprocess.logs(logs)
    time.sleep(0.05)
  procs[0].send_signal(signal.SIGKILL)
  procs[0].wait()
  assert not os.path.exists(score_files.shard_file(out, 0, "00001.tar"))
  stamp = os.stat(first).st_mtime_ns
  # the same command again, in this process (the fixture's audit compiled its program here: 1 process, 8 devices).
  # Its report's plots (the fixture's are drawn and checked above) are not drawn again: their summary recorded.
  from ncjax.cli import web_report
  plotted = []
  monkeypatch.setattr(web_report, "_plots", lambda summary, out, kind: plotted.append(summary.scored) or {})
  resumed = cli_in_process.run(["audit", f"--checkpoint={scored['run']}", f"--output={out}", "--top=8", "--sample=6",
                                "--progress_every=0.5"], cwd=ROOT)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  assert os.stat(first).st_mtime_ns == stamp                                # a finished shard is not scored again
  assert "(1 shards already scored)" in resumed.stdout
  assert _raw(out) == _raw(scored["out"])                                    # byte for byte the uninterrupted files
  assert plotted == [479]                                                   # its report summarised every scored pair


def test_a_filter_trains_exactly_on_the_kept_ids_in_every_read_mode_and_resumes_bitwise(scored, tmp_path):
  root, out = scored["root"], scored["out"]
  path = str(tmp_path / "filter")
  res = cli_in_process.run(["filter", f"--scores={out}", "--keep=0.3345", f"--output={path}", "--write_keys"],
                           cwd=ROOT)
  cols = _files(out)
  scored_pairs = int((~np.isnan(cols["score"])).sum())
  assert scored_pairs == 479   # 500 less 21 bad records
  assert res.returncode == 0 and "kept 160 of 479 scored pairs" in res.stdout, res.stdout + res.stderr   # 5 batches
  kept = set(np.flatnonzero(subset.open_subset(path, [web.open_dataset(root)]).kept[0].contains(np.arange(500))))
  best = np.argsort(-np.nan_to_num(cols["score"], nan=-np.inf), kind="stable")[:160]
  assert kept == set(best.tolist())                                          # the best 160 by score
  import pyarrow.parquet as pq
  keys = pq.read_table(os.path.join(path, "kept_keys", "d0.parquet")).to_pydict()
  assert sorted(keys["id"]) == sorted(kept) and all(cols["key"][i] == k for i, k in zip(keys["id"], keys["key"]))
  # 3 epochs of 5 steps: the 15 scheduled steps of the fixture's run (one epoch of its 500 pairs), so its compiled
  # step (which takes the clean flags too) serves these runs; they train the first epoch
  base = dict(arg="batch=32,epochs=3", total_steps=5, **{"input.dataset": f"web:{root}", "input.web.filter": path,
                                                         "input.web.clean_key": "clean", "input.prefetch": 1,
                                                         "input.web.block": 16, "input.web.shuffle_pairs": 64,
                                                         "input.web.window": 2})
  # what each read mode feeds an epoch's steps: the data the experiment builds from the config, as training reads it
  for mode, read in (("index", "pair"), ("index", "block"), ("stream", "auto")):
    exp = experiment.build_experiment(tiny_clip_config(**base, **{"input.web.mode": mode, "input.web.read": read}))
    data = exp.train_data
    assert data.num_examples == 500 and data.num_trained == 160 and data.steps_per_epoch == 5
    assert exp.method.num_examples == 500                                    # per-sample state by unfiltered ids
    batches = list(data.host_batches(0, 5))
    ids = [i for batch in batches for i in batch["id"].tolist()]
    assert all(int(batch["_skipped"]) == 0 for batch in batches)
    assert len(ids) == 160 and set(ids) == kept, (mode, read)   # one epoch: every kept pair once, nothing else
  # training (pair reads of the index): the same epoch, and a resume bitwise (the filtered order is a function of the
  # step)
  cfg = tiny_clip_config(**base)
  whole = train.train(cfg, str(tmp_path / "whole"))
  assert whole.experiment.train_data.num_trained == 160 and int(whole.state["step"]) == 5
  train.train(cfg, str(tmp_path / "resumed"), until=2)
  resumed = train.train(cfg, str(tmp_path / "resumed"))
  assert_trees_equal(whole.state, resumed.state)
  # another filter (or none) cannot continue that order (here one of as many steps an epoch: 167 pairs)
  other = str(tmp_path / "filter35")
  subset.write_from_scores(out, other, keep=0.35)
  with pytest.raises(errors.CheckpointError, match="input.web.filter"):
    train.train(tiny_clip_config(**dict(base, **{"input.web.filter": other})), str(tmp_path / "resumed"))
  # a filter of other data
  elsewhere = str(tmp_path / "web2")
  web_synthetic.write_img2dataset(elsewhere, 0, shard_sizes=[90, 150, 70, 130], image_size=16, pool=8)
  with pytest.raises(errors.DataError, match="was made for 5 shards"):
    train.train(tiny_clip_config(**dict(base, **{"input.dataset": f"web:{elsewhere}"})), str(tmp_path / "x"))


def test_web_audit_and_its_filter_on_gcs(scored, tmp_path):
  from gcs_server import GCSServer
  with GCSServer() as server:
    root = server.path("web")
    _write(root)
    out = server.path("audit")
    web_audit.run(out, checkpoint=scored["run"], dataset=f"web:{root}", top=4, sample=3, progress_every=0)
    remote, local = _files(out), _files(scored["out"])
    for c in ("id", "key", "offset", "length", "clean"):
      assert list(remote[c]) == list(local[c]), c
    assert [b.replace(root, "R") for b in remote["bad"]] == [b.replace(scored["root"], "R") for b in local["bad"]]
    np.testing.assert_array_equal(remote["score"], local["score"])         # the same pairs, bitwise
    assert fileio.exists(fileio.join(out, "index.html")) and fileio.exists(fileio.join(out, "thumbs"))
    path = server.path("filter")
    subset.write_from_scores(out, path, keep=0.5, keys=True)
    # training's data from the config (streamed from the bucket through the bucket's filter); training itself on gs://
    # data: tests/train/test_web_object_store.py
    cfg = tiny_clip_config(arg="batch=32,epochs=1", total_steps=2, **{
        "input.dataset": f"web:{root}", "input.web.filter": path, "input.web.mode": "stream", "input.prefetch": 1,
        "input.web.cache_dir": str(tmp_path / "cache")})
    data = experiment.build_experiment(cfg).train_data
    ids = [i for batch in data.host_batches(0, 2) for i in batch["id"].tolist()]
    kept = subset.open_subset(path, [web.open_dataset(root)], str(tmp_path / "cache")).kept[0]
    assert data.num_trained == kept.contains(np.arange(500)).sum() == 240     # half of the 479 scored pairs
    assert len(ids) == 64 and kept.contains(ids).all()
    # the filter's bits were fetched once into the host's cache
    assert any(f.startswith("kept-0-") for _, _, files in os.walk(tmp_path / "cache") for f in files)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_gsc_runs_own_labels_as_score_files_on_two_processes(scored, tmp_path):
  from helpers import make_config
  root = scored["root"]
  cfg = make_config("gsc", "batch=32,epochs=2,warmup=0", **{"input.dataset": f"web:{root}",
                                                             "input.web.clean_key": "clean"})
  run = str(tmp_path / "gsc")
  result = train.train(cfg, run)
  labels = np.asarray(jax.device_get(result.experiment.method.clean_scores(
      result.state["params"], result.state["method_state"])[0]))[:500]
  assert labels.std() > 1e-3
  out, logs = str(tmp_path / "gsc_audit"), str(tmp_path / "logs")
  codes = multiprocess.wait(_audit_cli(run, out, 2, 4, logs), timeout=600)
  assert codes == [0, 0], multiprocess.logs(logs)
  cols = _files(out)
  assert score_files.require_manifest(out)["scorer"]["kind"] == "method:gsc"
  np.testing.assert_array_equal(cols["id"], np.arange(500))
  np.testing.assert_allclose(cols["score"], labels, rtol=0, atol=0)         # the run's own labels, id for id
  ds = web.open_dataset(root)
  assert cols["key"][:90] == [x.key for x in ds.iter_shard(0)]              # keys from the shards' parquet
  assert (cols["offset"] >= 0).sum() >= 480                                 # byte ranges from the index


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_exactly_on_the_kept_ids(scored, tmp_path):
  path = str(tmp_path / "filter")
  subset.write_from_scores(scored["out"], path, keep=0.5345)   # 256 of the 479 scored pairs: 8 global batches
  ids_dir, logs = str(tmp_path / "ids"), str(tmp_path / "logs")
  os.makedirs(ids_dir)
  args = ["train", f"--config=clip:data=web:{scored['root']},model=micro,batch=32,epochs=1",
          "--config.total_steps=8", f"--config.input.web.filter={path}", "--config.log.progress=False",
          f"--plugins={os.path.join(PLUGINS, 'record_web_ids.py')}", f"--workdir={tmp_path / 'run'}"]
  codes = multiprocess.run(args, processes=2, devices=4, log_dir=logs, extra_env={"NCJAX_RECORD_IDS": ids_dir},
                           timeout=600)
  assert codes == [0, 0], multiprocess.logs(logs)
  kept = subset.open_subset(path, [web.open_dataset(scored["root"])]).kept[0]
  per_process = []
  for p in range(2):
    with open(os.path.join(ids_dir, f"process_{p}.txt")) as f:
      rows = [list(map(int, line.split())) for line in f]
    assert [r[0] for r in rows] == list(range(8)) and all(len(r) == 17 for r in rows)   # 16 ids a step each
    per_process.append([i for r in rows for i in r[1:]])
  ids = per_process[0] + per_process[1]
  assert sorted(ids) == np.flatnonzero(kept.contains(np.arange(500))).tolist()   # every kept pair once
  assert not set(per_process[0]) & set(per_process[1])


@pytest.mark.slow
def test_an_imported_openai_clip_scores_web_pairs_as_torch_does(scored, tmp_path):
  """--init: the pretrained model's cosine of each pair, recomputed by the PyTorch model it was imported from."""
  import torch   # make test-all installs it: a missing torch fails here, never skips
  import reference_models as rm
  ref = rm.make_open_clip(rm.tiny_open_clip_cfg(True, image_size=16, patch=4))
  path = str(tmp_path / "ViT-tiny.pt")
  torch.save(ref.state_dict(), path)
  out = str(tmp_path / "openai_audit")
  web_audit.run(out, init=f"openai:{path}", dataset=f"web:{scored['root']}", top=4, sample=2, progress_every=0)
  cols = _files(out)
  assert score_files.require_manifest(out)["scorer"]["init"] == f"openai:{path}"
  ds = web.open_dataset(scored["root"])
  ok = [x for s in range(len(ds.shards)) for x in ds.iter_shard(s) if not np.isnan(cols["score"][x.id])]
  assert len(ok) == 479
  images = np.stack([web_decode.decode_eval(x.image, 16, "openai") for x in ok])
  from ncjax.tokenizers import get_tokenizer
  tokens = get_tokenizer("clip_bpe")([x.caption for x in ok])
  with torch.no_grad():
    zi = ref.encode_image(rm.torch_nchw(images), normalize=True).numpy()
    zt = ref.encode_text(torch.from_numpy(np.asarray(tokens, np.int64)), normalize=True).numpy()
  np.testing.assert_allclose(cols["score"][[x.id for x in ok]], (zi * zt).sum(-1), atol=1e-4, rtol=0)
