"""MCP server parameters, and connections to servers over stdio, streamable HTTP and SSE.

Parameters are host-side configuration. They are never sent to, or written where, the sandboxed
kernel can read them: the kernel names a server, the host looks its parameters up.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import weakref
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ipybox._exceptions import MCPServerError, UsageError

if TYPE_CHECKING:
    import httpx2
    import mcp_types
    from mcp import ClientSession

    from ._oauth import AuthFailures, OAuth

from ._oauth import printable

__all__ = (
    "DEFAULT_REDIRECT_URI",
    "HttpRefusals",
    "HttpServer",
    "OAuthParams",
    "ServerExitWatch",
    "ServerParams",
    "StdioServer",
    "client_info",
    "describe_server",
    "http_refusals",
    "open_session",
    "parse_server_params",
    "resolve_placeholders",
)

# Long enough for `npx` to start a cached Node server on a loaded 2-core machine.
CONNECT_TIMEOUT = 30.0

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class StdioServer(BaseModel):
    """An MCP server the host starts as a subprocess and talks to over stdin/stdout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    """Extra environment for the server. Values may hold ``${VAR}`` placeholders."""
    cwd: str | None = None


# Where the CLI's browser flow listens; fixed, so that a client registered once keeps working.
DEFAULT_REDIRECT_URI = "http://127.0.0.1:47651/callback"


class OAuthParams(BaseModel):
    """How ipybox authenticates to a remote MCP server with OAuth 2.1 (see the "OAuth" docs).

    Written to the manifest with the other parameters, so it holds no token: secrets belong in
    ``${VAR}`` placeholders, resolved on the host when connecting. Tokens are kept in the host's
    token store (`ipybox.oauth.OAuth`), never here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    grant: Literal["authorization_code", "client_credentials"] = "authorization_code"
    """``authorization_code`` (a person authorizes once; PKCE, refresh) or ``client_credentials``
    (no person: ``client_id`` plus ``client_secret`` or ``private_key``)."""
    scope: str | None = None
    """Scopes to ask for; by default those the server names (``WWW-Authenticate``, its metadata)."""
    client_id: str | None = None
    """A pre-registered client; without it the client registers itself (dynamic registration or
    ``client_metadata_url``)."""
    client_secret: str | None = None
    """The pre-registered client's secret; write it as ``${VAR}``."""
    token_endpoint_auth_method: (
        Literal["none", "client_secret_basic", "client_secret_post", "private_key_jwt"] | None
    ) = None
    private_key: str | None = None
    """A PEM private key for ``private_key_jwt`` client credentials; write it as ``${VAR}``."""
    signing_algorithm: str = "RS256"
    issuer: str | None = None
    """The authorization server the client credentials belong to; tokens are asked only there."""
    client_metadata_url: str | None = None
    """An HTTPS URL of this client's metadata document (used instead of registering, where the
    authorization server supports it)."""
    redirect_uri: str = Field(default=DEFAULT_REDIRECT_URI, pattern=r"^https?://")
    """Where the browser returns after authorizing; the CLI listens there (a 127.0.0.1 URL)."""
    client_name: str = "ipybox"


