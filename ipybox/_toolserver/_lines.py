"""The tool socket's line protocol: connections, framing, the shared buffer budget, hang-ups.

Everything here handles bytes from kernel code, which is untrusted: a line is bounded
(`MAX_LINE_BYTES`), and so is what all connections hold together (`MAX_BUFFERED_BYTES`). What the
lines mean is `._parse`'s and `._server`'s business; binding and accepting is `ipybox._unixsocket`'s.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field

import anyio
import anyio.abc

from ._channel import ToolErrorReply, ToolResultReply, encode_reply

__all__ = (
    "HANGUP_WATCH_AFTER",
    "MAX_BUFFERED_BYTES",
    "Budget",
    "HangupWatch",
    "InFlight",
    "LineConnection",
    "LineTooLong",
    "OverBudget",
)

# Request lines (partial, or being answered) all connections together may hold: four of the largest
# requests at once, an eighth of what MAX_CONNECTIONS lines of MAX_LINE_BYTES would take. A line
# counts until its answer is sent, because its parsed form lives that long (and takes several times
# the line's bytes). A connection that needs more is refused rather than paused: a paused reader
# waits for others to finish their lines, and partial lines that are never finished would pause
# every connection for good; a refusal frees the memory at once and tells the code what to change.
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
# A hang-up is looked for only once a call has run this long. Cancelling a call that ends sooner
# gains nothing, and watching the socket from the start costs every call more than the rest of the
# host's work for it.
HANGUP_WATCH_AFTER = 0.05
# One read per wakeup; large requests take several.
_RECEIVE_CHUNK = 256 * 1024


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
    A call that ends sooner costs no timer update here and no pass of this task, unless the timer
    was idle (then one update; the task passes once when it expires, and idles it again).
    """

    def __init__(self, connection: LineConnection) -> None:
        self._connection = connection
        self._flight: InFlight | None = None
        self._timer = anyio.CancelScope()  # replaced in run(); expires when a call needs watching

    def arm(self, flight: InFlight) -> None:
        """Watch for a hang-up while ``flight`` is answered, until `disarm`."""
        self._flight = flight
        # A timer set for an earlier call expires sooner and is set again for this one then: in a
        # run of quick calls the timer is set once per HANGUP_WATCH_AFTER, not twice per call.
        if self._timer.deadline == math.inf:
            self._timer.deadline = flight.watch_from

    def disarm(self) -> None:
        self._flight = None

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
