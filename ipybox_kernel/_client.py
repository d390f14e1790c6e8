"""Tool calls from the sandboxed kernel to the host's ToolServer, over one unix socket.

Standard library only: the kernel must not pay for (or be able to misuse) an MCP client. The host
sets ``IPYBOX_TOOL_SOCKET`` and ``IPYBOX_TOOL_TOKEN`` on the kernel; each call sends one line of JSON
(server name, tool name, arguments, the running cell's id and a sequence number) and reads one line
back. The wire format is described in ``ipybox/_channel.py``; keep the two in step.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = (
    "MCPServerCrashed",
    "MCPServerStartError",
    "ToolCallError",
    "ToolCallRejected",
    "ToolCallTimeout",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolOutput",
    "ToolServerUnavailable",
    "acall_tool",
    "call_tool",
)

SOCKET_ENV = "IPYBOX_TOOL_SOCKET"
TOKEN_ENV = "IPYBOX_TOOL_TOKEN"
# The running cell's id, for a subprocess (it has no IPython to ask); set by ipybox_kernel._context.
EXECUTION_ENV = "IPYBOX_EXECUTION"
# Set to "kernel" in a kernel on a remote gateway: calls travel over the kernel protocol instead.
TRANSPORT_ENV = "IPYBOX_TOOL_TRANSPORT"

# The host refuses longer request lines (ipybox._channel.MAX_LINE_BYTES); fail before sending.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# Idle connections kept for reuse; more would only hold host connection slots without a call.
_IDLE_CONNECTIONS = 8
# Threads that carry acall_tool calls; bounds how many awaited calls are in flight at once.
_ASYNC_WORKERS = 32
# Image types Jupyter front ends render; other content stays in ToolOutput.content only.
_DISPLAYED_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/svg+xml"})


class ToolCallError(Exception):
    """A tool call did not return a result.

    Attributes:
        server_name: The MCP server the call was for.
        tool_name: The tool the call was for.
        message: What went wrong, naming the server and tool.
    """

    def __init__(self, server_name: str, tool_name: str, message: str) -> None:
        super().__init__(message)
        self.server_name = server_name
        self.tool_name = tool_name
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take extra keyword arguments, so rebuild from the instance dict.
        return (_rebuild_error, (type(self), self.message, dict(self.__dict__)))


def _rebuild_error(cls: type[ToolCallError], message: str, state: dict[str, Any]) -> ToolCallError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ToolCallRejected(ToolCallError):
    """The application did not approve the call; it was not made.

    Attributes:
        reason: The reason the application gave, if any.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, reason: str | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.reason = reason


class ToolServerUnavailable(ToolCallError):
    """The kernel cannot reach the host's tool server (not configured, stopped, or refused)."""


class ToolNotFound(ToolCallError, LookupError):
    """No MCP server of that name is registered, or the server has no tool of that name."""


class ToolExecutionError(ToolCallError):
    """The tool ran and reported an error (MCP ``isError``), or the server refused the call."""


class ToolCallTimeout(ToolCallError, TimeoutError):
    """The MCP call took longer than the executor's tool call timeout.

    Attributes:
        timeout: The timeout that was exceeded, in seconds.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, timeout: float | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.timeout = timeout


class MCPServerStartError(ToolCallError):
    """The MCP server could not be started or connected to.

    Attributes:
        output: The last lines the server wrote to stderr, if any.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, output: str | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.output = output


