"""Every remote call of the web reader and its tools is bounded, wherever it is made (ncjax.fileio makes every fsspec
filesystem, each request with a timeout): an index build (library and command), the audit's opening, the report's
and the filter's reads of score files end within their deadline against a store that never answers. Failures that
waiting cannot fix stop at once with their own line: a TLS certificate that does not verify, credentials refused
(HTTP 401 / 403) once more after a refresh. The training runs: tests/train/test_web_changes.py."""

import os
import re
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import multiprocess  # noqa: E402  (tests/multiprocess.py)
from gcs_server import GCSServer, RefusingStore  # noqa: E402
from helpers import ROOT  # noqa: E402
from latency_proxy import LatencyProxy  # noqa: E402
from ncjax import fileio  # noqa: E402
from ncjax.cli import web_report  # noqa: E402
from ncjax.data.web import dataset as web  # noqa: E402
from ncjax.data.web import index as web_index  # noqa: E402
from ncjax.data.web import store, subset  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402


def gcsfs_tries_once(monkeypatch):
  """gcsfs retries a request that failed fast for ~30 s itself before ncjax sees the error (a TLS failure among
  them); cut to one try, as tests/train/test_web_faults.py does, so that what ncjax decides is what is timed."""
  import gcsfs.core
  import gcsfs.retry
  once = gcsfs.retry.retry_request(retries=1)(gcsfs.core.GCSFileSystem._request.__wrapped__)
  monkeypatch.setattr(gcsfs.core.GCSFileSystem, "_request", once)


def _point_at(monkeypatch, env: dict) -> None:
  """gcsfs clients of this process talk to another server from now on (anonymously: fsspec read FSSPEC_GCS_TOKEN
  when it was imported)."""
  import fsspec
  import fsspec.config
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  monkeypatch.setitem(fsspec.config.conf, "gs", dict(fsspec.config.conf.get("gs", {}), token="anon"))
  fsspec.filesystem("gcs").clear_instance_cache()


def test_every_fsspec_filesystem_comes_from_fileio_with_its_requests_bounded():
  package = os.path.join(ROOT, "ncjax")
  makers = re.compile(r"url_to_fs\(|fsspec\.filesystem\(|fsspec\.open\(|fsspec\.open_files\(|GCSFileSystem\(|"
                      r"S3FileSystem\(|get_filesystem_class\(")
  found = []
  for directory, _, files in os.walk(package):
    for name in files:
      path = os.path.join(directory, name)
      if name.endswith(".py") and path != os.path.join(package, "fileio.py"):
        with open(path) as f:
          found += [f"{os.path.relpath(path, ROOT)}:{k}" for k, line in enumerate(f, 1) if makers.search(line)]
  assert not found, f"filesystems made outside ncjax.fileio.filesystem: {found}"
  with GCSServer() as server:
    fs, inner = fileio.filesystem(server.path("x"))
    assert inner.endswith("/x") and fs.requests_timeout == fileio.request_timeout_s() > 0   # gcsfs's default: None


def test_a_store_that_never_answers_ends_every_remote_call_within_its_deadline(tmp_path, monkeypatch):
  monkeypatch.setattr(fileio, "_bound", dict(fileio._bound))         # noqa: SLF001 — this test's bound stays here
  with GCSServer() as server, LatencyProxy(server.port, 3600.0) as stalled:
    root = server.path("web")
    web_synthetic.write_img2dataset(root, 0, shard_sizes=[20, 30], image_size=8, pool=2)
    fileio.write_text(server.path("audit", "scores", "manifest.json"), "{}")
    _point_at(monkeypatch, stalled.env)                              # every request is now held for an hour
    fileio.bound_requests(0.5)
    calls = {
        "index build": lambda: web_index.build_index(root, workers=1, deadline_s=1.0, request_timeout_s=0.5),
        "audit": lambda: web.open_dataset(root, use_index=False, policy=store.RetryPolicy(deadline_s=1.0)),
        "report": lambda: web_report.summarize(server.path("audit")),
        "filter": lambda: subset.choose(server.path("audit"), keep=0.5),
    }
    for what, call in calls.items():
      outcome = {}

      def run(call=call, outcome=outcome):
        try:
          call()
        except Exception as e:  # noqa: BLE001
          outcome["error"] = e

      began = time.monotonic()
      thread = threading.Thread(target=run, daemon=True)
      thread.start()
      thread.join(timeout=15)
      assert not thread.is_alive(), f"{what}: still waiting on the store after 15 s"
      assert isinstance(outcome.get("error"), fileio.StorageError), (what, outcome)
      assert "did not answer" in str(outcome["error"]), (what, outcome["error"])
      assert time.monotonic() - began < 1.0 + 0.5 + 4.0, what        # the deadline, one request, slack
    # the command: its own flags, one line
    env = multiprocess.env(dict(server.env, **stalled.env))
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ncjax.data.build", "--dataset=web", f"--manual_dir={root}",
                          "--workers=1", "--io_deadline_s=1", "--request_timeout_s=0.5"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "did not answer" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and time.monotonic() - began < 60


@pytest.mark.parametrize("status", [401, 403])
def test_credentials_refused_are_refreshed_once_then_stop_the_read_at_once(monkeypatch, status):
  # before issue 53 a 401 was retried for the whole deadline and reported as "the store did not answer"; a 403
  # stopped without a refresh
  with RefusingStore(status) as refusing:
    _point_at(monkeypatch, refusing.env)
    epoch = fileio.credentials_epoch()
    began = time.monotonic()
    with pytest.raises(store.StoreRefused, match="refused access .* again after the credentials were refreshed"):
      store.list_files("gs://bucket/web", ".tar", store.RetryPolicy(deadline_s=30.0))
    assert time.monotonic() - began < 5.0
    assert len(refusing.requests) == 2 and fileio.credentials_epoch() == epoch + 1   # one refresh, one more try


def test_a_tls_certificate_that_does_not_verify_stops_the_read_at_once(monkeypatch):
  gcsfs_tries_once(monkeypatch)
  with GCSServer(scheme="https") as server:                          # its own self-signed certificate
    _point_at(monkeypatch, server.env)
    began = time.monotonic()
    with pytest.raises(store.StoreRefused, match="TLS certificate does not verify .*CERTIFICATE_VERIFY_FAILED"):
      web.open_dataset(server.path("web"), policy=store.RetryPolicy(deadline_s=30.0))
    assert time.monotonic() - began < 5.0                            # not retried until the deadline
