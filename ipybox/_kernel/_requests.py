"""The Jupyter request layer a kernel handle is made of, written once over two channel transports.

A request to a kernel (an execute request, a kernel_info request) is answered by messages that name
it as their parent: its reply on the channel it was sent on, and its status and output on IOPub.
`Requests` keeps one `Inbox` per request waiting for them, by the request's id, and makes the
requests the host sends: `execute`, `evaluate` (user expressions in a silent execute request) and
`interrupt`. How messages travel is a `ChannelTransport`'s business: ipybox's ZMTP channels to a
local kernel (`ipybox._kernel._zmqkernel.Kernel`) or a gateway's websocket (`ipybox._gateway`'s
`RemoteKernel`). A transport sends what `Requests` asks it to, and hands each message it receives
and wants to `deliver` (after its own checks: the signature, the shape, the output budget).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal, Protocol

import anyio

from ._messages import Inbox, KernelEvent, execution_events

__all__ = ("ChannelName", "ChannelTransport", "Requests")

ChannelName = Literal["shell", "control"]
# Messages before its reply that one `evaluate` request accepts (ipykernel sends one: busy).
_MAX_SIDE_MESSAGES = 64


class ChannelTransport(Protocol):
    """Carries the requests of a `Requests` to the kernel."""

    def send(self, channel: ChannelName, msg_type: str, content: dict[str, Any], msg_id: str) -> None:
        """Send (or queue) a message to the kernel, unless the kernel is gone."""
        ...


class Requests:
    """One kernel's requests waiting for their messages, and the requests the host makes.

    Args:
        transport: Sends the requests.
        budget: The output budget of each request (see `Inbox`), in bytes.
        exited: Set once the kernel is gone; a request made after it ends at once.
        lost: The error a request that ended without its end raises.
        new_msg_id: Makes a fresh request id.
        inbox: Makes the inbox of a request (an `Inbox` subclass that keeps more).
        forget: Called when the last waiting request is done.
    """

    def __init__(
        self,
        transport: ChannelTransport,
        *,
        budget: int,
        exited: anyio.Event,
        lost: Callable[[], Exception],
        new_msg_id: Callable[[], str],
        inbox: Callable[[int], Inbox] = Inbox,
        forget: Callable[[], None] | None = None,
    ) -> None:
        self.waiters: dict[str, Inbox] = {}
        """The inbox of each request waiting for messages, by the request's id (shared with the transport)."""
        self._transport = transport
        self._budget = budget
        self._exited = exited
        self._lost = lost
        self._new_msg_id = new_msg_id
        self._inbox = inbox
        self._forget = forget

    async def execute(
        self, code: str, *, msg_id: str | None = None, silent: bool = False
    ) -> AsyncGenerator[KernelEvent]:
        """Run code and yield its events until the kernel is idle again.

        Raises:
            Exception: ``lost()``: the kernel went away before the execution completed.
        """
        content: dict[str, Any] = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg_id = msg_id or self._new_msg_id()
        inbox = self.open(msg_id)
        if self._exited.is_set():
            inbox.close()
        else:
            self._transport.send("shell", "execute_request", content, msg_id)
        async for event in self.follow(msg_id):
            yield event

    async def follow(self, msg_id: str) -> AsyncGenerator[KernelEvent]:
        """Yield the events of the execute request ``msg_id`` until the kernel is idle again: one sent
        by `execute`, or one an earlier client sent, whose messages were routed here since `open`.

        Raises:
            Exception: ``lost()``: the kernel went away before the execution completed.
        """
        inbox = self.waiters.get(msg_id) or self.open(msg_id)
        try:
            async for event in execution_events(inbox):
                yield event
            if not inbox.ended:
                raise self._lost()
        finally:
            self.done(msg_id, inbox)

    async def evaluate(self, expressions: dict[str, str]) -> dict[str, object] | None:
        """Evaluate expressions in the kernel by a silent execute request without code, and return
        its reply's content unchecked; None if the kernel sent over `_MAX_SIDE_MESSAGES` other
        messages for the request first.

        Raises:
            Exception: ``lost()``: the kernel went away before it replied.
        """
        if self._exited.is_set():
            raise self._lost()
        msg_id = self._new_msg_id()
        inbox = self.open(msg_id)
        content = {
            "code": "",
            "silent": True,
            "store_history": False,
            "user_expressions": expressions,
            "allow_stdin": False,
            "stop_on_error": False,
        }
        try:
            self._transport.send("shell", "execute_request", content, msg_id)
            side = 0
            async for msg in inbox:
                if msg["header"]["msg_type"] == "execute_reply":
                    return msg["content"]
                side += 1
                if side > _MAX_SIDE_MESSAGES:
                    return None
            raise self._lost()
        finally:
            self.done(msg_id, inbox)

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code (by a control message:
        signals reach neither a kernel in a PID namespace nor one on a gateway)."""
        if not self._exited.is_set():
            self._transport.send("control", "interrupt_request", {}, self._new_msg_id())

    def open(self, msg_id: str, inbox: Inbox | None = None) -> Inbox:
        """Route the messages of request ``msg_id`` to ``inbox`` (a new one if None) until `done`."""
        inbox = self.waiters[msg_id] = inbox if inbox is not None else self._inbox(self._budget)
        return inbox

    def done(self, msg_id: str, inbox: Inbox) -> None:
        """Stop routing the request's messages."""
        self.waiters.pop(msg_id, None)
        inbox.close()
        if not self.waiters and self._forget is not None:
            self._forget()

    def close_all(self) -> None:
        """The kernel is gone: end every request waiting for messages."""
        for inbox in list(self.waiters.values()):
            inbox.close()

    async def deliver(self, inbox: Inbox, msg: dict[str, Any], size: int) -> None:
        """Queue a received message for the request it answers (noting its reply and idle status)."""
        kind = msg["header"]["msg_type"]
        if kind == "status":
            inbox.idle = inbox.idle or msg["content"].get("execution_state") == "idle"
        elif kind in ("execute_reply", "kernel_info_reply"):
            inbox.replied = True
        await inbox.put(msg, size)
