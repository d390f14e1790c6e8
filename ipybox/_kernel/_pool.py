"""`KernelPool`: sandboxed kernels started ahead of time, so that a new executor is ready at once.

Each pooled kernel is started with its own private directory (tool socket, network proxy socket,
packages, import root) and its own tool token, exactly as an executor starts its kernel; the
executor that takes it adopts both (`KernelHost.adopt`). The pool is a `KernelSource`: an executor
made with ``pool=`` (or ``kernel=``) runs with the pool's settings. A kernel is handed out once and never
comes back: it has run someone's code. The kernel's process stays owned by the pool's task group
(one task per kernel holds its `Kernel.start` context), and the executor holds a `Lease` on it until
it is done with it.
"""

from __future__ import annotations

import dataclasses
import logging
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

from ipybox._engine._waiting import wait_any
from ipybox._exceptions import KernelStartError, UsageError
from ipybox._mounts import mounted, prepare_mounts
from ipybox._settings import (
    KernelSettings,
    Limits,
    SandboxConfig,
    Timeouts,
    check_kernel_settings,
    resolved_sandbox,
    take_settings,
)
from ipybox._tooldir import prepare_tools_dir
from ipybox._unixsocket import bind_socket
from ipybox.network._setup import NET_SOCKET
from ipybox.sandbox._sandbox import resolve_sandbox
from ipybox.skills._store import SKILLS_PACKAGE

from . import Kernel, KernelHandle, KernelHost, StartedHome
from ._home import check_bytecode, kernel_writable, link_tools_dir, new_home, resolve_tools_dir
from ._local import LaunchSpec, LocalKernel, start_kernel

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

    spec: LaunchSpec
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

    def started_home(self, *, own_dirs: bool) -> StartedHome:
        """What the taker moves over to (`KernelHost.adopt`); ``own_dirs``: the kernel's workspace too."""
        settings = self.spec.settings
        return StartedHome(
            home=self.home,
            token=self.token,
            tools_listener=self.listener,
            net_listener=self.net_listener,
            workspace=settings.workspace if own_dirs else None,
            tools_dir=settings.tools_dir if own_dirs else None,
        )


