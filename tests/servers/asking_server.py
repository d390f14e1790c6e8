"""An MCP server whose tools ask the client things during the call: elicitation (form and URL mode),
sampling and roots, with whatever text, schema, URL or repetition the test chooses.

Run it as ``python tests/servers/asking_server.py [--transport stdio|streamable-http] [--by-capability]``;
over HTTP it prints ``READY <url>`` like the test server. Each tool returns what the client answered,
so the test sees exactly what reached the server. ``--by-capability`` lists a tool only to a client
that declared what it needs (``ask``/``ask_url``: elicitation, ``sample``: sampling, ``roots``:
roots), as server-everything does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

sys.path.insert(0, str(Path(__file__).parent))
from test_server import serve

__all__ = ("build_server",)

NAME_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "title": "Your name"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name"],
}


# The client capability each tool needs, for --by-capability.
NEEDS = {"ask": "elicitation", "ask_url": "elicitation", "sample": "sampling", "roots": "roots"}


class ByCapability(MCPServer):
    """Lists a tool only to a client that declared the capability the tool uses."""

    async def _handle_list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        declared = ctx.session.client_capabilities
        offered: set[str] = set() if declared is None else set(declared.model_dump(exclude_none=True))
        tools = [tool for tool in await self.list_tools() if NEEDS.get(tool.name, "") in offered | {""}]
        return types.ListToolsResult(tools=tools)


def build_server(by_capability: bool = False) -> MCPServer:
    server = (ByCapability if by_capability else MCPServer)("asking")

    @server.tool()
    async def ask(
        message: str, ctx: Context, schema: dict[str, Any] | None = None, times: int = 1, repeat: int = 1
    ) -> str:
        """Elicit ``times`` times with ``message`` (``repeat`` times over) and ``schema`` (default: a name form)."""
        message *= repeat
        requested = NAME_FORM if schema is None else schema
        answers: list[Any] = []
        for _ in range(times):
            try:
                result = await ctx.session.elicit_form(message, requested, related_request_id=ctx.request_id)
            except MCPError as exc:
                answers.append({"error": exc.error.message})
                continue
            answers.append({"action": result.action, "content": result.content})
        return json.dumps(answers)

    @server.tool()
    async def ask_url(message: str, url: str, ctx: Context) -> str:
        """Elicit in URL mode."""
        try:
            result = await ctx.session.elicit_url(message, url, "elicitation-1", related_request_id=ctx.request_id)
        except MCPError as exc:
            return json.dumps({"error": exc.error.message})
        return json.dumps({"action": result.action, "content": result.content})

    @server.tool()
    async def sample(prompt: str, ctx: Context) -> str:
        """Ask the client's LLM to complete ``prompt``."""
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
        try:
            result = await ctx.session.create_message(  # pyright: ignore[reportDeprecated]
                [message], max_tokens=20, related_request_id=ctx.request_id
            )
        except MCPError as exc:
            return json.dumps({"error": exc.error.message})
        content = result.content
        return json.dumps({"text": content.text if isinstance(content, types.TextContent) else None})

    @server.tool()
    async def roots(ctx: Context) -> str:
        """The client's roots, or its refusal."""
        try:
            result = await ctx.session.list_roots()  # pyright: ignore[reportDeprecated]
        except MCPError as exc:
            return json.dumps({"error": exc.error.message})
        return json.dumps({"roots": [str(root.uri) for root in result.roots]})

    @server.tool()
    def capabilities(ctx: Context) -> str:
        """What the client declared."""
        declared = ctx.client_capabilities
        return json.dumps(None if declared is None else declared.model_dump(mode="json", exclude_none=True))

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--by-capability", action="store_true")
    options = parser.parse_args()
    serve(build_server(options.by_capability), options.transport)


if __name__ == "__main__":
    main()
