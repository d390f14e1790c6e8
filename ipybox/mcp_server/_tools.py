"""The MCP server's tools, in five families; `build_server` adds them in the order clients list them.

Every tool works on the calling MCP session's `Session` (`session_of`): its executor, its
workspace, its registered servers and generated modules. A mistake the caller can fix comes back as
the tool's error (`ToolError`, its text saying what to change); a failed or timed-out execution is a
result marked as an error, with the output before it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import mimetypes
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    ToolAnnotations,
)
from pydantic import Field

from ipybox._engine._results import CodeExecutionResult
from ipybox._exceptions import (
    CodeExecutionError,
    ExecutionError,
    ExecutionTimeout,
    IpyboxError,
    KernelError,
    UsageError,
)
from ipybox._mcp._servers import describe_server, parse_server_params
from ipybox._workspace import read_file, write_file
from ipybox.codegen._codegen import generate_mcp_sources
from ipybox.codegen._stubs import render_tool_stubs
from ipybox.codegen._toolsearch import render_match_stubs
from ipybox.codegen._toolsearch import search_tools as find_tools
from ipybox.skills._prompt import render_skill_stubs

from ._options import ServerConfig
from ._sessions import Session, sessions_of

__all__ = (
    "add_execute_tool",
    "add_file_tools",
    "add_kernel_tools",
    "add_server_tools",
    "add_skill_tools",
)

# Characters of installer output returned by install_package (its tail holds the outcome).
_INSTALL_OUTPUT_CHARS = 4000

_Code = Annotated[str, Field(description="Python source; IPython syntax (magics, top-level await) works")]
_Timeout = Annotated[
    float | None,
    Field(description="Seconds the code may run (time waiting for tool-call approval not counted); default 120"),
]
_MaxChars = Annotated[
    int | None,
    Field(description="Characters of output to return; longer output is cut in the middle (default 20000)"),
]
_ServerName = Annotated[str, Field(description="The name the server is registered under, e.g. 'github'")]

# What only reads: clients may call these without asking their user.
_READ_ONLY = ToolAnnotations(read_only_hint=True)


async def session_of(ctx: Context) -> Session:
    """The calling MCP session's `Session`, its executor started on first use."""
    return await sessions_of(ctx).get(ctx)


# -- running code ------------------------------------------------------------------------------


def add_execute_tool(server: MCPServer, config: ServerConfig) -> None:
    """execute_ipython_cell: run code in the session's kernel."""

    @server.tool(
        description=(
            "Run Python code in the session's stateful, sandboxed IPython kernel and return its output "
            "(stdout, stderr, results) as text and any displayed images (e.g. matplotlib figures) as images. "
            "Variables, imports and files persist between calls. Call tools of registered MCP servers from "
            "the code: `from mcptools.<server> import <tool>` then `<tool>.run(<tool>.Params(...))`; do the "
            "processing in Python and print only what you need. The kernel has no network; install packages "
            "with install_package. Errors come back with the traceback; a timeout interrupts the code and "
            "keeps the kernel's state."
        ),
        structured_output=False,
    )
    # The timeout is the kernel's, enforced by the executor (which stops the clock during approvals).
    async def execute_ipython_cell(
        code: _Code,
        ctx: Context,
        timeout: _Timeout = None,  # noqa: ASYNC109
        max_output_chars: _MaxChars = None,
    ) -> CallToolResult:
        if len(code) > config.max_code_chars:
            raise ToolError(
                f"code is {len(code)} characters; the limit is {config.max_code_chars}. Write large data to a "
                "file with upload_file and read it from the code instead"
            )
        if timeout is not None and not 0 < timeout <= config.max_timeout:
            raise ToolError(f"timeout must be between 0 and {config.max_timeout:g} seconds, got {timeout!r}")
        limit = max_output_chars if max_output_chars is not None else config.max_output_chars
        if limit < 1:
            raise ToolError(f"max_output_chars must be at least 1, got {limit!r}")
        session = await session_of(ctx)
        async with session.use() as executor, session.lock:
            notice, session.notice = session.notice, ""
            execution = executor.execute(code, timeout=timeout or config.timeouts.execution)
            with session.asking(execution, ctx):
                try:
                    result = await execution
                except anyio.get_cancelled_exc_class():
                    # The client cancelled the request (or left): stop the code rather than let it run on.
                    execution.cancel()
                    raise
                except CodeExecutionError as exc:
                    output = _truncate(exc.output, limit)
                    separator = "\n" if output and not output.endswith("\n") else ""
                    return _error_result(f"{notice}{output}{separator}{exc}")
                except ExecutionTimeout as exc:
                    output = _truncate(exc.output, limit)
                    shown = f"Output before the timeout:\n{output}\n" if output else "There was no output.\n"
                    return _error_result(f"{notice}TimeoutError: {exc}.\n{shown}")
                except (ExecutionError, KernelError) as exc:
                    return _error_result(f"{notice}{type(exc).__name__}: {exc}")
        content = _result_content(result, limit)
        if notice:
            content.insert(0, TextContent(text=notice))
        return CallToolResult(content=content)


