"""A small HTTP(S) server on 127.0.0.1 in a thread of the test process, for the network tests:
it answers ``GET /big/N`` with N bytes and any other path with a line naming the path and Host;
and a `Sink` that counts the bytes it is sent; and helpers to talk to a proxy and read its log."""

from __future__ import annotations

import http.server
import logging
import socket
import ssl
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import anyio

__all__ = ("Sink", "WebServer", "exchange", "proxy_log", "serving")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        cast("WebServer", self.server).paths.append(self.path)
        if self.path.startswith("/big/"):
            body = b"x" * int(self.path.removeprefix("/big/"))
        else:
            body = f"hello {self.path} for {self.headers['Host']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class WebServer(http.server.ThreadingHTTPServer):
    """Records the paths it was asked for."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.paths: list[str] = []
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    @property
    def port(self) -> int:
        return self.server_address[1]


@contextmanager
def serving(tls: ssl.SSLContext | None = None) -> Generator[WebServer]:
    server = WebServer(tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Sink:
    """A TCP server on 127.0.0.1 that reads every connection to its end and counts what arrived:
    what the network proxy forwarded there."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.received = 0
        self.accepted = 0
        self._open = 0
        self._changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._changed:
                self.accepted += 1
                self._open += 1
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        with connection:
            while True:
                try:
                    data = connection.recv(256 * 1024)
                except OSError:
                    data = b""
                with self._changed:
                    self.received += len(data)
                    if not data:
                        self._open -= 1
                        self._changed.notify_all()
                        return

    def settled(self, connections: int, timeout: float = 60.0) -> int:
        """What arrived, once ``connections`` were accepted and all of them have ended."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.accepted >= connections and self._open == 0, timeout):
                raise TimeoutError(f"the sink accepted {self.accepted} of {connections} connections, {self._open} open")
            return self.received

    def close(self) -> None:
        self._listener.close()


@contextmanager
def proxy_log() -> Generator[list[logging.LogRecord]]:
    """The records the network proxy logs (logger ``ipybox.network``) while in the block."""
    records: list[logging.LogRecord] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Recorder()
    log = logging.getLogger("ipybox.network")
    log.addHandler(handler)
    try:
        yield records
    finally:
        log.removeHandler(handler)


async def exchange(path: Path, data: bytes) -> bytes:
    """Send ``data`` into the proxy socket at ``path``; everything that comes back."""
    async with await anyio.connect_unix(path) as stream:
        await stream.send(data)
        received = b""
        with anyio.fail_after(30):
            try:
                while True:
                    received += await stream.receive()
            # A reply to a request the proxy did not read to its end may be cut off by a reset.
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return received
