"""`Recovery`: what the host checks and sends again once the link to a remote kernel is reopened.

The gateway replays what the kernel sent while the link was down, but not what was in flight when it
broke (`ipybox._gateway._link`). Before anything queued is written to the reopened link:

- The kernel is asked who it is: a ``kernel_info_request`` on the control channel, answered at once
  even while code runs. The reply's session id is the kernel process's own; another one than at
  start means the gateway restarted the kernel (its id stays the same) and its state is gone.
- The tool answers of the running executions are written again: an answer lost in flight would leave
  its call waiting for ever, and the kernel ignores an answer to a call it no longer waits for.
- If requests written before the loss have not ended, a ``kernel_info_request`` on the shell channel
  marks where their replies must have arrived by: the kernel answers shell requests in order and
  publishes on one IOPub socket, so once this request's reply and idle status are in, a request
  before it without both lost them with the connection, and its execution would wait for ever. The
  kernel is then given up (`KernelConnectionLost`) rather than left waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from ipybox._gateway._link import KernelGone, SendNow, Watch
from ipybox._kernel._messages import Inbox

__all__ = ("Recovery",)

# Tool answers kept to be written again after a reconnection (while executions run): the results of
# the calls in flight at once fit, and a stream of small calls keeps its recent ones.
_ANSWERS_KEPT = 64
_ANSWERS_BYTES = 16 * 1024 * 1024


Message = Callable[[str, str, dict[str, Any], str], str]
"""Makes the text of a message to the kernel: channel, type, content, id."""


class Recovery:
    """Checks a remote kernel after its link was reopened (see the module docstring).

    Args:
        waiters: The kernel's requests waiting for their messages, by id (shared, not copied).
        budget: The output budget of an inbox.
        message: Makes a message's text.
        queued: The ids of the requests not yet written.
        lose: Gives the kernel up, with the reason.
    """

    def __init__(
        self,
        waiters: dict[str, Inbox],
        *,
        budget: int,
        message: Message,
        queued: Callable[[], set[str]],
        lose: Callable[[str], None],
        new_id: Callable[[], str],
    ) -> None:
        self._waiters = waiters
        self._budget = budget
        self._message = message
        self._queued = queued
        self._lose = lose
        self._new_id = new_id
        self._answers: deque[str] = deque()
        self._answers_bytes = 0
        self.kernel_session: object = None
        """The kernel process's session id, from its first kernel_info_reply."""

    def keep_answer(self, text: str) -> None:
        """Keep a tool answer (with its reply line) to write again after a reconnection."""
        self._answers.append(text)
        self._answers_bytes += len(text)
        while len(self._answers) > _ANSWERS_KEPT or self._answers_bytes > _ANSWERS_BYTES:
            self._answers_bytes -= len(self._answers.popleft())

    def forget_answers(self) -> None:
        """No execution runs: the calls the kept answers were for have ended (or were abandoned)."""
        self._answers.clear()
        self._answers_bytes = 0

    async def resume(self, send_now: SendNow) -> Watch | None:
        """Check the kernel on a reopened link, before anything queued is written to it.

        Returns what watches for replies lost with the connection, if requests were in flight.

        Raises:
            KernelGone: Another kernel process answered (the kernel restarted), or the kernel is gone.
        """
        queued = self._queued()
        at_risk = {
            msg_id: inbox for msg_id, inbox in self._waiters.items() if msg_id not in queued and not inbox.complete
        }
        header = await self._ask(send_now, "control", self._new_id())
        if header.get("session") != self.kernel_session:
            raise KernelGone(
                "the kernel on the gateway restarted while the connection was down (another kernel process "
                "answered); its state is gone"
            )
        for text in list(self._answers):
            await send_now(text)
        if not at_risk:
            return None
        marker_id = self._new_id()
        marker = self._waiters[marker_id] = Inbox(self._budget)
        try:
            await send_now(self._message("shell", "kernel_info_request", {}, marker_id))
        except BaseException:
            self._waiters.pop(marker_id, None)
            marker.close()
            raise
        return partial(self._settle, marker_id, marker, at_risk)

    async def _ask(self, send_now: SendNow, channel: str, msg_id: str) -> dict[str, Any]:
        """Send a kernel_info_request on ``channel`` and return its reply's header."""
        inbox = self._waiters[msg_id] = Inbox(self._budget)
        try:
            await send_now(self._message(channel, "kernel_info_request", {}, msg_id))
            async for raw in inbox:
                if raw["header"]["msg_type"] == "kernel_info_reply":
                    return raw["header"]
        finally:
            self._waiters.pop(msg_id, None)
            inbox.close()
        raise KernelGone("the kernel was lost while it was being checked")

    async def _settle(self, marker_id: str, marker: Inbox, at_risk: dict[str, Inbox]) -> None:
        """Once the marker's reply and idle status are in, give the kernel up if a request before it
        still lacks its own."""
        try:
            async for _ in marker:
                if marker.complete:
                    break
            else:
                return  # the kernel is gone anyway
        finally:
            self._waiters.pop(marker_id, None)
            marker.close()
        if any(msg_id in self._waiters and not inbox.complete for msg_id, inbox in at_risk.items()):
            self._lose(
                "the websocket to the gateway was reopened, but the reply of the running execution had been lost "
                "with the connection (it was in flight when the connection broke)"
            )
