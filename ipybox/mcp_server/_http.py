"""The MCP server's transports: stdio, and streamable HTTP behind an optional bearer token; the command line."""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import anyio
from mcp.server.transport_security import TransportSecuritySettings

from ipybox._exceptions import UsageError

from ._config import TOKEN_ENV, ServerConfig, add_arguments, bearer_token, check_exposure, config_from_args
from ._events import RETRY_MS, BoundedEventStore
from ._server import build_server

__all__ = ("main", "run_parsed", "serve")

_ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]


_UNAUTHORIZED = (
    f"missing or wrong bearer token: send the header 'Authorization: Bearer <token>' with every request, "
    f"<token> being the one this server was started with ({TOKEN_ENV} or --bearer-token)"
)


def _require_bearer(app: _ASGIApp, token: str) -> _ASGIApp:
    expected = f"Bearer {token}".encode()

    async def guarded(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            headers = cast("list[tuple[bytes, bytes]]", scope.get("headers", []))
            given = next((v for k, v in headers if k.lower() == b"authorization"), b"")
            if not secrets.compare_digest(given, expected):
                body = json.dumps({"error": _UNAUTHORIZED}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


async def serve(
    config: ServerConfig,
    *,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
) -> None:
    """Serve ipybox over MCP until stdin closes (stdio) or the process is stopped (HTTP).

    Over HTTP the address it listens on is printed to stderr as ``ipybox MCP server listening on URL``.

    Args:
        config: The server configuration.
        transport: ``"stdio"`` or ``"http"`` (streamable HTTP at ``/mcp``).
        host: HTTP: the address to listen on.
        port: HTTP: the port (0 picks a free one).
        token: HTTP: require this bearer token (required unless ``host`` is a loopback address).

    Raises:
        UsageError: HTTP on a non-loopback address without a token.
    """
    if transport == "stdio":
        await build_server(config).run_stdio_async()
        return
    check_exposure(host, token)
    import uvicorn

    server = build_server(config, shared=True)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=host in ("127.0.0.1", "localhost", "::1"),
        allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=[f"http://{host}:*", "http://127.0.0.1:*", "http://localhost:*"],
    )
    app: Any = server.streamable_http_app(
        session_idle_timeout=config.idle_ttl,
        transport_security=security,
        host=host,
        # Event ids and a retry hint: a client that loses the connection during a long cell resumes it.
        event_store=BoundedEventStore(),
        retry_interval=RETRY_MS,
    )
    if token is not None:
        app = _require_bearer(app, token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listen before announcing the address: uvicorn only starts listening once its startup has run, and a
    # client that reads the announcement first would be refused. Connections wait in the backlog instead.
    sock.listen(2048)
    bound = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    print(f"ipybox MCP server listening on http://{host}:{bound}/mcp", file=sys.stderr, flush=True)
    await uv.serve(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the MCP server from the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m ipybox.mcp_server")
    add_arguments(parser)
    return run_parsed(parser.parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run the MCP server with arguments parsed by a parser `add_arguments` set up."""
    try:
        config = config_from_args(args)
    except UsageError as exc:
        print(f"ipybox mcp: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        anyio.run(
            lambda: serve(config, transport=args.transport, host=args.host, port=args.port, token=bearer_token(args))
        )
    except UsageError as exc:
        print(f"ipybox mcp: error: {exc}", file=sys.stderr)
        return 2
    return 0