class HttpServer(BaseModel):
    """A running MCP server reached over streamable HTTP (the default) or SSE."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["streamable-http", "sse"] = "streamable-http"
    url: str = Field(pattern=r"^https?://")
    headers: Mapping[str, str] | None = None
    """Extra HTTP headers, e.g. ``Authorization``. Values may hold ``${VAR}`` placeholders."""
    oauth: OAuthParams | None = None
    """Authenticate with OAuth 2.1 (``{}`` for the defaults, or `OAuthParams`; ``true`` in JSON)."""

    @field_validator("oauth", mode="before")
    @classmethod
    def _oauth_flag(cls, value: object) -> object:
        return {} if value is True else None if value is False else value


ServerParams = Annotated[StdioServer | HttpServer, Field(discriminator="type")]
_server_params: TypeAdapter[StdioServer | HttpServer] = TypeAdapter(ServerParams)

# Spellings of the transport used by MCP client configuration files in the wild.
_TYPE_ALIASES = {
    "http": "streamable-http",
    "streamable_http": "streamable-http",
    "streamableHttp": "streamable-http",
    "streamable-http": "streamable-http",
    "sse": "sse",
    "stdio": "stdio",
}


def parse_server_params(params: Mapping[str, Any] | StdioServer | HttpServer) -> StdioServer | HttpServer:
    """Validate server parameters given as a model or in the usual ``mcpServers`` JSON shape.

    Accepts ``{"command": ..., "args": [...], "env": {...}}`` for stdio servers and
    ``{"url": ..., "headers": {...}, "type": "sse"}`` for HTTP servers (``type`` or ``transport``
    may be omitted for streamable HTTP).

    Raises:
        UsageError: The parameters do not describe a server; the message says what is wrong.
    """
    if isinstance(params, StdioServer | HttpServer):
        return params
    if not isinstance(params, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"server parameters must be a mapping, got {type(params).__name__}")
    data = dict(params)
    kind = data.pop("transport", None) or data.get("type")
    if kind is None:
        kind = "stdio" if "command" in data else "streamable-http" if "url" in data else None
    if kind is None:
        raise UsageError("server parameters need either 'command' (stdio) or 'url' (HTTP or SSE)")
    data["type"] = _TYPE_ALIASES.get(str(kind), kind)
    _check_command_line(data)
    try:
        return _server_params.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'params'}: {err['msg']}" for err in exc.errors()
        )
        raise UsageError(f"invalid MCP server parameters: {problems}") from None


def _check_command_line(data: Mapping[str, Any]) -> None:
    """Name the fix for the two common ways of writing a stdio server's command line wrong."""
    command, args = data.get("command"), data.get("args")
    if isinstance(args, str):
        raise UsageError(
            f"'args' must be a list of strings, got the string {args!r}; write it as {json.dumps(shlex.split(args))}"
            if _splits(args)
            else f"'args' must be a list of strings, got the string {args!r}"
        )
    if (
        isinstance(command, str)
        and not args
        and _splits(command)
        and len(shlex.split(command)) > 1
        and shutil.which(command) is None
        and not os.path.exists(command)
    ):
        program, *rest = shlex.split(command)
        raise UsageError(
            f"'command' is a whole command line ({command!r}); the host runs it as one program name. Put the "
            f"program in 'command' and its arguments in 'args': {json.dumps({'command': program, 'args': rest})}"
        )


