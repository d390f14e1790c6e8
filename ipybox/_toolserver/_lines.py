"""The tool socket's line protocol: connections, framing, the shared buffer budget, hang-ups.

Everything here handles bytes from kernel code, which is untrusted: a line is bounded
(`MAX_LINE_BYTES`), and so is what all connections hold together (`MAX_BUFFERED_BYTES`). What the
lines mean is `._parse`'s and `._server`'s business; binding and accepting is `ipybox._unixsocket`'s.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import anyio

from ._channel import ToolErrorReply, ToolResultReply, encode_reply

__all__ = ("MAX_BUFFERED_BYTES", "Budget", "LineConnection", "LineTooLong", "OverBudget")

# Request lines (partial, or being answered) all connections together may hold: four of the largest
# requests at once, an eighth of what MAX_CONNECTIONS lines of MAX_LINE_BYTES would take. A line
# counts until its answer is sent, because its parsed form lives that long (and takes several times
# the line's bytes). A connection that needs more is refused rather than paused: a paused reader
# waits for others to finish their lines, and partial lines that are never finished would pause
# every connection for good; a refusal frees the memory at once and tells the code what to change.
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
# One read per wakeup; large requests take several.
_RECEIVE_CHUNK = 256 * 1024


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

    The socket is registered with the event loop once, for the connection's life (asyncio only: ipybox
    runs on asyncio, which jupyter_client needs), rather than once per wait, and the same reader
    notices a kernel that hangs up while one of its requests is answered (`answering`), at no cost
    to calls that end normally. Registering the socket for every wait, with a watcher task, a timer
    and a cancel scope per call for hang-ups, was 40% of the host's CPU for a call to a built-in tool.

    Not anyio's unix socket streams: their asyncio implementation can raise InvalidStateError in a
    loop callback when a read is cancelled just as data arrives (as happens to every open connection
    when the ToolServer stops).
    """

    def __init__(self, sock: socket.socket, budget: Budget) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._budget = budget
        self._buffer = bytearray()
        self._scanned = 0
        self._unanswered = 0
        """Bytes of lines handed out by `receive_line` that still count against the budget."""
        self._loop = asyncio.get_running_loop()
        self._registered = False
        self._receiving = False
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        """The peer closed the connection, or it broke: nothing more will be read."""
        self._over_budget = False
        self._on_hangup: Callable[[], None] | None = None
        self.hung_up = False
        """The peer hung up while a request was being answered (`answering`)."""

    def answering(self, on_hangup: Callable[[], None] | None) -> bool:
        """A request is being answered: call ``on_hangup`` if the peer hangs up meanwhile, until
        ``answering(None)`` (when its answer is done).

        Returns False, and watches nothing, when the peer has hung up already: a request it sent
        before it went (read with others in one chunk) has nobody waiting for its answer.
        """
        self._on_hangup = on_hangup
        if on_hangup is None:
            return True
        if self._ended:
            self.hung_up = True
            return False
        self._register()  # if the request was read at once, without waiting: watched from now
        return True

    async def receive_line(self, limit: int) -> bytes:
        """The next line without its newline; its bytes count against the budget until `answered`.

        Raises:
            LineTooLong: More than ``limit`` bytes arrived without a newline.
            OverBudget: The bytes that arrived do not fit into the shared budget.
            EOFError: The peer closed the connection (or it broke) before a full line.
        """
        self._receiving = True
        tried = False
        try:
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
                if self._over_budget:
                    raise OverBudget
                if self._ended:
                    raise EOFError
                if not tried:
                    # What is there already is read at once: the kernel often sends its next request
                    # before this task is back here (it wakes on the reply, on this CPU), and the
                    # reader would only hand it over a pass of the event loop later.
                    tried = True
                    if self._read():
                        continue
                self._register()
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        finally:
            self._receiving = False

    def _read(self) -> bool:
        """Read what has arrived into the buffer; False if nothing had."""
        try:
            data = self._sock.recv(_RECEIVE_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._ended = True
            self._unregister()
        # Checked after the read: a refused read (one chunk) is all that is ever held outside the budget.
        elif not self._budget.take(len(data)):
            self._over_budget = True
            self._unregister()
        else:
            self._buffer += data
        return True

    def _readable(self) -> None:
        """The event loop's callback: the socket has bytes, or the peer has gone."""
        if self._receiving:
            if self._read() and self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
            return
        # A request is being answered. Readable because the peer hung up, or because it sent its next
        # request early, which stays readable until it is read: in both cases stop watching.
        try:
            peeked = self._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return
        except OSError:
            peeked = b""
        self._unregister()
        if peeked:
            return
        self._ended = True
        on_hangup = self._on_hangup
        if on_hangup is not None:
            self.hung_up = True
            on_hangup()

    def _register(self) -> None:
        if not self._registered:
            self._registered = True
            self._loop.add_reader(self._fd, self._readable)

    def _unregister(self) -> None:
        if self._registered:
            self._registered = False
            self._loop.remove_reader(self._fd)

    def answered(self) -> None:
        """The lines handed out so far are answered: give their bytes back to the budget."""
        self._budget.give(self._unanswered)
        self._unanswered = 0

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
        self._unregister()
        self._sock.close()
        self._budget.give(len(self._buffer) + self._unanswered)
        self._buffer.clear()
        self._unanswered = 0
