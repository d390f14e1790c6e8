"""An MCP server (stdio) whose tools misbehave: garbage on stdout, truncated replies, huge results, hangs.

Run as ``python faulty_server.py``; ``--pid-file PATH`` writes the process id there at start.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from mcp.server.mcpserver import MCPServer

__all__ = ("build_server",)


def build_server() -> MCPServer:
    """The faulty server with all its tools registered."""
    server = MCPServer("ipybox-faulty", log_level="WARNING")

    @server.tool(structured_output=False)
    def echo(text: str) -> str:
        """Return the text unchanged (the control case)."""
        return text

    @server.tool(structured_output=False)
    def huge(size: int) -> str:
        """A text result of ``size`` characters."""
        return "x" * size

    @server.tool(structured_output=False)
    def garbage_then_exit() -> str:
        """Write a line that is not JSON-RPC to stdout, then half a JSON object, then die."""
        out = sys.stdout.buffer
        out.write(b"this is not json at all\n")
        out.write(b'{"jsonrpc": "2.0", "id": ')
        out.flush()
        os._exit(3)

    @server.tool(structured_output=False)
    def garbage_then_answer(text: str) -> str:
        """Write a line that is not JSON-RPC to stdout, then answer normally."""
        sys.stdout.buffer.write(b"\x00\xffnot json {{{\n")
        sys.stdout.buffer.flush()
        return text

    @server.tool(structured_output=False)
    def hang() -> str:
        """Block the server for good: the event loop's thread waits on an event nobody sets."""
        threading.Event().wait()
        return "unreachable"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-file", type=Path)
    args = parser.parse_args()
    if args.pid_file is not None:
        args.pid_file.write_text(str(os.getpid()))
    build_server().run(transport="stdio")


if __name__ == "__main__":
    main()
