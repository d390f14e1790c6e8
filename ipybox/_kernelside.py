"""`KernelSide`: what an executor keeps on the host for its kernel, and where each kernel comes from.

Whether a kernel is started from the executor's `KernelSpec`, taken from a `KernelPool` or started
on a gateway, it needs the same things from the host: the executor's private directory (tool socket,
network proxy socket, installed packages, import root), its tool token, and a tools and a skills
directory checked again before every start. `KernelSide` owns all of them, so that `CodeExecutor`
deals with executions, tools and approvals only. Its `open` is the `KernelSupervisor`'s kernel
opener.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import socket
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from ._config import KernelSettings, Limits, SandboxConfig
from ._exceptions import KernelStartError, UsageError
from ._gateway._config import GatewayKernel
from ._gateway._executor import open_gateway_kernel
from ._kernel import KernelHandle, KernelHost, KernelSource
from ._kernelhome import kernel_writable, link_tools_dir, new_home, resolve_tools_dir, restore_home
from ._kernelspec import KernelSpec, start_kernel
from ._pool import KernelPool, Lease
from ._tooldir import tools_dir_path
from ._toolserver._server import ToolServer
from .network._proxy import NetworkProxy
from .network._setup import NET_SOCKET
from .skills._store import SKILLS_PACKAGE, Skill, check_skill, prepare_skills_dir, skills_dir_path, write_skill

__all__ = ("KernelSide", "Listeners")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listeners:
    """A pooled kernel's listening sockets, bound before it started (its sandbox mounts the files):
    for the executor's tool server and network proxy to serve. None: bind their own."""

    tools: socket.socket | None = None
    net: socket.socket | None = None


