"""The host's ZMTP reader against real peers on unix sockets: libzmq itself (pyzmq sockets bound
the way the kernel binds them) and a raw socket that sends exactly the bytes a test gives it.

The raw peer's bytes are written out here by hand from the ZMTP 3 spec, not with the reader's own
encoder, so a mistake in one is not hidden by the same mistake in the other.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
import zmq

from ipybox._kernel._zmtp import Channel, FrameLimits, ProtocolViolation

pytestmark = pytest.mark.anyio

LIMITS = FrameLimits(frame_bytes=64 * 1024, message_bytes=256 * 1024, message_frames=8)
DEADLINE = 10.0

# A peer's greeting: signature, version 3.1, NULL, as-server, filler.
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL" + bytes(16) + b"\x01" + bytes(31)
READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"ROUTER"
READY = b"\x04" + bytes((len(READY_BODY),)) + READY_BODY
HANDSHAKE = GREETING + READY


def frame(body: bytes, *, more: bool = False) -> bytes:
    return bytes((1 if more else 0, len(body))) + body


class Delivered:
    """What a channel delivered, and how its run ended."""

    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []
        self.arrived = anyio.Event()
        self.violation: ProtocolViolation | None = None
        self.ended = anyio.Event()

    async def deliver(self, frames: list[bytes]) -> None:
        self.messages.append(frames)
        self.arrived.set()
        self.arrived = anyio.Event()

    async def run(self, channel: Channel) -> None:
        try:
            await channel.run(self.deliver)
        except ProtocolViolation as exc:
            self.violation = exc
        finally:
            self.ended.set()

    async def wait_for(self, count: int) -> None:
        with anyio.fail_after(DEADLINE):
            while len(self.messages) < count:
                await self.arrived.wait()


async def run_against_raw_peer(tmp_path: Path, sent: bytes) -> Delivered:
    """Run a DEALER channel against a peer that sends ``sent`` and then closes its end."""
    path = str(tmp_path / "raw")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        channel = Channel("DEALER", LIMITS)
        await channel.connect(path)
        # Our connect is in the backlog already: accept returns at once.
        peer, _ = listener.accept()
        with peer:
            peer.sendall(sent)
            peer.shutdown(socket.SHUT_WR)
            delivered = Delivered()
            with anyio.fail_after(DEADLINE):
                await delivered.run(channel)
    return delivered


Bind = Callable[[int, Path], zmq.Socket[bytes]]


@pytest.fixture
def bind() -> Iterator[Bind]:
    """Bind a libzmq socket of a kind at a path, as the kernel binds its own; closed after the test."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []

    def bound(kind: int, path: Path) -> zmq.Socket[bytes]:
        peer = context.socket(kind)
        sockets.append(peer)
        peer.linger = 0
        # A thread blocked in recv returns by this deadline even if the test has given up.
        peer.rcvtimeo = int(DEADLINE * 1000)
        peer.bind(f"ipc://{path}")
        return peer

    yield bound
    for peer in sockets:
        peer.close()
    context.term()


@asynccontextmanager
async def subscribed(bind: Bind, path: Path) -> AsyncGenerator[tuple[zmq.Socket[bytes], Delivered]]:
    """A SUB channel running against a libzmq XPUB, once its subscription has arrived."""
    xpub = bind(zmq.XPUB, path)
    channel = Channel("SUB", LIMITS)
    await channel.connect(str(path))
    delivered = Delivered()
    async with anyio.create_task_group() as tg:
        tg.start_soon(delivered.run, channel)
        assert await anyio.to_thread.run_sync(xpub.recv) == b"\x01"
        yield xpub, delivered
        tg.cancel_scope.cancel()


async def test_a_dealer_talks_to_a_libzmq_router_in_both_directions_with_its_identity(
    tmp_path: Path, bind: Bind
) -> None:
    router = bind(zmq.ROUTER, tmp_path / "router")
    channel = Channel("DEALER", LIMITS, identity=b"host")
    # Queued before the connection exists, sent once it is up.
    channel.send([b"before", b"connect"])
    await channel.connect(str(tmp_path / "router"))
    delivered = Delivered()
    async with anyio.create_task_group() as tg:
        tg.start_soon(delivered.run, channel)
        assert await anyio.to_thread.run_sync(router.recv_multipart) == [b"host", b"before", b"connect"]
        channel.send([b"x" * 300, b""])
        assert await anyio.to_thread.run_sync(router.recv_multipart) == [b"host", b"x" * 300, b""]
        router.send_multipart([b"host", b"reply", b"y" * 1000])
        await delivered.wait_for(1)
        tg.cancel_scope.cancel()
    assert delivered.messages == [[b"reply", b"y" * 1000]]


