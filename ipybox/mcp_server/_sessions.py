"""An MCP session's state: its executor (started on first use, stopped when idle or when the session
ends), its registered servers and the approval of the tool calls its code makes.
"""

# The per-session lifecycle needs the session's Connection, which mcp only exposes privately.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import copy
import logging
import secrets
import shutil
import tempfile
from collections.abc import AsyncGenerator, Generator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc
from mcp.server.connection import Connection
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest
from ipybox._approval._policies import ApprovalChain
from ipybox._approval._rendering import request_text
from ipybox._engine._execution import Execution
from ipybox._engine._executor import CodeExecutor
from ipybox._engine._waiting import wait_any
from ipybox._exceptions import IpyboxError
from ipybox._kernel._local import LocalKernel
from ipybox._kernel._pool import KernelPool
from ipybox._mcp._serverasks import ElicitationRequest
from ipybox._mcp._servers import HttpServer, StdioServer
from ipybox.codegen._codegen import generate_mcp_sources
from ipybox.network._request import NetworkRequest

from ._options import ServerConfig

__all__ = ("Session", "Sessions", "session_pool", "sessions_of")

logger = logging.getLogger(__name__)

# Key of the ipybox session in the MCP connection's per-connection state.
_STATE_KEY = "ipybox.session"
# The tools package name inside a session's private state directory (imported as `mcptools.<server>`).
_TOOLS_PACKAGE = "mcptools"
# Characters of the running code shown in an approval prompt: enough to recognise it (the client
# has the whole code: it sent it).
_PROMPT_CODE_CHARS = 5_000
# Characters of one argument value shown in an approval prompt; the prompt is the only place its
# user can see them, so only values too large to read are cut (ipybox.save_skill's code never).
_PROMPT_ARG_CHARS = 20_000


