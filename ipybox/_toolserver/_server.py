"""The host side of the tool channel: MCP calls from the kernel, each one approved first.

The sandboxed kernel has no network. Its only way to an MCP tool is the unix socket this
`ToolServer` listens on (see `._channel` for the wire format). For each request the ToolServer

1. checks the request's size and nesting and the executor's token (a wrong or missing one gets
   nothing run),
2. looks the server up *by name* in the registry the host filled with `register()`,
3. refuses arguments with a key the tool's input schema forbids (`invalid_arguments`),
4. asks the gate, which returns an `ApprovalDecision` (a refusal becomes the call's error reply),
5. starts or connects to the server if it is not running, looks the tool up in its tool list and
   checks the arguments against its schema again,
6. calls the tool over the server's long-lived MCP session and sends the result back.

Nothing of a server is started or connected before a call to it has been approved (kernel code must
not be able to start host processes by asking), so the gate sees a tool's annotations and input
schema only once its server has listed its tools; for the first call to a server they are None,
and the forbidden-key check of step 3 happens in step 5, before the call is made.

The bytes on the socket are `._lines`'s business, turning a line into a request `._parse`'s, the
MCP sessions `._registry`'s; every failure of a call passes through `._boundary.tool_errors` and
becomes its error reply.

Everything on the socket comes from kernel code, which is untrusted: whatever one request or
connection does ends in an error reply (or a closed connection) for it, never in an exception out
of `run()`, and the memory all connections together can hold is bounded (`MAX_BUFFERED_BYTES`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

from ipybox._approval._decisions import ApprovalDecision, read_only_copy
from ipybox._exceptions import UsageError
from ipybox._mcp._oauth import OAuth
from ipybox._mcp._serverasks import ClientFeatures
from ipybox._mcp._servers import HttpServer, StdioServer
from ipybox._unixsocket import ServedSocket

from ._boundary import ToolCallFailed, tool_errors
from ._channel import (
    MAX_LINE_BYTES,
    MAX_REPLY_BYTES,
    ErrorKind,
    ToolErrorReply,
    ToolRequest,
    ToolResultReply,
    encode_reply,
)
from ._lines import MAX_BUFFERED_BYTES, Budget, LineConnection, LineTooLong, OverBudget
from ._parse import parse_request
from ._registry import ElicitationAsker, Sessions, Target, check_arguments

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = ("MAX_BUFFERED_BYTES", "MAX_CONNECTIONS", "BuiltinTool", "Gate", "ToolServer")

logger = logging.getLogger(__name__)

# Each connection carries one call at a time, so this bounds the calls in flight and the host's
# descriptors a kernel can hold.
MAX_CONNECTIONS = 32
_TOO_LARGE = f"a tool-call request is limited to {MAX_LINE_BYTES} bytes; pass large data as a file"
_OVER_BUDGET = (
    f"the tool server holds at most {MAX_BUFFERED_BYTES} bytes of unanswered tool-call requests from this "
    "kernel, and this one did not fit; make fewer large calls at once, or pass large data as a file"
)


class Gate(Protocol):
    """Decides whether a tool call may run; the call runs only if the decision approves it.

    ``server`` is what the host will run or call for the request's server (its command line or URL,
    no secret values); ``annotations`` are the tool's MCP annotations as the server last listed them
    (hints from the server, not guarantees), None when it lists none or was never connected: a
    server is started only for a call that was approved, so the first call to it is decided without
    them. ``input_schema`` is the tool's input schema from the same listing (None likewise): keys it
    forbids were refused before the gate was asked. ``request.execution`` is whatever the kernel
    sent: informational only.

    The gate is cancelled when the kernel stops waiting for the call (its cell was interrupted or
    its connection closed); the call is then not made. An exception from it refuses the call too.
    """

    def __call__(
        self,
        request: ToolRequest,
        /,
        *,
        server: str,
        annotations: Mapping[str, Any] | None,
        input_schema: Mapping[str, Any] | None,
    ) -> Awaitable[ApprovalDecision]: ...


BuiltinTool = Callable[[Mapping[str, Any]], Awaitable[str]]
"""A tool the host itself provides (e.g. package installs): takes the arguments, returns text."""


# A built-in tool's schema when it gives none: any object.
_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class _Builtin:
    handler: BuiltinTool
    input_schema: Mapping[str, Any]


class ToolServer:
    """Serves MCP tool calls from a sandboxed kernel over a unix socket, approving each one.

    Args:
        socket_path: Where to create the unix socket (mode 0600). A stale socket file left there
            by a process that is gone is replaced.
        token: The secret the kernel must send with every request.
        gate: Decides each call before it is made (see `Gate`); a refusal, or an exception from
            it, is the call's error reply.
        call_timeout: Seconds one MCP call may take, not counting approval; None for no limit.
        connect_timeout: Seconds to start or reach a server and list its tools.
        max_connections: Connections served at once; more wait until one closes.
        listener: A listening socket already bound at ``socket_path`` (a pooled kernel's, made
            before the kernel started so that its sandbox could mount it), served instead of
            binding one. The server owns it from then on.
        oauth: Tokens and authorization for servers with ``oauth`` parameters (one per server,
            shared by its sessions); default: the default token store, no person to ask.
        on_finished: Told of the end of every call that was read (its error kind, None when the tool
            returned, ``"cancelled"`` when the kernel stopped waiting; and the tool's result when it
            returned), after its reply was sent: the gate's `ToolCallFinished` event and the end of
            the call's span. Awaited, so keep it quick.
        elicitation: Decides the questions a server asks during a call (`ApprovalGate.elicitation`);
            None declines them.
        features: Sampling and roots offered to the servers (`ClientFeatures`; default: none).
        trace_context: The OpenTelemetry context an approved call is made in (its span's, from
            `ApprovalGate.trace_context`), None for the ambient one: the MCP SDK passes the current
            span on to the server in the request's ``_meta`` (W3C ``traceparent``).
        unmarked: Whether later calls of a request's execution need no output mark, because nobody
            is shown them (`ApprovalGate.unmarked`); the reply then says ``"unmarked": true`` and the
            kernel stops flushing and marking its output before that execution's calls. None: never.
    """

    def __init__(
        self,
        *,
        socket_path: Path,
        token: str,
        gate: Gate,
        call_timeout: float | None = 300.0,
        connect_timeout: float = 30.0,
        max_connections: int = MAX_CONNECTIONS,
        listener: socket.socket | None = None,
        oauth: OAuth | None = None,
        on_finished: Callable[[ToolRequest, str | None, ToolResultReply | None], Awaitable[None]] | None = None,
        elicitation: ElicitationAsker | None = None,
        features: ClientFeatures | None = None,
        trace_context: Callable[[ToolRequest], Context | None] | None = None,
        unmarked: Callable[[ToolRequest], bool] | None = None,
    ) -> None:
        _check_token_strength(token)
        if call_timeout is not None and call_timeout <= 0:
            raise UsageError(f"call_timeout must be positive or None, got {call_timeout!r}")
        if connect_timeout <= 0:
            raise UsageError(f"connect_timeout must be positive, got {connect_timeout!r}")
        if max_connections < 1:
            raise UsageError(f"max_connections must be at least 1, got {max_connections!r}")
        self._token = token.encode()
        self._gate = gate
        self._sessions = Sessions(
            call_timeout=call_timeout,
            connect_timeout=connect_timeout,
            oauth=oauth or OAuth(),
            elicitation=elicitation,
            features=features,
        )
        self._builtins: dict[tuple[str, str], _Builtin] = {}
        self._budget = Budget(MAX_BUFFERED_BYTES)
        self._max_reply_bytes = MAX_REPLY_BYTES
        self._socket = ServedSocket(
            Path(socket_path),
            self._serve_socket,
            max_connections=max_connections,
            listener=listener,
            what="tool-call",
        )
        self._on_finished = on_finished
        self._trace_context = trace_context
        self._unmarked = unmarked

    @property
    def socket_path(self) -> Path:
        """Where the unix socket is (or will be) bound."""
        return self._socket.path

    @property
    def servers(self) -> Mapping[str, StdioServer | HttpServer]:
        """The registered servers by name (a read-only snapshot)."""
        return self._sessions.servers

    def register(self, name: str, params: StdioServer | HttpServer | Mapping[str, Any]) -> None:
        """Register an MCP server under a name, replacing any server registered under it before.

        The server is started (or connected to) on the first call of one of its tools. Replacing a
        server closes the old one's session.

        Args:
            name: The name kernel code uses for the server.
            params: A `StdioServer`, an `HttpServer`, or the usual ``mcpServers`` JSON shape.

        Raises:
            UsageError: The name is empty or the parameters do not describe a server.
        """
        if not isinstance(name, str) or not name.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"an MCP server needs a non-empty name, got {name!r}")
        if any(server == name for server, _ in self._builtins):
            raise UsageError(f"the server name {name!r} is reserved for tools the host provides")
        self._sessions.register(name, params)

    def register_builtin(
        self, server: str, tool: str, handler: BuiltinTool, *, input_schema: Mapping[str, Any] = _ANY_OBJECT
    ) -> None:
        """Serve a tool implemented on the host under ``server``/``tool``, gated like MCP tools.

        ``input_schema`` is its arguments' JSON schema: calls with keys it forbids are refused
        before the gate is asked, and the gate sees it like an MCP tool's. The default declares no
        key, so every argument is shown as undeclared.

        Raises:
            UsageError: An MCP server is registered under ``server`` already.
        """
        if server in self._sessions:
            raise UsageError(f"{server!r} is already the name of an MCP server")
        self._builtins[(server, tool)] = _Builtin(handler, read_only_copy(input_schema))

    async def reset(self) -> None:
        """Close every MCP session; servers are started again on their next call.

        Calls in flight on those sessions fail with a server error in the kernel.
        """
        await self._sessions.reset()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen on the socket and serve tool calls until cancelled.

        Signals readiness through ``task_status`` once the socket accepts connections (use
        ``await task_group.start(tool_server.run)``). On exit, closes every MCP session and removes
        the socket file.

        Raises:
            UsageError: Already running, or the socket path is unusable or in use.
        """
        if self._sessions.task_group is not None:
            raise UsageError("this ToolServer is already running; call run() once")
        self._socket.bind()
        try:
            async with anyio.create_task_group() as tg:
                self._sessions.task_group = tg
                self._socket.start(tg)
                task_status.started()
        finally:
            self._sessions.task_group = None
            self._sessions.forget_sessions()
            self._socket.stop()

    def rebind(self) -> None:
        """Bind the socket file again if it is gone (deleted by a ``/tmp`` cleaner, say).

        The old listener keeps serving the connections it has and anyone who still reaches its
        inode (a sandbox bind-mounts the file, not the path). The socket's directory must exist.

        Raises:
            UsageError: The server is not running, or the socket path is unusable.
            OSError: The socket could not be bound.
        """
        self._check_running("rebind()")
        self._socket.rebind()

    def move(self, socket_path: Path, token: str, *, listener: socket.socket | None = None) -> None:
        """Serve at ``socket_path`` with ``token`` from now on, for a kernel started with them, and
        stop listening where the server listened before.

        Connections already open stay, but their requests carry the old token and are refused.
        ``listener``, if given, is already bound there (see the constructor) and is owned by the
        server from then on.

        Raises:
            UsageError: The server is not running, or the socket path is unusable.
            OSError: The socket could not be bound.
        """
        self._check_running("move()")
        _check_token_strength(token)
        self._socket.move(Path(socket_path), listener=listener)
        self._token = token.encode()

    def _check_running(self, what: str) -> None:
        if self._sessions.task_group is None:
            raise UsageError(f"{what} needs a running ToolServer ('await task_group.start(server.run)')")

    # -- connections -------------------------------------------------------------------------------

    async def _serve_socket(self, sock: socket.socket) -> None:
        await self._serve_connection(LineConnection(sock, self._budget))

    async def _serve_connection(self, connection: LineConnection) -> None:
        """Read requests from one connection and answer them in order, one at a time.

        The answer runs in this task, right after its request is read: a hand-over to another task
        would put a pass of the event loop (and, on a busy machine, a chance to be preempted) on
        every call's path. A kernel that hangs up while a request is answered (an interrupted cell)
        cancels the approval or MCP call made for it: the connection's reader notices and cancels
        this scope, which serves the connection's requests and ends with it.
        """
        try:
            with anyio.CancelScope() as hangup:
                while await self._serve_request(connection, hangup):
                    pass
        except Exception:  # a task in the ToolServer's group: one connection's fault must not end it
            logger.exception("serving a tool-call connection failed; it was closed")
        finally:
            connection.close()

    async def _serve_request(self, connection: LineConnection, hangup: anyio.CancelScope) -> bool:
        """Read one request and answer it; False when the connection is done."""
        try:
            line = await connection.receive_line(MAX_LINE_BYTES)
        except LineTooLong:
            await connection.send_reply(_error(None, "too_large", _TOO_LARGE))
            return False
        except OverBudget:
            await connection.send_reply(_error(None, "too_large", _OVER_BUDGET))
            return False
        except EOFError:
            return False
        try:
            try:
                with tool_errors("reading the tool-call request"):
                    request = parse_request(line, self._token)
            except ToolCallFailed as early:
                await connection.send_reply(early.reply(early.seq))
                return not early.close
            del line  # with the request parsed, the line's bytes need not live through the call
            return await self._answer_watched(connection, request, hangup)
        finally:
            connection.answered()

    async def _answer_watched(
        self, connection: LineConnection, request: ToolRequest, hangup: anyio.CancelScope
    ) -> bool:
        """Answer one request; False if the kernel hung up meanwhile (the call was cancelled)."""
        reply: ToolResultReply | ToolErrorReply | None = None
        if not connection.answering(hangup.cancel):
            return False  # the kernel hung up before this request's turn: it is not asked about or made
        try:
            try:
                with tool_errors(f"{request.server}.{request.tool}"):
                    reply = await self._answer(request)
            except ToolCallFailed as failed:  # whatever fails in one call is that call's error
                reply = failed.reply(request.seq)
        finally:
            connection.answering(None)
            if self._on_finished is not None and (reply is None or connection.hung_up):
                if connection.hung_up:
                    # This task is being cancelled and serves no more requests: the call's end is
                    # reported from a task of its own.
                    self._report_cancelled(request)
                else:  # the ToolServer stops: what of the report runs before it is cancelled too
                    await self._on_finished(request, "cancelled", None)
        if reply is None or connection.hung_up:
            return False
        try:
            unmarked = self._unmarked is not None and self._unmarked(request)
            await connection.send(self._encode(request, reply, unmarked=unmarked))
            return True
        finally:
            if self._on_finished is not None:
                error = reply.error if isinstance(reply, ToolErrorReply) else None
                await self._on_finished(request, error, reply if isinstance(reply, ToolResultReply) else None)

    def _report_cancelled(self, request: ToolRequest) -> None:
        on_finished, group = self._on_finished, self._sessions.task_group
        if on_finished is None or group is None:
            return

        async def report() -> None:
            await on_finished(request, "cancelled", None)

        group.start_soon(report)

    def _encode(
        self, request: ToolRequest, reply: ToolResultReply | ToolErrorReply, *, unmarked: bool = False
    ) -> bytes:
        """The reply's line, or an error line when it cannot be sent (too large, not encodable)."""
        name = f"{request.server}.{request.tool}"
        try:
            with tool_errors(f"encoding the result of {name} as JSON"):  # e.g. text that is not valid Unicode
                data = encode_reply(reply, unmarked=unmarked)
        except ToolCallFailed as failed:
            return encode_reply(failed.reply(request.seq))
        if len(data) > self._max_reply_bytes:
            message = (
                f"the result of {name} is {len(data)} bytes as JSON; the limit is {self._max_reply_bytes} bytes "
                "(ask the tool for less, or for a file)"
            )
            return encode_reply(_error(request.seq, "too_large", message))
        return data

    # -- calls ------------------------------------------------------------------------------------

    async def _answer(self, request: ToolRequest) -> ToolResultReply:
        builtin = self._builtins.get((request.server, request.tool))
        if builtin is not None:
            check_arguments(builtin.input_schema, request)
            await self._approve(request, Target(f"ipybox on the host: {request.tool}", None, builtin.input_schema))
            text = await builtin.handler(request.arguments)
            return ToolResultReply(
                seq=request.seq, structured=None, text=text, content=[{"type": "text", "text": text}]
            )
        target = await self._sessions.target(request)
        await self._approve(request, target)
        trace = None if self._trace_context is None else self._trace_context(request)
        return await self._sessions.call(request, target, trace=trace)

    async def _approve(self, request: ToolRequest, target: Target) -> None:
        """Ask the gate.

        Raises:
            ToolCallFailed: The call must not be made (``rejected``, or ``approval_failed``).
        """
        name, tool = request.server, request.tool
        try:
            decision = await self._gate(
                request, server=target.server, annotations=target.annotations, input_schema=target.input_schema
            )
        except ToolCallFailed:  # the gate's own refusal with its kind (over_budget)
            raise
        except Exception as exc:  # the gate is application code; whatever it raises, the call is not made
            logger.exception("the approval gate failed for %s/%s", name, tool)
            raise ToolCallFailed(
                "approval_failed",
                f"approving the call to tool {tool!r} of MCP server {name!r} failed on the host "
                f"({type(exc).__name__}); the call was not made",
            ) from exc
        if decision.approved:
            return
        message = f"the application rejected the call to tool {tool!r} of MCP server {name!r}"
        if decision.reason:
            message += f": {decision.reason}"
        raise ToolCallFailed("rejected", message, reason=decision.reason)


def _error(seq: int | None, kind: ErrorKind, message: str) -> ToolErrorReply:
    return ToolErrorReply(seq=seq, error=kind, message=message)


def _check_token_strength(token: str) -> None:
    if len(token) < 16:
        raise UsageError("the ToolServer token must be at least 16 characters; use secrets.token_urlsafe()")
