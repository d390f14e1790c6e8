"""The tool socket's line protocol: connections, framing, the shared buffer budget, hang-ups.

Everything here handles bytes from kernel code, which is untrusted: a line is bounded
(`MAX_LINE_BYTES`), so is what all connections hold together (`MAX_BUFFERED_BYTES`), and a line's
JSON is checked for depth and value count before anything parses it (`shape_problem`). What the
lines mean is `._server`'s business.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import re
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from ipybox._exceptions import UsageError

from ._channel import MAX_JSON_DEPTH, MAX_JSON_VALUES, ToolErrorReply, ToolResultReply, encode_reply

__all__ = (
    "HANGUP_WATCH_AFTER",
    "LISTEN_BACKLOG",
    "MAX_BUFFERED_BYTES",
    "TOO_DEEP",
    "TOO_MANY_VALUES",
    "Budget",
    "HangupWatch",
    "InFlight",
    "LineConnection",
    "LineTooLong",
    "OverBudget",
    "accept_one",
    "bind_socket",
    "remove_socket",
    "shape_problem",
)

# Request lines (partial, or being answered) all connections together may hold: four of the largest
# requests at once, an eighth of what MAX_CONNECTIONS lines of MAX_LINE_BYTES would take. A line
# counts until its answer is sent, because its parsed form lives that long (and takes several times
# the line's bytes). A connection that needs more is refused rather than paused: a paused reader
# waits for others to finish their lines, and partial lines that are never finished would pause
# every connection for good; a refusal frees the memory at once and tells the code what to change.
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
# Connections beyond MAX_CONNECTIONS wait here (then in connect()) until a slot frees, rather than fail.
LISTEN_BACKLOG = 128
# A hang-up is looked for only once a call has run this long. Cancelling a call that ends sooner
# gains nothing, and watching the socket from the start costs every call more than the rest of the
# host's work for it.
HANGUP_WATCH_AFTER = 0.05
# One read per wakeup; large requests take several.
_RECEIVE_CHUNK = 256 * 1024
TOO_DEEP = f"the tool-call request is nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects"
TOO_MANY_VALUES = (
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


@dataclass(eq=False)
class InFlight:
    """The request a connection is answering; cancelled if the kernel hangs up."""

    watch_from: float
    """When the `HangupWatch` starts watching for a hang-up, if the answer is not done by then."""
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


class HangupWatch:
    """Cancels the request a connection is answering when the kernel hangs up meanwhile.

    The connection's reader answers each request itself and does not read meanwhile, so this task
    watches the socket instead, from `HANGUP_WATCH_AFTER` into a call until its answer is done.
    A call that ends sooner costs two timer updates here and no pass of this task.
    """

    def __init__(self, connection: LineConnection) -> None:
        self._connection = connection
        self._flight: InFlight | None = None
        self._timer = anyio.CancelScope()  # replaced in run(); expires when a call needs watching

    def arm(self, flight: InFlight) -> None:
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


class Budget:
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


def shape_problem(line: bytes, depth: int, values: int) -> str | None:
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
        return TOO_MANY_VALUES
    weights = text.translate(None, _NOT_BRACKETS).translate(_BRACKET_WEIGHTS)
    levels = map(operator.sub, itertools.accumulate(weights), itertools.count(1))
    return TOO_DEEP if any(map(depth.__lt__, levels)) else None


class LineTooLong(Exception):
    """A request line ran past the limit without a newline."""


class OverBudget(Exception):
    """The bytes a connection received do not fit into the ToolServer's `MAX_BUFFERED_BYTES`."""


class LineConnection:
    """Newline-delimited messages over one accepted, non-blocking unix socket.

    Driven by `anyio.wait_readable`/`wait_writable` rather than anyio's unix socket streams, whose
    asyncio implementation can raise InvalidStateError in a loop callback when a read is cancelled
    just as data arrives (as happens to every open connection when the ToolServer stops).
    """

    def __init__(self, sock: socket.socket, budget: Budget) -> None:
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
            LineTooLong: More than ``limit`` bytes arrived without a newline.
            OverBudget: The bytes that arrived do not fit into the shared budget.
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
                raise LineTooLong
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
                raise OverBudget
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
        await self.send(encode_reply(reply))

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


async def accept_one(listener: socket.socket) -> socket.socket:
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            await anyio.wait_readable(listener)
            continue
        return sock


def bind_socket(path: Path) -> socket.socket:
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


def remove_socket(path: Path, inode: int) -> None:
    """Remove the socket file, unless another ToolServer has bound a new one there since."""
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