class MCPServerCrashed(ToolCallError):
    """The connection to the MCP server ended during the call; the next call starts it again.

    Attributes:
        output: The last lines the server wrote to stderr, if any.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, output: str | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.output = output


@dataclass(frozen=True)
class ToolOutput:
    """The result of a tool call.

    Attributes:
        structured: The MCP ``structuredContent``, when the tool returned any.
        text: The text content items, joined with newlines.
        content: Every MCP content item (text, image, audio, resource) as MCP wire JSON.
    """

    structured: dict[str, Any] | None
    text: str
    content: list[dict[str, Any]]


def call_tool(server_name: str, tool_name: str, arguments: dict[str, Any] | None = None) -> ToolOutput:
    """Call a tool of an MCP server registered on the host, and wait for the result.

    The host asks the application to approve the call first. Safe to call from several threads at
    once. Images in the result are displayed when running in IPython.

    Args:
        server_name: The name the server is registered under on the host.
        tool_name: The tool's name as the server lists it.
        arguments: The tool's arguments; must be JSON-serializable.

    Raises:
        ToolCallRejected: The application rejected the call.
        ToolCallError: The call failed; the subclass says how.
    """
    output = _round_trip(server_name, tool_name, arguments, _execution_id(), None)
    _display_images(output)
    return output


async def acall_tool(server_name: str, tool_name: str, arguments: dict[str, Any] | None = None) -> ToolOutput:
    """Like `call_tool`, for ``await`` on asyncio; gathered calls run concurrently.

    The call runs in a worker thread. Cancelling the awaiting task closes the call's connection,
    which cancels the call (or its pending approval) on the host.

    Raises:
        ToolCallRejected: The application rejected the call.
        ToolCallError: The call failed; the subclass says how.
    """
    import asyncio
    import contextvars

    execution = _execution_id()
    abort = _Abort()
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()

    def work() -> ToolOutput:
        return context.run(_round_trip, server_name, tool_name, arguments, execution, abort)

    future = loop.run_in_executor(_executor(), work)
    try:
        output = await future
    except asyncio.CancelledError:
        abort.abort()
        raise
    _display_images(output)
    return output


class _Connection:
    """One connection to the tool server, used by one call at a time."""

    def __init__(self, path: str) -> None:
        self.pid = os.getpid()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.reader = self.sock.makefile("rb")

    def reusable(self) -> bool:
        """Still ours and open: the host has not closed it and sent nothing unasked."""
        if self.pid != os.getpid():
            return False
        try:
            self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class _Abortable(Protocol):
    """What a call is carried on: a socket connection, or a remote call (ipybox_kernel._remote)."""

    def abort(self) -> None: ...


class _Abort:
    """Lets an awaiting task cancel a call that a worker thread is carrying."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: _Abortable | None = None
        self.aborted = False

    def attach(self, connection: _Abortable) -> bool:
        with self._lock:
            self._connection = connection
            return not self.aborted

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            if self._connection is not None:
                self._connection.abort()


# Built once: json.dumps with any option set builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

_pool: list[_Connection] = []
_pool_lock = threading.Lock()
_seq = itertools.count(1)
_async_executor: ThreadPoolExecutor | None = None


def _after_fork() -> None:
    # A forked child must not share its parent's connections, nor inherit a lock held by another thread.
    global _pool_lock, _async_executor
    _pool_lock = threading.Lock()
    for connection in _pool:
        connection.close()  # closes the child's copies only; the parent's connections stay open
    _pool.clear()
    _async_executor = None


os.register_at_fork(after_in_child=_after_fork)


def _executor() -> ThreadPoolExecutor:
    global _async_executor
    with _pool_lock:
        if _async_executor is None:
            from concurrent.futures import ThreadPoolExecutor

            _async_executor = ThreadPoolExecutor(_ASYNC_WORKERS, thread_name_prefix="ipybox-tool-call")
        return _async_executor


def _checkout(path: str) -> _Connection:
    with _pool_lock:
        while _pool:
            connection = _pool.pop()
            if connection.reusable():
                return connection
            connection.close()
    return _Connection(path)


def _checkin(connection: _Connection) -> None:
    with _pool_lock:
        if len(_pool) < _IDLE_CONNECTIONS and connection.pid == os.getpid():
            _pool.append(connection)
            return
    connection.close()


def _round_trip(
    server_name: str,
    tool_name: str,
    arguments: dict[str, Any] | None,
    execution: str | None,
    abort: _Abort | None,
) -> ToolOutput:
    path = os.environ.get(SOCKET_ENV)
    token = os.environ.get(TOKEN_ENV)
    remote = os.environ.get(TRANSPORT_ENV) == "kernel"
    if not (path or remote) or not token:
        raise ToolServerUnavailable(
            server_name,
            tool_name,
            f"tool calls are not available in this kernel: {SOCKET_ENV} and {TOKEN_ENV} are not set "
            "(only kernels started by an ipybox CodeExecutor can call MCP tools)",
        )
    if arguments is None:
        arguments = {}
    elif not isinstance(arguments, dict):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"arguments for tool {tool_name!r} must be a dict, got {type(arguments).__name__}")
    seq = next(_seq)
    request = {
        "token": token,
        "seq": seq,
        "execution": execution,
        "server": server_name,
        "tool": tool_name,
        "arguments": arguments,
    }
    try:
        line = _ENCODER.encode(request).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise ToolCallError(
            server_name, tool_name, f"the arguments for tool {tool_name!r} are not JSON-serializable: {exc}"
        ) from None
    if len(line) > MAX_REQUEST_BYTES:
        raise ToolCallError(
            server_name,
            tool_name,
            f"the arguments for tool {tool_name!r} are {len(line)} bytes as JSON; the limit is "
            f"{MAX_REQUEST_BYTES} bytes (pass large data as a file in the workspace)",
        )
    if remote:
        return _remote_round_trip(server_name, tool_name, line, abort)
    assert path is not None
    try:
        connection = _checkout(path)
    except OSError as exc:
        raise ToolServerUnavailable(
            server_name,
            tool_name,
            f"cannot reach the tool server at {path!r} ({exc.strerror or exc}); "
            "the executor that started this kernel may have stopped",
        ) from None
    reply_line = b""
    try:
        if abort is not None and not abort.attach(connection):
            raise ToolCallError(server_name, tool_name, f"the call to tool {tool_name!r} was cancelled")
        connection.sock.sendall(line)
        reply_line = connection.reader.readline()
    except OSError as exc:
        reply_line = b""
        error: OSError | None = exc
    else:
        error = None
    finally:
        # A connection interrupted mid-call (KeyboardInterrupt, cancel) may still get a late reply.
        if reply_line.endswith(b"\n"):
            _checkin(connection)
        else:
            connection.close()
    if not reply_line.endswith(b"\n"):
        detail = f" ({error.strerror or error})" if error is not None else ""
        raise ToolServerUnavailable(
            server_name,
            tool_name,
            f"the tool server closed the connection during the call to tool {tool_name!r}{detail}",
        )
    return _parse_reply(server_name, tool_name, reply_line)


