"""ipybox as an MCP server: code actions in a sandboxed kernel per MCP session, with approved tool calls.

Run it with ``ipybox mcp`` or ``python -m ipybox.mcp_server`` (``--help`` lists the options). Every
MCP session gets its own `CodeExecutor`: its own kernel, tool server and generated tool modules, so
sessions cannot see each other's state. The executor is started on the session's first tool call and
shut down when the session ends. A kernel idle for ``--idle-ttl`` seconds is shut down too, and the
session's next request starts a fresh one (registered servers and workspace files are kept).

`build_server` makes the server (its sessions' lifespan, its instructions, what the protocol needs);
the tools it serves are `._tools`'s.
"""

# The 2026 protocol's discovery is refused through the low-level server, which mcp only exposes privately.
# pyright: reportPrivateUsage=false

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND, DiscoverResult, RequestParams

from ipybox import __version__
from ipybox._exceptions import UsageError
from ipybox._kernel._inprocess import forbid_in_process_kernels

from ._options import ServerConfig
from ._sessions import Sessions, session_pool
from ._tools import add_execute_tool, add_file_tools, add_kernel_tools, add_server_tools, add_skill_tools

__all__ = ("build_server",)

_INSTRUCTIONS = """\
ipybox runs Python in a sandboxed, stateful IPython kernel (no network; the workspace is the only \
writable directory) and lets that code call the tools of other MCP servers through generated, typed \
Python modules. Typical flow: register_mcp_server (or list_mcp_servers for the ones already \
registered) -> read the stubs it returns (get_tool_stubs on demand; search_tools finds the right ones \
among many) -> execute_ipython_cell with code \
like `from mcptools.<server> import <tool>; r = <tool>.run(<tool>.Params(...))`, processing results \
in Python and printing only what you need. Variables persist between cells until reset. Tool calls \
from code may need the user's approval."""

_SKILLS_INSTRUCTIONS = """ When code worked and is worth keeping, save it as a skill with save_skill \
(a module with a typed `run(...)` and a docstring; kernel code can call ipybox_kernel.save_skill, which \
needs approval): later cells, and later sessions, import it as `from skills.<name> import run`. \
list_skills shows the saved skills; check them before writing new code."""


def build_server(config: ServerConfig, *, shared: bool = False) -> MCPServer:
    """Build the ipybox MCP server.

    Args:
        config: The configuration every session's executor is built from.
        shared: Several MCP sessions share this server (HTTP): each session works in its own
            subdirectory of the workspace.
    """

    if config.pool_size and not shared:
        raise UsageError("pool_size keeps kernels for new HTTP sessions; a server with one session has no use for it")
    # Its code comes from MCP clients: an in-process kernel (ipybox.testing) would run it unsandboxed here.
    forbid_in_process_kernels("this process serves ipybox's MCP server, whose code comes from MCP clients")

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncGenerator[Sessions]:
        # Closed after the sessions: it shuts down the kernels they took from it.
        async with session_pool(config) as pool, anyio.create_task_group() as tg:
            sessions = Sessions(config, tg, shared=shared, pool=pool)
            try:
                yield sessions
            finally:
                await sessions.close_all()
                tg.cancel_scope.cancel()

    instructions = _INSTRUCTIONS + (_SKILLS_INSTRUCTIONS if config.kernel.skills_dir is not None else "")
    server = MCPServer("ipybox", version=__version__, instructions=instructions, lifespan=lifespan)

    if shared:
        # The 2026 protocol is sessionless, so it has nowhere to keep a kernel between requests.
        # Refusing discovery makes clients that probe for it fall back to the initialize handshake
        # (over HTTP every request without a session id stands alone, so the fallback can succeed).
        async def refuse_discovery(ctx: ServerRequestContext[Any], params: RequestParams) -> DiscoverResult:
            raise MCPError(
                code=METHOD_NOT_FOUND,
                message="ipybox keeps a kernel per MCP session: connect with the initialize handshake",
            )

        server._lowlevel_server.add_request_handler("server/discover", RequestParams, refuse_discovery)

    add_execute_tool(server, config)
    add_server_tools(server, config)
    if config.kernel.skills_dir is not None:
        add_skill_tools(server, config.kernel.skills_dir)
    add_kernel_tools(server)
    add_file_tools(server, config)
    return server
