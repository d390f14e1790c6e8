"""An MCP server behind OAuth 2.1, with its own authorization server, on 127.0.0.1 (for the tests).

Usage: ``python oauth_server.py LOG [--lifetime S] [--hostile-resource URL] [--issuer-path /P]``.
Prints ``URL <mcp url>``.

- Protected resource metadata and authorization server metadata at the well-known URLs, dynamic
  client registration, an authorization endpoint that approves at once (redirects with a code),
  a token endpoint for authorization codes (PKCE S256) and refresh tokens (rotated).
- Access tokens live ``--lifetime`` seconds. Tool ``write_note`` needs scope ``notes:write``
  beyond the default ``notes:read``: a call without it gets 403 ``insufficient_scope``.
- Every token grant and every request to /mcp is appended to LOG as a JSON line.
- ``--hostile-resource URL``: the protected resource metadata names another resource, as a server
  would that wants a token meant for someone else.
- ``--issuer-path /P``: the authorization server is ``<origin>/P`` (metadata at
  ``/.well-known/oauth-authorization-server/P``, endpoints under ``/P``), not the origin: a client
  that guesses ``<origin>/token`` instead of using the discovered token endpoint gets a 404.
- ``--foreign-token-endpoint URL``: the authorization server's metadata names a token endpoint on
  another origin (a metadata document rewritten on its way, or a hostile authorization server).
- Every request to a token endpoint is logged (``token_request``, with the refresh token's first
  characters), granted or not.
- A revocation endpoint (RFC 7009, ``/revoke``): the access or refresh token posted as ``token`` stops
  being accepted at once, whatever its lifetime said.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import secrets
import socket
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

READ, WRITE = "notes:read", "notes:write"
NEEDS = {"write_note": WRITE}


class State:
    def __init__(self, base: str, log: Path, lifetime: int, hostile_resource: str | None, issuer_path: str) -> None:
        self.base, self.log, self.lifetime, self.hostile_resource = base, log, lifetime, hostile_resource
        self.issuer = base + issuer_path
        self.issuer_path = issuer_path
        self.foreign_token_endpoint: str | None = None
        self.clients: dict[str, dict[str, Any]] = {}
        self.codes: dict[str, dict[str, Any]] = {}
        self.access: dict[str, tuple[float, set[str]]] = {}
        self.refresh: dict[str, tuple[str, set[str]]] = {}

    def write(self, **entry: Any) -> None:
        with self.log.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def issue(self, client_id: str, scopes: set[str]) -> dict[str, Any]:
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.access[access] = (time.time() + self.lifetime, scopes)
        self.refresh[refresh] = (client_id, scopes)
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "refresh_token": refresh,
            "scope": " ".join(sorted(scopes)),
        }


def build(state: State) -> Starlette:
    mcp = MCPServer("notes", version="1.0")

    @mcp.tool(description="Read the notes.")
    def read_notes() -> str:
        return "three notes"

    @mcp.tool(description="Write a note.")
    def write_note(text: str) -> str:
        return f"wrote {text}"

    @mcp.tool(description="Who the client says it is.")
    def whoami(ctx: Context) -> str:
        params = ctx.request_context.session.client_params
        info = params.client_info if params is not None else None
        return f"{info.name} {info.version}" if info is not None else "unknown"

    resource_metadata = f"{state.base}/.well-known/oauth-protected-resource/mcp"

    async def prm(request: Request) -> Response:
        return JSONResponse(
            {
                "resource": state.hostile_resource or f"{state.base}/mcp",
                "authorization_servers": [state.issuer],
                "scopes_supported": [READ, WRITE],
            }
        )

    async def asm(request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": state.issuer,
                "authorization_endpoint": f"{state.issuer}/authorize",
                "token_endpoint": state.foreign_token_endpoint or f"{state.issuer}/token",
                "registration_endpoint": f"{state.issuer}/register",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": [READ, WRITE],
            }
        )

    async def register(request: Request) -> Response:
        body = await request.json()
        client_id = secrets.token_urlsafe(12)
        state.clients[client_id] = body
        state.write(event="register", redirect_uris=body.get("redirect_uris"))
        return JSONResponse({**body, "client_id": client_id, "token_endpoint_auth_method": "none"}, status_code=201)

    async def authorize(request: Request) -> Response:
        q = request.query_params
        client = state.clients.get(q.get("client_id", ""))
        if client is None or q.get("redirect_uri") not in client.get("redirect_uris", []):
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        code = secrets.token_urlsafe(16)
        scopes = set((q.get("scope") or READ).split()) & {READ, WRITE}
        state.codes[code] = {"client_id": q["client_id"], "challenge": q.get("code_challenge"), "scopes": scopes}
        state.write(event="authorize", scope=sorted(scopes))
        return RedirectResponse(f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q.get('state', '')})}")

    async def token(request: Request) -> Response:
        form = await request.form()
        grant = str(form.get("grant_type"))
        state.write(event="token_request", grant=grant, refresh=str(form.get("refresh_token") or "")[:6])
        if grant == "authorization_code":
            entry = state.codes.pop(str(form.get("code")), None)
            verifier = str(form.get("code_verifier", ""))
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
            if entry is None or entry["challenge"] != challenge:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            state.write(event="token", grant=grant, scope=sorted(entry["scopes"]))
            return JSONResponse(state.issue(entry["client_id"], entry["scopes"]))
        if grant == "refresh_token":
            found = state.refresh.pop(str(form.get("refresh_token")), None)
            if found is None:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            state.write(event="token", grant=grant, scope=sorted(found[1]))
            return JSONResponse(state.issue(*found))
        return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)

    async def revoke(request: Request) -> Response:
        token = str((await request.form()).get("token"))
        revoked = state.access.pop(token, None) is not None or state.refresh.pop(token, None) is not None
        state.write(event="revoke", token=token[:6], revoked=revoked)
        return Response(status_code=200)

    app = mcp.streamable_http_app(host="127.0.0.1")

    class Guard:
        """Bearer tokens for /mcp: 401 without a live one, 403 insufficient_scope for a tool beyond it."""

        def __init__(self, inner: ASGIApp) -> None:
            self.inner = inner

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or not scope["path"].startswith("/mcp"):
                return await self.inner(scope, receive, send)
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            method, tool = _method_and_tool(body)
            live = state.access.get(bearer)
            expired = live is not None and live[0] < time.time()
            state.write(
                event="mcp", method=method, tool=tool, token=bearer[:6], expired=expired, known=live is not None
            )
            if live is None or expired:
                response: Response = Response(
                    status_code=401,
                    headers={"WWW-Authenticate": f'Bearer scope="{READ}", resource_metadata="{resource_metadata}"'},
                )
                return await response(scope, receive, send)
            needed = NEEDS.get(tool or "")
            if needed is not None and needed not in live[1]:
                challenge = (
                    f'Bearer error="insufficient_scope", scope="{READ} {WRITE}", '
                    f'resource_metadata="{resource_metadata}"'
                )
                response = Response(status_code=403, headers={"WWW-Authenticate": challenge})
                return await response(scope, receive, send)
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.inner(scope, replay, send)

    routes = [
        Route("/.well-known/oauth-protected-resource/mcp", prm),
        Route(f"/.well-known/oauth-authorization-server{state.issuer_path}", asm),
        Route(f"{state.issuer_path}/register", register, methods=["POST"]),
        Route(f"{state.issuer_path}/authorize", authorize),
        Route(f"{state.issuer_path}/token", token, methods=["POST"]),
        Route(f"{state.issuer_path}/revoke", revoke, methods=["POST"]),
        Mount("/", app=Guard(app)),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncGenerator[None]:
        async with app.router.lifespan_context(app):
            yield

    return Starlette(routes=routes, lifespan=lifespan)


def _method_and_tool(body: bytes) -> tuple[str | None, str | None]:
    try:
        parsed: dict[str, Any] = json.loads(body) if body else {}
    except ValueError:
        return None, None
    method = parsed.get("method")
    params: dict[str, Any] = parsed.get("params") or {}
    return method, params.get("name") if method == "tools/call" else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log", type=Path)
    parser.add_argument("--lifetime", type=int, default=3600)
    parser.add_argument("--hostile-resource")
    parser.add_argument("--issuer-path", default="")
    parser.add_argument("--foreign-token-endpoint")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    state = State(base, args.log, args.lifetime, args.hostile_resource, args.issuer_path)
    state.foreign_token_endpoint = args.foreign_token_endpoint
    app = build(state)
    print(f"URL {base}/mcp", flush=True)
    uvicorn.run(app, fd=sock.fileno(), log_level="warning")


if __name__ == "__main__":
    main()
