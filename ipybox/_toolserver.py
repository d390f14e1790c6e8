"""The host side of the tool channel: MCP calls from the kernel, each one approved first.

The sandboxed kernel has no network. Its only way to an MCP tool is the unix socket this
`ToolServer` listens on (see `ipybox._channel` for the wire format). For each request the ToolServer

1. checks the request's size and nesting and the executor's token (a wrong or missing one gets
   nothing run),
2. looks the server up *by name* in the registry the host filled with `register()`,
3. asks the gate, which returns an `ApprovalDecision` (a refusal becomes the call's error reply),
4. starts or connects to the server if it is not running, and looks the tool up in its tool list,
5. calls the tool over the server's long-lived MCP session and sends the result back.

Nothing of a server is started or connected before a call to it has been approved (kernel code must
not be able to start host processes by asking), so the gate sees a tool's annotations only once its
server has listed its tools; for the first call to a server they are None.

MCP sessions are started lazily, shared by concurrent calls, restarted after a crash, and closed on
`reset()` and when `run()` ends. Each one is owned by a task in the ToolServer's task group.

Everything on the socket comes from kernel code, which is untrusted: whatever one request or
connection does ends in an error reply (or a closed connection) for it, never in an exception out
of `run()`, and the memory all connections together can hold is bounded (`MAX_BUFFERED_BYTES`).
"""

from __future__ import annotations

import errno
import hmac
import itertools
import json
import logging
import math
import operator
import os
import re
import socket
import stat
import tempfile
import types
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, cast

import anyio
import anyio.abc
from mcp import ClientSession, MCPError
from mcp import types as mcp_types
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from ._approval import ApprovalDecision
from ._channel import (
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    MAX_LINE_BYTES,
    MAX_REPLY_BYTES,
    ErrorKind,
    ToolErrorReply,
    ToolRequest,
    ToolResultReply,
)
from ._exceptions import IpyboxError, MCPServerError, UsageError
from ._mcp import HttpServer, StdioServer, describe_server, open_session, parse_server_params

__all__ = ("BuiltinTool", "Gate", "ToolServer")

logger = logging.getLogger(__name__)

# Each connection carries one call at a time, so this bounds the calls in flight and the host's
# descriptors a kernel can hold.
MAX_CONNECTIONS = 32
# Request lines (partial, or being answered) all connections together may hold: four of the largest
# requests at once, an eighth of what MAX_CONNECTIONS lines of MAX_LINE_BYTES would take. A line
# counts until its answer is sent, because its parsed form lives that long (and takes several times
# the line's bytes). A connection that needs more is refused rather than paused: a paused reader
# waits for others to finish their lines, and partial lines that are never finished would pause
# every connection for good; a refusal frees the memory at once and tells the code what to change.
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
# Connections beyond MAX_CONNECTIONS wait here (then in connect()) until a slot frees, rather than fail.
LISTEN_BACKLOG = 128
# A server can exit unseen while a session is idle; after this long unused, a ping checks it first.
IDLE_PROBE_AFTER = 5.0
# A live server answers a ping within milliseconds; a slower one is busy, and the call goes ahead.
PROBE_TIMEOUT = 2.0
# Enough of a failed server's stderr for its error and a short traceback, small enough for a message.
STDERR_TAIL_BYTES = 4096
# accept() can fail when the process runs out of descriptors; wait for one of ours to close, or this long.
ACCEPT_RETRY_DELAY = 0.5
# A hang-up is looked for only once a call has run this long. Cancelling a call that ends sooner
# gains nothing, and watching the socket from the start costs every call more than the rest of the
# host's work for it.
HANGUP_WATCH_AFTER = 0.05
# One read per wakeup; large requests take several.
_RECEIVE_CHUNK = 256 * 1024
_TOO_LARGE = f"a tool-call request is limited to {MAX_LINE_BYTES} bytes; pass large data as a file"
_OVER_BUDGET = (
    f"the tool server holds at most {MAX_BUFFERED_BYTES} bytes of unanswered tool-call requests from this "
    "kernel, and this one did not fit; make fewer large calls at once, or pass large data as a file"
)
_TOO_DEEP = f"the tool-call request is nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects"
_TOO_MANY_VALUES = (
    f"the tool-call request holds {MAX_JSON_VALUES} or more JSON values; pass large data as a file in the workspace"
)
# A JSON string, its escaped backslashes and quotes removed first, and unterminated ones to the end
# of the line: it always matches once it has started, which keeps the scan linear.
_JSON_STRING = re.compile(rb'"[^"]*"?')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
# An opening bracket counts 2 and a closing one 0: depth after n brackets = running sum - n.
_BRACKET_WEIGHTS = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")
# Socket paths longer than this do not fit in sockaddr_un on Linux (108 bytes including the NUL).
_MAX_SOCKET_PATH = 107


