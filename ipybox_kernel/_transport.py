"""How a tool call's request reaches the host's ToolServer and its reply comes back.

Standard library only: the kernel must not pay for (or be able to misuse) an MCP client. The host
sets ``IPYBOX_TOOL_SOCKET`` and ``IPYBOX_TOOL_TOKEN`` on the kernel; each call sends one line of JSON
(server name, tool name, arguments, the running cell's id, a sequence number and, when the kernel
marked its output for it, the mark) and reads one line back. The wire format is described in
``ipybox/_toolserver/_channel.py``, the names and limits both sides share in
``ipybox_kernel._protocol``. A kernel on a remote gateway carries the same lines over the kernel
protocol instead (``ipybox_kernel._remote``).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import math
import os
import socket
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import ToolCallError, ToolServerUnavailable
from ._protocol import MAX_LINE_BYTES, MAX_MODULE_CHARS, SOCKET_ENV, TOKEN_ENV, TRANSPORT_ENV, TRANSPORT_KERNEL

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = (
    "Abort",
    "CallSite",
    "InProcess",
    "call_executor",
    "note_unmarked",
    "round_trip",
    "set_output_mark",
)

# The host refuses longer request lines; fail before sending.
MAX_REQUEST_BYTES = MAX_LINE_BYTES
# Idle connections kept for reuse; more would only hold host connection slots without a call.
_IDLE_CONNECTIONS = 8
# Threads that carry acall_tool calls; bounds how many awaited calls are in flight at once.
_ASYNC_WORKERS = 32


class _Connection:
    """One connection to the tool server, used by one call at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = _pid
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.reader = self.sock.makefile("rb")

    def reusable(self) -> bool:
        """Still ours and open: the host has not closed it and sent nothing unasked."""
        if self.pid != _pid:
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


class Abort:
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

# This process's id, kept up to date at fork: os.getpid() is a system call on every use.
_pid = os.getpid()
_pool: list[_Connection] = []
_pool_lock = threading.Lock()
_seq = itertools.count(1)
_async_executor: ThreadPoolExecutor | None = None
# Set by ipybox_kernel._marks in a kernel: flushes the output printed so far and returns the mark
# the host waits for before it shows the call for approval (None: nothing to wait for).
_output_mark: Callable[[str | None], int | None] | None = None


# The execution whose calls the host said need no output mark (a reply's "unmarked": nobody is shown
# them). Execution ids are unique, so one in-process kernel's cannot stand for another's.
_unmarked: str | None = None


def set_output_mark(mark: Callable[[str | None], int | None]) -> None:
    """Call ``mark(execution)`` before each request is sent and send the mark it returns with it."""
    global _output_mark
    _output_mark = mark


def note_unmarked(execution: str) -> None:
    """The host said the calls of ``execution`` need no output mark: from now on none is made for
    them (no flush of the output before each call either)."""
    global _unmarked
    _unmarked = execution


def _after_fork() -> None:
    # A forked child must not share its parent's connections, nor inherit a lock held by another thread.
    global _pool_lock, _async_executor, _pid
    _pid = os.getpid()
    _pool_lock = threading.Lock()
    for connection in _pool:
        connection.close()  # closes the child's copies only; the parent's connections stay open
    _pool.clear()
    _async_executor = None


os.register_at_fork(after_in_child=_after_fork)


def call_executor() -> ThreadPoolExecutor:
    """The threads that carry ``acall_tool`` calls."""
    global _async_executor
    with _pool_lock:
        if _async_executor is None:
            from concurrent.futures import ThreadPoolExecutor

            _async_executor = ThreadPoolExecutor(_ASYNC_WORKERS, thread_name_prefix="ipybox-tool-call")
        return _async_executor


def _checkout(path: str) -> _Connection:
    with _pool_lock:
        # Only this socket's: one process may talk to several tool servers (in-process kernels).
        for connection in [c for c in _pool if c.path == path]:
            _pool.remove(connection)
            if connection.reusable():
                return connection
            connection.close()
    return _Connection(path)


def close_connections(path: str) -> None:
    """Close the idle connections to the tool server at ``path``, which has gone (an in-process kernel stopped)."""
    with _pool_lock:
        gone = [c for c in _pool if c.path == path]
        _pool[:] = [c for c in _pool if c.path != path]
    for connection in gone:
        connection.close()


def _checkin(connection: _Connection) -> None:
    with _pool_lock:
        if len(_pool) < _IDLE_CONNECTIONS and connection.pid == _pid:
            _pool.append(connection)
            return
    connection.close()


@dataclass(frozen=True)
class CallSite:
    """Where a call was made, as the kernel reports it with the request (``ipybox_kernel._client.call_site``)."""

    line: int | None
    """The line of the running cell's code that made the call; None: no frame of the cell made it."""
    module: str | None
    """The module the call came through, when not the cell's own code (a skill, a library)."""


