"""A small HTTP(S) server on 127.0.0.1 in a thread of the test process, for the network tests:
it answers ``GET /big/N`` with N bytes and any other path with a line naming the path and Host."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Generator
from contextlib import contextmanager
from typing import cast

__all__ = ("WebServer", "serving")


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