class Gate(Protocol):
    """Decides whether a tool call may run; the call runs only if the decision approves it.

    ``server`` is what the host will run or call for the request's server (its command line or URL,
    no secret values); ``annotations`` are the tool's MCP annotations as the server last listed them
    (hints from the server, not guarantees), None when it lists none or was never connected: a
    server is started only for a call that was approved, so the first call to it is decided without
    them. ``request.execution`` is whatever the kernel sent: informational only.

    The gate is cancelled when the kernel stops waiting for the call (its cell was interrupted or
    its connection closed); the call is then not made. An exception from it refuses the call too.
    """

    def __call__(
        self, request: ToolRequest, /, *, server: str, annotations: Mapping[str, Any] | None
    ) -> Awaitable[ApprovalDecision]: ...


BuiltinTool = Callable[[Mapping[str, Any]], Awaitable[str]]
"""A tool the host itself provides (e.g. package installs): takes the arguments, returns text."""


class _Reply(Exception):
    """Ends the handling of a request early with an error reply (internal control flow)."""

    def __init__(self, reply: ToolErrorReply, *, close: bool = False) -> None:
        super().__init__(reply.message)
        self.reply = reply
        self.close = close


@dataclass(eq=False)
class _InFlight:
    """The request a connection is answering; cancelled if the kernel hangs up."""

    watch_from: float
    """When the `_HangupWatch` starts watching for a hang-up, if the answer is not done by then."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    watching: _Watching | None = None
    """Set by the watcher while it waits on the socket; most calls end before it starts."""
    hung_up: bool = False


@dataclass(eq=False)
class _Watching:
    """The watcher's wait for a hang-up during one call."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """Cancelled by the reader when the answer is done."""
    ended: anyio.Event = field(default_factory=anyio.Event)
    """Set once the watcher no longer waits on the socket."""


class _HangupWatch:
    """Cancels the request a connection is answering when the kernel hangs up meanwhile.

    The connection's reader answers each request itself and does not read meanwhile, so this task
    watches the socket instead, from `HANGUP_WATCH_AFTER` into a call until its answer is done.
    A call that ends sooner costs two timer updates here and no pass of this task.
    """

    def __init__(self, connection: _LineConnection) -> None:
        self._connection = connection
        self._flight: _InFlight | None = None
        self._timer = anyio.CancelScope()  # replaced in run(); expires when a call needs watching

    def arm(self, flight: _InFlight) -> None:
        """Watch for a hang-up while ``flight`` is answered, until `disarm`."""
        self._flight = flight
        self._timer.deadline = flight.watch_from

    def disarm(self) -> None:
        self._flight = None
        self._timer.deadline = math.inf

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        starting: anyio.abc.TaskStatus[None] | None = task_status
        while True:
            flight = self._flight
            with anyio.CancelScope(deadline=math.inf if flight is None else flight.watch_from) as self._timer:
                if starting is not None:
                    starting.started()
                    starting = None
                await anyio.sleep_forever()
            flight = self._flight
            if flight is None or anyio.current_time() < flight.watch_from:
                continue  # the call the timer was set for has ended since
            flight.watching = watching = _Watching()
            try:
                with watching.scope:
                    await self._connection.wait_hangup()
                    flight.hung_up = True
                    flight.scope.cancel()
            finally:
                watching.ended.set()


