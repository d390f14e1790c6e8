"""ipybox as an MCP server: code actions in a sandboxed kernel per MCP session, with approved tool calls.

Run it with ``ipybox mcp`` or ``python -m ipybox.mcp_server`` (``--help`` lists the options). Every
MCP session gets its own `CodeExecutor`: its own kernel, tool server and generated tool modules, so
sessions cannot see each other's state. The executor is started on the session's first tool call and
shut down when the session ends. A kernel idle for ``--idle-ttl`` seconds is shut down too, and the
session's next request starts a fresh one (registered servers and workspace files are kept).
"""

# The per-session lifecycle needs the session's Connection, which mcp only exposes privately.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import argparse
import base64
import binascii
import functools
import json
import logging
import mimetypes
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import anyio
import anyio.abc
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import (
    METHOD_NOT_FOUND,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    DiscoverResult,
    EmbeddedResource,
    ImageContent,
    RequestParams,
    TextContent,
)
from pydantic import BaseModel, Field

from ipybox import __version__
from ipybox._approval import ApprovalCallback, ApprovalDecision, ApprovalRequest, ApprovalRules
from ipybox._config import Limits, SandboxConfig, Timeouts
from ipybox._events import wait_any
from ipybox._exceptions import (
    CodeExecutionError,
    ExecutionError,
    ExecutionTimeout,
    IpyboxError,
    KernelError,
    UsageError,
)
from ipybox._executor import CodeExecutor
from ipybox._mcp import HttpServer, StdioServer, describe_server, parse_server_params
from ipybox._results import CodeExecutionResult
from ipybox._workspace import read_file, write_file
from ipybox.codegen._codegen import generate_mcp_sources
from ipybox.codegen._stubs import render_tool_stubs

from ._config import TOKEN_ENV, ServerConfig, add_arguments, bearer_token, check_exposure, config_from_args

__all__ = ("ServerConfig", "build_server", "main", "run_parsed", "serve")

logger = logging.getLogger(__name__)

# Key of the ipybox session in the MCP connection's per-connection state.
_STATE_KEY = "ipybox.session"
# The tools package name inside a session's private state directory (imported as `mcptools.<server>`).
_TOOLS_PACKAGE = "mcptools"
# Characters of the running code shown in an approval prompt; enough to recognise it.
_PROMPT_CODE_CHARS = 1500
# Characters of one argument value shown in an approval prompt.
_PROMPT_ARG_CHARS = 500
# Characters of installer output returned by install_package (its tail holds the outcome).
_INSTALL_OUTPUT_CHARS = 4000

_INSTRUCTIONS = """\
ipybox runs Python in a sandboxed, stateful IPython kernel (no network; the workspace is the only \
writable directory) and lets that code call the tools of other MCP servers through generated, typed \
Python modules. Typical flow: register_mcp_server (or list_mcp_servers for the ones already \
registered) -> read the stubs it returns (get_tool_stubs on demand) -> execute_ipython_cell with code \
like `from mcptools.<server> import <tool>; r = <tool>.run(<tool>.Params(...))`, processing results \
in Python and printing only what you need. Variables persist between cells until reset. Tool calls \
from code may need the user's approval."""


