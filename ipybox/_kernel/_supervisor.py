"""`KernelSupervisor`: keeps one kernel running for an executor, and a fresh one after each death."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import anyio
import anyio.abc

from ipybox._engine._waiting import wait_any
from ipybox._exceptions import KernelStartError

from . import KernelHandle

__all__ = ("KernelOpener", "KernelSupervisor")

KernelOpener = Callable[[bool], AbstractAsyncContextManager[KernelHandle]]
"""Prepares and starts a kernel; the flag says whether it replaces one. Raises KernelStartError."""


class KernelSupervisor:
    """Keeps one kernel running: starts it, and starts a fresh one after it dies or on `restart`.

    A failed restart is reported to the next caller of `get` (once); the caller after that gets a
    fresh attempt, since the cause may be gone by then.

    Args:
        open_kernel: Starts one kernel (see `KernelOpener`).
    """

    def __init__(self, open_kernel: KernelOpener) -> None:
        self._open = open_kernel
        # Opens the next kernel instead of ``open_kernel``, once (`replace`).
        self._next: KernelOpener | None = None
        self.kernel: KernelHandle | None = None
        """The running kernel, if there is one now."""
        self._changed = anyio.Event()
        self._restart = anyio.Event()
        self._start_error: KernelStartError | None = None
        # Whether a caller has been given _start_error; the next caller then gets a fresh attempt.
        self._start_error_reported = False

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Run kernels until cancelled; ready once the first one is.

        Raises:
            KernelStartError: The first kernel did not start.
        """
        started = False
        while True:
            self._restart = anyio.Event()
            try:
                opener, self._next = self._next or self._open, None
                async with opener(started) as kernel:
                    self._set(kernel)
                    self._start_error = None
                    if not started:
                        started = True
                        task_status.started()
                    await wait_any(kernel.exited, self._restart)
                    self._set(None)
            except KernelStartError as exc:
                if not started:
                    raise
                self._start_failed(exc)
                await self._restart.wait()
            finally:
                self._set(None)

    async def get(self) -> KernelHandle:
        """The running kernel, waiting for a replacement if it has died or is being restarted.

        Raises:
            KernelStartError: The replacement did not start (reported to one caller).
        """
        while True:
            kernel = self.kernel
            if kernel is not None and not kernel.exited.is_set():
                return kernel
            if kernel is None and self._start_error is not None:
                if not self._start_error_reported:
                    self._start_error_reported = True
                    raise self._start_error
                self._start_error = None
                self._restart.set()
            await self._changed.wait()

    async def restart(self) -> None:
        """Replace the kernel with a fresh one and wait until it runs.

        Raises:
            KernelStartError: The fresh kernel did not start.
        """
        old = self.kernel
        self._restart.set()
        while self.kernel is old or self.kernel is None:
            if self.kernel is None and self._start_error is not None:
                break
            await self._changed.wait()
        await self.get()

    async def replace(self, opener: KernelOpener) -> KernelHandle:
        """Replace the kernel with the one ``opener`` opens (once; later ones start as usual).

        Raises:
            KernelStartError: ``opener`` failed (the next `get` starts a kernel as usual).
        """
        self._next = opener
        await self.restart()
        kernel = self.kernel
        assert kernel is not None
        return kernel

    def _start_failed(self, error: KernelStartError) -> None:
        """Record a failed restart and wake whoever waits for a kernel."""
        self._start_error = error
        self._start_error_reported = False
        self._wake()

    def _set(self, kernel: KernelHandle | None) -> None:
        if kernel is self.kernel:
            return
        self.kernel = kernel
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