@dataclass(eq=False, kw_only=True)
class _Session:
    """One live MCP session, owned by a task in the ToolServer's task group."""

    session: ClientSession
    tools: dict[str, mcp_types.Tool]
    stderr: IO[str]
    last_used: float
    close_requested: anyio.Event = field(default_factory=anyio.Event)
    closed: anyio.Event = field(default_factory=anyio.Event)
    close_reason: str | None = None
    final_stderr: str | None = None

    @property
    def usable(self) -> bool:
        return not self.close_requested.is_set()

    def close(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.close_requested.set()

    def stderr_tail(self) -> str:
        if self.final_stderr is not None:
            return self.final_stderr
        return _read_tail(self.stderr)


@dataclass(eq=False)
class _Entry:
    """A registered server and, once connected, its session."""

    name: str
    params: StdioServer | HttpServer
    description: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    live: _Session | None = None
    tools: dict[str, mcp_types.Tool] | None = None
    """The server's tools as it last listed them; kept after its session closes, for the gate."""


class _Budget:
    """The bytes of request lines that all connections of a ToolServer hold together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (and nothing reserved) if they do not fit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


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
    ) -> None:
        if len(token) < 16:
            raise UsageError("the ToolServer token must be at least 16 characters; use secrets.token_urlsafe()")
        if call_timeout is not None and call_timeout <= 0:
            raise UsageError(f"call_timeout must be positive or None, got {call_timeout!r}")
        if connect_timeout <= 0:
            raise UsageError(f"connect_timeout must be positive, got {connect_timeout!r}")
        if max_connections < 1:
            raise UsageError(f"max_connections must be at least 1, got {max_connections!r}")
        self._socket_path = Path(socket_path)
        self._token = token.encode()
        self._gate = gate
        self._call_timeout = call_timeout
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._entries: dict[str, _Entry] = {}
        self._builtins: dict[tuple[str, str], BuiltinTool] = {}
        self._budget = _Budget(MAX_BUFFERED_BYTES)
        self._max_reply_bytes = MAX_REPLY_BYTES
        self._task_group: anyio.abc.TaskGroup | None = None
        self._connection_closed = anyio.Event()
        self._idle_probe_after = IDLE_PROBE_AFTER

    @property
    def socket_path(self) -> Path:
        """Where the unix socket is (or will be) bound."""
        return self._socket_path

    @property
    def servers(self) -> Mapping[str, StdioServer | HttpServer]:
        """The registered servers by name (a read-only snapshot)."""
        return types.MappingProxyType({name: entry.params for name, entry in self._entries.items()})

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
        parsed = parse_server_params(params)
        old = self._entries.get(name)
        if old is not None and old.live is not None:
            old.live.close(f"MCP server {name!r} was registered again")
        self._entries[name] = _Entry(name, parsed, describe_server(parsed))

    def register_builtin(self, server: str, tool: str, handler: BuiltinTool) -> None:
        """Serve a tool implemented on the host under ``server``/``tool``, gated like MCP tools.

        Raises:
            UsageError: An MCP server is registered under ``server`` already.
        """
        if server in self._entries:
            raise UsageError(f"{server!r} is already the name of an MCP server")
        self._builtins[(server, tool)] = handler

    async def reset(self) -> None:
        """Close every MCP session; servers are started again on their next call.

        Calls in flight on those sessions fail with a server error in the kernel.
        """
        lives = [entry.live for entry in self._entries.values() if entry.live is not None]
        for live in lives:
            live.close("the tool server was reset")
        for entry in self._entries.values():
            entry.live = None
        for live in lives:
            await live.closed.wait()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen on the socket and serve tool calls until cancelled.

        Signals readiness through ``task_status`` once the socket accepts connections (use
        ``await task_group.start(tool_server.run)``). On exit, closes every MCP session and removes
        the socket file.

        Raises:
            UsageError: Already running, or the socket path is unusable or in use.
        """
        if self._task_group is not None:
            raise UsageError("this ToolServer is already running; call run() once")
        listener = _bind_socket(self._socket_path)
        inode = os.stat(self._socket_path).st_ino
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                tg.start_soon(self._accept, listener, tg)
                task_status.started()
        finally:
            self._task_group = None
            for entry in self._entries.values():
                entry.live = None
            listener.close()
            _remove_socket(self._socket_path, inode)

    def rebind(self) -> None:
        """Bind the socket file again if it is gone (deleted by a ``/tmp`` cleaner, say).

        The old listener keeps serving the connections it has and anyone who still reaches its
        inode (a sandbox bind-mounts the file, not the path). The socket's directory must exist.

        Raises:
            UsageError: The server is not running, or the socket path is unusable.
            OSError: The socket could not be bound.
        """
        tg = self._task_group
        if tg is None:
            raise UsageError("rebind() needs a running ToolServer ('await task_group.start(server.run)')")
        if os.path.lexists(self._socket_path):
            return
        listener = _bind_socket(self._socket_path)
        tg.start_soon(self._serve_listener, listener, os.stat(self._socket_path).st_ino, tg)

    async def _serve_listener(self, listener: socket.socket, inode: int, tg: anyio.abc.TaskGroup) -> None:
        try:
            await self._accept(listener, tg)
        finally:
            listener.close()
            _remove_socket(self._socket_path, inode)

    # -- connections -------------------------------------------------------------------------------

    async def _accept(self, listener: socket.socket, tg: anyio.abc.TaskGroup) -> None:
        slots = anyio.Semaphore(self._max_connections)
        while True:
            await slots.acquire()
            try:
                sock = await _accept_one(listener)
            except OSError as exc:
                slots.release()
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    logger.debug("accept() on %s failed: %s", self._socket_path, exc)
                    continue
                logger.warning("cannot accept a tool-call connection: %s", exc)
                with anyio.move_on_after(ACCEPT_RETRY_DELAY):
                    await self._connection_closed.wait()
                continue
            tg.start_soon(self._serve_connection, _LineConnection(sock, self._budget), slots)

    async def _serve_connection(self, connection: _LineConnection, slots: anyio.Semaphore) -> None:
        """Read requests from one connection and answer them in order, one at a time.

        The answer runs in this task, right after its request is read: a hand-over to another task
        would put a pass of the event loop (and, on a busy machine, a chance to be preempted) on
        every call's path. A `_HangupWatch` notices a kernel that hangs up during a call (an
        interrupted cell) and cancels the approval or MCP call made for it.
        """
        try:
            async with anyio.create_task_group() as tg:
                watch = _HangupWatch(connection)
                await tg.start(watch.run)
                while await self._serve_request(connection, watch):
                    pass
                tg.cancel_scope.cancel()
        except Exception:  # a task in the ToolServer's group: one connection's fault must not end it
            logger.exception("serving a tool-call connection failed; it was closed")
        finally:
            connection.close()
            slots.release()
            self._connection_closed.set()
            self._connection_closed = anyio.Event()

    async def _serve_request(self, connection: _LineConnection, watch: _HangupWatch) -> bool:
        """Read one request and answer it; False when the connection is done."""
        try:
            line = await connection.receive_line(MAX_LINE_BYTES)
        except _LineTooLong:
            await connection.send_reply(_error(None, "too_large", _TOO_LARGE))
            return False
        except _OverBudget:
            await connection.send_reply(_error(None, "too_large", _OVER_BUDGET))
            return False
        except EOFError:
            return False
        try:
            try:
                request = self._parse(line)
            except _Reply as early:
                await connection.send_reply(early.reply)
                return not early.close
            except Exception as exc:  # a bug in parsing; the kernel gets an answer, not a hang-up
                logger.exception("reading a tool-call request failed")
                message = f"the tool server could not read the request ({type(exc).__name__}); see the host's log"
                await connection.send_reply(_error(None, "bad_request", message))
                return True
            del line  # with the request parsed, the line's bytes need not live through the call
            return await self._answer_watched(connection, request, watch)
        finally:
            connection.answered()

    async def _answer_watched(self, connection: _LineConnection, request: ToolRequest, watch: _HangupWatch) -> bool:
        """Answer one request; False if the kernel hung up meanwhile (the call was cancelled)."""
        flight = _InFlight(watch_from=anyio.current_time() + HANGUP_WATCH_AFTER)
        watch.arm(flight)
        reply: ToolResultReply | ToolErrorReply | None = None
        try:
            with flight.scope:
                try:
                    reply = await self._answer(request)
                except _Reply as early:
                    reply = early.reply
                except Exception as exc:  # whatever fails in one call is that call's error
                    logger.exception("the call to %s/%s failed on the host", request.server, request.tool)
                    reply = _error(
                        request.seq,
                        "internal",
                        f"the call to tool {request.tool!r} of {request.server!r} failed on the host "
                        f"({type(exc).__name__}); the host's log has the details",
                    )
        finally:
            watch.disarm()
        if flight.watching is not None:
            # Before this task waits on the socket again, the watcher must stop waiting on it.
            flight.watching.scope.cancel()
            await flight.watching.ended.wait()
        if flight.hung_up:
            return False
        if reply is not None:
            await connection.send(self._encode(request, reply))
        return True

    def _encode(self, request: ToolRequest, reply: ToolResultReply | ToolErrorReply) -> bytes:
        """The reply's line, or an error line when it cannot be sent (too large, not encodable)."""
        try:
            data = _encode(reply)
        except Exception as exc:  # e.g. text the server sent that is not valid Unicode
            logger.exception("encoding the reply to %s/%s failed", request.server, request.tool)
            message = (
                f"the result of tool {request.tool!r} of {request.server!r} could not be encoded as JSON "
                f"({type(exc).__name__}); the host's log has the details"
            )
            return _encode(_error(request.seq, "internal", message))
        if len(data) > self._max_reply_bytes:
            message = (
                f"the result of tool {request.tool!r} of {request.server!r} is {len(data)} bytes as JSON; the "
                f"limit is {self._max_reply_bytes} bytes (ask the tool for less, or for a file)"
            )
            return _encode(_error(request.seq, "too_large", message))
        return data

    def _parse(self, line: bytes) -> ToolRequest:
        problem = _shape_problem(line, MAX_JSON_DEPTH, MAX_JSON_VALUES)
        if problem is not None:
            raise _Reply(_error(None, "bad_request", problem))
        try:
            request = ToolRequest.model_validate_json(line)
        except ValidationError as exc:
            invalid = exc
        else:
            # Parsing and validating in one step takes a third of the time of json.loads and then validating.
            self._check_token(request.token)
            return request
        # Parsed again only to tell a bad token from a bad request; a request that runs is always
        # what the step above made of the line (json.loads takes more, e.g. lone surrogates, which
        # no MCP client can send on).
        try:
            data = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            raise _Reply(_error(None, "bad_request", "the tool-call request is not valid JSON")) from None
        if not isinstance(data, dict):
            raise _Reply(_error(None, "bad_request", "a tool-call request must be a JSON object"))
        fields: dict[str, Any] = data  # pyright: ignore[reportUnknownVariableType]
        self._check_token(fields.get("token"))
        seq = fields.get("seq")
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'request'}: {err['msg']}" for err in invalid.errors()
        )
        raise _Reply(
            _error(seq if isinstance(seq, int) else None, "bad_request", f"invalid tool-call request: {problems}")
        )

    def _check_token(self, token: object) -> None:
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
            message = "the tool server refused the request: missing or wrong token"
            raise _Reply(_error(None, "unauthorized", message), close=True)

    # -- calls ------------------------------------------------------------------------------------

    async def _answer(self, request: ToolRequest) -> ToolResultReply | ToolErrorReply:
        server, tool = request.server, request.tool
        builtin = self._builtins.get((server, tool))
        if builtin is not None:
            return await self._answer_builtin(request, builtin)
        entry = self._entries.get(server)
        if entry is None:
            known = ", ".join(repr(n) for n in sorted(self._entries)) or "none"
            return _error(
                request.seq,
                "unknown_server",
                f"no MCP server named {server!r} is registered with this executor (registered: {known})",
            )
        live = entry.live
        if live is not None and live.usable:
            # Connected already: an unknown tool is refused without asking the application.
            spec = await self._find_tool(entry, live, request)
        else:
            # Not connected, and not to be before this call is approved: the gate gets the
            # annotations of the server's last listing, if there was one.
            spec = entry.tools.get(tool) if entry.tools is not None else None
        annotations = (
            spec.annotations.model_dump(by_alias=True, mode="json", exclude_none=True)
            if spec is not None and spec.annotations
            else None
        )
        refused = await self._approve(request, entry.description, annotations)
        if refused is not None:
            return refused
        # Started here if it is not running; or, approval having taken long, reset or replaced meanwhile.
        live = await self._session(entry, request)
        await self._find_tool(entry, live, request)
        return await self._call(entry, live, request)

    async def _find_tool(self, entry: _Entry, live: _Session, request: ToolRequest) -> mcp_types.Tool:
        spec = live.tools.get(request.tool)
        if spec is None:
            # The server may have added the tool since it was listed.
            live.tools = entry.tools = await self._list_tools(entry, live.session, request)
            spec = live.tools.get(request.tool)
        if spec is None:
            known = ", ".join(repr(n) for n in sorted(live.tools)) or "none"
            raise _Reply(
                _error(
                    request.seq,
                    "unknown_tool",
                    f"MCP server {request.server!r} has no tool named {request.tool!r} (its tools: {known})",
                )
            )
        return spec

    async def _approve(
        self, request: ToolRequest, server: str, annotations: Mapping[str, Any] | None
    ) -> ToolErrorReply | None:
        """Ask the gate; the error reply when the call must not be made."""
        name, tool = request.server, request.tool
        try:
            decision = await self._gate(request, server=server, annotations=annotations)
        except Exception as exc:  # the gate is application code; whatever it raises, the call is not made
            logger.exception("the approval gate failed for %s/%s", name, tool)
            return _error(
                request.seq,
                "approval_failed",
                f"approving the call to tool {tool!r} of MCP server {name!r} failed on the host "
                f"({type(exc).__name__}); the call was not made",
            )
        if decision.approved:
            return None
        message = f"the application rejected the call to tool {tool!r} of MCP server {name!r}"
        if decision.reason:
            message += f": {decision.reason}"
        return ToolErrorReply(seq=request.seq, error="rejected", message=message, reason=decision.reason)

    async def _answer_builtin(self, request: ToolRequest, handler: BuiltinTool) -> ToolResultReply | ToolErrorReply:
        refused = await self._approve(request, f"ipybox on the host: {request.tool}", None)
        if refused is not None:
            return refused
        name = f"{request.server}.{request.tool}"
        try:
            text = await handler(request.arguments)
        except IpyboxError as exc:
            return _error(request.seq, "tool_error", f"{name} failed: {exc}")
        except TimeoutError:
            logger.warning("%s timed out on the host", name, exc_info=True)
            return ToolErrorReply(seq=request.seq, error="timeout", message=f"{name} timed out on the host")
        except OSError as exc:
            logger.warning("%s failed on the host", name, exc_info=True)
            why = exc.strerror or type(exc).__name__
            return _error(request.seq, "tool_error", f"{name} failed on the host: {why}")
        return ToolResultReply(seq=request.seq, structured=None, text=text, content=[{"type": "text", "text": text}])

    async def _session(self, entry: _Entry, request: ToolRequest) -> _Session:
        live = await self._connect(entry, request)
        if anyio.current_time() - live.last_used < self._idle_probe_after:
            return live
        try:
            with anyio.move_on_after(PROBE_TIMEOUT):
                await live.session.send_ping()
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                return live
            live.close(f"MCP server {entry.name!r} had exited")
            live = await self._connect(entry, request)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            live.close(f"MCP server {entry.name!r} had exited")
            live = await self._connect(entry, request)
        live.last_used = anyio.current_time()
        return live

    async def _connect(self, entry: _Entry, request: ToolRequest) -> _Session:
        live = entry.live
        if live is not None and live.usable:
            return live  # the common case, without a checkpoint for the lock
        async with entry.lock:
            live = entry.live
            if live is not None and live.usable:
                return live
            tg = self._task_group
            if tg is None:
                raise _Reply(_error(request.seq, "internal", "the tool server is shutting down"))
            try:
                live = await tg.start(self._own_session, entry)
            except MCPServerError as exc:
                raise _Reply(
                    ToolErrorReply(
                        seq=request.seq,
                        error="server_start",
                        message=f"{exc}\n(while calling tool {request.tool!r})",
                        output=exc.output if isinstance(exc, _StartFailed) else None,
                    )
                ) from None
            except UsageError as exc:
                raise _Reply(
                    _error(request.seq, "server_start", f"cannot start MCP server {entry.name!r}: {exc}")
                ) from None
            entry.live = live
            entry.tools = live.tools
            return live

    async def _own_session(self, entry: _Entry, *, task_status: anyio.abc.TaskStatus[_Session]) -> None:
        """Open a session, hand it out through ``task_status``, keep it open until asked to close."""
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
            live: _Session | None = None
            try:
                async with open_session(
                    entry.name, entry.params, connect_timeout=self._connect_timeout, errlog=stderr
                ) as session:
                    with anyio.fail_after(self._connect_timeout):
                        tools = await _list_all_tools(session)
                    live = _Session(session=session, tools=tools, stderr=stderr, last_used=anyio.current_time())
                    task_status.started(live)
                    await live.close_requested.wait()
            except Exception as exc:  # top level of a background task: it must not take the ToolServer down
                if live is None:
                    raise _start_error(entry.name, exc, _read_tail(stderr)) from exc
                logger.debug("the session with MCP server %r ended: %r", entry.name, exc)
            finally:
                if live is not None:
                    live.final_stderr = _read_tail(stderr)
                    live.close_requested.set()
                    live.closed.set()

    async def _list_tools(
        self, entry: _Entry, session: ClientSession, request: ToolRequest
    ) -> dict[str, mcp_types.Tool]:
        try:
            with anyio.fail_after(self._connect_timeout):
                return await _list_all_tools(session)
        except TimeoutError:
            message = f"MCP server {entry.name!r} did not list its tools within {self._connect_timeout:g} s"
        except MCPError as exc:
            message = f"MCP server {entry.name!r} failed to list its tools: {exc.message}"
        raise _Reply(_error(request.seq, "tool_error", message))

    async def _call(self, entry: _Entry, live: _Session, request: ToolRequest) -> ToolResultReply | ToolErrorReply:
        server, tool, seq = request.server, request.tool, request.seq
        deadline = math.inf if self._call_timeout is None else anyio.current_time() + self._call_timeout
        result: mcp_types.CallToolResult | None = None
        try:
            # A bare scope rather than fail_after: the same deadline at half the cost on every call.
            with anyio.CancelScope(deadline=deadline):
                result = await live.session.call_tool(tool, request.arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                return self._crashed(entry, live, request)
            return _error(seq, "tool_error", f"MCP server {server!r} refused the call to tool {tool!r}: {exc.message}")
        except RuntimeError as exc:
            # The client checks structured results against the tool's output schema.
            return _error(
                seq,
                "tool_error",
                f"MCP server {server!r} returned an invalid result for tool {tool!r}: {exc}",
            )
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return self._crashed(entry, live, request)
        if result is None:  # the scope's deadline passed
            assert self._call_timeout is not None
            return ToolErrorReply(
                seq=seq,
                error="timeout",
                message=f"the call to tool {tool!r} of MCP server {server!r} timed out after "
                f"{self._call_timeout:g} s (the executor's tool call timeout)",
                timeout=self._call_timeout,
            )
        live.last_used = anyio.current_time()
        text = "\n".join(item.text for item in result.content if isinstance(item, mcp_types.TextContent))
        if result.is_error:
            detail = text or "no error message"
            return _error(seq, "tool_error", f"tool {tool!r} of MCP server {server!r} failed: {detail}")
        return ToolResultReply(
            seq=seq,
            structured=result.structured_content,
            text=text,
            content=[item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in result.content],
        )

    def _crashed(self, entry: _Entry, live: _Session, request: ToolRequest) -> ToolErrorReply:
        tail = live.stderr_tail()
        if live.close_reason is not None:
            why = f"the session was closed because {live.close_reason}"
        else:
            why = "the server exited or dropped the connection; the next call starts it again"
            live.close(f"MCP server {entry.name!r} dropped the connection")
        message = (
            f"the connection to MCP server {request.server!r} ended during the call to tool {request.tool!r}: {why}"
        )
        if tail:
            message += f"\nits stderr ends with:\n{tail}"
        return ToolErrorReply(seq=request.seq, error="server_crashed", message=message, output=tail or None)


async def _list_all_tools(session: ClientSession) -> dict[str, mcp_types.Tool]:
    tools: dict[str, mcp_types.Tool] = {}
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.update((tool.name, tool) for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


class _StartFailed(MCPServerError):
    """A server could not be started or connected to; carries the tail of its stderr."""

    def __init__(self, server_name: str, message: str, *, output: str | None) -> None:
        super().__init__(server_name, message)
        self.output = output


def _start_error(name: str, exc: BaseException, tail: str) -> _StartFailed:
    # The transports' task groups wrap the one error that matters.
    while isinstance(exc, BaseExceptionGroup):
        exc = cast("BaseExceptionGroup[BaseException]", exc).exceptions[0]
    if isinstance(exc, MCPServerError):
        detail = str(exc).removeprefix(f"MCP server {name!r}: ")
    elif isinstance(exc, MCPError):
        detail = f"it closed the connection during the MCP handshake ({exc.message})"
    elif isinstance(exc, TimeoutError):
        detail = "it did not list its tools in time"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    message = f"failed to start or connect: {detail}"
    if tail:
        message += f"\nits stderr ends with:\n{tail}"
    return _StartFailed(name, message, output=tail or None)


def _read_tail(stderr: IO[str]) -> str:
    try:
        fd = stderr.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - STDERR_TAIL_BYTES)
        data = os.pread(fd, size - start, start)
    except (OSError, ValueError):
        return ""
    text = data.decode("utf-8", errors="replace")
    if start > 0:
        text = text.partition("\n")[2]
    return text.strip()


def _error(seq: int | None, kind: ErrorKind, message: str) -> ToolErrorReply:
    return ToolErrorReply(seq=seq, error=kind, message=message)


def _encode(reply: ToolResultReply | ToolErrorReply) -> bytes:
    return reply.model_dump_json(exclude_none=isinstance(reply, ToolErrorReply)).encode() + b"\n"


def _shape_problem(line: bytes, depth: int, values: int) -> str | None:
    """Why the JSON in ``line`` is refused before parsing, or None.

    Parsers recurse per level of arrays and objects (json.loads runs out of stack), and every value
    becomes a Python object several times its size in the line (a 16 MiB line of ``[],`` parsed into
    428 MiB). Brackets and commas inside strings do not count; it runs in C. Exact for valid JSON;
    for invalid JSON it may count more than a parser would get to before failing, which only refuses
    a line that fails anyway.
    """
    brackets = line.count(b"[") + line.count(b"{")
    if brackets <= depth and brackets + line.count(b",") < values:
        return None  # the common case: too few brackets and commas to matter
    # Inside strings every backslash escapes the next byte: drop escaped backslashes, then escaped
    # quotes, and the strings are what lies between plain quotes.
    text = _JSON_STRING.sub(b"", line.replace(b"\\\\", b"").replace(b'\\"', b""))
    if text.count(b",") + text.count(b"[") + text.count(b"{") >= values:
        return _TOO_MANY_VALUES
    weights = text.translate(None, _NOT_BRACKETS).translate(_BRACKET_WEIGHTS)
    levels = map(operator.sub, itertools.accumulate(weights), itertools.count(1))
    return _TOO_DEEP if any(map(depth.__lt__, levels)) else None


class _LineTooLong(Exception):
    """A request line ran past the limit without a newline."""


class _OverBudget(Exception):
    """The bytes a connection received do not fit into the ToolServer's `MAX_BUFFERED_BYTES`."""


class _LineConnection:
    """Newline-delimited messages over one accepted, non-blocking unix socket.

    Driven by `anyio.wait_readable`/`wait_writable` rather than anyio's unix socket streams, whose
    asyncio implementation can raise InvalidStateError in a loop callback when a read is cancelled
    just as data arrives (as happens to every open connection when the ToolServer stops).
    """

    def __init__(self, sock: socket.socket, budget: _Budget) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._budget = budget
        self._buffer = bytearray()
        self._scanned = 0
        self._unanswered = 0
        """Bytes of lines handed out by `receive_line` that still count against the budget."""

    async def receive_line(self, limit: int) -> bytes:
        """The next line without its newline; its bytes count against the budget until `answered`.

        Raises:
            _LineTooLong: More than ``limit`` bytes arrived without a newline.
            _OverBudget: The bytes that arrived do not fit into the shared budget.
            EOFError: The peer closed the connection (or it broke) before a full line.
        """
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                self._unanswered += end + 1
                return line
            self._scanned = len(self._buffer)
            if len(self._buffer) > limit:
                raise _LineTooLong
            try:
                data = self._sock.recv(_RECEIVE_CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError:
                raise EOFError from None
            if not data:
                raise EOFError
            # Checked after the read: a refused read (one chunk) is all that is ever held outside the budget.
            if not self._budget.take(len(data)):
                raise _OverBudget
            self._buffer += data

    def answered(self) -> None:
        """The lines handed out so far are answered: give their bytes back to the budget."""
        self._budget.give(self._unanswered)
        self._unanswered = 0

    async def wait_hangup(self) -> None:
        """Return once the peer has closed the connection (or it broke).

        Does not read: data that arrives meanwhile (a request sent early) is left for `receive_line`.
        """
        while True:
            await anyio.wait_readable(self._sock)
            try:
                data = self._sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not data:
                return
            # Readable because a request is waiting, which stays so until it is read: stop looking.
            await anyio.sleep_forever()

    async def send_reply(self, reply: ToolResultReply | ToolErrorReply) -> None:
        await self.send(_encode(reply))

    async def send(self, data: bytes) -> None:
        """Send one reply line; a peer that has gone away is ignored (it no longer waits for it)."""
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
                continue
            except OSError:
                return
            view = view[sent:]

    def close(self) -> None:
        self._sock.close()
        self._budget.give(len(self._buffer) + self._unanswered)
        self._buffer.clear()
        self._unanswered = 0


async def _accept_one(listener: socket.socket) -> socket.socket:
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            await anyio.wait_readable(listener)
            continue
        return sock


def _bind_socket(path: Path) -> socket.socket:
    """Bind a listening unix socket that only this user can connect to."""
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise UsageError(
            f"the tool socket path {str(path)!r} is longer than {_MAX_SOCKET_PATH} bytes; use a shorter run directory"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise UsageError(f"{str(path)!r} exists and is not a socket; choose another tool socket path")
        if _socket_in_use(path):
            raise UsageError(f"another process serves the tool socket {str(path)!r}; choose another path")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        # Nobody can connect before listen(), so tightening the mode here leaves no window.
        os.chmod(path, 0o600)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _socket_in_use(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _remove_socket(path: Path, inode: int) -> None:
    """Remove the socket file, unless another ToolServer has bound a new one there since."""
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
