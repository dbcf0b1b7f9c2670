"""A web run whose data changes, or whose store refuses it, mid-run: a local shard written in place under the
reader's open descriptor stops the run with one line naming it (data errors' exit status), its last checkpoint
intact and its readers closed; a store whose TLS certificate does not verify, or that refuses the credentials,
stops the command at once with its own line (slow). The reads themselves: tests/data/test_web_pins.py and
tests/data/test_web_bounds.py."""

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
from gcs_server import GCSServer, RefusingStore  # noqa: E402
from helpers import ROOT, tiny_clip_config  # noqa: E402
from ncjax import checkpoint as ckpt_lib  # noqa: E402
from ncjax import train  # noqa: E402
from ncjax.data.web import index as web_index  # noqa: E402
from ncjax.data.web import store  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402

SIZES = [90, 150, 70, 130, 110, 80]     # 630 pairs in unequal shards (tests/train/test_web_faults.py's)
READER_THREADS = ("ncjax-pread", "ncjax-web-fetch", "ncjax-web-decode")


def _local_data(root: str) -> str:
  web_synthetic.write_img2dataset(root, 0, shard_sizes=SIZES, image_size=16, pool=8)
  past = time.time() - 3600   # written well before the run lists it: a write in place moves the mtime on any clock
  for name in os.listdir(root):
    os.utime(os.path.join(root, name), (past, past))
  web_index.build_index(root, workers=1)
  return root


def _readers_alive() -> list[str]:
  return [t.name for t in threading.enumerate() if t.name.startswith(READER_THREADS)]


def test_a_shard_written_in_place_mid_run_stops_it_with_its_last_checkpoint_intact_and_readers_closed(tmp_path):
  root = _local_data(str(tmp_path / "d"))
  # tests/train/test_web_faults.py's run (its compiled step is shared within a worker), read from local disk
  cfg = tiny_clip_config(arg="batch=32,epochs=2", total_steps=24, **{
      "input.prefetch": 1, "input.dataset": f"web:{root}", "input.web.read": "block", "input.web.block": 16,
      "input.web.shuffle_pairs": 32, "input.web.window_batches": 1, "input.web.cache_dir": str(tmp_path / "c"),
      "input.web.io_deadline_s": 120.0, "ckpt.every_steps": 3})   # (a save costs ~0.6 s here)
  shard = os.path.join(root, "00001.tar")

  def hook(step, state, writer):
    del state, writer
    if step == 3:
      with open(shard, "r+b") as f:                                  # `cp` over it: the same inode
        data = f.read()
        f.seek(0)
        f.write(data.replace(b"skyline", b"SKYLINE"))

  workdir = str(tmp_path / "run")
  with pytest.raises(store.ShardChanged, match=r"00001.tar changed since this run listed it") as raised:
    train.train(cfg, workdir, evaluate=hook)
  assert _readers_gone(), _readers_alive()
  assert raised.value.status == 3                                    # data (ncjax.errors)
  saved = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
  assert saved and 3 <= saved[-1] < 24, saved
  state, _, step = ckpt_lib.restore_state_on_host(workdir)           # the last checkpoint restores whole
  assert step == saved[-1] and int(np.asarray(state["step"])) == step
  # a run stopped by anything else (here its evaluation hook) while its reader waits between batches closes it too
  web_index.build_index(root, workers=1)                             # the changed shard indexed as it is now

  def failing_hook(step, state, writer):
    if step == 2:
      raise RuntimeError("the hook stops the run")

  with pytest.raises(RuntimeError, match="the hook stops the run"):
    train.train(cfg, str(tmp_path / "second"), evaluate=failing_hook)
    # (the error still holds the run's frames)
  assert _readers_gone(), _readers_alive()


def _readers_gone(wait_s: float = 5.0) -> bool:
  """No reader thread alive within `wait_s` (a fetch thread waiting on its last read ends when it returns)."""
  deadline = time.monotonic() + wait_s
  while _readers_alive() and time.monotonic() < deadline:
    time.sleep(0.05)
  return not _readers_alive()


