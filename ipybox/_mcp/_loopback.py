"""A person authorizes in their browser; the redirect comes back to a listener on 127.0.0.1.

The authorization URL comes from the remote server's authorization server, which may be hostile:
it is opened only if it is HTTPS (or HTTP to this machine), and shown in full so that the person
sees where it leads. Anything on this machine can connect to the listener, so it answers only a
GET of the redirect path that carries the ``state`` of this authorization, and keeps waiting
otherwise.
"""

from __future__ import annotations

import contextlib
import html
import sys
import urllib.parse
import webbrowser
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.to_thread

from ipybox._exceptions import UsageError

from ._oauth import AuthorizationRequest, printable

__all__ = ("LoopbackAuthorizer",)

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# A browser's request line and headers fit in this; more is not a browser.
_MAX_REQUEST = 16384


class LoopbackAuthorizer:
    """Authorizes in the host's browser: opens the authorization URL, waits for the redirect on
    the redirect URI's port of 127.0.0.1 (what ``ipybox generate --oauth`` uses).

    Args:
        open_browser: Opens a URL for the person (default `webbrowser.open`); None only prints it.
        timeout: Seconds to wait for the person.
    """

    def __init__(
        self, *, open_browser: Callable[[str], object] | None = webbrowser.open, timeout: float = 600.0
    ) -> None:
        self.open_browser = open_browser
        self.timeout = timeout

    async def __call__(self, request: AuthorizationRequest) -> str:
        target = urllib.parse.urlsplit(request.url)
        if target.scheme != "https" and not (target.scheme == "http" and target.hostname in _LOOPBACK):
            raise UsageError(
                f"MCP server {request.server!r}: the authorization URL {printable(request.url, 200)!r} is neither "
                "HTTPS nor on this machine; ipybox does not open it"
            )
        state = urllib.parse.parse_qs(target.query).get("state", [""])[0]
        redirect = urllib.parse.urlsplit(request.redirect_uri)
        if redirect.scheme != "http" or redirect.hostname not in _LOOPBACK or not redirect.port:
            raise UsageError(
                f"the redirect URI {request.redirect_uri!r} is not http://127.0.0.1:PORT/...; the browser flow "
                "listens on this machine only"
            )
        landed: list[str] = []
        done = anyio.Event()
        try:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=redirect.port)
        except OSError as exc:
            raise UsageError(
                f"cannot listen on 127.0.0.1:{redirect.port} for the authorization redirect ({exc.strerror}); set "
                "another port in the server's oauth.redirect_uri"
            ) from None

        async def answer(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                query = await _read_callback(stream, redirect.path or "/")
                got = urllib.parse.parse_qs(query or "").get("state", [""])[0]
                if query is None or not state or got != state:
                    await _respond(stream, 400, "This is not the authorization ipybox is waiting for.")
                    return
                await _respond(stream, 200, "ipybox received the authorization; you can close this tab.")
                landed.append(f"{request.redirect_uri}?{query}")
                done.set()

        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, answer)
            print(
                f"ipybox: authorize access to MCP server {request.server!r} in your browser; if it does not open, "
                f"open this URL:\n  {printable(request.url, 4000)}",
                file=sys.stderr,
            )
            if self.open_browser is not None:
                await anyio.to_thread.run_sync(self.open_browser, request.url)
            with anyio.move_on_after(self.timeout):
                await done.wait()
            tg.cancel_scope.cancel()
        if not landed:
            raise UsageError(f"MCP server {request.server!r}: no authorization arrived within {self.timeout:g} s")
        return landed[0]


async def _read_callback(stream: anyio.abc.SocketStream, path: str) -> str | None:
    """The query of a ``GET <path>?...`` request, or None for anything else."""
    data = b""
    with anyio.move_on_after(10):
        while b"\r\n\r\n" not in data and len(data) < _MAX_REQUEST:
            try:
                data += await stream.receive(4096)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] != "GET":
        return None
    target = urllib.parse.urlsplit(parts[1])
    return target.query if target.path == path else None


async def _respond(stream: anyio.abc.SocketStream, status: int, text: str) -> None:
    body = f"<!doctype html><title>ipybox</title><p>{html.escape(text)}</p>".encode()
    reason = "OK" if status == 200 else "Bad Request"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
    )
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(head.encode() + body)
