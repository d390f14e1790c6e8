"""The kernel's end of network egress: a forwarder on the sandbox's own loopback.

The sandbox has no network but its loopback. When the host runs a network proxy for the executor
(``IPYBOX_NET_SOCKET`` is set), the launcher starts this forwarder before any user code: it listens
on ``127.0.0.1`` at a free port, points ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` (and their
lower-case forms) at it, and passes every connection's bytes unchanged to the host's proxy over the
unix socket, after one line holding the executor's token. The forwarder decides nothing: the host
checks every destination, so code that talks to the unix socket itself gains nothing.

``NO_PROXY`` names the sandbox's own loopback (``localhost``, ``127.0.0.1``, ``::1``): a server the
code starts in the sandbox is reached directly, never mistaken for one on the host.

One thread multiplexes all connections with `selectors` (no thread per connection); each direction
buffers at most `_BUFFER` bytes before it stops reading, so a slow reader holds back its writer.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading

from ._protocol import NET_SOCKET_ENV, TOKEN_ENV

__all__ = ("start_forwarder",)

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
_LOCAL = "localhost,127.0.0.1,::1"
_BUFFER = 256 * 1024
# How long reaching the host's proxy socket may take before the client's connection is dropped.
_CONNECT_TIMEOUT = 10.0


class _Side:
    """One socket of a pair, and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.eof = False  # nothing more will be read from it
        self.shut = False  # its write side was shut down
        self.registered = False


class _Pair:
    def __init__(self, client: socket.socket, host: socket.socket, client_port: int) -> None:
        self.client = _Side(client)
        self.host = _Side(host)
        self.client_port = client_port
        self.started = False  # the first line went to the host (with the client's first bytes)
        self.closed = False

    def peer(self, side: _Side) -> _Side:
        return self.host if side is self.client else self.client


class _Forwarder:
    def __init__(self, socket_path: str, token: str) -> None:
        self._path = socket_path
        self._token = token.encode()
        self._selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ, None)

    def run(self) -> None:
        while True:
            for key, mask in self._selector.select():
                if key.data is None:
                    self._accept()
                    continue
                pair, side = key.data
                try:
                    self._service(pair, side, mask)
                except OSError:
                    self._close(pair)

    def _accept(self) -> None:
        try:
            client, address = self.listener.accept()
        except OSError:
            return
        host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            host.settimeout(_CONNECT_TIMEOUT)
            host.connect(self._path)
        except OSError:
            host.close()
            client.close()
            return
        client.setblocking(False)
        host.setblocking(False)
        pair = _Pair(client, host, address[1])
        for side in (pair.client, pair.host):
            self._update(pair, side)

    def _interest(self, pair: _Pair, side: _Side) -> int:
        mask = 0
        if not side.eof and len(pair.peer(side).out) < _BUFFER:
            mask |= selectors.EVENT_READ
        if side.out:
            mask |= selectors.EVENT_WRITE
        return mask

    def _service(self, pair: _Pair, side: _Side, mask: int) -> None:
        peer = pair.peer(side)
        if mask & selectors.EVENT_READ:
            data = side.sock.recv(_BUFFER)
            if data and not pair.started:
                # The first line waits for the client's first bytes: by then the code that connected
                # has noted its line (_note_line runs when connect() returns, before it sends).
                pair.started = True
                line = _LINES.pop(pair.client_port, None)
                peer.out += self._token + (b"" if line is None else b" %d" % line) + b"\n"
            if data:
                peer.out += data
            else:
                side.eof = True
        if mask & selectors.EVENT_WRITE and side.out:
            sent = side.sock.send(side.out)
            del side.out[:sent]
        for one in (side, peer):
            other = pair.peer(one)
            if other.eof and not one.out and not one.shut:
                # The other end finished and all it sent was delivered: pass its EOF on.
                one.shut = True
                one.sock.shutdown(socket.SHUT_WR)
        if pair.client.shut and pair.host.shut:
            self._close(pair)
            return
        for one in (side, peer):
            self._update(pair, one)

    def _update(self, pair: _Pair, side: _Side) -> None:
        # A selector takes no empty interest: a side with nothing to do leaves it until its peer
        # has drained the buffer it was waiting on.
        mask = self._interest(pair, side)
        if mask and side.registered:
            self._selector.modify(side.sock, mask, (pair, side))
        elif mask:
            self._selector.register(side.sock, mask, (pair, side))
        elif side.registered:
            self._selector.unregister(side.sock)
        side.registered = bool(mask)

    def _close(self, pair: _Pair) -> None:
        if pair.closed:
            return
        pair.closed = True
        for side in (pair.client, pair.host):
            if side.registered:
                self._selector.unregister(side.sock)
                side.registered = False
            side.sock.close()


def start_forwarder() -> int | None:
    """Start the forwarder if the host runs a proxy for this kernel, and point the proxy variables
    at it; its port, or None when the kernel has no network."""
    path = os.environ.get(NET_SOCKET_ENV)
    token = os.environ.get(TOKEN_ENV)
    if not path or not token:
        return None
    forwarder = _Forwarder(path, token)
    port = forwarder.listener.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    for name in _PROXY_VARS:
        os.environ[name] = os.environ[name.lower()] = url
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = _LOCAL
    threading.Thread(target=forwarder.run, name="ipybox-network", daemon=True).start()
    _note_lines_of_connections_to(port)
    return port


# The line of the running cell that opened each connection to the forwarder, by the connection's
# port on the sandbox's loopback, until the forwarder takes it; at most _MAX_LINES kept. Kernel code
# can write here (it can write anything in the kernel): the host shows a line only from its own copy
# of the code, so a forgery can point at another line of it, no more (SECURITY.md).
_LINES: dict[int, int] = {}
_MAX_LINES = 1024


def _note_lines_of_connections_to(port: int) -> None:
    """Note the calling line of every connection made to the forwarder at ``port`` (a client going
    through HTTP_PROXY), for the host's approval of its destination."""
    from ._client import call_site

    real = socket.socket.connect

    def connect(self: socket.socket, address: object) -> None:
        try:
            real(self, address)  # pyright: ignore[reportArgumentType]
        finally:
            # Also after BlockingIOError: a non-blocking connect has its local port already.
            if isinstance(address, tuple) and address[:2] == ("127.0.0.1", port):
                _note_line(self, call_site().line)

    socket.socket.connect = connect


def _note_line(sock: socket.socket, line: int | None) -> None:
    if line is None:
        return
    try:
        local = sock.getsockname()[1]
    except OSError:
        return
    while len(_LINES) >= _MAX_LINES:
        _LINES.pop(next(iter(_LINES)), None)
    _LINES[local] = line
