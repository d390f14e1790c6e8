"""`KernelPool`: sandboxed kernels started ahead of time, so that a new executor is ready at once.

Each pooled kernel is started with its own private directory (tool socket, network proxy socket,
packages, import root) and its own tool token, exactly as an executor starts its kernel; the
executor that takes it adopts both (`KernelSide._adopt`). A kernel is handed out once and never
comes back: it has run someone's code. The kernel's process stays owned by the pool's task group
(one task per kernel holds its `Kernel.start` context), and the executor holds a `Lease` on it until
it is done with it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import anyio
import anyio.abc
import anyio.lowlevel

from ._config import Limits, SandboxConfig, Timeouts, check_kernel_settings
from ._events import wait_any
from ._exceptions import KernelStartError, UsageError
from ._kernel import Kernel
from ._kernelhome import check_bytecode, kernel_writable, link_tools_dir, new_home, resolve_tools_dir
from ._kernelspec import KernelSpec, start_kernel
from ._tooldir import prepare_tools_dir
from ._unixsocket import bind_socket
from .network._setup import NET_SOCKET
from .sandbox._sandbox import resolve_sandbox
from .skills._store import SKILLS_PACKAGE, prepare_skills_dir

__all__ = ("KernelPool", "Lease")

logger = logging.getLogger(__name__)

# After a failed start the pool waits this long before the next, doubling up to the maximum: a
# broken sandbox must not turn the refill into a busy loop.
_RETRY_FIRST = 0.5
_RETRY_MAX = 30.0
# Turns of the event loop between an executor taking its kernel and the start of the next one.
_HANDOVER_TURNS = 5


@dataclass(eq=False)
class Lease:
    """One pooled kernel, and what it was started with; taken by one executor only."""

    spec: KernelSpec
    home: Path
    token: str
    listener: socket.socket | None = None
    """The tool socket, bound before the kernel starts so that its sandbox mounts it; the taker's
    ToolServer serves it."""
    net_listener: socket.socket | None = None
    """The network proxy socket (``spec.network``), bound likewise; the taker's NetworkProxy serves it."""
    dirs: tuple[Path, ...] = ()
    """Directories made for this kernel alone (separate workspaces): the taker's once adopted."""
    kernel: Kernel | None = None
    adopted: bool = False
    """The executor took over ``home`` (and ``dirs``): the pool no longer removes them."""
    leaving: anyio.Event = field(default_factory=anyio.Event)
    """The kernel left the pool: taken, or dropped because it no longer fits."""
    in_use: anyio.Event = field(default_factory=anyio.Event)
    """The taker runs the kernel now (its executor is ready)."""
    released: anyio.Event = field(default_factory=anyio.Event)
    closed: anyio.Event = field(default_factory=anyio.Event)

    @asynccontextmanager
    async def use(self) -> AsyncGenerator[Kernel]:
        """The kernel until the block ends; then it is shut down (the pool's task does that)."""
        assert self.kernel is not None
        self.in_use.set()
        try:
            yield self.kernel
        finally:
            self.release()
            with anyio.CancelScope(shield=True):
                # Bounded: the kernel's own shutdown kills it within seconds.
                await self.closed.wait()

    def release(self) -> None:
        """Shut the kernel down without using it (or after using it)."""
        self.released.set()


