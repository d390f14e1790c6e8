"""An MCP server with tools that exercise every path of ipybox's tool channel.

Run it as ``python tests/servers/test_server.py [--transport stdio|streamable-http|sse]``. Over HTTP
and SSE it binds 127.0.0.1 on a port the OS picks and prints one line ``READY <url>`` to stdout as
soon as the socket listens. ``--started-file PATH`` appends the process id to PATH at start, so a
test can tell whether (and how often) the server was started; ``--call-log PATH`` makes the tools
that change something (``delete_item``) append a line to PATH when they run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import struct
import sys
import zlib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

import anyio
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

__all__ = ("build_server", "png_bytes", "serve", "serve_http")

# Long enough for uvicorn to finish in-flight requests; the test fixture kills it after its own grace.
HTTP_SHUTDOWN_GRACE = 2

_call_log: Path | None = None

_COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "black": (0, 0, 0)}


class Address(BaseModel):
    street: str
    city: str
    country: Annotated[str, Field(min_length=2, max_length=2, description="ISO 3166 alpha-2 code")]


class Customer(BaseModel):
    name: str
    email: str | None = None
    address: Address


class Item(BaseModel):
    sku: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{3}$")]
    quantity: Annotated[int, Field(ge=1, le=100)]
    unit_price: Annotated[float, Field(gt=0)]


class Priority(StrEnum):
    low = "low"
    normal = "normal"
    urgent = "urgent"


class Range(BaseModel):
    min: float
    max: float


class Stats(BaseModel):
    count: int
    mean: float
    range: Range


def png_bytes(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG, built with the standard library only."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def build_server() -> MCPServer:
    """The test server with all its tools registered."""
    server = MCPServer("ipybox-test", log_level="WARNING")

    @server.tool(structured_output=False)
    def greet(name: str) -> str:
        """Greet someone by name."""
        return f"Hello, {name}!"

    @server.tool()
    def create_order(
        customer: Customer,
        items: Annotated[list[Item], Field(min_length=1)],
        priority: Priority = Priority.normal,
    ) -> str:
        """Place an order for a customer."""
        total = sum(item.quantity * item.unit_price for item in items)
        return (
            f"order for {customer.name} to {customer.address.city}, {customer.address.country}: "
            f"{len(items)} items, total {total:.2f}, priority {priority.value}"
        )

    @server.tool()
    def compute_stats(values: list[float]) -> Stats:
        """Count, mean and range of some numbers."""
        if not values:
            raise ToolError("values must not be empty")
        return Stats(count=len(values), mean=sum(values) / len(values), range=Range(min=min(values), max=max(values)))

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool(name="get-time")
    def get_time() -> str:
        """The server's current time in ISO 8601 format (UTC)."""
        return datetime.datetime.now(datetime.UTC).isoformat()

    @server.tool()
    def make_image(color: Literal["red", "green", "blue", "black"] = "red") -> Image:
        """A 4x4 PNG image of one colour."""
        return Image(data=png_bytes(4, 4, _COLORS[color]), format="png")

    @server.tool()
    def fail(message: str) -> str:
        """Always fails with the given message."""
        raise ToolError(message)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Return after the given number of seconds."""
        await anyio.sleep(seconds)  # waiting is what this tool is for
        return f"slept {seconds:g} s"

    @server.tool()
    def crash() -> str:
        """Kill the server process in the middle of the call."""
        sys.stderr.write("test server: crashing on request\n")
        sys.stderr.flush()
        os._exit(1)

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def get_env(name: str) -> str:
        """The value of an environment variable of the server process ('' when unset)."""
        return os.environ.get(name, "")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(key: str) -> str:
        """Look a key up without changing anything."""
        return f"value of {key}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False))
    def delete_item(item_id: str) -> str:
        """Delete an item for good."""
        if _call_log is not None:
            with _call_log.open("a") as f:
                f.write(f"delete_item {item_id}\n")
        return f"deleted {item_id}"

    return server


async def serve_http(server: MCPServer, transport: str, *, announce: str = "READY") -> None:
    """Serve over streamable HTTP or SSE on a free 127.0.0.1 port; print ``<announce> <url>`` once
    a client can connect."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    if transport == "sse":
        app, path = server.sse_app(host="127.0.0.1"), "/sse"
    else:
        app, path = server.streamable_http_app(host="127.0.0.1"), "/mcp"
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=HTTP_SHUTDOWN_GRACE)
    # The socket already listens, so a client that connects now waits in the backlog until uvicorn runs.
    print(f"{announce} http://127.0.0.1:{port}{path}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--started-file", type=Path)
    parser.add_argument("--call-log", type=Path)
    options = parser.parse_args()
    global _call_log
    _call_log = options.call_log
    if options.started_file is not None:
        with options.started_file.open("a") as f:
            f.write(f"{os.getpid()}\n")
    serve(build_server(), options.transport)


def serve(server: MCPServer, transport: str) -> None:
    """Serve over stdio, or over HTTP as `serve_http` does."""
    if transport == "stdio":
        server.run("stdio")
    else:
        anyio.run(serve_http, server, transport)


if __name__ == "__main__":
    main()
