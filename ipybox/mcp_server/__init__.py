"""ipybox as an MCP server: code actions in a sandboxed kernel per MCP session, with approved tool calls.

Run it with ``ipybox mcp`` or ``python -m ipybox.mcp_server``. ``_options`` holds the options and
`ServerConfig` (light: ``ipybox --help`` reads it), ``_sessions`` a session's executor and the
approval of its tool calls, ``_build`` the server (`build_server`), ``_tools`` the MCP tools it
serves, ``_transports`` the transports (`serve`), ``_command`` the command line (light until its
arguments are checked), ``_eventstore`` the events kept for stream resumption. The names below
are imported on first use, so importing this package does not load the MCP server stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipybox._lazy import lazy_names

if TYPE_CHECKING:
    from ._build import build_server as build_server
    from ._command import main as main
    from ._command import run_parsed as run_parsed
    from ._options import ServerConfig as ServerConfig
    from ._transports import serve as serve

_LAZY = {
    "ServerConfig": "._options",
    "build_server": "._build",
    "main": "._command",
    "run_parsed": "._command",
    "serve": "._transports",
}

__all__ = ("ServerConfig", "build_server", "main", "run_parsed", "serve")

if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, _LAZY)
