"""What one connection through the network proxy costs.

    uv run --frozen python bench/network.py [--runs N]

A local HTTP server on 127.0.0.1 (a thread of this process) answers ``GET /`` with 2 bytes. Kernel
code opens N fresh connections one after another, each a whole request and response:

- ``direct``: from this (host) process straight to the server, no proxy: the floor;
- ``http``: from the sandboxed kernel with urllib through the proxy (absolute-form GET), i.e. the
  forwarder in the kernel, the unix socket, the host proxy's checks and h11 parse, and its
  connection to the server;
- ``connect``: the same through a CONNECT tunnel (raw socket, one request inside it).

Prints the median wall-clock time per connection for each, and the host process's CPU time per
proxied connection (everything the host does for it, measured with ``time.process_time``). Also
times h11's parse of one request head alone. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import anyio

from ipybox import CodeExecutor, Network


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving() -> Generator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


KERNEL = """
import http.client, os, socket, time
proxy = os.environ["HTTP_PROXY"].removeprefix("http://")
host, port = proxy.split(":")
def http_once():
    c = http.client.HTTPConnection(proxy)
    c.request("GET", "http://web.test:{port}/")
    c.getresponse().read()
    c.close()
def connect_once():
    s = socket.create_connection((host, int(port)))
    s.sendall(b"CONNECT web.test:{port} HTTP/1.1\\r\\nHost: web.test\\r\\n\\r\\n")
    f = s.makefile("rb")
    while f.readline() not in (b"\\r\\n", b""):
        pass
    s.sendall(b"GET / HTTP/1.1\\r\\nHost: web.test\\r\\nConnection: close\\r\\n\\r\\n")
    f.read()
    s.close()
timings = {{}}
for name, once in (("http", http_once), ("connect", connect_once)):
    once()
    spans = []
    for _ in range({runs}):
        t = time.perf_counter()
        once()
        spans.append(time.perf_counter() - t)
    timings[name] = spans
import json
print(json.dumps(timings))
"""


def _direct(port: int, runs: int) -> list[float]:
    spans: list[float] = []
    for _ in range(runs):
        t = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", "/")
        c.getresponse().read()
        c.close()
        spans.append(time.perf_counter() - t)
    return spans


def _h11_parse(runs: int) -> float:
    import h11

    head = b"CONNECT api.example.org:443 HTTP/1.1\r\nHost: api.example.org:443\r\nUser-Agent: python-httpx/0.28\r\n\r\n"
    t = time.perf_counter()
    for _ in range(runs):
        parser = h11.Connection(h11.SERVER)
        parser.receive_data(head)
        parser.next_event()
    return (time.perf_counter() - t) / runs


async def main(runs: int) -> None:
    with serving() as web, tempfile.TemporaryDirectory() as tmp:
        port = web.server_address[1]
        network = Network(allow=[f"web.test:{port}", f"127.0.0.1:{port}"], hosts={"web.test": "127.0.0.1"})
        async with CodeExecutor(workspace=Path(tmp), network=network) as executor:
            direct = _direct(port, runs)
            cpu = time.process_time()
            result = await executor.execute(KERNEL.format(port=port, runs=runs))
            cpu = time.process_time() - cpu
    timings = json.loads(result.text)
    print(f"{'variant':<10} median ms per connection ({runs} runs)")
    print(f"{'direct':<10} {statistics.median(direct) * 1e3:.2f}")
    for name in ("http", "connect"):
        print(f"{name:<10} {statistics.median(timings[name]) * 1e3:.2f}")
    print(f"host CPU per proxied connection: {cpu / (2 * runs + 2) * 1e3:.2f} ms (includes the server thread)")
    print(f"h11 parse of one request head: {_h11_parse(10_000) * 1e6:.1f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    anyio.run(main, parser.parse_args().runs)
