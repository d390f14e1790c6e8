"""The HTTP the network proxy speaks: the one request head a connection starts with, and error replies.

A connection from the kernel's forwarder starts with one HTTP/1.1 request head, read here with h11
(at most `MAX_HEAD_BYTES`): ``CONNECT host:port`` (a tunnel) or an absolute-form ``http://`` request,
rewritten to origin form with ``Connection: close`` and without hop-by-hop and ``Proxy-*`` headers.
Anything else, or a host or port that is not one, is `Refused` with a 4xx reply whose reason phrase
says why (clients show it for a failed CONNECT).
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import anyio.abc
import h11

from ._policy import HOST_LABEL, normalize_host, parse_ip

__all__ = ("MAX_HEAD_BYTES", "Refused", "Target", "error_reply", "read_head")

# A request head larger than this is refused (real ones are a few hundred bytes).
MAX_HEAD_BYTES = 16 * 1024
# What one read of the head takes; bytes after the head (a body, tunnel data) are handed on.
_RECEIVE_CHUNK = 64 * 1024
# Headers that describe the hop to the proxy, not the request: never passed on.
_HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-authorization", b"proxy-connection", b"te", b"upgrade"})


class Refused(Exception):
    """The connection is refused with HTTP ``status``.

    ``reason`` becomes the reply's reason phrase and the `NetworkEvent`'s reason, ``kind`` its kind.
    """

    def __init__(self, status: int, reason: str, kind: str = "denied") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.kind = kind


@dataclass
class Target:
    """Where one connection asks to go."""

    host: str
    port: int
    connect: bool
    head: bytes = b""
    """For plain HTTP: the request head to send upstream (origin-form, ``Connection: close``)."""


async def read_head(stream: anyio.abc.SocketStream, buffered: bytes) -> tuple[Target, bytes]:
    """Read one request head; the target, and the bytes after the head (body or tunnel data)."""
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    if buffered:  # h11 takes empty data for the end of the stream
        parser.receive_data(buffered)
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                raise Refused(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes") from None
            raise Refused(400, f"not an HTTP/1.1 proxy request ({_printable(str(exc))})") from None
        if isinstance(event, h11.Request):
            break
        if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            raise anyio.EndOfStream
        data = await stream.receive(_RECEIVE_CHUNK)
        parser.receive_data(data)
    rest, _ = parser.trailing_data
    return _target(event), rest


def _target(request: h11.Request) -> Target:
    raw = request.target.decode("ascii", "replace")
    if request.method == b"CONNECT":
        host, port = _authority(raw)
        if port is None:
            raise Refused(400, "CONNECT needs host:port")
        return Target(host, port, connect=True)
    scheme, sep, rest = raw.partition("://")
    if scheme.lower() != "http" or not sep:
        raise Refused(
            400,
            "the proxy takes CONNECT (for https and other TCP) and absolute http:// URLs; set HTTP_PROXY "
            "and HTTPS_PROXY to it rather than sending other requests",
        )
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    # Userinfo is not sent on: it is no part of where the request goes.
    host, port = _authority(rest[:end].rpartition("@")[2])
    target = Target(host, port or 80, connect=False)
    path = rest[end:].partition("#")[0]
    if not path.startswith("/"):
        path = "/" + path
    fields = {name.lower() for name, _ in request.headers.raw_items()}
    if b"transfer-encoding" in fields and b"content-length" in fields:
        # Two framings of one body: the proxy and the server could read different requests from it.
        raise Refused(400, "the request has both Transfer-Encoding and Content-Length; send one")
    lines = [request.method + b" " + path.encode("ascii", "replace") + b" HTTP/1.1"]
    # The request goes where its URL says; its Host is that URL's host (RFC 9112 3.2.2), whatever the
    # client's Host field said, so that the server sees the destination that was decided.
    bracketed = f"[{host}]" if ":" in host else host
    lines.append(b"Host: " + (bracketed if target.port == 80 else f"{bracketed}:{target.port}").encode("ascii"))
    for name, value in request.headers.raw_items():
        if name.lower() not in _HOP_HEADERS and name.lower() != b"host":
            lines.append(name + b": " + value)
    lines.append(b"Connection: close")
    target.head = b"\r\n".join(lines) + b"\r\n\r\n"
    return target


def _authority(text: str) -> tuple[str, int | None]:
    """The host and port (None if absent) of ``host[:port]``: a name, an IPv4 address, or an IPv6
    address in brackets."""
    if text.startswith("["):
        end = text.find("]")
        inside, after = text[1:end], text[end + 1 :]
        address = parse_ip(inside) if end > 0 else None
        if address is None or address.version != 6 or (after and not after.startswith(":")):
            raise Refused(
                400, f"{_printable(text)!r} is not host:port (brackets hold an IPv6 address, then only ':PORT')"
            )
        return _host(inside), _port(after[1:]) if after else None
    host, sep, port = text.partition(":")
    if ":" in port:
        raise Refused(400, f"{_printable(text)!r} is not host:port (write an IPv6 address in brackets)")
    return _host(host), _port(port) if sep else None


def _host(host: str) -> str:
    host = normalize_host(host)
    if parse_ip(host) is None and (len(host) > 253 or not all(HOST_LABEL.match(label) for label in host.split("."))):
        raise Refused(400, f"{_printable(host)!r} is not a host name or IP address")
    return host


def _port(port: str) -> int:
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise Refused(400, f"the port must be 1-65535, got {_printable(port)!r}")
    return int(port)


def _printable(text: str, limit: int = 200) -> str:
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in text[:limit])


def error_reply(status: int, reason: str) -> bytes:
    """An error reply; the reason phrase carries the message, since clients show it for a failed CONNECT."""
    phrase = _printable(f"ipybox: {reason}", 2000)
    body = (phrase + "\n").encode("ascii")
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
