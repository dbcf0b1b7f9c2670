"""A TCP proxy that holds every request for a fixed time before passing it on: a local object store (tests/
gcs_server.py answers in well under a millisecond) made to answer like a real bucket, whose first byte of a small
ranged GET takes tens of milliseconds (../shared/reference/pods.md §7).

A request is the first bytes a client sends after the server last answered on that connection (HTTP/1.1 keeps
connections alive: one connection carries many requests). Those bytes wait `latency` seconds, then everything flows
through unchanged, so every request — a ranged GET, a listing page, an upload — costs at least `latency` more than
it did. Connections are independent: requests in flight on N connections overlap, as they do against a real store.

The proxy runs in its own process (its event loop competes with nothing in the process being measured):

    with LatencyProxy(server.port, latency_s=0.025) as proxy:
        env = dict(server.env, **proxy.env)    # STORAGE_EMULATOR_HOST and friends now point at the proxy

or from a shell: `python tests/latency_proxy.py --target=PORT --latency_ms=25` (prints the port it listens on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

CHUNK = 1 << 16


async def _pipe(reader, writer, hold, state):
  """Copy reader -> writer; with `hold`, the first chunk after the other direction last sent waits `hold` s."""
  try:
    while True:
      data = await reader.read(CHUNK)
      if not data:
        break
      if hold is not None:
        if state["answered"]:
          state["answered"] = False
          await asyncio.sleep(hold)
      else:
        state["answered"] = True
      writer.write(data)
      await writer.drain()
  except (ConnectionError, asyncio.CancelledError):
    pass
  finally:
    try:
      writer.close()
    except Exception:   # noqa: BLE001 — the peer may already be gone
      pass


async def _serve(listen_port: int, target_port: int, latency_s: float, ready):
  async def handle(client_reader, client_writer):
    try:
      server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
      client_writer.close()   # the store is down: the client sees its connection closed, as with a dead host
      return
    state = {"answered": True}
    await asyncio.gather(_pipe(client_reader, server_writer, latency_s, state),
                         _pipe(server_reader, client_writer, None, state))

  server = await asyncio.start_server(handle, "127.0.0.1", listen_port, backlog=1024)
  ready(server.sockets[0].getsockname()[1])
  async with server:
    await server.serve_forever()


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class LatencyProxy:
  """`latency_s` added to every request sent to 127.0.0.1:`target_port`, served on 127.0.0.1:`port`."""

  def __init__(self, target_port: int, latency_s: float):
    self.target_port, self.latency_s = int(target_port), float(latency_s)
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.process = None

  @property
  def env(self) -> dict:
    """The variables of tests/gcs_server.py's `env`, pointed at the proxy."""
    return dict(STORAGE_EMULATOR_HOST=self.url, TENSORSTORE_GCS_HTTP_URL=self.url,
                CLOUD_STORAGE_EMULATOR_ENDPOINT=self.url)

  def start(self) -> "LatencyProxy":
    self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), f"--target={self.target_port}",
                                     f"--latency_ms={1000 * self.latency_s}", f"--port={self.port}"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = self.process.stdout.readline()
    if not line.startswith("listening"):
      raise RuntimeError("the latency proxy did not start")
    return self

  def stop(self) -> None:
    if self.process is not None:
      self.process.kill()
      self.process.wait()
      self.process = None

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()


def measure_first_byte(url: str, tries: int = 5) -> float:
  """Median seconds for a GET of `url` through a fresh connection each time (a check that the proxy holds)."""
  import urllib.request
  times = []
  for _ in range(tries):
    t = time.perf_counter()
    urllib.request.urlopen(url, timeout=10).read()
    times.append(time.perf_counter() - t)
  return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", type=int, required=True, help="the port of the server on 127.0.0.1")
  parser.add_argument("--latency_ms", type=float, default=25.0)
  parser.add_argument("--port", type=int, default=0, help="the port to listen on (0: any free one)")
  args = parser.parse_args(argv)

  def ready(port):
    print(f"listening on 127.0.0.1:{port}", flush=True)

  try:
    asyncio.run(_serve(args.port, args.target, args.latency_ms / 1000.0, ready))
  except KeyboardInterrupt:
    pass
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
