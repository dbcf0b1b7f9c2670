"""`ncjax train` on img2dataset output (input.dataset='web:ROOT') as two real processes of one JAX job x 4 CPU
devices (tests/multiprocess.py), what each process read recorded by tests/plugins/record_web_ids.py:
* indexed: the global batch of a step is the same for any process count (positions [sB, (s+1)B) of one global
  order, process p reading its contiguous part), so 2 x 4 reads exactly 1 x 8's ids, split in halves, and ends with
  its parameters;
* streamed: each process streams its own shards, so the order depends on the process count; the two read disjoint
  pairs from disjoint shards, and a run stopped after step 2 (--until_step) and resumed ends bitwise where the
  uninterrupted 2-process run ends."""

import os

import jax
import numpy as np
import pytest

from helpers import ROOT
import multiprocess
from ncjax.data.web import dataset as web
from ncjax.data.web import index as web_index
from ncjax.data.web import synthetic as web_synthetic

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

N, PER_SHARD, STEPS, BATCH = 640, 80, 4, 32
PLUGIN = os.path.join(ROOT, "tests", "plugins", "record_web_ids.py")


@pytest.fixture(scope="module")
def webroot(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("webmp") / "data")
  web_synthetic.write_img2dataset(root, N, per_shard=PER_SHARD, image_size=24, pool=16, corrupt_images=(5,))
  web_index.build_index(root, workers=1)
  return root


def _train(root, mode, workdir, ids_dir, processes, *extra):
  os.makedirs(ids_dir, exist_ok=True)
  args = ["train", f"--config=configs/clip.py:data=web:{root},model=micro,batch={BATCH},epochs=1",
          f"--config.total_steps={STEPS}", f"--config.input.web.mode={mode}", "--config.input.web.window=2",
          "--config.ckpt.every_steps=1", "--config.log.progress=False",
          f"--plugins={PLUGIN}", f"--workdir={workdir}", *extra]
  logs = workdir + "_logs"
  codes = multiprocess.run(args, processes=processes, devices=8 // processes, log_dir=logs,
                           extra_env={"NCJAX_RECORD_IDS": ids_dir}, timeout=600)
  assert codes == [0] * processes, multiprocess.logs(logs)
  return logs


def _ids(ids_dir, process) -> dict[int, np.ndarray]:
  """{step: the ids process `process` read for it} (a step re-read after a resume: the same ids, checked)."""
  out = {}
  with open(os.path.join(ids_dir, f"process_{process}.txt")) as f:
    for line in f:
      step, *ids = map(int, line.split())
      if step in out:
        np.testing.assert_array_equal(out[step], ids)
      out[step] = np.asarray(ids)
  return out


def _params(workdir):
  from ncjax import checkpoint as ckpt_lib
  state, _, step = ckpt_lib.restore_state_on_host(workdir)
  assert step == STEPS
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(state)[0]}


def test_indexed_web_training_on_two_processes_equals_one_process(webroot, tmp_path):
  _train(webroot, "index", str(tmp_path / "one"), str(tmp_path / "ids1"), 1)
  _train(webroot, "index", str(tmp_path / "two"), str(tmp_path / "ids2"), 2)
  one = _ids(str(tmp_path / "ids1"), 0)
  halves = [_ids(str(tmp_path / "ids2"), p) for p in range(2)]
  assert sorted(one) == list(range(STEPS))
  for s in range(STEPS):   # process p read exactly its contiguous half of the one-process global batch
    np.testing.assert_array_equal(np.concatenate([halves[0][s], halves[1][s]]), one[s])
  a, b = _params(str(tmp_path / "one")), _params(str(tmp_path / "two"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_allclose(b[k], a[k], atol=2e-5, rtol=0, err_msg=k)


def test_streamed_web_training_on_two_processes_reads_disjoint_shards_and_resumes_bitwise(webroot, tmp_path):
  full, stopped = str(tmp_path / "full"), str(tmp_path / "stopped")
  _train(webroot, "stream", full, str(tmp_path / "ids_full"), 2)
  _train(webroot, "stream", stopped, str(tmp_path / "ids_stop"), 2, "--until_step=2")
  from ncjax import checkpoint as ckpt_lib
  assert ckpt_lib.restore_state_on_host(stopped)[2] == 2
  logs = _train(webroot, "stream", stopped, str(tmp_path / "ids_stop"), 2)
  assert "resumed from step" in multiprocess.logs(logs, tail=None)
  reads = [_ids(str(tmp_path / "ids_full"), p) for p in range(2)]
  for p in range(2):       # the stopped + resumed run read what the uninterrupted one read
    again = _ids(str(tmp_path / "ids_stop"), p)
    assert sorted(again) == sorted(reads[p]) == list(range(STEPS))
    for s in range(STEPS):
      np.testing.assert_array_equal(again[s], reads[p][s])
  seen = [np.concatenate([reads[p][s] for s in range(STEPS)]) for p in range(2)]
  assert all(len(np.unique(x)) == STEPS * BATCH // 2 for x in seen)   # the first epoch: no pair twice
  assert not set(seen[0]) & set(seen[1])                               # disjoint pairs ...
  assert not set(seen[0] // PER_SHARD) & set(seen[1] // PER_SHARD)     # ... from disjoint shards
  a, b = _params(full), _params(stopped)
  for k in a:
    np.testing.assert_array_equal(b[k], a[k], err_msg=k)
