"""The benchmark's own small MCP server (stdio), used by both sides of the benchmark.

It runs under this repository's interpreter (mcp 2.x) for both sides, so the two executors talk to
the very same server implementation and only the path between kernel and server differs.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

__all__ = ("server",)

server = MCPServer("benchsrv", log_level="ERROR")


class Point(BaseModel):
    x: int
    y: int


@server.tool(structured_output=False)
def greet(name: str) -> str:
    """Greet someone by name (plain text result)."""
    return f"Hello, {name}!"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers (structured result)."""
    return a + b


@server.tool()
def shift(p: Point, dx: int) -> Point:
    """Shift a point along x (nested object in, structured object out)."""
    return Point(x=p.x + dx, y=p.y)


if __name__ == "__main__":
    server.run("stdio")