class KernelSide:
    """The host side of one executor's kernels: private directory, token, directories, pool lease.

    Args:
        workspace: The kernel's working directory (resolved, existing).
        sandbox: The local sandbox, or None (no sandbox, or a kernel on a gateway).
        env: The kernel's extra environment.
        limits: The kernel's resource limits.
        start_timeout: How long one kernel start may take.
        tools_dir: The tools directory as given (None: none), made absolute but not resolved:
            every start checks it again for planted symlinks.
        skills_dir: The skills directory as given, likewise.
        network: Whether the kernel reaches a network proxy.
        pool: Where to take kernels from, if anywhere.
        gateway: The gateway the kernel runs on, if it is remote.
        source: Where kernels come from instead, if given (`KernelSource`; for now only the
            in-process kernel of ``ipybox.testing``).

    Raises:
        UsageError: The tools or skills directory cannot be used (the message names the fix).
    """

    def __init__(
        self,
        *,
        workspace: Path,
        sandbox: SandboxConfig | None,
        env: Mapping[str, str],
        limits: Limits,
        start_timeout: float,
        tools_dir: Path | None,
        skills_dir: Path | None,
        network: bool,
        pool: KernelPool | None,
        gateway: GatewayKernel | None,
        source: KernelSource | None = None,
    ) -> None:
        self.workspace = workspace
        self._sandbox = sandbox
        self._env = dict(env)
        self._limits = limits
        self._start_timeout = start_timeout
        self._network = network
        self._pool = pool
        self._gateway = gateway
        self._source = source
        self._tools_given = tools_dir
        self.tools_dir: Path | None = None
        """The real tools directory, as last checked."""
        if tools_dir is not None:
            self.tools_dir = tools_dir_path(tools_dir, kernel_writable=self.kernel_writable())
            if self.tools_dir.exists() and not self.tools_dir.is_dir():
                raise UsageError(f"tools_dir {str(tools_dir)!r} is not a directory")
            if self.tools_dir.parent == self.tools_dir:
                raise UsageError("tools_dir cannot be the filesystem root")
        self._skills_given = skills_dir
        self.skills_dir: Path | None = None
        """The real skills directory, as last checked."""
        if skills_dir is not None:
            self.skills_dir = skills_dir_path(
                skills_dir, kernel_writable=self.kernel_writable(), tools_dir=self.tools_dir
            )
        self.home: Path | None = None
        """The private directory of the kernel running now (or about to): a pooled kernel brings its own."""
        self.token = secrets.token_urlsafe(32)
        """The tool token of the kernel running now (or about to)."""
        # The pooled kernel taken at the start, until the supervisor runs it.
        self._lease: Lease | None = None
        self._tools: ToolServer | None = None
        self._proxy: NetworkProxy | None = None

    @property
    def has_skills(self) -> bool:
        """Whether the executor was given a skills directory."""
        return self._skills_given is not None

    def kernel_writable(self) -> list[Path]:
        """Host directories kernel code can write to (where it could plant symlinks)."""
        return kernel_writable(self.workspace, self._sandbox)

    def spec(self) -> KernelSpec:
        """What a kernel started now would be started with."""
        return KernelSpec.of(
            sandbox=self._sandbox,
            limits=self._limits,
            env=self._env,
            workspace=self.workspace,
            tools_dir=self.tools_dir,
            skills_dir=self.skills_dir,
            network=self._network,
        )

    # -- the first kernel -----------------------------------------------------------------

    async def begin(self, stack: AsyncExitStack) -> Listeners:
        """Make the private directory, or take the first kernel from the pool with its own.

        The directory is removed, and a lease left unused is released, when ``stack`` closes.

        Returns:
            The pooled kernel's listening sockets, for the executor's tool server and proxy to serve.

        Raises:
            UsageError: The tools directory cannot be trusted; the message names the fix.
        """
        separate = self._pool is not None and self._pool.separate_workspaces
        if not separate:
            self.check_tools_dir()
        lease = await self._pool._take(self.spec()) if self._pool is not None else None  # pyright: ignore[reportPrivateUsage]
        listeners = Listeners()
        if lease is not None:
            self._lease = lease
            stack.callback(self._drop_lease)
            lease.adopted = True
            self.home, self.token = lease.home, lease.token
            if separate:
                self.workspace, self._tools_given = lease.spec.workspace, lease.spec.tools_dir
            tools, net = lease.listener, lease.net_listener
            lease.listener = lease.net_listener = None
            if net is not None and not self._network:
                net.close()  # as in `_adopt` (the specs rule this out)
                net = None
            for listener in (tools, net):
                if listener is not None:
                    # The servers' from now on; closed here too in case they never run (twice is harmless).
                    stack.callback(listener.close)
            listeners = Listeners(tools, net)
        else:
            self.home = new_home(None)
        # The one the executor has at the end: a kernel taken from a pool brings its own.
        stack.callback(lambda: shutil.rmtree(self.home, ignore_errors=True) if self.home else None)
        return listeners

    def serve(self, tools: ToolServer, proxy: NetworkProxy | None) -> None:
        """The executor's tool server and network proxy, which follow the kernel's private directory."""
        self._tools, self._proxy = tools, proxy

    # -- directories ----------------------------------------------------------------------

    def check_tools_dir(self) -> None:
        """Check the tools directory before a kernel starts (see `resolve_tools_dir`).

        Raises:
            UsageError: The tools directory cannot be trusted; the message names the fix.
        """
        if self._tools_given is not None:
            self.tools_dir = resolve_tools_dir(self._tools_given, kernel_writable=self.kernel_writable())

    def prepare_dirs(self) -> None:
        """Check the tools and skills directories and link them into the kernel's import root.

        Raises:
            UsageError: A directory cannot be trusted; the message names the fix.
        """
        assert self.home is not None
        self.check_tools_dir()
        if self.tools_dir is not None:
            link_tools_dir(self.home, self.tools_dir)
        self.prepare_skills_dir()

    def prepare_skills_dir(self) -> None:
        """Create and check the skills directory, as `check_tools_dir` does the tools directory, and
        link it into the import root as ``skills``.

        Raises:
            UsageError: The skills directory cannot be trusted; the message names the fix.
        """
        if self._skills_given is None:
            return
        assert self.home is not None
        self.skills_dir = prepare_skills_dir(
            self._skills_given, kernel_writable=self.kernel_writable(), tools_dir=self.tools_dir
        )
        link_tools_dir(self.home, self.skills_dir, name=SKILLS_PACKAGE)

    async def save_skill(self, name: str, code: str, description: str, *, overwrite: bool) -> Skill:
        """Check and write a skill (see `CodeExecutor.save_skill`).

        Raises:
            InvalidSkill: The name, code or description cannot be used, or the skill exists.
            UsageError: There is no skills directory, or it cannot be trusted any more.
        """
        if self._skills_given is None:
            raise UsageError("this CodeExecutor has no skills directory; pass skills_dir='skills' (or another path)")
        # A skill must not shadow the tools package in the kernel's import root.
        check_skill(name, code, description, reserved=[self.tools_dir.name] if self.tools_dir is not None else [])
        # The directory may have been deleted, or a symlink planted on its way, since the kernel started.
        self.prepare_skills_dir()
        assert self.skills_dir is not None
        return await anyio.to_thread.run_sync(
            functools.partial(write_skill, self.skills_dir, name, code, description, overwrite=overwrite)
        )

    def _recheck_dirs(self) -> None:
        """`prepare_dirs` before a restart, where a failure is a start error of that kernel.

        Raises:
            KernelStartError: The tools or skills directory can no longer be trusted.
        """
        what = "tools"
        try:
            self.check_tools_dir()
            if self.tools_dir is not None:
                assert self.home is not None
                link_tools_dir(self.home, self.tools_dir)
            what = "skills"
            self.prepare_skills_dir()
        except (OSError, UsageError) as exc:
            raise KernelStartError(f"the {what} directory cannot be used any more: {exc}") from exc

    # -- kernels ------------------------------------------------------------------------

    @asynccontextmanager
    async def open(self, restarting: bool) -> AsyncGenerator[KernelHandle]:
        """Prepare the host side and start a kernel, or take one from the pool (see `KernelOpener`)."""
        assert self.home is not None and self._tools is not None
        lease, self._lease = self._lease, None
        if lease is None:
            restore_home(self.home, self._tools)
            if restarting:
                self._recheck_dirs()
            if self._pool is not None and not self._pool.separate_workspaces:
                lease = await self._pool._take(self.spec())  # pyright: ignore[reportPrivateUsage]
                if lease is not None and not self._adopt(lease):
                    lease = None
        if lease is not None:
            async with lease.use() as kernel:
                yield kernel
            return
        if self._source is not None:
            async with self._source.open(self._host(restarting)) as kernel:
                yield kernel
            return
        if self._gateway is not None:
            tools = self.tools_dir if self.tools_dir is not None and self.tools_dir.is_dir() else None
            async with open_gateway_kernel(
                self._gateway,
                limits=self._limits,
                start_timeout=self._start_timeout,
                tool_socket=self._tools.socket_path,
                token=self.token,
                tools_dir=tools,
            ) as remote:
                yield remote
            return
        if self._proxy is not None:
            self._proxy.rebind()
        async with start_kernel(
            self.spec(), home=self.home, token=self.token, start_timeout=self._start_timeout
        ) as kernel:
            yield kernel

    def _host(self, restarting: bool) -> KernelHost:
        """What a `KernelSource` gets for the next kernel."""
        assert self.home is not None and self._tools is not None
        settings = KernelSettings(
            workspace=self.workspace,
            sandbox=self._sandbox,
            env=self._env,
            limits=self._limits,
            tools_dir=self.tools_dir,
            skills_dir=self.skills_dir,
            network=self._network,
        )
        return KernelHost(
            settings=settings,
            home=self.home,
            token=self.token,
            tool_socket=self._tools.socket_path,
            restarting=restarting,
            adopt=lambda _started: False,
        )

    def _adopt(self, lease: Lease) -> bool:
        """Move the private directory over to a pooled kernel's: its installed packages (into the
        kernel's packages directory, which its sandbox mounts), its tool and proxy sockets and its
        token, which the tool server and the proxy check from then on.

        False, with the lease released, if that failed: the caller starts a kernel of its own.
        """
        assert self.home is not None and self._tools is not None
        old = self.home
        moved: list[str] = []
        try:
            for name in os.listdir(old / "packages"):
                os.rename(old / "packages" / name, lease.home / "packages" / name)
                moved.append(name)
            # The tool socket's file is there (a /tmp cleaner?) before anything moves; the proxy checks
            # its own before it moves.
            os.stat(lease.home / "tools.sock")
            net, lease.net_listener = lease.net_listener, None
            if self._proxy is not None:
                self._proxy.move(lease.home / NET_SOCKET, lease.token, listener=net)
            elif net is not None:
                # Never served, so that a forwarder without this executor's policy behind it reaches
                # nothing (a listener nobody accepts on still takes connections into its backlog).
                net.close()
            self._tools.move(lease.home / "tools.sock", lease.token, listener=lease.listener)
        except (OSError, UsageError) as exc:
            for name in moved:
                os.rename(lease.home / "packages" / name, old / "packages" / name)
            logger.warning("could not take a pooled kernel (%s); starting one", exc)
            lease.release()
            return False
        lease.listener = None
        lease.adopted = True
        self.home, self.token = lease.home, lease.token
        shutil.rmtree(old, ignore_errors=True)
        return True

    def _drop_lease(self) -> None:
        """Release the pooled kernel taken at the start if no kernel supervisor ran it."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
