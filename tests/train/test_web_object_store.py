"""img2dataset output in object storage (gs://, a real GCS JSON API server on 127.0.0.1: tests/gcs_server.py): the
index built there by `python -m ncjax.data.build --dataset=web` (its main, in this process), streamed and indexed
reads giving what the same files on local disk give (ids, keys, captions, image bytes, .json, the bad records of a
cut shard), the training batches of every read mode (pair, block, streamed) bitwise those of local disk, and a short
training run on the gs:// copy (blocks of the index) trained on bitwise those batches: it ends where a run on local
disk ends."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gcs_server import GCSServer  # noqa: E402
from helpers import tiny_clip_config  # noqa: E402
from ncjax import experiment, fileio, train  # noqa: E402
from ncjax.data import build  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402
from ncjax.data.web import dataset as web
from ncjax.data.web import index as web_index
from ncjax.data.web import pipeline as web_pipeline

N, PER_SHARD = 300, 60
_WRITE = dict(per_shard=PER_SHARD, image_size=16, pool=8, corrupt_images=(7,), truncate_shards=(3,))


def _fields(samples):
  # everything a sample carries but the reason text of a bad one (it names the shard's path)
  return [(s.id, s.key, s.caption, s.image, s.meta, bool(s.bad)) for s in samples]


def _streamed(ds):
  return [x for s in range(len(ds.shards)) for x in ds.iter_shard(s)]


def _config(root, mode, read, cache):
  return tiny_clip_config(arg="batch=32,epochs=1", total_steps=3, **{
      "input.dataset": f"web:{root}", "input.web.mode": mode, "input.web.read": read, "input.web.window": 2,
      "input.web.block": 16, "input.web.shuffle_pairs": 64, "input.web.cache_dir": cache})


def test_img2dataset_output_in_gcs_reads_and_trains_like_local_disk(tmp_path, monkeypatch):
  local = str(tmp_path / "web")
  web_synthetic.write_img2dataset(local, N, **_WRITE)
  local_manifest = web_index.build_index(local, workers=1)
  with GCSServer() as server:
    remote = server.path("web")
    web_synthetic.write_img2dataset(remote, N, **_WRITE)
    assert not fileio.exists(fileio.join(remote, web.INDEX_DIRNAME))
    # Streamed before any index: shard list and counts from the parquet / _stats.json objects.
    unindexed = web.open_dataset(remote)
    assert unindexed.index is None and [fileio.basename(s) for s in unindexed.shards] == \
        [f"{s:05d}.tar" for s in range(N // PER_SHARD)]
    np.testing.assert_array_equal(unindexed.counts, [PER_SHARD] * (N // PER_SHARD))
    ref = _streamed(web.open_dataset(local, use_index=False))
    assert _fields(_streamed(unindexed)) == _fields(ref) and sum(bool(s.bad) for s in ref) == 15
    # The build's command line, writing its index into the bucket (parts from 2 spawned scanners, then offsets.npy +
    # manifest.json); GCSServer set this process's environment, which the scanners inherit.
    assert build.main(["--dataset=web", f"--manual_dir={remote}", "--workers=2"]) == 0
    index_dir = fileio.join(remote, web.INDEX_DIRNAME)
    remote_manifest = web_index.WebIndex.open(index_dir, str(tmp_path / "c0")).manifest
    assert fileio.listdir(index_dir) == ["manifest.json", remote_manifest["offsets_file"]]   # parts merged, removed
    # the same index as on local disk but for what each shard *is*: an object's generation, a file's mtime
    assert {k: v for k, v in remote_manifest.items() if k != "versions"} == \
        {k: v for k, v in local_manifest.items() if k != "versions"}
    assert all(v.isdigit() for v in remote_manifest["versions"])
    indexed = web.open_dataset(remote, cache_dir=str(tmp_path / "cache"))
    assert indexed.index is not None and not os.path.exists("gs:")
    assert _fields([indexed.read(i) for i in range(N)]) == _fields(ref)          # one ranged read per pair
    assert _fields(_streamed(web.open_dataset(remote, use_index=False))) == _fields(ref)
    # What each read mode feeds the training steps from the bucket is bitwise what it feeds from local disk (the index's
    # local copy is reused) ...
    cache = str(tmp_path / "cache")
    local_batches = {}
    for mode, read in (("index", "pair"), ("index", "block"), ("stream", "auto")):
      local_data, remote_data = (experiment.build_experiment(_config(root, mode, read, cache)).train_data
                                 for root in (local, remote))
      assert local_data.mode == remote_data.mode == mode
      local_batches[mode, read] = list(local_data.host_batches(0, 3))
      _assert_batches_equal(local_batches[mode, read], list(remote_data.host_batches(0, 3)), f"{mode}/{read}")
    # ... and so is what a training run on the bucket's blocks trains on, step by step (its steps a function of them).
    fed = []
    assemble = web_pipeline.WebTrainData.assemble

    def recording(self, step, specs, decoded):
      fed.append(assemble(self, step, specs, decoded))
      return fed[-1]

    monkeypatch.setattr(web_pipeline.WebTrainData, "assemble", recording)
    unsaved = _config(remote, "index", "block", cache)
    unsaved.ckpt.save_at_end = False   # (its state is read in memory: no checkpoint, ~0.5 s)
    run = train.train(unsaved, str(tmp_path / "run"))
    assert int(run.state["step"]) == 3 and run.experiment.train_data.read == "block"
    _assert_batches_equal(local_batches["index", "block"], fed, "training on gs://")


def _assert_batches_equal(want: list[dict], got: list[dict], what: str) -> None:
  assert len(got) == len(want), what
  for step, (a, b) in enumerate(zip(want, got)):
    assert sorted(a) == sorted(b), what
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what}, step {step}: {key}")