# -- sessions ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Session:
    """The state of one MCP session: its executor, tools directory and registered servers.

    The executor is stopped after ``config.idle_ttl`` seconds without a request and started again
    by the next one; registered servers (the tools directory) and workspace files are kept.
    """

    config: ServerConfig
    workspace: Path
    state_dir: Path
    owns_workspace: bool = False
    """The workspace is this session's own directory (``sessions/<id>`` of a server shared over HTTP),
    removed when the session ends."""
    executor: CodeExecutor | None = None
    servers: dict[str, StdioServer | HttpServer] = field(default_factory=dict[str, StdioServer | HttpServer])
    modules: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    """The generated tool modules of each registered server."""
    startup_notes: list[str] = field(default_factory=list[str])
    notice: str = ""
    """Told to the model with the next cell's output (the kernel was restarted after being idle)."""
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    ready: anyio.Event = field(default_factory=anyio.Event)
    closed: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    error: IpyboxError | None = None
    """Why the executor could not be started (or restarted) last time."""
    start_error: IpyboxError | None = None
    """Why the session's first executor could not be started: the session is unusable."""
    busy: int = 0
    last_active: float = 0.0
    _activity: anyio.Event = field(default_factory=anyio.Event)
    _wanted: anyio.Event = field(default_factory=anyio.Event)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def tools_dir(self) -> Path:
        return self.state_dir / _TOOLS_PACKAGE

    def _touch(self) -> None:
        self.last_active = anyio.current_time()
        self._activity.set()
        self._activity = anyio.Event()

    def _set_executor(self, executor: CodeExecutor | None) -> None:
        if executor is None:
            # Replaced in the same step the executor goes away, so a request arriving while it
            # shuts down sets the event the restart loop waits on next.
            self._wanted = anyio.Event()
        self.executor = executor
        self._changed.set()
        self._changed = anyio.Event()

    @asynccontextmanager
    async def use(self) -> AsyncGenerator[CodeExecutor]:
        """The running executor for one request, started again if it was stopped for idleness."""
        self.busy += 1
        self._touch()
        try:
            while self.executor is None:
                if self.closed.is_set():
                    raise ToolError("this MCP session is closing; its kernel was shut down")
                changed = self._changed
                self._wanted.set()
                await changed.wait()
                if self.executor is None and self.error is not None:
                    raise ToolError(f"the sandboxed kernel could not be restarted: {self.error}")
            yield self.executor
        finally:
            self.busy -= 1
            self._touch()

    async def _until_idle_or_closed(self) -> None:
        while not self.closed.is_set():
            activity = self._activity
            if self.busy:
                await wait_any(self.closed, activity)
                continue
            remaining = self.last_active + self.config.idle_ttl - anyio.current_time()
            if remaining <= 0:
                return
            with anyio.move_on_after(remaining):
                await wait_any(self.closed, activity)

    def _executor(self) -> CodeExecutor:
        config = self.config
        sandbox = SandboxConfig(ro_paths=config.ro_paths, rw_paths=config.rw_paths) if config.sandbox else None
        # Servers listed in the tools directory's manifest are registered again on a restart.
        return CodeExecutor(
            workspace=self.workspace,
            sandbox=sandbox,
            env=config.env,
            limits=Limits(memory=config.memory),
            timeouts=Timeouts(execution=config.timeout, approval=config.approval_timeout),
            tools_dir=self.tools_dir,
            approval=self.approval_for(None, ""),
        )

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # Created before the kernel starts so they are mounted read-only and the manifest is hidden.
        (self.tools_dir / ".ipybox").mkdir(parents=True, exist_ok=True)
        self._touch()
        try:
            async with self._executor() as executor:
                for name, params in self.config.servers.items():
                    try:
                        self.modules[name] = await generate_mcp_sources(name, params, self.tools_dir)
                        executor.register_mcp_server(name, params)
                        self.servers[name] = params
                    except IpyboxError as exc:
                        self.startup_notes.append(f"server {name!r} from the configuration is unavailable: {exc}")
                self._set_executor(executor)
                task_status.started()
                self.ready.set()
                await self._until_idle_or_closed()
                self._set_executor(None)
            while not self.closed.is_set():
                self.notice = (
                    f"[ipybox: the kernel was shut down after {self.config.idle_ttl:g} s without requests and "
                    "restarted: variables are lost; registered servers and workspace files are kept]\n"
                )
                await wait_any(self.closed, self._wanted)
                if self.closed.is_set():
                    break
                try:
                    async with self._executor() as executor:
                        self.error = None
                        self._set_executor(executor)
                        await self._until_idle_or_closed()
                        self._set_executor(None)
                except IpyboxError as exc:
                    # Reported to the waiting request; the next request tries again.
                    self.error = exc
                    self._set_executor(None)
        except IpyboxError as exc:
            self.error = exc
            if not self.ready.is_set():
                self.start_error = exc
                self.ready.set()
                raise  # to the request that started the session
            # Shutting down: one session's failure must not take the whole server down.
            logger.warning("ipybox session shut down with an error: %s", exc)
        except Exception:
            if not self.ready.is_set():
                raise  # to the request that started the session
            # A bug: it ends this session only. Raised on, it would end the task group every session runs in.
            logger.exception("ipybox session failed; it was closed")
        finally:
            # Requests waiting for a kernel hear that there will be none, instead of waiting for good.
            self.closed.set()
            self._set_executor(None)
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if self.owns_workspace:
                # The kernel is gone; rmtree never follows the symlinks its code may have left.
                shutil.rmtree(self.workspace, ignore_errors=True)
            self.done.set()

    # -- approval --------------------------------------------------------------------------

    def approval_for(self, ctx: Context | None, code: str) -> ApprovalCallback:
        """The approval policy of one request's execution: prompts go to that request's client."""
        return functools.partial(self._approve, ctx, code)

    async def _approve(self, ctx: Context | None, code: str, request: ApprovalRequest) -> ApprovalDecision:
        config = self.config
        rules = ApprovalRules(
            allow=config.allow,
            deny=config.deny,
            allow_read_only=config.allow_read_only,
            otherwise=_OTHERWISE[config.approval],
        )
        decision = rules.decide(request)
        if decision is not None:
            return decision
        name = f"{request.server_name}.{request.tool_name}"
        capabilities = ctx.client_capabilities if ctx is not None else None
        can_ask = ctx is not None and ctx.request_context.session.can_send_request
        if ctx is None or not can_ask or capabilities is None or capabilities.elicitation is None:
            return ApprovalDecision(
                approved=False,
                by="policy",
                reason=(
                    f"{name} needs approval, but this MCP client cannot ask its user (no elicitation support); "
                    f"start ipybox with '--allow {name}' (or another --allow glob), '--allow-read-only' "
                    "or '--approval auto' to allow tool calls"
                ),
            )
        try:
            answer = await ctx.elicit(_approval_message(request, code), _ApprovalForm)
        except (MCPError, ValueError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            # No answer (an error, an invalid form, a client that went away) means no.
            logger.warning("elicitation for %s failed: %r", name, exc)
            return ApprovalDecision(approved=False, reason=f"asking the user about {name} failed: {exc}")
        if answer.action == "accept" and cast("_ApprovalForm", getattr(answer, "data", None)).approve:
            return ApprovalDecision(approved=True)
        how = "cancelled" if answer.action == "cancel" else "declined"
        return ApprovalDecision(approved=False, reason=f"the user {how} the call to {name}")


_OTHERWISE: dict[str, Literal["ask", "accept", "reject"]] = {"ask": "ask", "auto": "accept", "deny": "reject"}


class _ApprovalForm(BaseModel):
    approve: bool = Field(default=True, description="Allow this tool call to run")


def _approval_message(request: ApprovalRequest, code: str) -> str:
    args: list[str] = []
    for key, value in request.tool_args.items():
        text = json.dumps(value, ensure_ascii=False, default=repr)
        if len(text) > _PROMPT_ARG_CHARS:
            text = text[:_PROMPT_ARG_CHARS] + f"... ({len(text)} characters)"
        args.append(f"  {key} = {text}")
    shown = code if len(code) <= _PROMPT_CODE_CHARS else code[:_PROMPT_CODE_CHARS] + "\n# ... (code truncated)"
    hints = ", ".join(f"{k}={v}" for k, v in (request.annotations or {}).items() if v is not None)
    return "\n".join(
        [
            f"Code running in ipybox wants to call tool {request.tool_name!r} of MCP server {request.server_name!r}.",
            f"Server: {request.server}",
            *([f"Tool hints: {hints}"] if hints else []),
            "Arguments:" if args else "Arguments: none",
            *args,
            "Code:",
            shown,
            "Approve to run this call; decline to make it raise ToolCallRejected in the code.",
        ]
    )


class _Sessions:
    """Starts a `_Session` on first use and stops it when its MCP session ends.

    Over stdio the server has exactly one client, and its session lasts as long as the process.
    Over HTTP each MCP session (``Mcp-Session-Id``) gets its own, stopped when the client ends the
    session or the session manager closes it (a client gone for ``idle_ttl`` seconds).
    """

    def __init__(self, config: ServerConfig, tg: anyio.abc.TaskGroup, *, shared: bool) -> None:
        self.config = config
        self._tg = tg
        self._shared = shared
        self._only: _Session | None = None
        self.active: set[_Session] = set()

    async def get(self, ctx: Context) -> _Session:
        if not self._shared:
            session = self._only
            if session is None:
                session = self._only = self._create(None)
                try:
                    await self._start(session)
                except ToolError:
                    self._only = None  # the next request tries again
                    raise
        else:
            connection = _connection(ctx)
            if connection.session_id is None:
                raise ToolError(
                    "ipybox keeps a kernel per MCP session, and this request belongs to none; connect with "
                    "the initialize handshake (protocol 2025-11-25) over streamable HTTP with sessions"
                )
            session = cast("_Session | None", connection.state.get(_STATE_KEY))
            if session is None:
                session = self._create(connection)
                await self._start(session)
        await session.ready.wait()
        if session.start_error is not None:
            raise ToolError(f"the sandboxed kernel could not start: {session.start_error}")
        return session

    def _create(self, connection: Connection | None) -> _Session:
        """A new session, registered before it starts so concurrent first requests wait for it."""
        workspace = self.config.workspace
        if connection is not None:
            # Several clients share this server: each works in its own directory.
            label = "".join(c for c in connection.session_id or "" if c.isalnum() or c in "-_")[:64]
            workspace = workspace / "sessions" / (label or secrets.token_hex(8))
            workspace.mkdir(parents=True, exist_ok=True)
        session = _Session(
            config=self.config,
            workspace=workspace,
            state_dir=Path(tempfile.mkdtemp(prefix="ipybox-mcp-")),
            owns_workspace=connection is not None,
        )
        if connection is not None:
            connection.state[_STATE_KEY] = session
            connection.exit_stack.push_async_callback(self.close, session)
        return session

    async def _start(self, session: _Session) -> None:
        self.active.add(session)
        try:
            await self._tg.start(session.run)
        except IpyboxError as exc:
            self.active.discard(session)
            raise ToolError(f"the sandboxed kernel could not start: {exc}") from None

    async def close(self, session: _Session) -> None:
        """Stop a session's executor and wait until its kernel and private files are gone."""
        session.closed.set()
        await session.done.wait()
        self.active.discard(session)

    async def close_all(self) -> None:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for session in list(self.active):
                    tg.start_soon(self.close, session)


def _connection(ctx: Context) -> Connection:
    return ctx.request_context.session._connection


def _sessions(ctx: Context) -> _Sessions:
    return cast("_Sessions", ctx.request_context.lifespan_context)


# -- results -----------------------------------------------------------------------------------


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


# -- the server --------------------------------------------------------------------------------

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


def build_server(config: ServerConfig, *, shared: bool = False) -> MCPServer:
    """Build the ipybox MCP server.

    Args:
        config: The configuration every session's executor is built from.
        shared: Several MCP sessions share this server (HTTP): each session works in its own
            subdirectory of the workspace.
    """

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncGenerator[_Sessions]:
        async with anyio.create_task_group() as tg:
            sessions = _Sessions(config, tg, shared=shared)
            try:
                yield sessions
            finally:
                await sessions.close_all()
                tg.cancel_scope.cancel()

    server = MCPServer("ipybox", version=__version__, instructions=_INSTRUCTIONS, lifespan=lifespan)

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

    async def session_of(ctx: Context) -> _Session:
        return await _sessions(ctx).get(ctx)

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
            execution = executor.execute(
                code, timeout=timeout or config.timeout, approval=session.approval_for(ctx, code)
            )
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

    return server


# -- transports --------------------------------------------------------------------------------

_ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]


