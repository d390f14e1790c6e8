"""OAuth 2.1 for remote MCP servers: how a person authorizes, and where tokens are kept.

A server gets OAuth from its parameters (``{"url": ..., "oauth": {}}``, see `OAuthParams`); what
happens at run time is host configuration, given as one `OAuth` to `ipybox.generate_mcp_sources`
and `ipybox.CodeExecutor`::

    from ipybox.oauth import OAuth

    async def authorize(request):  # show request.url to the person, return where the browser landed
        ...

    oauth = OAuth(authorize=authorize)
    await generate_mcp_sources("linear", {"url": "https://mcp.linear.app/mcp", "oauth": {}}, "mcptools", oauth=oauth)
    async with CodeExecutor(oauth=oauth) as executor:
        ...

Tokens stay on the host, in `OAuth.store` (default `FileTokenStore`: private files under the
user's data directory), never in the tools directory, its manifest or the kernel. Tokens obtained
elsewhere are handed over with `import_tokens` (or ``ipybox auth import``).
"""

from ._mcp._loopback import LoopbackAuthorizer
from ._mcp._oauth import AuthorizationRequest, Authorize, OAuth
from ._mcp._servers import OAuthParams
from ._mcp._tokenimport import ImportedTokens, import_tokens
from ._mcp._tokenstore import FileTokenStore, TokenStore, default_token_dir

__all__ = (
    "AuthorizationRequest",
    "Authorize",
    "FileTokenStore",
    "ImportedTokens",
    "LoopbackAuthorizer",
    "OAuth",
    "OAuthParams",
    "TokenStore",
    "default_token_dir",
    "import_tokens",
)
