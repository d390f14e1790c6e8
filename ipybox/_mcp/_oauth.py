"""OAuth 2.1 for remote MCP servers, on the MCP SDK's providers.

A server whose parameters say ``"oauth": {...}`` (`OAuthParams`, no secrets but ``${VAR}``
placeholders) gets an ``httpx2.Auth`` from the SDK: `OAuthClientProvider` (authorization code with
PKCE, metadata discovery, dynamic registration or a client ID metadata document, refresh, scope
step-up), `ClientCredentialsOAuthProvider` or `PrivateKeyJWTOAuthProvider`. ipybox adds three
things around them:

- where tokens live (a `TokenStore` on the host, keyed by the server's URL, so generation and every
  tool-server session of the server share them, across processes too);
- how a person authorizes (`OAuth.authorize`, a callback that gets the authorization URL; the CLI
  uses `LoopbackAuthorizer`, a browser plus a listener on 127.0.0.1);
- what a failure says: the flow's error is kept (`AuthFailures`) and the request is answered with
  the server's own refusal at once, instead of leaving the MCP request waiting for a reply that
  never comes (the SDK's transport drops an exception from its auth).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from ._tokenstore import FileTokenStore, TokenStore

if TYPE_CHECKING:
    from types import TracebackType

    import httpx2

    from ._servers import HttpServer

__all__ = (
    "AuthFailures",
    "AuthorizationRequest",
    "Authorize",
    "OAuth",
    "PausableDeadline",
    "current_deadline",
    "pausable_deadline",
    "person_waiting",
    "printable",
)


@dataclass(frozen=True)
class AuthorizationRequest:
    """A person must authorize ipybox at a remote MCP server's authorization server.

    Everything here comes from the server and its authorization server, which may be hostile:
    show the URL (with its host) to the person, never act on it unseen.

    Attributes:
        server: The name the server is registered under.
        url: The authorization URL to open in the person's browser.
        redirect_uri: Where the authorization server sends the browser back to; the callback
            returns the full URL the browser was sent to (with ``code`` and ``state``).
    """

    server: str
    url: str
    redirect_uri: str


Authorize = Callable[[AuthorizationRequest], Awaitable[str]]
"""Shows the authorization URL to a person and returns the URL the browser was redirected to."""


@dataclass
class OAuth:
    """How ipybox gets and keeps OAuth tokens for remote MCP servers (host side only).

    Pass the same object to `generate_mcp_sources` and `CodeExecutor` (or rely on the defaults,
    which share tokens through the default store).

    Attributes:
        authorize: Called when a person must authorize (first use, a refresh token that no longer
            works, a call that needs more scope); None: such a server fails with an error that says
            how to authorize (``ipybox generate NAME --url URL --oauth``). Never called for client
            credentials.
        store: Where tokens are kept; default a `FileTokenStore` under the user's data directory.
    """

    authorize: Authorize | None = None
    store: TokenStore = field(default_factory=FileTokenStore)
    # One provider per server and parameters, shared by all of its sessions.
    _providers: dict[tuple[str, str], httpx2.Auth] = field(
        default_factory=dict[tuple[str, str], "httpx2.Auth"], init=False, repr=False
    )

    def provider(self, name: str, params: HttpServer) -> httpx2.Auth:
        """The auth of server ``name`` (``params`` with placeholders resolved): one per server and
        parameters, so that every session of it shares one token and one refresh."""
        assert params.oauth is not None
        key = (name, params.model_dump_json())
        found = self._providers.get(key)
        if found is None:
            from ._oauthproviders import build_provider

            found = self._providers[key] = build_provider(name, params, self)
        return found

    def failures(self, auth: httpx2.Auth) -> AuthFailures | None:
        """The failure record of a provider made by `provider`."""
        return getattr(auth, "ipybox_failures", None)


@dataclass
class AuthFailures:
    """The last error of a provider's OAuth flow, told to whoever reports the refused request."""

    last: BaseException | None = None
    count: int = 0

    def record(self, exc: BaseException) -> None:
        self.last = exc
        self.count += 1

    def since(self, mark: int) -> BaseException | None:
        return self.last if self.count > mark else None


class PausableDeadline:
    """A deadline that stops while a person authorizes (the connect or call timeout measures the
    server, not the person). Travels in a ContextVar: the SDK's HTTP transports run each message
    in its sender's context, so the auth flow finds the deadline of the request it serves."""

    def __init__(self, scope: anyio.CancelScope, seconds: float | None) -> None:
        self._scope = scope
        self._budget = math.inf if seconds is None else seconds
        self._paused = 0
        scope.deadline = anyio.current_time() + self._budget

    @contextmanager
    def paused(self) -> Generator[None]:
        if not self._paused:
            self._budget = self._scope.deadline - anyio.current_time()
            self._scope.deadline = math.inf
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            if not self._paused:
                self._scope.deadline = anyio.current_time() + self._budget


_deadline: ContextVar[PausableDeadline | None] = ContextVar("ipybox_oauth_deadline", default=None)


def pausable_deadline(seconds: float | None) -> AbstractContextManager[anyio.CancelScope]:
    """A cancel scope whose deadline (``seconds`` from now) stands still while a person authorizes."""
    return _PausableScope(seconds)


class _PausableScope(AbstractContextManager[anyio.CancelScope]):
    """`pausable_deadline`: a class rather than a generator, since every tool call enters one."""

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._scope = anyio.CancelScope()
        self._token: Token[PausableDeadline | None] | None = None

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        self._token = _deadline.set(PausableDeadline(scope, self._seconds))
        return scope

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if self._token is not None:
            _deadline.reset(self._token)
        return bool(self._scope.__exit__(kind, exc, tb))


def current_deadline() -> PausableDeadline | None:
    """The pausable deadline of the running call or connect, if any (see `pausable_deadline`)."""
    return _deadline.get()


@contextmanager
def person_waiting() -> Generator[None]:
    deadline = _deadline.get()
    if deadline is None:
        yield
        return
    with deadline.paused():
        yield


def printable(text: str, limit: int) -> str:
    """Untrusted text made safe to show: one line, no control characters, bounded."""
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in text)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"