def _truncate(text: str, limit: int) -> str:
    """Keep the head and the tail of ``text`` within ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    note = f"\n[ipybox: output truncated: {cut} of {len(text)} characters cut from the middle; "
    note += "print less, or pass a larger max_output_chars]\n"
    return text[:head] + note + (text[-tail:] if tail else "")


def _result_content(result: CodeExecutionResult, limit: int) -> list[ContentBlock]:
    text = _truncate(result.text, limit)
    content: list[ContentBlock] = []
    if text or not result.images:
        content.append(TextContent(text=text or "(no output)"))
    content.extend(ImageContent(data=base64.b64encode(i.data).decode(), mime_type=i.mime) for i in result.images)
    return content


def _error_result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=text)], is_error=True)


def add_kernel_tools(server: MCPServer) -> None:
    """install_package and reset: the kernel's packages and its state."""

    @server.tool(
        description=(
            "Install a Python package from the package index for the kernel (the kernel itself has no "
            "network), e.g. 'pandas' or 'requests==2.32.3'. It is importable right away and survives reset."
        ),
        structured_output=False,
    )
    async def install_package(
        name: Annotated[str, Field(description="A requirement: a name with an optional version specifier")],
        ctx: Context,
    ) -> str:
        session = await session_of(ctx)
        async with session.use() as executor:
            try:
                output = await executor.install(name)
            except IpyboxError as exc:
                raise ToolError(str(exc)) from None
        tail = output[-_INSTALL_OUTPUT_CHARS:]
        return f"installed {name!r}\n{tail}".rstrip()

    @server.tool(
        description="Restart the kernel: all variables and imports are lost; workspace files and packages are kept.",
        structured_output=False,
    )
    async def reset(ctx: Context) -> str:
        session = await session_of(ctx)
        async with session.use() as executor, session.lock:
            await executor.reset()
        return "The kernel was restarted; variables are cleared, workspace files are kept."


# -- the MCP servers the code calls ------------------------------------------------------------