@dataclass(frozen=True, eq=False)
class InProcess:
    """An in-process kernel's settings (``ipybox.testing``), for the cells it runs.

    A real kernel takes them from its environment. An in-process kernel shares the host's, and one
    process may run several such kernels, so each runs its cells in a context holding its own
    (`IN_PROCESS`).

    Attributes:
        env: The settings a real kernel finds in its environment (`SOCKET_ENV`, `TOKEN_ENV`,
            `EXECUTION_ENV`: the running cell).
        output_mark: Marks the cell's output before each call (see `set_output_mark`).
        calls: The calls in flight, which an interrupt aborts: a thread blocked on its reply sees
            no KeyboardInterrupt until the reply comes.
    """

    env: Mapping[str, str]
    output_mark: Callable[[str | None], int | None] | None = None
    calls: weakref.WeakSet[Abort] = field(default_factory=lambda: weakref.WeakSet[Abort]())


IN_PROCESS: contextvars.ContextVar[InProcess | None] = contextvars.ContextVar("ipybox_in_process", default=None)


def kernel_settings() -> Mapping[str, str]:
    """This kernel's settings: the in-process kernel's whose cell runs in this context, else the
    environment."""
    in_process = IN_PROCESS.get()
    return os.environ if in_process is None else in_process.env


def kernel_setting(name: str) -> str | None:
    """One of this kernel's settings (see `kernel_settings`)."""
    return kernel_settings().get(name)


def round_trip(
    server_name: str,
    tool_name: str,
    arguments: dict[str, Any] | None,
    execution: str | None,
    abort: Abort | None,
    site: CallSite | None = None,
) -> bytes:
    """Send one request and return the host's reply line.

    Raises:
        ToolServerUnavailable: The tool server cannot be reached, or hung up during the call.
        ToolCallError: The request cannot be sent (arguments), or the call was cancelled.
    """
    settings = kernel_settings()
    in_process = IN_PROCESS.get()
    path = settings.get(SOCKET_ENV)
    token = settings.get(TOKEN_ENV)
    remote = settings.get(TRANSPORT_ENV) == TRANSPORT_KERNEL
    output_mark = _output_mark if in_process is None else in_process.output_mark
    if in_process is not None and abort is None:
        abort = Abort()
        in_process.calls.add(abort)
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
    request: dict[str, Any] = {
        "token": token,
        "seq": next(_seq),
        "execution": execution,
        "server": server_name,
        "tool": tool_name,
        "arguments": arguments,
    }
    if site is not None:
        if site.line is not None:
            request["line"] = site.line
        if site.module is not None:
            request["module"] = site.module[:MAX_MODULE_CHARS]
    mark = None
    # A stream that cannot send (closed at shutdown) must not fail the call: it goes on, unordered.
    with contextlib.suppress(Exception):
        mark = output_mark(execution) if output_mark is not None and execution != _unmarked else None
    if mark is not None:
        request["mark"] = mark
    try:
        line = _ENCODER.encode(request).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        where = _non_finite(arguments)
        if where is not None:
            raise ToolCallError(
                server_name,
                tool_name,
                f"{where[0]} for tool {tool_name!r} is {where[1]}: JSON has no NaN or Infinity, so the "
                "call cannot carry it (nothing was sent)",
            ) from None
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
    return _socket_round_trip(server_name, tool_name, path, line, abort)


def _non_finite(arguments: dict[str, Any]) -> tuple[str, str] | None:
    """Where in ``arguments`` the first NaN or infinite float is (``a.b[2]``) and what it is, or None."""
    stack: list[tuple[str, Any]] = [(f"arguments[{k!r}]", v) for k, v in reversed(arguments.items())]
    seen: set[int] = set()  # a container that holds itself is the encoder's "circular reference"
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where, repr(value)
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            entries: dict[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
            stack.extend((f"{where}[{k!r}]", v) for k, v in reversed(entries.items()))
        elif isinstance(value, list | tuple):
            items: list[Any] | tuple[Any, ...] = value  # pyright: ignore[reportUnknownVariableType]
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(items))))
    return None


def _socket_round_trip(server_name: str, tool_name: str, path: str, line: bytes, abort: Abort | None) -> bytes:
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
    return reply_line


def _remote_round_trip(server_name: str, tool_name: str, line: bytes, abort: Abort | None) -> bytes:
    """The call over the kernel protocol, for a kernel on a remote gateway (see ipybox_kernel._remote)."""
    from ._remote import round_trip as remote_round_trip

    try:
        reply_line = remote_round_trip(server_name, tool_name, line, abort)
    except ValueError as exc:
        raise ToolCallError(server_name, tool_name, str(exc)) from None
    except RuntimeError as exc:
        raise ToolServerUnavailable(server_name, tool_name, str(exc)) from None
    if reply_line is None:
        raise ToolCallError(server_name, tool_name, f"the call to tool {tool_name!r} was cancelled")
    return reply_line
