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
    def __init__(self, client: socket.socket, host: socket.socket, preamble: bytes) -> None:
        self.client = _Side(client)
        self.host = _Side(host)
        self.host.out += preamble
        self.closed = False

    def peer(self, side: _Side) -> _Side:
        return self.host if side is self.client else self.client


class _Forwarder:
    def __init__(self, socket_path: str, token: str) -> None:
        self._path = socket_path
        self._preamble = token.encode() + b"\n"
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
            client, _ = self.listener.accept()
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
        pair = _Pair(client, host, self._preamble)
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
    return port