class KernelPool:
    """Sandboxed kernels started ahead of time, so that ``async with CodeExecutor(pool=pool)`` is
    ready at once instead of waiting for a kernel to start.

    Use it as an async context manager around the executors that take from it::

        async with KernelPool(size=4) as pool:
            async with CodeExecutor(pool=pool) as executor:
                ...

    Each kernel is used by one executor only and never returns to the pool; the pool starts
    another in the background. An executor on a pool runs with the pool's settings (`settings`):
    what it leaves out it takes from the pool, and a setting it gives that differs from the pool's
    is a `UsageError` when it is made, never a kernel started some other way. When no kernel is
    ready within ``timeouts.start`` it starts its own, with the same settings. Closing the pool
    shuts down every kernel it started, including those executors still use: close it after them.

    For executors with a network, start the pool's kernels ready for one::

        async with KernelPool(size=4, skills_dir="skills", network=True) as pool:
            async with CodeExecutor(pool=pool, network=Network(allow=[...])) as executor:
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
        # With separate workspaces each kernel's tools directory is made later (under this name).
        self._tools_name = Path(tools_dir) if separate_workspaces and tools_dir is not None else None
        settings = KernelSettings(
            workspace=Path(workspace),
            sandbox=resolve_sandbox(sandbox),
            env=env or {},
            limits=limits or Limits(),
            tools_dir=Path(tools_dir) if tools_dir is not None and not separate_workspaces else None,
            skills_dir=Path(skills_dir) if skills_dir is not None else None,
            network=network,
        )
        if network and settings.sandbox is None:
            raise UsageError(
                "network=True needs the sandbox: without one a kernel has this host's whole network and no "
                "executor's Network can hold it; drop sandbox=None, or drop network="
            )
        self.settings = settings
        """What the pool's kernels are started with (with separate workspaces, each in its own
        workspace under ``workspace`` with its own tools directory)."""
        self.timeouts = timeouts or Timeouts()
        self.separate_workspaces = separate_workspaces
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
        if self.settings.sandbox is not None:
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
    def workspace(self) -> Path:
        """The kernels' working directory (with separate workspaces: where each gets its own)."""
        return self.settings.workspace

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

    # -- the kernel source ------------------------------------------------------------

    remote = False

    def settings_for(self, requested: KernelSettings) -> KernelSettings:
        """The pool's settings, for an executor that asked for ``requested`` (see
        `KernelSource.settings_for` and `take_settings`). With separate workspaces the executor keeps
        its own workspace and tools directory for a kernel it has to start itself.

        Raises:
            UsageError: The executor set something to another value than the pool did.
        """
        return take_settings(self.settings, requested, owner="KernelPool", dirs=not self.separate_workspaces)

    @asynccontextmanager
    async def open(self, host: KernelHost) -> AsyncGenerator[KernelHandle]:
        """A ready kernel, or one started for ``host`` when none is (see `KernelSource.open`).

        With separate workspaces only the executor's first kernel comes from the pool: its
        replacements start in the workspace that kernel brought.
        """
        lease = None
        if not (self.separate_workspaces and host.restarting):
            lease = await self._take(LaunchSpec.of(host.settings))
        if lease is not None:
            if host.adopt(lease.started_home(own_dirs=self.separate_workspaces)):
                # The taker's from now on.
                lease.listener = lease.net_listener = None
                lease.adopted = True
            else:
                lease.release()
                lease = None
        if lease is not None:
            async with lease.use() as kernel:
                yield kernel
            return
        async with LocalKernel().open(host) as kernel:
            yield kernel

    # -- taking -------------------------------------------------------------------------

    async def _take(self, spec: LaunchSpec) -> Lease | None:
        """A ready kernel started as ``spec`` says, waiting up to ``timeouts.start`` for one.

        With ``separate_workspaces`` the directories of ``spec`` are not compared: the kernel comes
        with its own. None when the pool's kernels no longer fit (its directories changed since;
        logged once per difference), when the pool is closed or its starts fail, or when none was
        ready in time: the caller then starts its own.
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
            # The settings are the pool's (`settings_for`): what differs is a directory checked since.
            if tuple(differences) not in self._warned:
                self._warned.add(tuple(differences))
                logger.warning(
                    "the executor's kernel would differ from its KernelPool's in %s (changed since the pool "
                    "checked them); it starts its own kernel",
                    ", ".join(differences),
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

    def _take_ready(self, current: LaunchSpec) -> Lease | None:
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
                if self._tools_name is not None:
                    private = Path(tempfile.mkdtemp(prefix="ipybox-state-"))
                    dirs.append(private)
                    # Made before the kernel starts, so it is mounted (read-only) and the manifest hidden.
                    tools = prepare_tools_dir(private / self._tools_name, kernel_writable=self._writable(workspace))
                spec = self._spec(workspace, tools)
            else:
                spec = self._shared_spec()
            home = new_home(spec.settings.tools_dir)
            dirs.append(home)
            for mount, path in mounted(spec.settings):
                link_tools_dir(home, path, name=mount.package)
            lease = Lease(spec=spec, home=home, token=secrets.token_urlsafe(32), dirs=tuple(dirs[:-1]))
            # Bound before the kernel starts: its sandbox mounts the socket files.
            lease.listener = bind_socket(home / "tools.sock")
            if spec.settings.network:
                lease.net_listener = bind_socket(home / NET_SOCKET)
        except BaseException:
            if lease is not None and lease.listener is not None:
                lease.listener.close()
            for path in dirs:
                shutil.rmtree(path, ignore_errors=True)
            raise
        return lease

    def _current_spec(self) -> LaunchSpec:
        """The spec of a kernel started now; with separate workspaces, without its own directories."""
        return self._spec(self.workspace, None) if self.separate_workspaces else self._shared_spec()

    def _writable(self, workspace: Path) -> list[Path]:
        return kernel_writable(workspace, resolved_sandbox(self.settings))

    def _shared_spec(self) -> LaunchSpec:
        tools = self.settings.tools_dir
        if tools is not None:
            tools = resolve_tools_dir(tools, kernel_writable=self._writable(self.workspace))
        return self._spec(self.workspace, tools)

    def _spec(self, workspace: Path, tools: Path | None) -> LaunchSpec:
        settings = dataclasses.replace(self.settings, workspace=workspace, tools_dir=tools)
        # Checked against every kernel's workspace: with separate workspaces, all of ``workspace``.
        settings = prepare_mounts(settings, kernel_writable=self._writable(self.workspace), tools_dir=tools)
        return LaunchSpec.of(settings)

    def _running(self) -> bool:
        return self._tg is not None

    # -- events -------------------------------------------------------------------------

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