class KernelPool:
    """Sandboxed kernels started ahead of time, so that ``async with CodeExecutor(pool=pool)`` is
    ready at once instead of waiting for a kernel to start.

    Use it as an async context manager around the executors that take from it::

        async with KernelPool(size=4) as pool:
            async with CodeExecutor(pool=pool) as executor:
                ...

    Each kernel is used by one executor only and never returns to the pool; the pool starts
    another in the background. An executor takes a kernel only if it would start the same one
    itself (same sandbox, limits, env, workspace, tools and skills directories, and network or
    none); otherwise it starts its own and logs once why the pool did not fit. Closing the pool
    shuts down every kernel it started, including those executors still use: close it after them.

    For executors with a skills directory or a network, give the pool the same::

        async with KernelPool(size=4, skills_dir="skills", network=True) as pool:
            async with CodeExecutor(pool=pool, skills_dir="skills", network=Network(allow=[...])) as executor:
                ...

    Args:
        size: Kernels kept ready.
        workspace: The kernels' working directory (as for `CodeExecutor`). With
            ``separate_workspaces``, the directory in which each kernel gets its own.
        sandbox: As for `CodeExecutor`.
        env: As for `CodeExecutor`.
        limits: As for `CodeExecutor`.
        tools_dir: As for `CodeExecutor`. With ``separate_workspaces``, the name of each kernel's own
            tools directory, made in a new private directory out of the kernel's reach (None: none).
        timeouts: ``timeouts.start`` bounds each start, and how long an executor waits for a
            kernel when none is ready (then it starts its own).
        max_starting: Kernels started at once while refilling.
        separate_workspaces: Give each kernel a new workspace directory inside ``workspace`` and its
            own tools directory. An executor that takes such a kernel uses its directories instead of
            its own ``workspace`` and ``tools_dir`` (read them from ``executor.workspace`` and
            ``executor.tools_dir``); they are the caller's from then on and are kept when the
            executor exits. The pool removes those of kernels it never handed out.
        skills_dir: As for `CodeExecutor`: mounted read-only into every kernel and importable as
            ``skills``, held to the same rules (created by the host if missing, no symlink on its way,
            the host's own). Shared by all kernels, also with ``separate_workspaces``.
        network: Start the kernels ready for an executor with a `Network`: with the forwarder that
            ``HTTP_PROXY`` points to and a proxy socket of their own, which the taker's proxy serves
            with the taker's `Network` policy. A bool, not a `Network`: what is allowed, asked and
            limited is each executor's, decided on the host when a connection is made, so one pool
            serves executors with different policies, and a policy given here could be mistaken for
            one that applies. Then only executors with a `Network` take the pool's kernels: one
            without starts its own, so a forwarder never runs without a policy behind it. Needs
            the sandbox.
    """

    def __init__(
        self,
        size: int = 2,
        *,
        workspace: Path | str = ".",
        sandbox: SandboxConfig | Literal["auto"] | None = "auto",
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        tools_dir: Path | str | None = "mcptools",
        timeouts: Timeouts | None = None,
        max_starting: int = 2,
        separate_workspaces: bool = False,
        skills_dir: Path | str | None = None,
        network: bool = False,
    ) -> None:
        if not isinstance(size, int) or size < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"size must be a positive number of kernels, got {size!r}")
        if not isinstance(max_starting, int) or max_starting < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"max_starting must be a positive number of kernels, got {max_starting!r}")
        check_kernel_settings(env, limits, timeouts)
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise UsageError(f"workspace {str(workspace)!r} is not an existing directory; create it first")
        if separate_workspaces and tools_dir is not None and Path(tools_dir).name != str(tools_dir):
            raise UsageError(
                f"with separate_workspaces, tools_dir is the name of each kernel's tools directory, "
                f"not a path: got {str(tools_dir)!r}"
            )
        if separate_workspaces and skills_dir is not None and str(tools_dir) == SKILLS_PACKAGE:
            # Each kernel's tools directory is made later; the executor's own check would come too late.
            raise UsageError(
                f"the kernels import the skills directory as {SKILLS_PACKAGE!r}: give the tools directory "
                "another name (tools_dir='mcptools')"
            )
        if not isinstance(network, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(
                f"network must be True or False (whether the kernels can reach their executor's network proxy), "
                f"got {network!r}; give the policy, Network(...), to each CodeExecutor"
            )
        self.size = size
        self.sandbox = resolve_sandbox(sandbox)
        if network and self.sandbox is None:
            raise UsageError(
                "network=True needs the sandbox: without one a kernel has this host's whole network and no "
                "executor's Network can hold it; drop sandbox=None, or drop network="
            )
        self.network = network
        self.env = dict(env or {})
        self.limits = limits or Limits()
        self.timeouts = timeouts or Timeouts()
        self.separate_workspaces = separate_workspaces
        # As given (made absolute, not resolved), like the executor's: checked again at each start.
        self._tools_given: Path | None = None
        if tools_dir is not None:
            self._tools_given = Path(tools_dir) if separate_workspaces else Path(os.path.join(os.getcwd(), tools_dir))
        # Likewise, shared by all kernels (also with separate workspaces).
        self._skills_given = Path(os.path.join(os.getcwd(), skills_dir)) if skills_dir is not None else None
        self._max_starting = max_starting
        self._ready: list[Lease] = []
        self._starting = 0
        # Kernels taken whose executor is not ready yet: the next start waits for it, so that its
        # work on the event loop and the CPU does not slow that executor down.
        self._handing = 0
        # Failed starts in a row (they delay the next), and in all; the last one's error.
        self._failures = 0
        self._failed_starts = 0
        self._error: KernelStartError | None = None
        self._changed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._warned: set[tuple[str, ...]] = set()

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise UsageError("this KernelPool is already running; create a new one")
        if self.sandbox is not None:
            check_bytecode()
        self._current_spec()  # a tools or skills directory that cannot be trusted is an error now, not at each refill
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._refill)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            # Our tasks are cancelled, not failed: the body's exception is not passed in, so that it
            # propagates as it is instead of wrapped in an ExceptionGroup.
            await tg.__aexit__(None, None, None)
        self._wake()

    @property
    def ready(self) -> int:
        """Kernels ready to be taken now."""
        return len(self._ready)

    async def wait_until_full(self) -> None:
        """Wait until ``size`` kernels are ready.

        Raises:
            UsageError: The pool is not running.
            KernelStartError: A start failed meanwhile (the pool keeps trying in the background).
        """
        failed = self._failed_starts
        while len(self._ready) < self.size:
            if self._tg is None:
                raise UsageError("the KernelPool is not running; use it as 'async with KernelPool() as pool:'")
            if self._failed_starts != failed and self._error is not None:
                raise self._error
            await self._wait_changed()

    # -- taking -------------------------------------------------------------------------

    async def _take(self, spec: KernelSpec) -> Lease | None:
        """A ready kernel started as ``spec`` says, waiting up to ``timeouts.start`` for one.

        With ``separate_workspaces`` the directories of ``spec`` are not compared: the kernel comes
        with its own. None when the pool's kernels do not fit (logged once per difference), when
        the pool is closed or its starts fail, or when none was ready in time: the caller then
        starts its own.
        """
        if self._tg is None:
            return None
        try:
            current = self._current_spec()
        except (OSError, UsageError) as exc:
            logger.warning("the kernel pool cannot start kernels (%s); this executor starts its own", exc)
            return None
        differences = current.differences(spec, dirs=not self.separate_workspaces)
        if differences:
            if tuple(differences) not in self._warned:
                self._warned.add(tuple(differences))
                logger.warning(
                    "the executor's kernel settings differ from its KernelPool's in %s; it starts its own "
                    "kernel instead of taking a pooled one (create the pool with the executor's settings%s)",
                    ", ".join(differences),
                    ": network=True for executors with a Network, False for those without"
                    if "network" in differences
                    else "",
                )
            return None
        with anyio.move_on_after(self.timeouts.start):
            while self._running():
                lease = self._take_ready(current)
                if lease is not None:
                    return lease
                if self._failures:
                    return None  # its starts fail: the caller's own start says why
                await self._wait_changed()
        return None

    def _take_ready(self, current: KernelSpec) -> Lease | None:
        for lease in list(self._ready):
            assert lease.kernel is not None
            if lease.kernel.exited.is_set():
                continue  # its task removes it
            self._ready.remove(lease)
            self._handing += 1
            lease.leaving.set()
            self._wake()
            # Started before the tools directory appeared, say: it no longer fits.
            if lease.spec.differences(current, dirs=not self.separate_workspaces):
                lease.release()
                continue
            return lease
        return None

    # -- refilling ----------------------------------------------------------------------

    async def _refill(self) -> None:
        assert self._tg is not None
        while True:
            while len(self._ready) + self._starting + self._handing < self.size and self._starting < self._max_starting:
                self._starting += 1
                self._tg.start_soon(self._hold)
            await self._wait_changed()

    async def _hold(self) -> None:
        """Start one kernel, keep it ready, and own its process until its executor is done."""
        lease: Lease | None = None
        starting = True
        try:
            lease = self._new_lease()
            async with start_kernel(
                lease.spec, home=lease.home, token=lease.token, start_timeout=self.timeouts.start
            ) as kernel:
                lease.kernel = kernel
                self._starting -= 1
                starting = False
                self._failures = 0
                self._ready.append(lease)
                self._wake()
                await wait_any(kernel.exited, lease.leaving)
                if not lease.leaving.is_set():
                    logger.info("a pooled kernel exited while waiting (%s); it is replaced", kernel.exit_code)
                else:
                    try:
                        await wait_any(kernel.exited, lease.in_use, lease.released)
                        # The executor becomes ready a few turns of the event loop later; the next
                        # start's preparation (tens of ms of CPU) must not run before that.
                        for _ in range(_HANDOVER_TURNS):
                            await anyio.lowlevel.checkpoint()
                    finally:
                        self._handing -= 1
                        self._wake()
                await wait_any(kernel.exited, lease.released)
        except (KernelStartError, UsageError, OSError) as exc:
            self._failures += 1
            self._failed_starts += 1
            self._error = exc if isinstance(exc, KernelStartError) else KernelStartError(str(exc))
            self._wake()
            logger.warning("the kernel pool could not start a kernel: %s", exc)
            await anyio.sleep(min(_RETRY_FIRST * 2 ** (self._failures - 1), _RETRY_MAX))
        finally:
            if starting:
                self._starting -= 1
            if lease is not None:
                for listener in (lease.listener, lease.net_listener):
                    if listener is not None:
                        listener.close()
                if lease in self._ready:
                    self._ready.remove(lease)
                if not lease.adopted:
                    for path in (lease.home, *lease.dirs):
                        shutil.rmtree(path, ignore_errors=True)
                lease.closed.set()
            self._wake()

    def _new_lease(self) -> Lease:
        dirs: list[Path] = []
        lease: Lease | None = None
        try:
            if self.separate_workspaces:
                workspace = Path(tempfile.mkdtemp(prefix="", dir=self.workspace))
                dirs.append(workspace)
                tools = None
                if self._tools_given is not None:
                    private = Path(tempfile.mkdtemp(prefix="ipybox-state-"))
                    dirs.append(private)
                    # Made before the kernel starts, so it is mounted (read-only) and the manifest hidden.
                    writable = kernel_writable(workspace, self.sandbox)
                    tools = prepare_tools_dir(private / self._tools_given, kernel_writable=writable)
                spec = self._spec(workspace, tools)
            else:
                spec = self._shared_spec()
            home = new_home(spec.tools_dir)
            dirs.append(home)
            if spec.skills_dir is not None:
                link_tools_dir(home, spec.skills_dir, name=SKILLS_PACKAGE)
            lease = Lease(spec=spec, home=home, token=secrets.token_urlsafe(32), dirs=tuple(dirs[:-1]))
            # Bound before the kernel starts: its sandbox mounts the socket files.
            lease.listener = bind_socket(home / "tools.sock")
            if spec.network:
                lease.net_listener = bind_socket(home / NET_SOCKET)
        except BaseException:
            if lease is not None and lease.listener is not None:
                lease.listener.close()
            for path in dirs:
                shutil.rmtree(path, ignore_errors=True)
            raise
        return lease

    def _current_spec(self) -> KernelSpec:
        """The spec of a kernel started now; with separate workspaces, without its own directories."""
        return self._spec(self.workspace, None) if self.separate_workspaces else self._shared_spec()

    def _shared_spec(self) -> KernelSpec:
        tools = None
        if self._tools_given is not None:
            tools = resolve_tools_dir(self._tools_given, kernel_writable=kernel_writable(self.workspace, self.sandbox))
        return self._spec(self.workspace, tools)

    def _spec(self, workspace: Path, tools: Path | None) -> KernelSpec:
        skills = None
        if self._skills_given is not None:
            # Checked against every kernel's workspace: with separate workspaces, all of ``workspace``.
            skills = prepare_skills_dir(
                self._skills_given, kernel_writable=kernel_writable(self.workspace, self.sandbox), tools_dir=tools
            )
        return KernelSpec.of(
            sandbox=self.sandbox,
            limits=self.limits,
            env=self.env,
            workspace=workspace,
            tools_dir=tools,
            skills_dir=skills,
            network=self.network,
        )

    def _running(self) -> bool:
        return self._tg is not None

    # -- events -------------------------------------------------------------------------

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
