"""The MCP server's transports: stdio, and streamable HTTP behind a bearer token (`serve`)."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ipybox._exceptions import UsageError

from ._build import build_server
from ._eventstore import RETRY_MS, BoundedEventStore
from ._options import (
    TOKEN_ENV,
    ServerConfig,
    check_exposure,
    is_loopback,
)

__all__ = ("serve",)


# A refused client is told what to do in the body, as a JSON-RPC error: the MCP SDK's client raises a
# JSON-RPC error body's message as it is, where it turns any other 401 into "Server returned an error
# response". Code -32001 is the one the MCP SDKs use for a failed authentication.
_UNAUTHORIZED_CODE = -32001
# The characters an RFC 6750 error_description may hold; anything else in a path becomes '?'.
_DESCRIPTION_CHARACTERS = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")


def _token_help(token_file: Path | None) -> str:
    """What a client refused for its token must do: where the token is, and how to choose one."""
    header = "send the header 'Authorization: Bearer <token>' with every request"
    if token_file is None:
        return f"{header}, <token> being the one this server was started with ({TOKEN_ENV} or --bearer-token)"
    return (
        f"the token is in {token_file} (new at each start; to keep one, start the server with "
        f"{TOKEN_ENV}=<token> or --bearer-token <token>); {header}"
    )


def _unauthorized_response(reason: str, advice: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of the 401 answer to a request refused for ``reason``."""
    # The status in the text as well: the MCP SDK's client raises the message alone.
    message = f"ipybox MCP server: 401 Unauthorized, {reason}; {advice}"
    challenge = 'Bearer realm="ipybox"'
    if reason != "no Authorization header":  # RFC 6750: a request that sent no credentials gets no error code
        description = _DESCRIPTION_CHARACTERS.sub("?", message)
        challenge += f', error="invalid_token", error_description="{description}"'
    # The message first and no spaces: Claude Code shows the body's first ~300 characters.
    body = {"error": {"message": message, "code": _UNAUTHORIZED_CODE}, "id": None, "jsonrpc": "2.0"}
    headers = [(b"content-type", b"application/json"), (b"www-authenticate", challenge.encode())]
    return headers, json.dumps(body, separators=(",", ":")).encode()


_log = logging.getLogger("ipybox.mcp_server")
# A refused client is logged once, then at most once per this many seconds with how many more it sent:
# a client retrying in a loop (or a local process guessing tokens) must not flood the log.
_REFUSAL_LOG_INTERVAL = 60.0
_REFUSAL_KEYS = 1024


@dataclass
class _Refusals:
    """The log of refused requests, rate-limited per client address and kind of refusal."""

    _last: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict[tuple[str, str], tuple[float, int]])

    def log(self, scope: Scope, reason: str, detail: str = "") -> None:
        client = cast("tuple[str, int] | None", scope.get("client"))
        address = client[0] if client else "an unknown client"
        key = (address, reason)
        now = time.monotonic()
        last, missed = self._last.get(key, (-_REFUSAL_LOG_INTERVAL, 0))
        if now - last < _REFUSAL_LOG_INTERVAL:
            self._last[key] = (last, missed + 1)
            return
        if len(self._last) >= _REFUSAL_KEYS:  # many addresses (127.0.0.0/8 is all loopback): forget the old
            self._last.clear()
        self._last[key] = (now, 0)
        more = f" ({missed} more since the last report)" if missed else ""
        _log.warning("refused a request from %s: %s%s%s", address, reason, detail, more)


def _bearer_refusal(given: bytes | None, expected: bytes) -> str | None:
    """Why a request with this ``Authorization`` header is refused, or None: it carries the token."""
    # Compared in constant time, whatever the header holds; the reason is worked out only once refused.
    if given is not None and secrets.compare_digest(given, expected):
        return None
    if given is None:
        return "no Authorization header"
    if not given.lower().startswith(b"bearer "):
        return "the Authorization header is not a bearer token"
    return "wrong bearer token"


def _guard(
    app: ASGIApp, token: str | None, security: TransportSecuritySettings, token_file: Path | None = None
) -> ASGIApp:
    """``app`` behind the checks of every HTTP request: Host and Origin (DNS rebinding), then the token.

    A request refused for its token is answered with what to do, naming ``token_file`` (where a token the
    server made up is) if given.
    """
    advice = _token_help(token_file)
    expected = f"Bearer {token}".encode() if token is not None else b""
    headers_check = TransportSecurityMiddleware(security)
    refusals = _Refusals()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            refused = await headers_check.validate_request(request)
            if refused is not None:
                # What a hostile page sent, quoted and cut: it goes into the operator's log.
                sent = {k: request.headers.get(k, "")[:100] for k in ("host", "origin")}
                refusals.log(
                    scope, bytes(refused.body).decode(), f" (Host {sent['host']!r}, Origin {sent['origin']!r})"
                )
                await refused(scope, receive, send)
                return
            if token is not None:
                headers = cast("list[tuple[bytes, bytes]]", scope.get("headers", []))
                given = next((v for k, v in headers if k.lower() == b"authorization"), None)
                reason = _bearer_refusal(given, expected)
                if reason is not None:
                    refusals.log(scope, reason)
                    response_headers, body = _unauthorized_response(reason, advice)
                    await send({"type": "http.response.start", "status": 401, "headers": response_headers})
                    await send({"type": "http.response.body", "body": body})
                    return
        await app(scope, receive, send)

    return guarded


