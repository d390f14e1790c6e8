"""What the host sees of code left running in the kernel by earlier code actions: threads and processes.

A request from the kernel carries the id of the execution it claims; code an earlier execution left
behind can copy the running one's id from the kernel's memory, so the id says nothing about which
code made it. What the host can see for itself, without asking the kernel, is the sandbox's
threads and processes in /proc (it runs as the same or a more privileged user). So, per kernel:

- its first walk (before any code of it ran) is the baseline: ipykernel's and the sandbox's own;
- every thread or process alive when an execution begins that is not in the baseline was born in
  an earlier execution (nothing else runs between executions) and may make this one's requests.

While such code is alive at the start of an execution, every request of that execution carries a
host-written statement saying so (`ApprovalRequest.left_running`). It holds for the whole
execution, not only while that code lives: a left thread can start a new one during the
execution and end, and the new one looks like the running code's own.

A walk of /proc can miss a thread that starts and ends during it, so a walk is repeated until two
agree, and threads that keep coming and going through every try count as left behind. A thread the
last execution joined may still be listed for a moment after: threads seen at the start are looked
for again for a short grace before they count, unless new ones appear meanwhile.

Not seen: code an earlier execution left in the kernel's main thread (event hooks, patched
functions, asyncio tasks, signal handlers, trace functions) and kernels on a gateway (the host
cannot read their /proc: every request of theirs after the kernel's first execution says that its
origin cannot be established, `UNSEEN`). Of those, asyncio tasks name their own (ended) execution and are refused,
and IPython hooks are refused in the kernel (ipybox_kernel._context.CELL_CODE). SECURITY.md,
"Attribution of requests", says what holds for the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import anyio.to_thread

__all__ = ("LeftRunning",)

logger = logging.getLogger(__name__)

Tasks = frozenset[tuple[int, int]]
# Walks of /proc tried until two in a row agree.
_WALKS = 8
# Seconds threads seen at an execution's start are given to be gone (a joined thread still exiting),
# looked for again after the first wait, then twice as long each time.
_GRACE = 0.3
_FIRST_WAIT = 0.005
# What the requests of a kernel the host cannot look into say, once an earlier execution ran in it.
UNSEEN = (
    "the host cannot see this kernel's threads and processes (a kernel on a gateway), so code an earlier "
    "code action left running in it may be alive: this request may come from that code, not from the "
    "code shown with it"
)


class LeftRunning:
    """The threads and processes each execution of one kernel left behind, seen from the host."""

    def __init__(self, walk: Callable[[], Tasks | None], *, unseen: bool = False) -> None:
        self._walk = walk
        self._unseen = unseen
        # Whether an execution of this kernel has ended: code it left may be alive in it from then on.
        self._ran = False
        self._baseline: Tasks | None = None
        # The execution each non-baseline thread was first seen alive at the end of.
        self._born_in: dict[tuple[int, int], str] = {}

    async def begin(self) -> str | None:
        """At the start of an execution: the statement its requests carry, or None when the host saw
        no code of an earlier execution alive (or cannot look)."""
        tasks, steady = await anyio.to_thread.run_sync(self._steady_walk)
        if tasks is None:
            return UNSEEN if self._unseen and self._ran else None
        if self._baseline is None:
            self._baseline = tasks
            return None
        left = tasks - self._baseline
        wait, waited = _FIRST_WAIT, 0.0
        # Wait only while some of them go away (threads still exiting); ones that stay, or new ones, count now.
        while left and steady and waited < _GRACE:
            await anyio.sleep(wait)
            waited, wait = waited + wait, wait * 2
            tasks, steady = await anyio.to_thread.run_sync(self._steady_walk)
            now = (tasks or frozenset()) - self._baseline
            if now == left or not now <= left:
                left = now
                break
            left = now
        if not left and steady:
            self._born_in.clear()
            return None
        sources = sorted({self._born_in.get(task, "") for task in left} - {""})
        threads = f"{len(left)} thread{'s' if len(left) != 1 else ''}"
        if not steady:
            threads = "threads that keep starting and ending"
        by = f" by code action {', '.join(sources)}" if sources else " by an earlier code action"
        return (
            f"code left running{by} is alive in the kernel ({threads} of the kernel or of processes it "
            "started, seen by the host when this code action began): this request may come from that "
            "code, not from the code shown with it"
        )

    def end(self, execution: str) -> None:
        """At the end of an execution: remember which threads it left behind, to name it later."""
        self._ran = True
        tasks, _ = self._steady_walk()
        if tasks is None or self._baseline is None:
            return
        left = tasks - self._baseline
        self._born_in = {task: self._born_in.get(task, execution) for task in left}

    def _steady_walk(self) -> tuple[Tasks | None, bool]:
        """A walk of the sandbox's threads that the next one agrees with (True), or the union of all
        tried when none did (False)."""
        last = self._walk()
        if last is None:
            return None, True
        seen = set(last)
        for _ in range(_WALKS):
            tasks = self._walk() or frozenset()
            if tasks == last:
                return tasks, True
            seen |= tasks
            last = tasks
        logger.warning("the kernel's threads kept changing over %d walks of /proc", _WALKS + 1)
        return frozenset(seen), False