def _cli(args, env, tmp_path, *extra):
  return subprocess.run([sys.executable, "-m", "ncjax.main", "train", *args, "--config.log.progress=False",
                         f"--workdir={tmp_path / 'run'}", *extra], cwd=ROOT, env=multiprocess.env(env),
                        capture_output=True, text=True, timeout=600)


def _one_line(out) -> str:
  errors = [line for line in out.stderr.splitlines() if line.startswith("ncjax: error:")]
  assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  return errors[0]


def _write_in_place_after_reads(monkeypatch, shard: str, reads: int) -> None:
  """After the first `reads` ranged reads of the local `shard`, the shard is written over in place (its captions
  changed, every byte where it was: the index's offsets still fit) while the reader's descriptor of it is open: what
  tests/plugins/change_shard_mid_read.py does to a `ncjax train` process, here for this test only."""
  pread = store._LocalFiles.pread   # noqa: SLF001
  count = {"reads": 0, "lock": threading.Lock()}

  def changing_pread(self, path, start, end, pin=""):
    if path == shard:
      with count["lock"]:
        count["reads"] += 1
        if count["reads"] == reads + 1:
          with open(path, "r+b") as f:   # `cp` of a re-downloaded shard over this one: the same inode
            data = f.read()
            f.seek(0)
            f.write(data.replace(b"skyline", b"SKYLINE"))
    return pread(self, path, start, end, pin)

  monkeypatch.setattr(store._LocalFiles, "pread", changing_pread)   # noqa: SLF001


def test_a_shard_written_in_place_under_an_open_descriptor_stops_ncjax_train_with_one_line(tmp_path, monkeypatch):
  # per-pair reads (the default on local disk): before issue 53, 230 of the shard's 346 later pairs were trained
  # with the new captions and the run went on. The command runs in this process (its main(argv): the error's one
  # line and exit status are main's; tests/cli/test_errors.py keeps a real process's)
  root = _local_data(str(tmp_path / "d"))
  shard = os.path.join(root, "00001.tar")
  _write_in_place_after_reads(monkeypatch, shard, 3)
  out = cli_in_process.run(["train", f"--config=clip:data=web:{root},model=micro,batch=32,epochs=2",
                            "--config.log.progress=False", f"--workdir={tmp_path / 'run'}"], cwd=ROOT)
  assert out.returncode == 3, out.stderr[-3000:]                     # data (ncjax.errors)
  line = _one_line(out)
  assert shard in line and "changed since this run listed it" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("store_kind", ["tls", "refusing"])
def test_a_store_that_will_never_serve_the_run_stops_ncjax_train_at_once(tmp_path, store_kind):
  # before issue 53 both were retried for input.web.io_deadline_s (300 s), then reported as "the store did not
  # answer". (make test-all: tests/data/test_web_bounds.py makes the same decisions through the library in make test)
  plugin = os.path.join(ROOT, "tests", "plugins", "gcsfs_one_try.py")   # gcsfs's own ~30 s of tries, cut
  args = ["--config=clip:data=web:gs://ncjax-test/web,model=micro,batch=32", f"--plugins={plugin}",
          f"--config.input.web.cache_dir={tmp_path / 'c'}", "--config.input.web.io_deadline_s=30"]
  if store_kind == "tls":
    with GCSServer(scheme="https") as server:                        # its own self-signed certificate
      began = time.monotonic()
      out = _cli(args, server.env, tmp_path)
  else:
    with RefusingStore(401) as refusing:                             # a store that answers 401 to everything
      began = time.monotonic()
      out = _cli(args, refusing.env, tmp_path)
    assert len(refusing.requests) == 2                               # once, and once after a credential refresh
  waited = time.monotonic() - began
  assert out.returncode == 5, out.stderr[-3000:]                     # storage (ncjax.errors)
  line = _one_line(out)
  expected = "TLS certificate does not verify" if store_kind == "tls" else \
      "refused access (HttpError: Anonymous caller does not have storage.objects.list access, 401) again after " \
      "the credentials were refreshed"
  assert expected in line, line
  assert waited < 30, waited                                         # the command's start-up, not the deadline