_UNAUTHORIZED = (
    f"missing or wrong bearer token: send the header 'Authorization: Bearer <token>' with every request, "
    f"<token> being the one this server was started with ({TOKEN_ENV} or --bearer-token)"
)


def _require_bearer(app: _ASGIApp, token: str) -> _ASGIApp:
    expected = f"Bearer {token}".encode()

    async def guarded(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            headers = cast("list[tuple[bytes, bytes]]", scope.get("headers", []))
            given = next((v for k, v in headers if k.lower() == b"authorization"), b"")
            if not secrets.compare_digest(given, expected):
                body = json.dumps({"error": _UNAUTHORIZED}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


async def serve(
    config: ServerConfig,
    *,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
) -> None:
    """Serve ipybox over MCP until stdin closes (stdio) or the process is stopped (HTTP).

    Over HTTP the address it listens on is printed to stderr as ``ipybox MCP server listening on URL``.

    Args:
        config: The server configuration.
        transport: ``"stdio"`` or ``"http"`` (streamable HTTP at ``/mcp``).
        host: HTTP: the address to listen on.
        port: HTTP: the port (0 picks a free one).
        token: HTTP: require this bearer token (required unless ``host`` is a loopback address).

    Raises:
        UsageError: HTTP on a non-loopback address without a token.
    """
    if transport == "stdio":
        await build_server(config).run_stdio_async()
        return
    check_exposure(host, token)
    import uvicorn

    server = build_server(config, shared=True)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=host in ("127.0.0.1", "localhost", "::1"),
        allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=[f"http://{host}:*", "http://127.0.0.1:*", "http://localhost:*"],
    )
    app: Any = server.streamable_http_app(session_idle_timeout=config.idle_ttl, transport_security=security, host=host)
    if token is not None:
        app = _require_bearer(app, token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listen before announcing the address: uvicorn only starts listening once its startup has run, and a
    # client that reads the announcement first would be refused. Connections wait in the backlog instead.
    sock.listen(2048)
    bound = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    print(f"ipybox MCP server listening on http://{host}:{bound}/mcp", file=sys.stderr, flush=True)
    await uv.serve(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the MCP server from the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m ipybox.mcp_server")
    add_arguments(parser)
    return run_parsed(parser.parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run the MCP server with arguments parsed by a parser `add_arguments` set up."""
    try:
        config = config_from_args(args)
    except UsageError as exc:
        print(f"ipybox mcp: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        anyio.run(
            lambda: serve(config, transport=args.transport, host=args.host, port=args.port, token=bearer_token(args))
        )
    except UsageError as exc:
        print(f"ipybox mcp: error: {exc}", file=sys.stderr)
        return 2
    return 0
