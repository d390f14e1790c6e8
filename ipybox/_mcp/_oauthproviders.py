"""The MCP SDK's OAuth providers, as ipybox uses them (see `ipybox._mcp._oauth`).

Separate from `ipybox._mcp._oauth` because it imports the SDK's auth stack, which only a connection to
an OAuth server needs.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.utils import credentials_match_issuer, issuers_match
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import AnyUrl, ValidationError

from ipybox._exceptions import UsageError

from ._oauth import AuthFailures, AuthorizationRequest, OAuth, person_waiting, printable
from ._tokenstore import TokenStore

if TYPE_CHECKING:
    from ._servers import HttpServer

__all__ = ("DiscoveredServer", "build_provider", "parse_callback")


@dataclass(frozen=True)
class DiscoveredServer:
    """What a refresh in a later process needs of discovery: the authorization server's metadata
    (its token endpoint) and the protected resource metadata that named it (the ``resource``
    parameter). Kept in the token store beside the tokens, under ``"authorization_server"``.

    The SDK keeps both in memory only; without them a refresh in a new process goes to
    ``/token`` on the MCP server's origin, fails where the authorization server lives elsewhere,
    and the person is sent to the browser again.
    """

    metadata: OAuthMetadata
    resource_metadata: ProtectedResourceMetadata | None

    def record(self) -> dict[str, Any]:
        return {
            "metadata": self.metadata.model_dump(mode="json", exclude_none=True),
            "resource_metadata": None
            if self.resource_metadata is None
            else self.resource_metadata.model_dump(mode="json", exclude_none=True),
        }

    @classmethod
    def trusted(
        cls,
        raw: object,
        server_url: str,
        client: OAuthClientInformationFull | None,
        client_metadata_url: str | None = None,
    ) -> DiscoveredServer | None:
        """The stored discovery of ``server_url`` if it holds together, else None (the flow then
        discovers again). A store is written only by ipybox, but a record is also what a token
        import or an edited file brings, and the refresh token goes to the token endpoint named
        here: it must be on the issuer's own origin, the issuer must be the one the client was
        registered with and one the stored resource metadata names, and that metadata must be
        about this server. A rewritten record that names another host is not used."""
        if not isinstance(raw, dict):
            return None
        fields = cast(dict[str, object], raw)
        try:
            metadata = OAuthMetadata.model_validate(fields.get("metadata"))
            found = fields.get("resource_metadata")
            resource = None if found is None else ProtectedResourceMetadata.model_validate(found)
        except ValidationError:
            return None
        issuer = str(metadata.issuer)
        if _origin(str(metadata.token_endpoint)) != _origin(issuer):
            return None
        if resource is not None:
            if not check_resource_allowed(resource_url_from_server_url(server_url), str(resource.resource)):
                return None
            if not any(issuers_match(str(listed), issuer) for listed in resource.authorization_servers):
                return None
        elif _origin(issuer) != _origin(server_url):
            # Without resource metadata (the 2025-03-26 path) the issuer is the server's own origin.
            return None
        if client is not None and not credentials_match_issuer(client, issuer, client_metadata_url):
            return None
        return cls(metadata, resource)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class _StoreAdapter:
    """The SDK's ``TokenStorage`` over an ipybox `TokenStore` record.

    The token's expiry is kept as an absolute time: the SDK keeps it only in memory, so a token
    loaded from storage would never count as expired and would be sent instead of refreshed.
    """

    def __init__(self, store: TokenStore, url: str, redirect_uri: str | None) -> None:
        self.store = store
        self.url = url
        self.redirect_uri = redirect_uri
        self.expires_at: float | None = None
        self.fixed_client: OAuthClientInformationFull | None = None
        # As loaded with the tokens (checked by the provider), and as discovered in this process.
        self.stored_server: object = None
        self.discovered: DiscoveredServer | None = None

    def _record(self) -> dict[str, Any]:
        return dict(self.store.load(self.url) or {})

    async def get_tokens(self) -> OAuthToken | None:
        record = self._record()
        expires = record.get("expires_at")
        self.expires_at = float(expires) if isinstance(expires, int | float) else None
        self.stored_server = record.get("authorization_server")
        try:
            return OAuthToken.model_validate(record["tokens"]) if record.get("tokens") else None
        except ValidationError:
            return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        record = self._record()
        record["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        record["expires_at"] = time.time() + tokens.expires_in if tokens.expires_in is not None else None
        if self.discovered is not None:
            record["authorization_server"] = self.discovered.record()
        self.store.save(self.url, record)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self.fixed_client is not None:
            return self.fixed_client
        raw = self._record().get("client")
        if not raw:
            return None
        try:
            info = OAuthClientInformationFull.model_validate(raw)
        except ValidationError:
            return None
        # A client registered for another redirect URI (another loopback port, an earlier
        # configuration) would be refused by the authorization server: register again instead.
        uris = {str(uri) for uri in info.redirect_uris or ()}
        if self.redirect_uri is not None and uris and self.redirect_uri not in uris:
            return None
        return info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        record = self._record()
        record["client"] = client_info.model_dump(mode="json", exclude_none=True)
        self.store.save(self.url, record)


# A token's expiry at which the SDK counts it as expired (0 or None would count as "never").
_EXPIRED = 1.0
_EARLY_REFRESH_SHARE = 0.25
_EARLY_REFRESH_MAX = 60.0


class _IpyboxProvider(OAuthClientProvider):
    """What ipybox adds to each SDK provider: the stored expiry and token endpoint, a refresh before a
    token runs out and after a live one is refused, and failures that are reported."""

    ipybox_failures: AuthFailures
    _stored_server: DiscoveredServer | None = None

    async def _initialize(self) -> None:
        await super()._initialize()
        storage = self.context.storage
        if isinstance(storage, _StoreAdapter):
            if storage.expires_at is not None:
                self.context.token_expiry_time = storage.expires_at
                self._refresh_if_due()
            self._stored_server = DiscoveredServer.trusted(
                storage.stored_server,
                self.context.server_url,
                self.context.client_info,
                self.context.client_metadata_url,
            )

    async def _refresh_token(self) -> httpx2.Request:
        stored = self._stored_server if self.context.oauth_metadata is None else None
        if stored is None:
            return await super()._refresh_token()
        # Nothing discovered in this process yet: the refresh goes where the stored discovery says.
        # Only the refresh request sees it; any other flow (a 401, a step-up) discovers afresh.
        context = self.context
        context.oauth_metadata = stored.metadata
        held = context.protected_resource_metadata
        context.protected_resource_metadata = held or stored.resource_metadata
        try:
            return await super()._refresh_token()
        finally:
            context.oauth_metadata = None
            context.protected_resource_metadata = held

    async def _handle_token_response(self, response: httpx2.Response) -> None:
        storage = self.context.storage
        if isinstance(storage, _StoreAdapter) and self.context.oauth_metadata is not None:
            storage.discovered = DiscoveredServer(self.context.oauth_metadata, self.context.protected_resource_metadata)
        await super()._handle_token_response(response)

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        refreshed = False
        while True:
            self._refresh_if_due()
            flow = super()._auth_flow(request)
            try:
                outgoing = await flow.__anext__()
                while True:
                    response = yield outgoing
                    if (
                        outgoing is request
                        and response.status_code == 401
                        and not refreshed
                        and self._refreshable(request)
                    ):
                        # A token this side still counted as live was refused: the server's clock
                        # runs ahead, the request arrived as the token expired, or the access token
                        # alone was revoked. The SDK would ask a person to sign in again; a refresh
                        # and the same request once more come first (`_refresh_if_due`).
                        refreshed = True
                        self.context.token_expiry_time = _EXPIRED
                        break
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                return
            except Exception as exc:
                self.ipybox_failures.record(exc)
                # The SDK's transport would drop this exception and leave the MCP request waiting for
                # ever; sent again without a token, the server's own refusal answers it now, and the
                # recorded error says why (`HttpRefusals.explain`).
                request.headers.pop("Authorization", None)
                yield request
                return
            finally:
                # Leaving the SDK's flow releases its lock before the next one takes it.
                await flow.aclose()

    def _refreshable(self, request: httpx2.Request) -> bool:
        # A 401 to a request sent without a token is how authorization starts, not a refusal.
        return "Authorization" in request.headers and self._initialized and self.context.can_refresh_token()

    def _refresh_if_due(self) -> None:
        """Counts the token as expired a little before its expiry, so the SDK refreshes it first.

        The expiry is reckoned from when this side received the token, after the server started its
        clock, and a request takes time to arrive: sent in the last moments, a token reaches the
        server expired. A quarter of the token's lifetime, at most a minute, is the margin.
        """
        context = self.context
        tokens, expiry = context.current_tokens, context.token_expiry_time
        if tokens is None or not expiry or tokens.expires_in is None:
            return
        if time.time() >= expiry - min(_EARLY_REFRESH_MAX, tokens.expires_in * _EARLY_REFRESH_SHARE):
            context.token_expiry_time = _EXPIRED


class _ClientCredentials(_IpyboxProvider, ClientCredentialsOAuthProvider):
    pass


class _PrivateKeyJWT(_IpyboxProvider, PrivateKeyJWTOAuthProvider):
    pass


def build_provider(name: str, params: HttpServer, oauth: OAuth) -> httpx2.Auth:
    """The SDK provider for server ``name`` (placeholders resolved), storing in ``oauth.store``.

    Raises:
        UsageError: The OAuth parameters do not fit together.
    """
    settings = params.oauth
    assert settings is not None
    key = resource_url_from_server_url(params.url)
    provider: _IpyboxProvider
    if settings.grant == "client_credentials":
        storage = _StoreAdapter(oauth.store, key, None)
        if settings.client_id is None:
            raise UsageError(f"MCP server {name!r}: the client_credentials grant needs oauth.client_id")
        if settings.private_key is not None:
            jwt = SignedJWTParameters(
                issuer=settings.client_id,
                subject=settings.client_id,
                signing_key=settings.private_key,
                signing_algorithm=settings.signing_algorithm,
            )
            provider = _PrivateKeyJWT(
                server_url=params.url,
                storage=storage,
                client_id=settings.client_id,
                assertion_provider=jwt.create_assertion_provider(),
                scope=settings.scope,
                issuer=settings.issuer,
            )
        else:
            method = settings.token_endpoint_auth_method or "client_secret_basic"
            if settings.client_secret is None or method not in ("client_secret_basic", "client_secret_post"):
                raise UsageError(
                    f"MCP server {name!r}: the client_credentials grant needs oauth.client_secret (write it as "
                    "'${VAR}') with client_secret_basic or client_secret_post, or oauth.private_key"
                )
            provider = _ClientCredentials(
                server_url=params.url,
                storage=storage,
                client_id=settings.client_id,
                client_secret=settings.client_secret,
                token_endpoint_auth_method=method,
                scope=settings.scope,
                issuer=settings.issuer,
            )
        provider.ipybox_failures = AuthFailures()
        return provider

    redirect_uri = settings.redirect_uri
    storage = _StoreAdapter(oauth.store, key, redirect_uri)
    if settings.client_id is not None:
        # A pre-registered client stands where a registration would be kept.
        storage.fixed_client = OAuthClientInformationFull(
            client_id=settings.client_id,
            client_secret=settings.client_secret,
            redirect_uris=[AnyUrl(redirect_uri)],
            token_endpoint_auth_method=settings.token_endpoint_auth_method
            or ("client_secret_basic" if settings.client_secret else "none"),
            grant_types=["authorization_code", "refresh_token"],
            issuer=settings.issuer,
        )
    codes: list[AuthorizationCodeResult] = []

    async def redirect(url: str) -> None:
        if oauth.authorize is None:
            raise UsageError(
                f"MCP server {name!r} needs a person to authorize ipybox, and no authorize callback was given: "
                f"run 'ipybox generate {name} --url {params.url} --oauth' once (or pass OAuth(authorize=...))"
            )
        with person_waiting():
            landed = await oauth.authorize(AuthorizationRequest(name, url, redirect_uri))
        codes.append(parse_callback(landed, redirect_uri))

    async def callback() -> AuthorizationCodeResult:
        return codes.pop()

    provider = _IpyboxProvider(
        server_url=params.url,
        client_metadata=OAuthClientMetadata(
            client_name=settings.client_name,
            redirect_uris=[AnyUrl(redirect_uri)],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            scope=settings.scope,
            token_endpoint_auth_method=settings.token_endpoint_auth_method,
        ),
        storage=storage,
        redirect_handler=redirect,
        callback_handler=callback,
        client_metadata_url=settings.client_metadata_url,
    )
    provider.ipybox_failures = AuthFailures()
    return provider


def parse_callback(landed: str, redirect_uri: str) -> AuthorizationCodeResult:
    """The code, state and issuer of the URL the browser was sent back to (the SDK checks the state).

    Raises:
        UsageError: The authorization server sent an error, or the URL has no code.
    """
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(landed).query)
    if "error" in query:
        description = query.get("error_description", [""])[0]
        raise UsageError(
            f"the authorization server refused: {printable(query['error'][0], 60)}"
            + (f" ({printable(description, 200)})" if description else "")
        )
    codes = query.get("code")
    if not codes:
        raise UsageError(f"the URL the browser was sent back to has no 'code' (expected {redirect_uri}?code=...)")
    return AuthorizationCodeResult(code=codes[0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0])
