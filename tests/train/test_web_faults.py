"""Web data in object storage when the store misbehaves, against a real GCS JSON API server on 127.0.0.1
(tests/gcs_server.py; behind tests/latency_proxy.py where a bucket's latency matters): an outage mid-run (the server
killed, restarted 1.5 s later) is absorbed with zero skipped records, every step trained on bitwise the batch of the
uninterrupted order; a store that stays dead stops the
run within its deadline with one line, its checkpoints intact and the relaunch exact (slow); a shard replaced or
deleted after the build is one clear error, at start-up or on its next read; hosts build and merge an index in the
bucket at once (slow); two processes train on gs:// web data read in blocks, each reading its own share (slow)."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli_in_process  # noqa: E402  (tests/cli_in_process.py)
import multiprocess  # noqa: E402  (tests/multiprocess.py)
from gcs_server import GCSServer  # noqa: E402
from latency_proxy import LatencyProxy  # noqa: E402
from helpers import ROOT, assert_trees_equal, tiny_clip_config  # noqa: E402
from ncjax import fileio, train  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402
from ncjax.data.web import store
from ncjax.data.web import dataset as web
from ncjax.data.web import host_cache
from ncjax.data.web import index as web_index
from ncjax.data.web import pipeline as web_pipeline

SIZES = [90, 150, 70, 130, 110, 80]     # 630 pairs in unequal shards
STEPS = 16       # the run reads ~5 steps ahead (readahead, prefetch): the outage at step 2 finds it mid-run
OUTAGE_S = 1.5   # longer than the first retry's backoff (0.5-1 s): the reads fail and retry more than once


def _config(root, cache, **kw):
  return tiny_clip_config(arg="batch=32,epochs=2", total_steps=STEPS, **{"input.prefetch": 1,
      "input.dataset": f"web:{root}", "input.web.read": "block", "input.web.block": 16,
      "input.web.shuffle_pairs": 32, "input.web.window_batches": 1, "input.web.cache_dir": cache,
      "input.web.io_deadline_s": 120.0, "ckpt.save_at_end": False, **kw})   # (read in memory: no save)


def _write(root):
  web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=16, pool=8)
  web_index.build_index(root, workers=1)


def _gcsfs_tries_once(monkeypatch):
  """gcsfs retries each request for ~30 s itself, which absorbs a short outage before ncjax sees it; cut to one try,
  so that the outage reaches ncjax's own policy (as an outage longer than gcsfs's retries does on a real bucket)."""
  import gcsfs.core
  import gcsfs.retry
  once = gcsfs.retry.retry_request(retries=1)(gcsfs.core.GCSFileSystem._request.__wrapped__)
  monkeypatch.setattr(gcsfs.core.GCSFileSystem, "_request", once)


def test_an_outage_of_the_store_mid_run_is_absorbed_bitwise(tmp_path, monkeypatch, caplog):
  _gcsfs_tries_once(monkeypatch)
  with GCSServer() as server, LatencyProxy(server.port, 0.02) as proxy:
    root = server.path("web")
    _write(root)
    for key, value in proxy.env.items():   # the run reads through the proxy: 20 ms per request, as a bucket
      monkeypatch.setenv(key, value)
    import fsspec
    fsspec.filesystem("gcs").clear_instance_cache()
    cfg = _config(root, str(tmp_path / "cache"))
    # the uninterrupted order's batches, read through the same pipeline while the store answers (the steps of a run
    # are a function of its batches: a run fed these, bitwise, ends where the uninterrupted run ends)
    from ncjax import experiment
    reference = list(experiment.build_experiment(cfg).train_data.host_batches(0, STEPS))
    seen, fed = {}, []
    assemble = web_pipeline.WebTrainData.assemble

    def recording(self, step, specs, decoded):
      batch = assemble(self, step, specs, decoded)
      fed.append((step, batch))
      return batch

    monkeypatch.setattr(web_pipeline.WebTrainData, "assemble", recording)

    def outage():
      server.kill()
      time.sleep(OUTAGE_S)
      seen["step_at_restart"] = seen.get("step", 0)
      server.restart()

    def hook(step, state, writer):
      del state, writer
      seen["step"] = step
      if step == 2 and "thread" not in seen:
        seen["thread"] = threading.Thread(target=outage)
        seen["thread"].start()

    import logging
    with caplog.at_level(logging.WARNING, logger="ncjax"):
      interrupted = train.train(cfg, str(tmp_path / "interrupted"), evaluate=hook)
    seen["thread"].join()
    assert interrupted.experiment.train_data.read == "block"
    assert interrupted.experiment.train_data.steps_per_window == 1   # a window per step: reads all along the run
    assert "retrying for up to 120 s" in caplog.text     # the reads failed, and ncjax's policy retried them
    # the run was still reading when the store came back: the reads of the later steps waited out the outage
    assert seen["step_at_restart"] < STEPS - 3, seen
    assert int(interrupted.state["step"]) == STEPS
    assert interrupted.metrics["input/skipped_records"] == 0
    assert [step for step, _ in fed] == list(range(STEPS))              # each step once, in order
    for (step, got), want in zip(fed, reference):
      assert sorted(got) == sorted(want)
      for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"step {step}: {key}")


def test_a_shard_replaced_or_deleted_in_the_bucket_after_the_build_is_one_clear_error(tmp_path):
  with GCSServer() as server:
    root = server.path("web")
    _write(root)
    cache = str(tmp_path / "cache")
    ds = web.open_dataset(root, cache_dir=cache)
    assert ds.read(100).caption == web_synthetic.captions(90, 150)[10]
    shard = fileio.join(root, "00001.tar")
    data = fileio.read_bytes(shard)
    fileio.write_bytes(shard, data)            # the same bytes, uploaded again: a new generation
    # mid-run: the reads are pinned to the indexed generation
    with pytest.raises(store.ShardChanged, match=r"00001.tar: the version \d+ this run listed is gone"):
      ds.read(100)
    # at start-up: one listing, compared with the manifest
    with pytest.raises(store.ShardChanged, match=r"1 shards under gs://.* changed after the index was built "
                                                 r"\(e.g. 00001.tar"):
      web.open_dataset(root, cache_dir=cache)
    fileio.remove(fileio.join(root, "00002.tar"))
    with pytest.raises(store.ShardMissing, match="00002.tar"):
      web.open_dataset(root, cache_dir=cache)
    # through the CLI (its main(argv), in this process: tests/cli/test_errors.py keeps a real process's line): one
    # line, no traceback
    out = cli_in_process.run(["train", f"--config=clip:data=web:{root},model=micro,batch=32",
                              f"--config.input.web.cache_dir={cache}", f"--workdir={tmp_path / 'run'}",
                              "--config.log.progress=False"], cwd=ROOT)
    assert out.returncode == 3, out.stderr[-3000:]   # data (ncjax.errors)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ncjax: error: ") and "00002.tar" in last and "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_store_that_stays_dead_stops_the_run_within_its_deadline_and_the_relaunch_is_exact(tmp_path):
  args = lambda root, workdir: [
      "train", f"--config=clip:data=web:{root},model=micro,batch=32,epochs=2", "--config.total_steps=24",
      "--config.input.prefetch=1",
      "--config.input.web.read=block", "--config.input.web.block=16", "--config.input.web.shuffle_pairs=32",
      "--config.input.web.window_batches=1",
      f"--config.input.web.cache_dir={tmp_path / 'cache'}", "--config.input.web.io_deadline_s=5",
      "--config.ckpt.every_steps=1", "--config.log.progress=False", f"--workdir={workdir}"]
  with GCSServer() as server:
    root = server.path("web")
    _write(root)
    logs = str(tmp_path / "logs")
    reference = str(tmp_path / "reference")
    assert multiprocess.run(args(root, reference), processes=1, devices=8, log_dir=str(tmp_path / "ref_logs"),
                            extra_env=server.env) == [0]
    workdir = str(tmp_path / "run")
    procs = multiprocess.start(args(root, workdir), processes=1, devices=8, log_dir=logs, extra_env=server.env)
    ckpts = os.path.join(workdir, "checkpoints")
    t0 = time.time()
    while not (os.path.isdir(ckpts) and any(n.isdigit() and int(n) >= 2 for n in os.listdir(ckpts))):
      assert procs[0].poll() is None and time.time() - t0 < 300, multiprocess.logs(logs)
      time.sleep(0.05)
    server.kill()                                   # for good
    t_dead = time.time()
    code = procs[0].wait(timeout=300)
    waited = time.time() - t_dead
    text = multiprocess.logs(logs, tail=None)
    errors = [line for line in text.splitlines() if line.startswith("ncjax: error:")]
    assert code == 5 and len(errors) == 1, text[-4000:]   # storage (ncjax.errors)
    assert "the store did not answer" in errors[0] and "relaunch the same command" in errors[0], errors[0]
    assert "Traceback" not in text.split(errors[0])[-1]
    # the deadline (5 s) plus gcsfs's own retries of the request in flight (~35 s), not minutes more
    assert waited < 120, waited
    saved = sorted(int(n) for n in os.listdir(ckpts) if n.isdigit())
    assert saved and 2 <= max(saved) < 24
    server.restart()
    assert multiprocess.run(args(root, workdir), processes=1, devices=8, log_dir=logs, extra_env=server.env) == [0]
    from ncjax import checkpoint as ckpt_lib
    ref, _, _ = ckpt_lib.restore_state_on_host(reference)
    got, _, step = ckpt_lib.restore_state_on_host(workdir)
    assert step == 24
    assert_trees_equal(ref, got)


@pytest.mark.slow
def test_two_hosts_build_and_merge_an_index_in_the_bucket_at_once(tmp_path):
  with GCSServer() as server:
    root = server.path("web")
    web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES * 2, image_size=16, pool=8)
    build = lambda *extra: subprocess.Popen([sys.executable, "-m", "ncjax.data.build", "--dataset=web",
                                             f"--manual_dir={root}", "--workers=1", *extra], cwd=ROOT,
                                            env=multiprocess.env(server.env), stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)
    hosts = [build("--num_hosts=2", f"--host_index={h}") for h in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in hosts]
    assert [p.returncode for p in hosts] == [0, 0], outs
    merges = [build("--num_hosts=2", "--merge") for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in merges]
    assert [p.returncode for p in merges] == [0, 0], outs
    index_dir = fileio.join(root, web_index.INDEX_DIRNAME)
    manifest = web_index.read_manifest(index_dir)
    assert fileio.listdir(index_dir) == ["manifest.json", manifest["offsets_file"]]
    one = str(tmp_path / "one")
    assert web_index.build_index(root, index_dir=one, workers=1)["counts"] == manifest["counts"] == SIZES * 2
    np.testing.assert_array_equal(np.load(os.path.join(one, manifest["offsets_file"])),
                                  np.load(web_index.WebIndex.open(index_dir, str(tmp_path / "c")).offsets.filename))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_on_gcs_web_data_read_in_blocks(tmp_path):
  plugin = os.path.join(ROOT, "tests", "plugins", "record_web_ids.py")

  def run(workdir, ids_dir, processes, server, root, *extra):
    os.makedirs(ids_dir, exist_ok=True)
    args = ["train", f"--config=clip:data=web:{root},model=micro,batch=32,epochs=1", "--config.total_steps=8",
            "--config.input.web.read=block", "--config.input.web.block=16", "--config.input.web.shuffle_pairs=64",
            f"--config.input.web.cache_dir={tmp_path / 'cache'}", "--config.ckpt.every_steps=1",
            "--config.log.progress=False", f"--plugins={plugin}", f"--workdir={workdir}", *extra]
    codes = multiprocess.run(args, processes=processes, devices=8 // processes, log_dir=workdir + "_logs",
                             extra_env={**server.env, "NCJAX_RECORD_IDS": ids_dir}, timeout=600)
    assert codes == [0] * processes, multiprocess.logs(workdir + "_logs")

  def ids(ids_dir, process):
    out = {}
    with open(os.path.join(ids_dir, f"process_{process}.txt")) as f:
      for line in f:
        step, *rest = map(int, line.split())
        if step in out:
          np.testing.assert_array_equal(out[step], rest)   # a step re-read after a resume: the same pairs
        out[step] = np.asarray(rest)
    return out

  with GCSServer() as server:
    root = server.path("web")
    _write(root)
    run(str(tmp_path / "two"), str(tmp_path / "ids"), 2, server, root)
    parts = [ids(str(tmp_path / "ids"), p) for p in range(2)]
    assert sorted(parts[0]) == sorted(parts[1]) == list(range(8))
    ds = web.open_dataset(root, cache_dir=str(tmp_path / "cache"))
    simulated = [web_pipeline.WebTrainData([ds], None, 32, 0, None, read="block", block=16, shuffle_pairs=64,
                                           process_index=p, process_count=2) for p in range(2)]
    for s in range(8):
      assert not set(parts[0][s].tolist()) & set(parts[1][s].tolist())
      for p in range(2):   # each process read its own share, as the order says for 2 processes
        np.testing.assert_array_equal(parts[p][s], simulated[p].order.local_ids(s, p))
    # stopped after step 3 and resumed: bitwise the uninterrupted 2-process run
    run(str(tmp_path / "resumed"), str(tmp_path / "ids_r"), 2, server, root, "--until_step=3")
    run(str(tmp_path / "resumed"), str(tmp_path / "ids_r"), 2, server, root)
    from ncjax import checkpoint as ckpt_lib
    a, _, _ = ckpt_lib.restore_state_on_host(str(tmp_path / "two"))
    b, _, step = ckpt_lib.restore_state_on_host(str(tmp_path / "resumed"))
    assert step == 8
    assert_trees_equal(a, b)


def test_a_stalled_store_ends_a_streamed_read_and_an_index_open_by_themselves(tmp_path, monkeypatch):
  # a store that accepts every connection and never answers (the proxy holds each request for an hour): before
  # 2026-11-26 gcsfs waited for ever (no request timeout), so streamed reads and index opens hung past any deadline
  import fsspec
  import fsspec.config
  _gcsfs_tries_once(monkeypatch)
  monkeypatch.setattr(fsspec.config, "conf", {})
  monkeypatch.setattr(fileio, "_bound", dict(fileio._bound))   # noqa: SLF001 — this test's bound stays here
  with GCSServer() as server, LatencyProxy(server.port, 3600.0) as stalled:
    root = server.path("web")
    _write(root)
    for key, value in server.env.items():
      monkeypatch.setenv(key, value)
    fsspec.filesystem("gcs").clear_instance_cache()
    streamed = web.open_dataset(root, use_index=False)               # listed while the store answered
    for key, value in stalled.env.items():
      monkeypatch.setenv(key, value)
    fsspec.filesystem("gcs").clear_instance_cache()
    policy = store.RetryPolicy(deadline_s=1.0, request_timeout_s=0.5, first_backoff_s=0.1)
    fileio.bound_requests(policy.request_timeout_s)
    streamed.policy = policy
    for attempt in (lambda: next(streamed.iter_shard(1)),
                    lambda: web_index.WebIndex.open(web_index.index_dir_of(root), str(tmp_path / "c"), policy)):
      began = time.monotonic()
      with pytest.raises(store.StoreUnavailable, match="did not answer"):
        attempt()
      assert time.monotonic() - began < 1.0 + 0.5 + 3.0               # the deadline, one request, slack


def test_a_process_waiting_on_a_stalled_index_download_gives_up(tmp_path):
  lock = str(tmp_path / "cache" / ".lock")
  with host_cache._host_lock(lock):                                   # noqa: SLF001 — the holder, stalled
    began = time.monotonic()
    with pytest.raises(store.StoreUnavailable, match="without any progress"):
      with host_cache._host_lock(lock, stall_s=0.5):                  # noqa: SLF001
        pass
    assert time.monotonic() - began < 3.0
