"""`Link`: the websocket to a remote kernel's channels, opened again after a loss.

jupyter_server, under both gateways, keys a kernel's websocket by the ``session_id`` the client puts
in its URL. When the last websocket of a session closes, the gateway keeps that session's ZMQ
channels open and buffers what the kernel sends on all of them (iopub, shell, control); a websocket
opened later with the same session id gets the buffer replayed before live messages. So a link that
opens the same kernel id with the same session after a loss continues a running execution: its
output, its reply and the tool requests it made meanwhile arrive once, in order.

What no buffer holds is what was in flight when the connection broke: the kernel's messages the
gateway wrote before it noticed the close, and the host's messages written into a connection that
was already dead. The host's messages made while the link is down wait here, bounded, and are
written once it is back; each is written at most once (one taken for a connection that then broke
is not written again). The kernel's side is checked after each reopening by the ``resume`` hook
(`RemoteKernel`: same kernel process, replies that never came).

Reopening backs off from 0.1 s to 2 s between attempts, with jitter so that the clients of a gateway
that restarted do not return in step; every attempt and the check after it run under one deadline,
`GatewayKernel.reconnect_timeout`. The gateway answering 404 (the kernel was deleted or culled, or
the gateway lost it) or 401/403 ends the attempts at once.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.protocol import State

from ipybox._gateway._gatewaykernel import GatewayKernel

__all__ = ("KernelGone", "Link", "Outage", "SendNow", "Watch")

logger = logging.getLogger(__name__)

# Websocket keep-alive: a silent peer (a dropped network) is noticed within the sum.
_PING_INTERVAL = 20.0
_PING_TIMEOUT = 20.0
# A closing handshake with a live gateway takes a round trip; a dead one is not waited for longer.
_CLOSE_TIMEOUT = 2.0
# Backoff between attempts to reopen: the first retry soon (most losses are a proxy's or a load
# balancer's, and the path is back at once), later ones no further apart than this.
_FIRST_RETRY = 0.1
_LAST_RETRY = 2.0
# What may wait for the connection: the host's messages are its own (code, interrupts, tool answers
# of at most 8 MiB each), but a long outage must not grow host memory without bound.
_QUEUE_BYTES = 64 * 1024 * 1024
_QUEUE_MESSAGES = 10_000
# Close codes the host sends when the kernel broke the protocol (a message over the size limit,
# malformed frames or UTF-8): the kernel is not trusted again, so the link is not reopened.
_KERNEL_FAULTS = frozenset({1002, 1007, 1009})


class KernelGone(Exception):
    """The kernel behind the link no longer exists as the host knew it; the message says why."""


@dataclass
class Outage:
    """One loss of the link, from the first close until the link is back and the kernel checked."""

    reason: str
    """Why the connection ended."""
    deadline: float
    timeout: float
    last: str = ""
    """Why the last attempt to reopen failed."""

    def failed(self) -> str:
        last = f" (last attempt: {self.last})" if self.last else ""
        return f"{self.reason}; reconnecting failed for {self.timeout:g} s{last}"


Route = Callable[[str], Awaitable[None]]
"""Takes one text message from the kernel."""
SendNow = Callable[[str], Awaitable[None]]
"""Writes one message on the reopened connection before anything queued."""
Watch = Callable[[], Coroutine[Any, Any, None]]
Resume = Callable[[SendNow], Awaitable[Watch | None]]
"""Checks the kernel after a reopening (raising `KernelGone`, or TimeoutError at the outage's
deadline) and returns what watches the connection from then on, if anything."""


@dataclass
class _Loss:
    reason: str
    final: bool = False
    resumed: bool = False


@dataclass
class _Queue:
    items: deque[tuple[str | None, str]] = field(default_factory=deque[tuple[str | None, str]])
    size: int = 0
    wakeup: anyio.Event = field(default_factory=anyio.Event)


class Link:
    """The websocket to one kernel's channels, and the host's messages waiting for it.

    Args:
        config: The gateway.
        kernel_id: The kernel on it.
        session: The client's session id: the same for every connection, so the gateway replays.
        frame_limit: The largest message taken from the gateway.
        route: Takes each text message from the kernel, in order.
        stopped: Set once the kernel is gone for the host: attempts to reopen end.
    """

    def __init__(
        self,
        config: GatewayKernel,
        kernel_id: str,
        session: str,
        *,
        frame_limit: int,
        route: Route,
        stopped: anyio.Event,
    ) -> None:
        self._config = config
        self._kernel_id = kernel_id
        self.session = session
        self._frame_limit = frame_limit
        self._route = route
        self._stopped = stopped
        self._queue = _Queue()
        self.resumable = False
        """Whether a lost connection may be reopened: not until the kernel is ready (a loss during
        start-up fails the start), and never with a ``reconnect_timeout`` of 0."""
        self.reconnects = 0
        """Connections reopened (and the kernel checked) so far."""

    def queue(self, msg_id: str | None, text: str) -> str | None:
        """Queue a message for the kernel; the reason it cannot wait, if it cannot."""
        queue = self._queue
        if queue.size + len(text) > _QUEUE_BYTES or len(queue.items) >= _QUEUE_MESSAGES:
            return (
                f"more than {_QUEUE_BYTES // 2**20} MiB or {_QUEUE_MESSAGES} messages for the kernel waited for "
                "the connection to the gateway"
            )
        queue.items.append((msg_id, text))
        queue.size += len(text)
        queue.wakeup.set()
        return None

    def queued_ids(self) -> set[str]:
        """The ids of the requests not yet written."""
        return {msg_id for msg_id, _ in self._queue.items if msg_id is not None}

    async def open(self) -> ClientConnection:
        """Open a websocket to the kernel's channels (the caller bounds the wait).

        Raises:
            OSError, InvalidHandshake: It could not be opened.
        """
        base = "ws" + self._config.base.removeprefix("http")
        return await connect(
            f"{base}/api/kernels/{self._kernel_id}/channels?session_id={self.session}",
            additional_headers=self._config.http_headers(),
            max_size=self._frame_limit,
            compression=None,
            ping_interval=_PING_INTERVAL,
            ping_timeout=_PING_TIMEOUT,
            close_timeout=_CLOSE_TIMEOUT,
            open_timeout=None,
        )

    async def run(self, ws: ClientConnection, resume: Resume) -> str:
        """Serve ``ws``, and reopen the link after each loss while `resumable`; return why it ended."""
        outage: Outage | None = None
        while True:
            loss = await self._serve(ws, outage, resume)
            timeout = self._config.reconnect_timeout
            if loss.final or not self.resumable or timeout == 0 or self._stopped.is_set():
                return loss.reason
            if outage is None or loss.resumed:
                outage = Outage(loss.reason, anyio.current_time() + timeout, timeout)
                logger.info("reconnecting to kernel %s on %s: %s", self._kernel_id, self._config.base, loss.reason)
            else:
                outage.last = loss.reason  # lost again before the kernel was checked
            try:
                reopened = await self._reopen(outage)
            except KernelGone as exc:
                return f"{outage.reason}; {exc}"
            if reopened is None:
                return outage.failed()
            ws = reopened

    async def _serve(self, ws: ClientConnection, outage: Outage | None, resume: Resume) -> _Loss:
        loss = _Loss("the connection to the gateway ended", resumed=outage is None)
        try:
            async with anyio.create_task_group() as tg:

                async def read() -> None:
                    loss.reason, loss.final = await self._read(ws)
                    tg.cancel_scope.cancel()

                tg.start_soon(read)
                if outage is not None:
                    watch: Watch | None = None
                    try:
                        with anyio.fail_at(outage.deadline):
                            watch = await resume(ws.send)
                    except KernelGone as exc:
                        loss.reason, loss.final = f"{outage.reason}; {exc}", True
                        tg.cancel_scope.cancel()
                        return loss
                    except TimeoutError:
                        outage.last = "the kernel did not answer on the reopened connection"
                        loss.reason, loss.final = outage.failed(), True
                        tg.cancel_scope.cancel()
                        return loss
                    except ConnectionClosed:
                        await anyio.sleep_forever()  # the reader reports it and ends this
                    loss.resumed = True
                    self.reconnects += 1
                    logger.info("reopened the websocket to kernel %s on %s", self._kernel_id, self._config.base)
                    if watch is not None:
                        tg.start_soon(watch)
                tg.start_soon(self._write, ws)
        finally:
            with anyio.CancelScope(shield=True):
                await ws.close()
        return loss

    async def _read(self, ws: ClientConnection) -> tuple[str, bool]:
        """Route every message until the websocket ends; why it ended, and whether for good."""
        sock = cast("socket.socket | None", ws.transport.get_extra_info("socket"))
        quickack = getattr(socket, "TCP_QUICKACK", None)
        try:
            async for raw in ws:
                if quickack is not None and sock is not None:
                    # The gateway writes with Nagle's algorithm on: its next small message waits for
                    # our acknowledgement of the last one, which delayed ACKs hold back by up to 40 ms.
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
                if isinstance(raw, str):
                    await self._route(raw)
                # Binary messages carry buffers (widgets); nothing on the host reads them.
        except ConnectionClosed as exc:
            # A fault is the host's verdict on what the kernel sent, not an echo of the gateway's close.
            fault = exc.sent is not None and exc.sent.code in _KERNEL_FAULTS and exc.rcvd_then_sent is not True
            return f"the websocket to the gateway closed ({exc})", fault
        return f"the gateway closed the websocket (code {ws.close_code}, {ws.close_reason or 'no reason'})", False

    async def _write(self, ws: ClientConnection) -> None:
        queue = self._queue
        while True:
            if not queue.items:
                queue.wakeup = anyio.Event()
                await queue.wakeup.wait()
                continue
            if ws.state is not State.OPEN:
                return  # the reader reports it; the message waits for the next connection
            _, text = queue.items.popleft()
            queue.size -= len(text)
            try:
                await ws.send(text)
            except ConnectionClosed:
                return

    async def _reopen(self, outage: Outage) -> ClientConnection | None:
        """A websocket to the same kernel and session, or None once the deadline has passed.

        Raises:
            KernelGone: The gateway says the kernel no longer exists, or refuses the host.
        """
        delay = _FIRST_RETRY
        while not self._stopped.is_set():
            attempt_ends = min(outage.deadline, anyio.current_time() + self._config.request_timeout)
            try:
                with anyio.fail_at(attempt_ends):
                    return await self.open()
            except TimeoutError:
                outage.last = "the gateway did not answer in time"
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status == 404:
                    raise KernelGone(
                        f"the gateway no longer has kernel {self._kernel_id} (HTTP 404: deleted, culled, or lost "
                        "by a gateway that restarted)"
                    ) from None
                if status in (401, 403):
                    raise KernelGone(f"the gateway refused the reconnection (HTTP {status}): check the token") from None
                outage.last = f"HTTP {status}"
            except (OSError, InvalidHandshake) as exc:
                outage.last = str(exc) or type(exc).__name__
            wait = min(delay * random.uniform(0.5, 1.0), outage.deadline - anyio.current_time())
            if wait <= 0:
                return None
            with anyio.move_on_after(wait):
                await self._stopped.wait()
            delay = min(delay * 2, _LAST_RETRY)
        return None