def _splits(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:
        return False
    return True


def resolve_placeholders(
    params: StdioServer | HttpServer, environ: Mapping[str, str] | None = None
) -> StdioServer | HttpServer:
    """Replace ``${VAR}`` in args, env, cwd, URL and headers with values from the host environment.

    Raises:
        UsageError: A placeholder names a variable that is not set.
    """
    env = os.environ if environ is None else environ

    def sub(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise UsageError(f"server parameters use ${{{name}}}, but {name} is not set on the host")
            return env[name]

        return _PLACEHOLDER.sub(one, text)

    if isinstance(params, StdioServer):
        return params.model_copy(
            update={
                "command": sub(params.command),
                "args": tuple(sub(a) for a in params.args),
                "env": None if params.env is None else {k: sub(v) for k, v in params.env.items()},
                "cwd": None if params.cwd is None else sub(params.cwd),
            }
        )
    oauth = params.oauth
    if oauth is not None:
        oauth = oauth.model_copy(
            update={
                key: sub(value)
                for key in ("client_id", "client_secret", "private_key", "scope")
                if isinstance(value := getattr(oauth, key), str)
            }
        )
    return params.model_copy(
        update={
            "url": sub(params.url),
            "headers": None if params.headers is None else {k: sub(v) for k, v in params.headers.items()},
            "oauth": oauth,
        }
    )


def describe_server(params: StdioServer | HttpServer) -> str:
    """What the host will run or call for a server, for approval prompts.

    Environment and header *values* are left out (they are often secrets); their names are shown.
    """
    if isinstance(params, StdioServer):
        line = shlex.join([params.command, *params.args])
        extras = [f"env: {', '.join(sorted(params.env))}"] if params.env else []
        if params.cwd:
            extras.append(f"cwd: {params.cwd}")
        return f"{line} ({'; '.join(extras)})" if extras else line
    extras = [f"headers: {', '.join(sorted(params.headers))}"] if params.headers else []
    if params.oauth is not None:
        extras.append(f"OAuth {params.oauth.grant.replace('_', ' ')}")
    return f"{params.type} {params.url}" + (f" ({'; '.join(extras)})" if extras else "")


@dataclass(eq=False)
class HttpRefusals:
    """What an HTTP server last refused (401/403, its ``WWW-Authenticate``) and why OAuth failed,
    for the error of a request the transport reports only as "Server returned an error response".

    Everything here comes from the server: it is shown only cleaned and bounded.
    """

    name: str
    url: str
    oauth: bool
    failures: AuthFailures | None = None
    status: int | None = None
    challenge: str | None = None
    count: int = 0

    def mark(self) -> tuple[int, int]:
        """A point to explain later failures from (`explain`)."""
        return self.count, self.failures.count if self.failures is not None else 0

    async def record(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.status = response.status_code
            self.challenge = response.headers.get("www-authenticate")
            self.count += 1

    def explain(self, mark: tuple[int, int]) -> str | None:
        """Why requests since ``mark`` were refused, with what to change; None if none was."""
        failure = self.failures.since(mark[1]) if self.failures is not None else None
        if failure is not None:
            return f"OAuth authorization failed: {printable(str(failure) or type(failure).__name__, 400)}"
        if self.count <= mark[0] or self.status is None:
            return None
        challenge = printable(self.challenge, 300) if self.challenge else None
        said = f" (WWW-Authenticate: {challenge})" if challenge else ""
        if self.status == 401:
            if self.oauth:
                return f"the server answered 401 Unauthorized{said} even after OAuth authorization"
            return (
                f"the server answered 401 Unauthorized{said}: it needs authorization. Give it OAuth ('\"oauth\": {{}}' "
                f"in its parameters, or 'ipybox generate {self.name} --url {self.url} --oauth'), or a token header "
                '(\'"headers": {"Authorization": "Bearer ${TOKEN}"}\')'
            )
        error, scope = _challenge_field(self.challenge, "error"), _challenge_field(self.challenge, "scope")
        if error == "insufficient_scope":
            needs = f"scope {printable(scope, 200)!r}" if scope else "more scope"
            fix = (
                "authorizing the extra scope did not succeed"
                if self.oauth
                else "use a token that has it, or OAuth, which asks for it when a call needs it"
            )
            return f"the server answered 403 insufficient_scope: this needs {needs}; {fix}"
        return f"the server answered 403 Forbidden{said}"


_REFUSALS: weakref.WeakKeyDictionary[ClientSession, HttpRefusals] = weakref.WeakKeyDictionary()


def http_refusals(session: ClientSession) -> HttpRefusals | None:
    """The refusal record of a session `open_session` made with an HTTP server (None for stdio)."""
    return _REFUSALS.get(session)


def _challenge_field(challenge: str | None, key: str) -> str | None:
    if not challenge:
        return None
    match = re.search(rf'(?:^|[\s,]){key}="([^"]*)"|(?:^|[\s,]){key}=([^\s,]+)', challenge)
    return None if match is None else match.group(1) or match.group(2)


def client_info() -> mcp_types.Implementation:
    """How ipybox introduces itself to MCP servers."""
    import mcp_types

    from ipybox import __version__

    return mcp_types.Implementation(name="ipybox", version=__version__)


@asynccontextmanager
async def open_session(
    name: str,
    params: StdioServer | HttpServer,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    errlog: TextIO = sys.stderr,
    oauth: OAuth | None = None,
    callbacks: Mapping[str, Any] | None = None,
) -> AsyncGenerator[ClientSession]:
    """Connect to an MCP server and yield an initialized session.

    ``${VAR}`` placeholders are resolved from the host environment here, at connect time. A server
    with ``oauth`` gets its auth from ``oauth`` (default: an `OAuth` with the default token store
    and no person to ask); the connect timeout stands still while a person authorizes.
    ``callbacks`` answer what the server asks of the client (`BoundedClientSession`'s keywords:
    elicitation, sampling, roots); without them the session advertises none and refuses them all.

    Raises:
        MCPServerError: The server could not be started, refused the connection (the message says
            why: a 401 and what it asked for, an OAuth failure) or did not complete the handshake.
        UsageError: A placeholder names an unset variable.
    """
    # Imported here: the server parameters above are also read by `ipybox --help`, `ipybox stubs` and
    # the manifest, which should not pay ~0.6 s for the MCP client stack they never use.
    import httpx2
    from mcp import StdioServerParameters, stdio_client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    from ._boundedsession import BoundedClientSession
    from ._oauth import OAuth, pausable_deadline

    resolved = resolve_placeholders(params)
    refusals: HttpRefusals | None = None
    mark = (0, 0)
    async with AsyncExitStack() as stack:
        try:
            if isinstance(resolved, StdioServer):
                server = StdioServerParameters(
                    command=resolved.command,
                    args=list(resolved.args),
                    env=dict(resolved.env) if resolved.env else None,
                    cwd=resolved.cwd,
                )
                read, write = await stack.enter_async_context(stdio_client(server, errlog=errlog))
            else:
                auth = None
                if resolved.oauth is not None:
                    oauth = oauth or OAuth()
                    auth = oauth.provider(name, resolved)
                refusals = HttpRefusals(
                    name,
                    params.url if isinstance(params, HttpServer) else resolved.url,
                    auth is not None,
                    oauth.failures(auth) if oauth and auth else None,
                )
                hooks = {"response": [refusals.record]}
                timeout = httpx2.Timeout(connect_timeout, read=300.0)
                headers = dict(resolved.headers or {})

                def factory(
                    headers: dict[str, str] | None = None,
                    timeout: httpx2.Timeout | None = timeout,
                    auth: httpx2.Auth | None = auth,
                ) -> httpx2.AsyncClient:
                    return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, event_hooks=hooks)

                if resolved.type == "sse":
                    read, write = await stack.enter_async_context(
                        sse_client(
                            resolved.url,
                            headers=headers,
                            timeout=connect_timeout,
                            auth=auth,
                            httpx_client_factory=factory,
                        )
                    )
                else:
                    client = await stack.enter_async_context(factory(headers))
                    read, write = await stack.enter_async_context(
                        streamable_http_client(resolved.url, http_client=client)
                    )
            session = await stack.enter_async_context(
                BoundedClientSession(read, write, client_info=client_info(), **(callbacks or {}))
            )
            if refusals is not None:
                _REFUSALS[session] = refusals
            mark = refusals.mark() if refusals is not None else mark
            with pausable_deadline(connect_timeout) as scope:
                await session.initialize()
            if scope.cancelled_caught:
                raise TimeoutError
        except TimeoutError:
            why = refusals.explain(mark) if refusals is not None else None
            raise MCPServerError(name, why or f"no MCP handshake within {connect_timeout:g} s") from None
        except MCPError as exc:
            why = refusals.explain(mark) if refusals is not None else None
            if why is None:
                raise
            raise MCPServerError(name, f"cannot connect: {why}") from exc
        except (OSError, httpx2.HTTPError) as exc:
            raise MCPServerError(name, f"cannot connect: {exc}") from exc
        yield session


class ServerExitWatch:
    """Runs a stdio server so that a failure can say how it ended: its exit status and its last stderr lines.

    The MCP SDK reaps the server's process itself and never exposes its exit status, so the server runs
    as the child of ``/bin/sh``, which appends the status to the server's stderr (a temporary file). The
    SDK stops a server by signalling its whole process group, so sh never outlives it. A command that
    cannot be found is left unwrapped: starting it then fails with the OS's own error, as before.

    Args:
        params: The server as configured.
        errlog: A file (with a descriptor) that receives the server's stderr.
    """

    _MARK = "ipybox: the server exited with status "
    # How much of the stderr file is read, and how many of its last lines a message shows.
    TAIL_BYTES = 4096
    TAIL_LINES = 10

    def __init__(self, params: StdioServer | HttpServer, errlog: TextIO) -> None:
        self.errlog = errlog
        self.params = params
        if isinstance(params, StdioServer) and shutil.which(params.command) is not None:
            script = f'"$@"; status=$?; printf "\\n{self._MARK}%s\\n" "$status" >&2; exit "$status"'
            self.params = params.model_copy(
                update={"command": "/bin/sh", "args": ("-c", script, "ipybox-server", params.command, *params.args)}
            )

    def ending(self) -> tuple[int | None, list[str]]:
        """The server's exit status (None when unknown: still running, or an HTTP server) and the
        last lines of its stderr."""
        fd = self.errlog.fileno()
        size = os.fstat(fd).st_size
        tail = os.pread(fd, self.TAIL_BYTES, max(0, size - self.TAIL_BYTES)).decode("utf-8", "replace")
        lines = [line.rstrip() for line in tail.splitlines()]
        if size > self.TAIL_BYTES:
            lines = lines[1:]  # the first line read is most likely cut
        marked = next((line.removeprefix(self._MARK) for line in reversed(lines) if line.startswith(self._MARK)), None)
        output = [line for line in lines if line and not line.startswith(self._MARK)][-self.TAIL_LINES :]
        # The shell wrapper prints the status as a decimal number; anything else is not its line.
        status = int(marked) if marked is not None and marked.isdigit() else None
        return status, output

    def describe(self) -> str:
        """How the server ended, for an error message; empty when there is nothing to tell (an HTTP server)."""
        status, output = self.ending()
        parts: list[str] = []
        if status is not None:
            parts.append(f"the server exited with status {status}")
        if output:
            parts.append("the last lines of its stderr:\n" + "\n".join(f"  {line}" for line in output))
        elif status is not None:
            parts.append("it wrote nothing to stderr")
        return "; ".join(parts)