def runtime_dir() -> Path:
    """Where the server writes the token it made up: ``$XDG_RUNTIME_DIR/ipybox``, else
    ``~/.local/share/ipybox/runtime`` (as Jupyter keeps its servers' tokens), private to the user.

    Raises:
        UsageError: The directory is a symlink, or another user's.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "ipybox" if base else Path.home() / ".local" / "share" / "ipybox" / "runtime"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UsageError(
            f"{path} is not a directory of yours: the server will not write its token there; remove it, or set "
            f"{TOKEN_ENV}"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def _write_token(path: Path, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(fd, 0o600)  # a file left from before keeps its mode through O_CREAT
        file.write(token + "\n")


async def serve(
    config: ServerConfig,
    *,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    no_token: bool = False,
) -> None:
    """Serve ipybox over MCP until stdin closes (stdio) or the process is stopped (HTTP).

    Over HTTP the address it listens on is printed to stderr as ``ipybox MCP server listening on URL``.
    Without a token, on a loopback address, it makes one up, writes it to ``mcp-<port>.token`` in
    `runtime_dir` (readable only by the user; removed when the server stops) and prints that file's
    path first. Refused requests are logged with the reason, at most once a minute per client and reason.

    Args:
        config: The server configuration.
        transport: ``"stdio"`` or ``"http"`` (streamable HTTP at ``/mcp``).
        host: HTTP: the address to listen on.
        port: HTTP: the port (0 picks a free one).
        token: HTTP: require this bearer token (required unless ``host`` is a loopback address).
        no_token: HTTP on a loopback address: require no token at all, so that every local process
            can run code in the kernels; not allowed with ``config.allow_register``.

    Raises:
        UsageError: HTTP on a non-loopback address without a token, or ``no_token`` with
            ``config.allow_register``.
    """
    if transport == "stdio":
        await build_server(config).run_stdio_async()
        return
    made_up = token is None and not no_token and is_loopback(host)
    if made_up:
        token = secrets.token_urlsafe(32)
    check_exposure(host, token, allow_register=config.allow_register)
    import uvicorn

    server = build_server(config, shared=True)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=is_loopback(host),
        allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=[f"http://{host}:*", "http://127.0.0.1:*", "http://localhost:*"],
    )
    # The guard checks these headers first and logs refusals, rate-limited; the SDK would log each again.
    logging.getLogger("mcp.server.transport_security").setLevel(logging.ERROR)
    app: Any = server.streamable_http_app(
        session_idle_timeout=config.idle_ttl,
        transport_security=security,
        host=host,
        # Event ids and a retry hint: a client that loses the connection during a long cell resumes it.
        event_store=BoundedEventStore(),
        retry_interval=RETRY_MS,
    )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listen before announcing the address: uvicorn only starts listening once its startup has run, and a
    # client that reads the announcement first would be refused. Connections wait in the backlog instead.
    sock.listen(2048)
    bound = sock.getsockname()[1]
    # Known before the guard is made: a client refused for its token is told which file holds the token.
    made_up_file = runtime_dir() / f"mcp-{bound}.token" if made_up else None
    app = _guard(app, token, security, made_up_file)
    token_file: Path | None = None

    def forget_token() -> None:
        if token_file is not None:
            token_file.unlink(missing_ok=True)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # On SIGTERM uvicorn shuts down, then raises the signal again, which ends the process
            # before `serve`'s own cleanup could run.
            try:
                await super().shutdown(sockets)
            finally:
                forget_token()

    uv = Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        if made_up_file is not None and token is not None:
            token_file = made_up_file
            _write_token(token_file, token)
            print(
                f"ipybox MCP server: its bearer token is in {token_file} (readable only by you); clients send "
                f"'Authorization: Bearer <token>'",
                file=sys.stderr,
                flush=True,
            )
        elif token is None:
            print("ipybox MCP server: no token (--no-token): every local process can run code here", file=sys.stderr)
        print(f"ipybox MCP server listening on http://{host}:{bound}/mcp", file=sys.stderr, flush=True)
        await uv.serve(sockets=[sock])
    finally:
        forget_token()
