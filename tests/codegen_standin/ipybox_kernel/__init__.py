"""THROWAWAY STAND-IN for the kernel-side ``ipybox_kernel`` package; code generation tests only.

Generated tool modules call ``ipybox_kernel.call_tool``/``acall_tool``. The real package (written
elsewhere) sends each call over the sandbox's tool channel to the host. This stand-in instead calls
the MCP server directly, with the parameters recorded in the manifest under the tools directory
named by ``IPYBOX_STANDIN_TOOLS_DIR``, so the tests can run generated code end to end in a plain
subprocess. Tests put its directory first on ``PYTHONPATH``; nothing else may import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

__all__ = ("ToolOutput", "acall_tool", "call_tool")


@dataclass
class ToolOutput:
    """What a tool call returned: structured content, text, and every content item."""

    structured: dict[str, Any] | None
    text: str
    content: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])


class ToolError(Exception):
    """The tool reported an error."""


async def acall_tool(server_name: str, tool_name: str, arguments: dict[str, Any] | None) -> ToolOutput:
    """Call a tool of a server recorded in the manifest, directly over MCP."""
    from ipybox._manifest import load_manifest  # a test stand-in: keep imports local
    from ipybox._mcp import open_session

    params = load_manifest(Path(os.environ["IPYBOX_STANDIN_TOOLS_DIR"]))[server_name]
    async with open_session(server_name, params) as session:
        result = await session.call_tool(tool_name, arguments)
    content = [item.model_dump(mode="json", by_alias=True) for item in result.content]
    text = "\n".join(item["text"] for item in content if item.get("type") == "text")
    if result.is_error:
        raise ToolError(text)
    return ToolOutput(result.structured_content, text, content)


def call_tool(server_name: str, tool_name: str, arguments: dict[str, Any] | None) -> ToolOutput:
    """Synchronous `acall_tool`, for code that runs outside an event loop."""
    return anyio.run(acall_tool, server_name, tool_name, arguments)
