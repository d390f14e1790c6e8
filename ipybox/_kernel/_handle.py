"""What the executor needs of a running kernel, wherever it runs (`Kernel` here, or a gateway's)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

import anyio

from ._messages import KernelEvent

__all__ = ("KernelHandle",)


class KernelHandle(Protocol):
    """A running kernel: runs code, is interrupted, killed, and says when it has gone."""

    exited: anyio.Event
    """Set once the kernel is gone (its process exited, or the connection to it was lost)."""
    unseen: bool
    """Whether the kernel is a sandbox whose threads and processes the host cannot see (a kernel on a
    gateway): then nothing tells whether code an earlier execution left in it is alive, and its
    requests say so (ipybox._kernel._leftrunning)."""

    def new_msg_id(self) -> str:
        """A fresh id for an execute request."""
        ...

    def execute(self, code: str, *, msg_id: str | None = None) -> AsyncGenerator[KernelEvent]:
        """Run code and yield its events until the kernel is idle again.

        Raises:
            KernelDied: The kernel went away before the execution completed.
        """
        ...

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code."""
        ...

    def cpu_seconds(self) -> float | None:
        """CPU seconds the kernel and everything it started have used, counted by the host; None
        where the host cannot see them (a kernel on a gateway)."""
        ...

    def live_tasks(self) -> frozenset[tuple[int, int]] | None:
        """Every live thread of the kernel and of every process it started, seen by the host as
        (host tid, start time); None where the host cannot see them (a kernel on a gateway)."""
        ...

    async def kill_and_wait(self) -> None:
        """Stop the kernel for good and wait until `exited` is set."""
        ...