async def test_a_sub_subscribes_to_everything_a_libzmq_xpub_publishes(tmp_path: Path, bind: Bind) -> None:
    async with subscribed(bind, tmp_path / "xpub") as (xpub, delivered):
        xpub.send_multipart([b"kernel.stream", b"text"])
        await delivered.wait_for(1)
    assert delivered.messages == [[b"kernel.stream", b"text"]]


async def test_messages_of_too_many_frames_or_bytes_are_dropped_and_the_next_one_arrives(
    tmp_path: Path, bind: Bind
) -> None:
    at_most = [b"f"] * LIMITS.message_frames
    async with subscribed(bind, tmp_path / "xpub") as (xpub, delivered):
        xpub.send_multipart([b"f"] * (LIMITS.message_frames + 1))
        xpub.send_multipart(at_most)
        # Each frame within its limit, together over the message's.
        xpub.send_multipart([b"b" * LIMITS.frame_bytes] * 5)
        xpub.send_multipart([b"last"])
        await delivered.wait_for(2)
    assert delivered.messages == [at_most, [b"last"]]
    assert delivered.violation is None


async def test_a_frame_over_the_limit_from_libzmq_ends_the_connection_with_the_reason(
    tmp_path: Path, bind: Bind
) -> None:
    async with subscribed(bind, tmp_path / "xpub") as (xpub, delivered):
        xpub.send_multipart([b"topic", b"b" * (LIMITS.frame_bytes + 1)])
        with anyio.fail_after(DEADLINE):
            await delivered.ended.wait()
    assert delivered.violation is not None
    assert f"a frame of {LIMITS.frame_bytes + 1} bytes" in delivered.violation.reason
    assert "larger than the host accepts" in delivered.violation.reason
    assert delivered.messages == []


async def test_a_frame_announcing_a_terabyte_is_refused_from_its_header_alone(tmp_path: Path) -> None:
    # Only the header is sent: the reader must decide without waiting for (or allocating) the body.
    delivered = await run_against_raw_peer(tmp_path, HANDSHAKE + b"\x02" + (2**40).to_bytes(8, "big"))
    assert delivered.violation is not None
    assert f"a frame of {2**40} bytes" in delivered.violation.reason


async def test_a_truncated_greeting_is_the_peer_closing_and_nothing_is_delivered(tmp_path: Path) -> None:
    delivered = await run_against_raw_peer(tmp_path, GREETING[:20])
    assert delivered.violation is None
    assert delivered.messages == []


async def test_a_truncated_frame_is_the_peer_closing_and_nothing_is_delivered(tmp_path: Path) -> None:
    whole = frame(b"complete")
    cut = bytes((0, 200)) + b"only ten b"
    delivered = await run_against_raw_peer(tmp_path, HANDSHAKE + whole + cut)
    assert delivered.violation is None
    assert delivered.messages == [[b"complete"]]


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        pytest.param(
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").ljust(64, b" "), "a greeting that is not ZMTP's", id="http"
        ),
        pytest.param(GREETING[:10] + b"\x02\x00" + GREETING[12:], "ZMTP version 2", id="old-version"),
        pytest.param(GREETING[:12] + b"CURVE" + bytes(15) + GREETING[32:], "CURVE", id="curve"),
        pytest.param(GREETING + frame(b"data"), "a message before its READY", id="no-ready"),
        pytest.param(GREETING + b"\x04\x0b\x05ERROR\x04nope", "an ERROR command: 'nope'", id="error"),
        pytest.param(HANDSHAKE + b"\xf0\x01x", "a frame with flags 0xf0", id="bad-flags"),
        pytest.param(HANDSHAKE + frame(b"a", more=True) + READY, "a command inside a message", id="command-inside"),
        pytest.param(HANDSHAKE + b"\x06" + (2**20).to_bytes(8, "big"), "a command of 1048576 bytes", id="huge-command"),
    ],
)
async def test_a_peer_that_speaks_garbage_ends_the_connection_with_what_it_sent(
    tmp_path: Path, sent: bytes, reason: str
) -> None:
    delivered = await run_against_raw_peer(tmp_path, sent)
    assert delivered.violation is not None
    assert reason in delivered.violation.reason
    assert delivered.messages == []