def add_server_tools(server: MCPServer, config: ServerConfig) -> None:
    """register_mcp_server, list_mcp_servers, get_tool_stubs and search_tools."""

    @server.tool(
        description=(
            "Connect to an MCP server, generate a typed Python module for each of its tools (importable in "
            "the kernel as `mcptools.<server>.<tool>`) and return compact stubs of those modules: read them "
            "to write code that calls the tools. server_params uses the usual mcpServers format: "
            '{"command": "npx", "args": ["-y", "some-server"], "env": {...}} for a server started as a '
            'process, or {"url": "https://...", "headers": {...}} (add "type": "sse" for SSE). '
            "Registering again with the same name regenerates the modules."
        ),
        structured_output=False,
    )
    async def register_mcp_server(server_name: _ServerName, server_params: dict[str, Any], ctx: Context) -> str:
        if not config.allow_register:
            raise ToolError(
                "registering servers is disabled on this ipybox server (it was started with --no-register, or "
                "over HTTP without --allow-register); list_mcp_servers shows the servers it was configured with"
            )
        session = await session_of(ctx)
        async with session.use() as executor:
            try:
                params = parse_server_params(server_params)
                modules = await generate_mcp_sources(server_name, params, session.tools_dir)
                executor.register_mcp_server(server_name, params)
            except IpyboxError as exc:
                raise ToolError(str(exc)) from None
        session.servers[server_name] = params
        session.modules[server_name] = modules
        return render_tool_stubs(session.tools_dir, servers=[server_name])

    @server.tool(
        description=(
            "List the MCP servers registered in this session, with the names of their tools. Use "
            "get_tool_stubs to read a server's tool signatures."
        ),
        structured_output=False,
        annotations=_READ_ONLY,
    )
    async def list_mcp_servers(ctx: Context) -> str:
        session = await session_of(ctx)
        lines: list[str] = []
        for name, params in session.servers.items():
            modules = session.modules.get(name, [])
            lines.append(f"{name}: {describe_server(params)}\n  tools: {', '.join(modules) or '(none)'}")
        lines.extend(session.startup_notes)
        return "\n".join(lines) if lines else "No MCP servers are registered; use register_mcp_server."

    @server.tool(
        description=(
            "Return compact Python stubs (models, signatures, one-line docs) of a registered server's tool "
            "modules, optionally only the named tools. Read them before writing code that calls the tools."
        ),
        structured_output=False,
        annotations=_READ_ONLY,
    )
    async def get_tool_stubs(
        server_name: _ServerName,
        ctx: Context,
        tools: Annotated[
            list[str] | None, Field(description="Only these tools (tool or module names); all when omitted")
        ] = None,
    ) -> str:
        session = await session_of(ctx)
        if server_name not in session.servers:
            known = ", ".join(repr(n) for n in session.servers) or "none"
            raise ToolError(
                f"no MCP server {server_name!r} is registered (registered: {known}); use register_mcp_server"
            )
        try:
            return render_tool_stubs(session.tools_dir, servers=[server_name], tools=tools or None)
        except UsageError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(
        description=(
            "Search the tools of the registered MCP servers by what they should do (e.g. 'weather forecast "
            "for a city') and return the stubs of the best matches. With many servers, use this instead of "
            "reading every server's stubs; kernel code can do the same with ipybox_kernel.search_tools."
        ),
        structured_output=False,
        annotations=_READ_ONLY,
    )
    async def search_tools(
        query: Annotated[str, Field(description="What the tool should do, in words")],
        ctx: Context,
        k: Annotated[int, Field(description="How many tools to return", ge=1, le=50)] = 5,
    ) -> str:
        session = await session_of(ctx)
        if not session.servers:
            return "No MCP servers are registered; use register_mcp_server."
        tools_dir = session.tools_dir
        try:
            # Reads and parses the generated modules the first time: off the event loop.
            matches = await anyio.to_thread.run_sync(functools.partial(find_tools, tools_dir, query, k))
        except UsageError as exc:
            raise ToolError(str(exc)) from None
        if not matches:
            return f"No registered tool matches {query!r}; list_mcp_servers lists them all."
        return render_match_stubs(tools_dir, matches)


# -- files and skills --------------------------------------------------------------------------


