"""An MCP server whose one tool, ``trace_context``, returns the W3C trace context fields the
request's ``_meta`` carried (``traceparent``, ``tracestate``, ``baggage``; null when absent), so a
test sees exactly what a server is told of the client's trace.

Run it as ``python tests/servers/tracing_server.py [--transport stdio|streamable-http]``; over HTTP
it prints ``READY <url>`` like the test server.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer

sys.path.insert(0, str(Path(__file__).parent))
from test_server import serve

__all__ = ("build_server",)

FIELDS = ("traceparent", "tracestate", "baggage")


def build_server() -> MCPServer:
    server = MCPServer("tracing")

    @server.tool()
    def trace_context(ctx: Context) -> str:
        """The trace context fields of this request's _meta, as JSON."""
        meta = ctx.request_context.meta or {}
        return json.dumps({name: meta.get(name) for name in FIELDS})

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    options = parser.parse_args()
    serve(build_server(), options.transport)


if __name__ == "__main__":
    main()