def _remote_round_trip(server_name: str, tool_name: str, line: bytes, abort: _Abort | None) -> ToolOutput:
    """The call over the kernel protocol, for a kernel on a remote gateway (see ipybox_kernel._remote)."""
    from ._remote import round_trip

    try:
        reply_line = round_trip(server_name, tool_name, line, abort)
    except ValueError as exc:
        raise ToolCallError(server_name, tool_name, str(exc)) from None
    except RuntimeError as exc:
        raise ToolServerUnavailable(server_name, tool_name, str(exc)) from None
    if reply_line is None:
        raise ToolCallError(server_name, tool_name, f"the call to tool {tool_name!r} was cancelled")
    return _parse_reply(server_name, tool_name, reply_line)


def _parse_reply(server_name: str, tool_name: str, line: bytes) -> ToolOutput:
    try:
        reply: Any = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ToolCallError(server_name, tool_name, "the tool server sent a reply that is not a JSON object")
    fields: dict[str, Any] = reply  # pyright: ignore[reportUnknownVariableType]
    if fields.get("ok") is True:
        return ToolOutput(
            structured=fields.get("structured"),
            text=fields.get("text") or "",
            content=fields.get("content") or [],
        )
    kind = fields.get("error")
    message = str(fields.get("message") or f"the call to tool {tool_name!r} of MCP server {server_name!r} failed")
    if kind == "rejected":
        raise ToolCallRejected(server_name, tool_name, message, reason=fields.get("reason"))
    if kind in ("unknown_server", "unknown_tool"):
        raise ToolNotFound(server_name, tool_name, message)
    if kind == "tool_error":
        raise ToolExecutionError(server_name, tool_name, message)
    if kind == "timeout":
        raise ToolCallTimeout(server_name, tool_name, message, timeout=fields.get("timeout"))
    if kind == "server_start":
        raise MCPServerStartError(server_name, tool_name, message, output=fields.get("output"))
    if kind == "server_crashed":
        raise MCPServerCrashed(server_name, tool_name, message, output=fields.get("output"))
    if kind == "unauthorized":
        raise ToolServerUnavailable(server_name, tool_name, message)
    raise ToolCallError(server_name, tool_name, message)


def _execution_id() -> str | None:
    """The IPython parent msg_id of the cell this code belongs to.

    In a thread, the cell that started the thread (ipybox_kernel._context); in a subprocess of the
    kernel, the cell that ran when it started; None outside an ipybox kernel. The host allows a call
    only while the cell it names runs.
    """
    ipython = sys.modules.get("IPython")
    try:
        msg_id = ipython.get_ipython().kernel.get_parent()["header"]["msg_id"]  # pyright: ignore[reportOptionalMemberAccess]
    except (AttributeError, KeyError, TypeError):
        msg_id = os.environ.get(EXECUTION_ENV)
    return msg_id if isinstance(msg_id, str) and msg_id else None


def _display_images(output: ToolOutput) -> None:
    """Show image results as cell outputs, so they reach the execution's result."""
    images = [
        item for item in output.content if item.get("type") == "image" and item.get("mimeType") in _DISPLAYED_IMAGES
    ]
    if not images:
        return
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:
        return
    from IPython.display import display  # pyright: ignore[reportUnknownVariableType]

    for item in images:
        mime: str = item["mimeType"]
        data = item.get("data")
        if not isinstance(data, str):
            continue
        if mime == "image/svg+xml":
            # SVG is text in a MIME bundle; MCP sends every image base64-encoded.
            data = base64.b64decode(data).decode("utf-8", errors="replace")
        display({mime: data}, raw=True)
