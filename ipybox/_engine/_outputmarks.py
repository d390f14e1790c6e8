"""A tool call's approval request comes after the output the code sent before the call.

Output reaches the host on IOPub, a tool request on the tool socket (from a remote kernel: on IOPub,
then through the bridge to that socket), and the host reads them independently. So the kernel puts
a mark on IOPub behind what a cell sent before each request, and names it in the request
(``ipybox_kernel._marks``). An execution's output collector records each mark as it reads it, after
the chunks before it (`ReceivedMarks`); `ExecutionDriver.ask` waits for the request's mark before it
shows the request to the application.

Only requests the application is asked about wait; a call decided by a policy or a callback is not
shown, so its order does not matter. And never longer than `OUTPUT_MARK_WAIT`: the mark comes from
kernel code, which can name one it never sends, and an IOPub message can be dropped on the way (a
gateway's rate limit). Marks are kept in a bounded set, per execution; marks of other executions go
to their own (or to none), and marks no request names are never looked at.
"""

from __future__ import annotations

import anyio

__all__ = ("OUTPUT_MARK_WAIT", "ReceivedMarks")

# A mark reaches the host moments after the request (the kernel's IOPub thread and the host's reader
# pass it on): well under a millisecond on an idle machine, tens of milliseconds on a loaded one.
# One missing after this was forged or dropped, and the request is shown without it.
OUTPUT_MARK_WAIT = 1.0
# Marks remembered per execution. A request names the latest mark its kernel sent, so only that many
# marks sent by other threads between its mark and its request could evict it (it then waits the
# deadline); a flood of forged marks costs the host this much at most.
_KEPT = 64


class ReceivedMarks:
    """The kernel's output marks an execution's collector has read, oldest first."""

    def __init__(self) -> None:
        self._seen: dict[int, None] = {}
        self._arrived: anyio.Event | None = None

    def add(self, mark: int) -> None:
        """Record a mark read in the execution's output (after every chunk before it)."""
        if mark in self._seen:
            return
        self._seen[mark] = None
        if len(self._seen) > _KEPT:
            del self._seen[next(iter(self._seen))]
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = None

    async def wait_for(self, mark: int | None) -> None:
        """Return once ``mark`` has been read, or after `OUTPUT_MARK_WAIT` (None: at once)."""
        if mark is None or mark in self._seen:
            return
        with anyio.move_on_after(OUTPUT_MARK_WAIT):
            while mark not in self._seen:
                if self._arrived is None:
                    self._arrived = anyio.Event()
                await self._arrived.wait()
