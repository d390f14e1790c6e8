"""Tokens obtained elsewhere (another client, an admin console, a CI secret), handed to ipybox.

The import takes the tokens and the client they were issued to, but never where to send them: the
token endpoint is discovered from the MCP server itself (its protected resource metadata, then its
authorization server's metadata), checked as an authorization flow checks it, and kept beside the
tokens in the store. A later refresh goes there; a token file that names a host of its own has no
way to say so.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import httpx2
from mcp.client.auth.exceptions import OAuthFlowError
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    create_oauth_metadata_request,
    handle_auth_metadata_response,
    handle_protected_resource_response,
    issuers_match,
    validate_metadata_issuer,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ipybox._exceptions import UsageError

from ._oauth import printable
from ._oauthproviders import DiscoveredServer
from ._tokenstore import FileTokenStore, TokenStore

__all__ = ("ImportedTokens", "import_tokens")

# Discovery is two or three small GETs; a server that takes longer is not answering.
_DISCOVERY_TIMEOUT = 30.0


class ImportedTokens(BaseModel):
    """Tokens obtained elsewhere for one MCP server: an OAuth token response plus the client it was
    issued to. Unknown fields are refused (a ``token_endpoint`` among them: it is discovered)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str = Field(min_length=1)
    """The OAuth client the tokens were issued to; a refresh must name it."""
    client_secret: str | None = None
    """Its secret, for a confidential client."""
    token_endpoint_auth_method: Literal["none", "client_secret_basic", "client_secret_post"] | None = None
    """How the client authenticates at the token endpoint; default ``client_secret_basic`` with a
    secret, else ``none``."""
    refresh_token: str | None = None
    access_token: str | None = None
    expires_in: int | None = None
    """Seconds the access token has left; without it a refresh token is used before the first call
    (an access token of unknown age would otherwise be sent until a 401 sends a person to the browser)."""
    scope: str | None = None
    token_type: Literal["Bearer", "bearer"] = "Bearer"

    @model_validator(mode="after")
    def _something_to_use(self) -> ImportedTokens:
        if not self.refresh_token and not self.access_token:
            raise ValueError("give a refresh_token (or at least an access_token)")
        return self


async def import_tokens(url: str, tokens: ImportedTokens | dict[str, Any], *, store: TokenStore | None = None) -> str:
    """Keep tokens obtained elsewhere for the MCP server at ``url``, as if ipybox had been authorized.

    The server's authorization server is discovered now, as the authorization flow would: the
    protected resource metadata must be about ``url``, the authorization server's metadata must
    name the issuer it was fetched for, and its token endpoint must be on the issuer's origin.

    Args:
        url: The server's URL, as given to ``generate_mcp_sources`` (``{"url": ..., "oauth": {}}``).
        tokens: An `ImportedTokens`, or a mapping of its fields (e.g. a parsed token response with
            ``client_id`` added).
        store: Where to keep them; default `FileTokenStore`.

    Returns:
        The authorization server's token endpoint, where a refresh will go.

    Raises:
        UsageError: The tokens are incomplete, or the server's metadata cannot be discovered or does
            not pass the checks (nothing is stored then).
    """
    try:
        imported = tokens if isinstance(tokens, ImportedTokens) else ImportedTokens.model_validate(tokens)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'tokens'}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"the tokens to import for {url}: {problems}") from None
    discovered = await _discover(url)
    key = resource_url_from_server_url(url)
    client = OAuthClientInformationFull(
        client_id=imported.client_id,
        client_secret=imported.client_secret,
        token_endpoint_auth_method=imported.token_endpoint_auth_method
        or ("client_secret_basic" if imported.client_secret else "none"),
        grant_types=["authorization_code", "refresh_token"],
        issuer=str(discovered.metadata.issuer),
    )
    if DiscoveredServer.trusted(discovered.record(), url, client) is None:
        raise UsageError(
            f"{url}: its authorization server {printable(str(discovered.metadata.issuer), 200)} names the token "
            f"endpoint {printable(str(discovered.metadata.token_endpoint), 200)}, not on its own origin; ipybox "
            "sends refresh tokens only to the issuer's origin: authorize with 'ipybox generate NAME --url URL --oauth'"
        )
    token = OAuthToken(
        access_token=imported.access_token or "",
        token_type="Bearer",
        expires_in=imported.expires_in,
        refresh_token=imported.refresh_token,
        scope=imported.scope,
    )
    # An access token of unknown age is refreshed before its first use, when there is a refresh token.
    if imported.expires_in is not None:
        expires_at: float | None = time.time() + imported.expires_in
    else:
        expires_at = 0.0 if imported.refresh_token else None
    (store if store is not None else FileTokenStore()).save(
        key,
        {
            "tokens": token.model_dump(mode="json", exclude_none=True),
            "expires_at": expires_at,
            "client": client.model_dump(mode="json", exclude_none=True),
            "authorization_server": discovered.record(),
        },
    )
    return str(discovered.metadata.token_endpoint)


async def _discover(url: str) -> DiscoveredServer:
    """The protected resource metadata of ``url`` and its authorization server's metadata, checked
    as the SDK's flow checks them (RFC 9728 resource, RFC 8414 issuer)."""
    try:
        async with httpx2.AsyncClient(timeout=_DISCOVERY_TIMEOUT, follow_redirects=False) as client:
            resource: ProtectedResourceMetadata | None = None
            for candidate in build_protected_resource_metadata_discovery_urls(None, url):
                resource = await handle_protected_resource_response(
                    await client.send(create_oauth_metadata_request(candidate))
                )
                if resource is not None:
                    break
            issuer = str(resource.authorization_servers[0]) if resource is not None else None
            if resource is not None and not check_resource_allowed(
                resource_url_from_server_url(url), str(resource.resource)
            ):
                raise UsageError(
                    f"{url}: its protected resource metadata is about {printable(str(resource.resource), 200)}, "
                    "not about this server; tokens for it are not imported"
                )
            metadata: OAuthMetadata | None = None
            for candidate in build_oauth_authorization_server_metadata_discovery_urls(issuer, url):
                ok, found = await handle_auth_metadata_response(
                    await client.send(create_oauth_metadata_request(candidate))
                )
                if not ok:
                    break
                if found is not None:
                    metadata = found
                    break
    except httpx2.HTTPError as exc:
        raise UsageError(f"{url}: cannot discover its authorization server: {printable(str(exc), 300)}") from None
    if metadata is None:
        raise UsageError(f"{url}: no authorization server metadata found (is it an OAuth-protected MCP server?)")
    expected = issuer
    if expected is None:
        # The 2025-03-26 path: the issuer is the server's origin (with or without the root slash).
        origin = url.split("/", 3)
        expected = "/".join(origin[:3])
        if issuers_match(str(metadata.issuer), expected):
            expected = str(metadata.issuer)
    try:
        validate_metadata_issuer(metadata, expected)
    except OAuthFlowError as exc:
        raise UsageError(f"{url}: {printable(str(exc), 300)}; tokens for it are not imported") from None
    return DiscoveredServer(metadata, resource)
