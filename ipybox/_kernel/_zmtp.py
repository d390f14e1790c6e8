"""The host's end of one kernel channel: ZMTP 3.0 over the unix socket the kernel binds.

ipybox reads this wire itself instead of through libzmq. Kernel code holds the kernel's sockets and
can send anything on them, and libzmq takes in every frame of a multipart message before it hands
over the first, bounding only each frame's size: a message of many frames would be held whole in
the host's memory. Here each frame's header is read before its body, so a message is measured
while it arrives: a frame over `FrameLimits.frame_bytes` ends the connection, and a message of too
many frames or bytes is read past and let go, never held. The host's memory per channel is one
read buffer and one message.

Only what the host needs is spoken (ZMTP 3.0, https://rfc.zeromq.org/spec/23/): the client side
of a connection with the NULL security mechanism, as a DEALER (shell, control) or a SUB (iopub,
subscribed to everything). Announcing 3.0 rather than 3.1 lets the subscription go as a message.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio

from ipybox._exceptions import IpyboxError

__all__ = ("Channel", "FrameLimits", "ProtocolViolation")

# Signature, version 3.0, mechanism NULL, not a server, filler: 64 bytes.
_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31)
_GREETING_SIZE = 64
# Frame flags.
_MORE, _LONG, _COMMAND = 1, 2, 4
# A NULL-mechanism peer's commands (READY with its socket type, ERROR, PING) are a few dozen bytes.
_MAX_COMMAND = 4096
# How much the host reads at once; also the most it holds of frames not yet measured.
_CHUNK = 64 * 1024


class ProtocolViolation(IpyboxError):
    """The kernel's side of a channel sent something the host does not take; the connection is over.

    Attributes:
        reason: What it sent, in words that complete "it sent ...".
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the kernel sent {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """What the host takes in one message.

    Attributes:
        frame_bytes: A larger frame ends the connection (`ProtocolViolation`).
        message_bytes: A message whose frames add up to more is dropped.
        message_frames: So is a message of more frames.
    """

    frame_bytes: int
    message_bytes: int
    message_frames: int


class Channel:
    """One connection to a socket the kernel binds: `connect`, then `run` reads it until it ends.

    Messages passed to `send` are queued until the connection is up and written in order; sending
    never blocks.
    """

    def __init__(self, socket_type: Literal["DEALER", "SUB"], limits: FrameLimits, *, identity: bytes = b"") -> None:
        self._socket_type = socket_type
        self._identity = identity
        self._limits = limits
        self._sock: socket.socket | None = None
        self._outbox: deque[bytes] = deque()
        self._wakeup = anyio.Event()
        # Messages go out only once the kernel's READY has arrived: libzmq takes a message that
        # comes before it has sent its own READY for a malformed handshake command.
        self._ready = False
        self._broken = False
        # Received bytes not consumed yet are _buf[_start:_end].
        self._buf = bytearray(_CHUNK)
        self._start = 0
        self._end = 0

    async def connect(self, path: str) -> None:
        """Connect to the unix socket at ``path``.

        Raises:
            OSError: Nothing accepts connections there.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            try:
                sock.connect(path)
            except BlockingIOError:
                # A unix socket whose backlog is full: wait until it takes us.
                await anyio.wait_writable(sock)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, f"connecting to {path} failed") from None
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def send(self, frames: Sequence[bytes]) -> None:
        """Queue one message; written at once when the socket takes it, else by `run`."""
        if self._broken:
            # The kernel's end is gone; the reader reports that.
            return
        data = encode(frames)
        if self._ready and not self._outbox:
            assert self._sock is not None
            try:
                written = self._sock.send(data)
            except BlockingIOError:
                written = 0
            except OSError:
                # The kernel's end is gone; the reader sees that too and reports it.
                self._broken = True
                return
            data = data[written:]
            if not data:
                return
        self._outbox.append(data)
        self._wakeup.set()

    async def run(self, deliver: Callable[[list[bytes]], Awaitable[None]]) -> None:
        """Write what is queued and read messages into ``deliver`` until the kernel closes its end.

        Raises:
            ProtocolViolation: The kernel's end sent something that is not ZMTP or broke a limit.
        """
        sock = self._sock
        assert sock is not None, "connect first"
        violation: ProtocolViolation | None = None
        try:
            properties = {b"Socket-Type": self._socket_type.encode()}
            if self._identity:
                properties[b"Identity"] = self._identity
            await self._write_all(sock, _GREETING + _command(b"READY", properties))
            async with anyio.create_task_group() as tg:
                # Caught here, not around the task group, which would wrap it in an exception group.
                try:
                    await self._handshake()
                    if self._socket_type == "SUB":
                        # Subscribe to every topic: a message whose first byte is 1, then the empty prefix.
                        self._outbox.appendleft(encode([b"\x01"]))
                    self._ready = True
                    tg.start_soon(self._write, sock)
                    while True:
                        frames = await self._message()
                        if frames is not None:
                            await deliver(frames)
                except anyio.EndOfStream:
                    pass
                except ProtocolViolation as exc:
                    violation = exc
                tg.cancel_scope.cancel()
        finally:
            self._broken = True
            sock.close()
        if violation is not None:
            raise violation

    async def _write(self, sock: socket.socket) -> None:
        while True:
            while self._outbox and not self._broken:
                await self._write_all(sock, self._outbox[0])
                self._outbox.popleft()
            self._outbox.clear()
            await self._wakeup.wait()
            self._wakeup = anyio.Event()

    async def _write_all(self, sock: socket.socket, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._broken:
            try:
                view = view[sock.send(view) :]
            except BlockingIOError:
                await anyio.wait_writable(sock)
            except OSError:
                # The kernel's end is gone; the reader sees that too and reports it.
                self._broken = True

    async def _handshake(self) -> None:
        await self._need(_GREETING_SIZE)
        greeting = self._take(_GREETING_SIZE)
        if greeting[0] != 0xFF or not greeting[9] & 1:
            raise ProtocolViolation("a greeting that is not ZMTP's")
        if greeting[10] < 3:
            raise ProtocolViolation(f"a greeting of ZMTP version {greeting[10]}, older than 3")
        mechanism = greeting[12:32].rstrip(b"\0")
        if mechanism != b"NULL":
            raise ProtocolViolation(f"a greeting asking for the {mechanism[:20]!r} security mechanism, not NULL")
        flags, size = await self._header()
        if not flags & _COMMAND:
            raise ProtocolViolation("a message before its READY command")
        name, _ = await self._command(size)
        if name != b"READY":
            raise ProtocolViolation(f"the command {name!r} where READY belongs")

    async def _message(self) -> list[bytes] | None:
        """The next message; None if it broke a limit (it was read past, not held)."""
        frames: list[bytes] = []
        count = total = 0
        kept = True
        while True:
            flags, size = await self._header()
            if flags & _COMMAND:
                if count:
                    raise ProtocolViolation("a command inside a message")
                await self._command(size)
                continue
            limits = self._limits
            if size > limits.frame_bytes:
                raise ProtocolViolation(
                    f"a frame of {size} bytes, larger than the host accepts ({limits.frame_bytes} bytes, set by "
                    "Limits.output_chars)"
                )
            count += 1
            total += size
            if kept and (count > limits.message_frames or total > limits.message_bytes):
                kept = False
                frames.clear()
            if kept:
                frames.append(await self._read(size))
            else:
                await self._skip(size)
            if not flags & _MORE:
                return frames if kept else None

    async def _header(self) -> tuple[int, int]:
        await self._need(2)
        flags = self._buf[self._start]
        if flags & ~(_MORE | _LONG | _COMMAND):
            raise ProtocolViolation(f"a frame with flags {flags:#04x}")
        if flags & _LONG:
            await self._need(9)
            size = int.from_bytes(self._buf[self._start + 1 : self._start + 9], "big")
            self._start += 9
        else:
            size = self._buf[self._start + 1]
            self._start += 2
        return flags, size

    async def _command(self, size: int) -> tuple[bytes, bytes]:
        """Read a command's body: its name and its data. An ERROR ends the connection; others the
        host has no use for (PING, SUBSCRIBE) are ignored."""
        if size > _MAX_COMMAND:
            raise ProtocolViolation(f"a command of {size} bytes")
        body = await self._read(size)
        name = body[1 : 1 + body[0]] if body else b""
        data = body[1 + len(name) :]
        if name == b"ERROR":
            reason = data[1 : 1 + data[0]].decode("ascii", "replace") if data else ""
            raise ProtocolViolation(f"an ERROR command: {reason!r}")
        return name, data

    async def _need(self, n: int) -> None:
        """Have at least ``n`` (at most _CHUNK) unconsumed bytes in the buffer."""
        while self._end - self._start < n:
            if self._end == len(self._buf):
                rest = self._end - self._start
                self._buf[:rest] = self._buf[self._start : self._end]
                self._start, self._end = 0, rest
            self._end += await self._receive(memoryview(self._buf)[self._end :])

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[self._start : self._start + n])
        self._start += n
        return data

    async def _read(self, size: int) -> bytes:
        buffered = self._end - self._start
        if size <= buffered:
            return self._take(size)
        # The frame's body is received straight into its own buffer, with nothing read past its end.
        body = bytearray(size)
        body[:buffered] = self._buf[self._start : self._end]
        self._start = self._end = 0
        view = memoryview(body)
        got = buffered
        while got < size:
            got += await self._receive(view[got:])
        return bytes(body)

    async def _skip(self, size: int) -> None:
        while True:
            buffered = self._end - self._start
            if size <= buffered:
                self._start += size
                return
            size -= buffered
            self._start = 0
            self._end = await self._receive(memoryview(self._buf))

    async def _receive(self, into: memoryview) -> int:
        """Receive into ``into``, waiting for data.

        Raises:
            anyio.EndOfStream: The kernel's end closed the connection.
        """
        sock = self._sock
        assert sock is not None
        while True:
            try:
                received = sock.recv_into(into)
            except BlockingIOError:
                await anyio.wait_readable(sock)
                continue
            except ConnectionResetError:
                received = 0
            if not received:
                raise anyio.EndOfStream
            return received


def encode(frames: Sequence[bytes]) -> bytes:
    """One message as ZMTP frames."""
    parts: list[bytes] = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        parts.append(_frame_header(_MORE if i < last else 0, len(frame)))
        parts.append(frame)
    return b"".join(parts)


def _frame_header(flags: int, size: int) -> bytes:
    if size < 256:
        return bytes((flags, size))
    return bytes((flags | _LONG,)) + size.to_bytes(8, "big")


def _command(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    body = bytes((len(name),)) + name
    for key, value in properties.items():
        body += bytes((len(key),)) + key + len(value).to_bytes(4, "big") + value
    return _frame_header(_COMMAND, len(body)) + body