@dataclass(eq=False)
class Session:
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
    pool: KernelPool | None = None
    """Where the session's first kernel comes from, with its own directories (see `_adopt_dirs`)."""
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
    _asking: dict[str, tuple[Context, str]] = field(default_factory=dict[str, tuple[Context, str]])
    """The client to ask about each running execution's calls, and its code, by execution id."""

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

    def _executor(self, pool: KernelPool | None = None) -> CodeExecutor:
        config = self.config
        # This session's own directories; a pool's kernel (made from the same settings) brings its own.
        settings = replace(config.kernel, workspace=self.workspace, tools_dir=self.tools_dir)
        # Servers listed in the tools directory's manifest are registered again on a restart.
        return CodeExecutor(
            workspace=self.workspace,
            # Given, not taken: a source's "no sandbox" is never taken by default (--no-sandbox says it).
            sandbox=settings.sandbox,
            timeouts=config.timeouts,
            tools_dir=self.tools_dir,
            # The configuration's rules first; what they leave open, the client's user.
            approval=ApprovalChain(config.rules, self._ask_user),
            network=config.network,
            kernel=pool or LocalKernel(settings),
        )

    def _adopt_dirs(self, executor: CodeExecutor) -> None:
        """Work in the directories of a kernel taken from the pool instead of the ones made for
        this session (still empty: nothing ran in them)."""
        if executor.workspace != self.workspace.resolve() and executor.tools_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if self.owns_workspace:
                shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace, self.state_dir = executor.workspace, executor.tools_dir.parent
            self.owns_workspace = True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # Created before the kernel starts so they are mounted read-only and the manifest is hidden.
        (self.tools_dir / ".ipybox").mkdir(parents=True, exist_ok=True)
        self._touch()
        try:
            async with self._executor(self.pool) as executor:
                self._adopt_dirs(executor)
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

    @contextmanager
    def asking(self, execution: Execution, ctx: Context) -> Generator[None]:
        """Send the prompts of ``execution``'s calls to the client of ``ctx``, with its code.

        The executor's policy is one chain for every execution (the rules, then the client's user),
        which finds the client by the request's execution: the gate refuses the calls of an execution
        whose policy differs from an earlier one's (code that one left behind could be making them),
        and a request never goes to another request's client, even while a cancelled execution is
        still winding down.
        """
        self._asking[execution.id] = (ctx, execution.code)
        try:
            yield
        finally:
            del self._asking[execution.id]

    async def _ask_user(self, request: ApprovalRequest) -> ApprovalDecision:
        """Ask the client's user about a request the rules left open (MCP elicitation)."""
        # The request's id is "<execution id>:<n>" (ApprovalRequest.id).
        ctx, code = self._asking.get(request.id.rsplit(":", 1)[0], (None, ""))
        if isinstance(request, ElicitationRequest):
            return await _forward_question(ctx, request)
        name = request.rule_name
        capabilities = ctx.client_capabilities if ctx is not None else None
        can_ask = ctx is not None and ctx.request_context.session.can_send_request
        if ctx is None or not can_ask or capabilities is None or capabilities.elicitation is None:
            if isinstance(request, NetworkRequest):
                fix = f"'--allow-net {request.destination}' (or another --allow-net entry) to allow the destination"
            else:
                fix = f"'--allow {name}' (or another --allow glob), '--allow-read-only' or '--approval auto'"
            return ApprovalDecision(
                approved=False,
                reason=(
                    f"{name} needs approval, but this MCP client cannot ask its user (no elicitation support); "
                    f"start ipybox with {fix}"
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


async def _forward_question(ctx: Context | None, request: ElicitationRequest) -> ApprovalDecision:
    """Ask this server's own client the question a registered server asked during a call, in the
    same mode, when that client declares it can be asked so; decline otherwise. The client's
    user reads ipybox's rendering (the server's text escaped, bounded and marked as the server's),
    and its answer goes back through the same checks (ipybox._mcp._serverasks.settled)."""
    declared = ctx.client_capabilities.elicitation if ctx is not None and ctx.client_capabilities else None
    if ctx is None or declared is None or not ctx.request_context.session.can_send_request:
        why = "this MCP client cannot be asked (no elicitation support)"
        return ApprovalDecision(approved=False, reason=f"declined {request}: {why}")
    # A client that declares elicitation without naming a mode supports form mode (2025-11-25).
    form = declared.form is not None or declared.url is None
    session = ctx.request_context.session
    try:
        if request.url is not None:
            if declared.url is None:
                return ApprovalDecision(approved=False, reason="this MCP client cannot be asked in URL mode")
            answer = await session.elicit_url(
                request.description, request.url, f"ipybox-{request.id}", related_request_id=ctx.request_id
            )
        else:
            if not form:
                return ApprovalDecision(approved=False, reason="this MCP client cannot be asked in form mode")
            # A plain copy of the read-only schema (tuples for arrays, which JSON clients misread).
            schema = cast("dict[str, Any]", copy.deepcopy(request.requested_schema or {}))
            answer = await session.elicit_form(request.description, schema, related_request_id=ctx.request_id)
    except (MCPError, ValueError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
        logger.warning("forwarding %s failed: %r", request, exc)
        return ApprovalDecision(approved=False, reason=f"asking the user failed: {exc}")
    if answer.action != "accept":
        return ApprovalDecision(approved=False, reason=f"the user chose {answer.action}")
    return ApprovalDecision(approved=True, content=dict(answer.content or {}))


class _ApprovalForm(BaseModel):
    approve: bool = Field(default=True, description="Allow this tool call to run")


def _approval_message(request: ApprovalRequest, code: str) -> str:
    """The elicitation text: the request as every rendering shows it (ipybox._approval._rendering), the code
    that made it, and what the answers do."""
    text = request_text(
        request,
        value_chars=_PROMPT_ARG_CHARS,
        whole_at="this prompt cannot show the rest: decline unless you know what it holds",
        code=code,
        code_chars=_PROMPT_CODE_CHARS,
        code_whole_at="the whole code is the 'code' argument of this execute_ipython_cell call",
    )
    if isinstance(request, NetworkRequest):
        return f"{text}\nApprove to let this connection through; decline to refuse it (the code gets an HTTP 403)."
    return f"{text}\nApprove to run this call; decline to make it raise ToolCallRejected in the code."


class Sessions:
    """Starts a `Session` on first use and stops it when its MCP session ends.

    Over stdio the server has exactly one client, and its session lasts as long as the process.
    Over HTTP each MCP session (``Mcp-Session-Id``) gets its own, stopped when the client ends the
    session or the session manager closes it (a client gone for ``idle_ttl`` seconds).
    """

    def __init__(
        self, config: ServerConfig, tg: anyio.abc.TaskGroup, *, shared: bool, pool: KernelPool | None = None
    ) -> None:
        self.config = config
        self._pool = pool
        self._tg = tg
        self._shared = shared
        self._only: Session | None = None
        self.active: set[Session] = set()

    async def get(self, ctx: Context) -> Session:
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
            session = cast("Session | None", connection.state.get(_STATE_KEY))
            if session is None:
                session = self._create(connection)
                await self._start(session)
        await session.ready.wait()
        if session.start_error is not None:
            raise ToolError(f"the sandboxed kernel could not start: {session.start_error}")
        return session

    def _create(self, connection: Connection | None) -> Session:
        """A new session, registered before it starts so concurrent first requests wait for it."""
        workspace = self.config.kernel.workspace
        if connection is not None:
            # Several clients share this server: each works in its own directory.
            label = "".join(c for c in connection.session_id or "" if c.isalnum() or c in "-_")[:64]
            workspace = workspace / "sessions" / (label or secrets.token_hex(8))
            workspace.mkdir(parents=True, exist_ok=True)
        session = Session(
            config=self.config,
            workspace=workspace,
            state_dir=Path(tempfile.mkdtemp(prefix="ipybox-mcp-")),
            owns_workspace=connection is not None,
            pool=self._pool,
        )
        if connection is not None:
            connection.state[_STATE_KEY] = session
            connection.exit_stack.push_async_callback(self.close, session)
        return session

    async def _start(self, session: Session) -> None:
        self.active.add(session)
        try:
            await self._tg.start(session.run)
        except IpyboxError as exc:
            self.active.discard(session)
            raise ToolError(f"the sandboxed kernel could not start: {exc}") from None

    async def close(self, session: Session) -> None:
        """Stop a session's executor and wait until its kernel and private files are gone."""
        session.closed.set()
        await session.done.wait()
        self.active.discard(session)

    async def close_all(self) -> None:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for session in list(self.active):
                    tg.start_soon(self.close, session)


def session_pool(config: ServerConfig) -> AbstractAsyncContextManager[KernelPool | None]:
    """The pool new sessions take their first kernel from, if ``config`` asks for one.

    Each of its kernels has its own workspace in ``sessions/`` and its own tools directory, as a
    session over HTTP has, and the skills directory all sessions share. With a network each is
    ready for its session's proxy, which serves it with ``config.network``.
    """
    if not config.pool_size:
        return nullcontext()
    kernel = config.kernel
    sessions = kernel.workspace / "sessions"
    sessions.mkdir(exist_ok=True)
    return KernelPool(
        config.pool_size,
        workspace=sessions,
        sandbox=kernel.sandbox,
        env=kernel.env,
        limits=kernel.limits,
        tools_dir=_TOOLS_PACKAGE,
        timeouts=config.timeouts,
        separate_workspaces=True,
        skills_dir=kernel.skills_dir,
        network=kernel.network,
    )


def _connection(ctx: Context) -> Connection:
    return ctx.request_context.session._connection


def sessions_of(ctx: Context) -> Sessions:
    return cast("Sessions", ctx.request_context.lifespan_context)