def add_file_tools(server: MCPServer, config: ServerConfig) -> None:
    """upload_file and download_file: the workspace, for clients that do not share a filesystem."""

    @server.tool(
        description=(
            "Write a file into the kernel's workspace (for clients that do not share a filesystem with "
            f"ipybox). content_base64 is the file's bytes in base64; at most {config.max_file_bytes} bytes."
        ),
        structured_output=False,
    )
    async def upload_file(
        path: Annotated[str, Field(description="Destination, relative to the workspace, e.g. 'data/input.csv'")],
        content_base64: Annotated[str, Field(description="The file content, base64-encoded")],
        ctx: Context,
    ) -> str:
        if len(content_base64) > (config.max_file_bytes + 2) // 3 * 4 + 4:
            raise ToolError(f"the file is larger than the upload limit of {config.max_file_bytes} bytes")
        try:
            data = base64.b64decode(content_base64, validate=True)
        except (binascii.Error, ValueError):
            raise ToolError(
                "content_base64 is not valid base64 (use the standard alphabet with padding, no line breaks)"
            ) from None
        if len(data) > config.max_file_bytes:
            raise ToolError(f"the file is {len(data)} bytes; the upload limit is {config.max_file_bytes}")
        session = await session_of(ctx)
        try:
            written = await anyio.to_thread.run_sync(write_file, session.workspace, path, data)
        except (UsageError, OSError) as exc:
            raise ToolError(f"cannot write {path!r}: {exc}") from None
        return f"wrote {len(data)} bytes to {written.relative_to(session.workspace).as_posix()!r} in the workspace"

    @server.tool(
        description=(
            "Read a file from the kernel's workspace and return its bytes as an embedded base64 resource "
            f"(at most {config.max_file_bytes} bytes)."
        ),
        structured_output=False,
        annotations=_READ_ONLY,
    )
    async def download_file(
        path: Annotated[str, Field(description="The file, relative to the workspace")], ctx: Context
    ) -> CallToolResult:
        session = await session_of(ctx)
        # The content comes back inline, so the cap is the server's file limit, checked before and
        # while reading: the kernel can make a file of any size in an instant.
        read = functools.partial(
            read_file,
            session.workspace,
            path,
            max_bytes=config.max_file_bytes,
            fix="download_file returns files inline, up to the server's file limit (--max-file-mb, or "
            "max_file_bytes in its config); make the file smaller in the kernel (compress or split it), "
            "or start the server with a larger limit",
        )
        try:
            data = await anyio.to_thread.run_sync(read)
        except (UsageError, OSError) as exc:
            raise ToolError(f"cannot read {path!r}: {exc}") from None
        mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
        blob = BlobResourceContents(
            uri=f"file:///workspace/{path.lstrip('/')}", mime_type=mime, blob=base64.b64encode(data).decode()
        )
        return CallToolResult(
            content=[
                TextContent(text=f"{path!r}: {len(data)} bytes ({mime})"),
                EmbeddedResource(resource=blob),
            ]
        )


def add_skill_tools(server: MCPServer, skills_dir: Path) -> None:
    """save_skill and list_skills, for a server with a skills directory."""

    @server.tool(
        description=(
            "Save Python code that worked as a skill: a module importable by later cells and sessions as "
            "`from skills.<name> import run`. The code must define `run(...)`; give it typed parameters and a "
            "docstring, and the module a docstring saying what the skill is for (list_skills shows them). It is "
            "compiled, not run. overwrite replaces a saved skill of the same name."
        ),
        structured_output=False,
    )
    async def save_skill(
        name: Annotated[str, Field(description="Lowercase module name, e.g. 'summarize_forecasts'")],
        code: Annotated[str, Field(description="The module's Python source, defining run(...)")],
        description: Annotated[str, Field(description="One line: what the skill does and when to use it")],
        ctx: Context,
        overwrite: Annotated[bool, Field(description="Replace a saved skill of this name")] = False,
    ) -> str:
        session = await session_of(ctx)
        async with session.use() as executor:
            try:
                skill = await executor.save_skill(name, code, description=description, overwrite=overwrite)
            except IpyboxError as exc:
                raise ToolError(str(exc)) from None
        return f"saved skill {skill.name!r}: `from {skill.module} import run`"

    @server.tool(
        description=(
            "List the saved skills with their descriptions and the signatures of their run functions. Import "
            "one in a cell with `from skills.<name> import run`."
        ),
        structured_output=False,
        annotations=_READ_ONLY,
    )
    async def list_skills() -> str:
        stubs = await anyio.to_thread.run_sync(render_skill_stubs, skills_dir)
        return stubs or "No skills are saved yet; save code that worked with save_skill."
