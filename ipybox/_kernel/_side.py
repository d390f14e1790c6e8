"""`KernelSide`: what an executor keeps on the host for its kernels, whatever their source.

Whether a kernel is started here, taken from a `KernelPool`, started on a gateway or run in this
process, it needs the same things from the host: the executor's private directory (tool socket,
network proxy socket, installed packages, import root), its tool token, and a tools directory and
the checked mounts (`ipybox._mounts`), checked again before every start. `KernelSide` owns all of
them and hands them to the executor's `KernelSource` as a `KernelHost`, so that `CodeExecutor`
deals with executions, tools and approvals only. Its `open` is the `KernelSupervisor`'s kernel
opener.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import secrets
import shutil
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread

from ipybox._exceptions import KernelStartError, UsageError
from ipybox._mounts import mounted, prepare_mounts
from ipybox._settings import KernelSettings, resolved_sandbox
from ipybox._tooldir import tools_dir_path
from ipybox._toolserver._server import ToolServer
from ipybox.network._proxy import NetworkProxy
from ipybox.network._setup import NET_SOCKET
from ipybox.skills._store import Skill, check_skill, skills_dir_path, write_skill

from . import KernelHandle, KernelHost, KernelSource, StartedHome
from ._home import kernel_writable, link_tools_dir, new_home, resolve_tools_dir, restore_home

__all__ = ("KernelSide",)

logger = logging.getLogger(__name__)


class KernelSide:
    """The host side of one executor's kernels: private directory, token, checked directories.

    Args:
        source: Where the kernels come from.
        settings: What they are started with, as the source resolved them (`KernelSource.settings_for`);
            its tools and skills directories as given (absolute, not resolved): every start checks
            them again for planted symlinks.
        start_timeout: How long one kernel start may take.

    Raises:
        UsageError: The tools or skills directory cannot be used (the message names the fix).
    """

    def __init__(self, *, source: KernelSource, settings: KernelSettings, start_timeout: float) -> None:
        self._source = source
        self._given = settings
        self._start_timeout = start_timeout
        self.settings = settings
        """The settings with the real directories, as last checked."""
        tools_dir = settings.tools_dir
        if tools_dir is not None:
            real = tools_dir_path(tools_dir, kernel_writable=self.kernel_writable())
            if real.exists() and not real.is_dir():
                raise UsageError(f"tools_dir {str(tools_dir)!r} is not a directory")
            if real.parent == real:
                raise UsageError("tools_dir cannot be the filesystem root")
            self.settings = dataclasses.replace(self.settings, tools_dir=real)
        if settings.skills_dir is not None:
            real_skills = skills_dir_path(
                settings.skills_dir, kernel_writable=self.kernel_writable(), tools_dir=self.tools_dir
            )
            self.settings = dataclasses.replace(self.settings, skills_dir=real_skills)
        self.home: Path | None = None
        """The private directory of the kernel running now (or about to): a pooled kernel brings its own."""
        self.token = secrets.token_urlsafe(32)
        """The tool token of the kernel running now (or about to)."""
        self._tools: ToolServer | None = None
        self._proxy: NetworkProxy | None = None

    @property
    def workspace(self) -> Path:
        """The kernel's working directory (a pooled kernel's own with separate workspaces)."""
        return self._given.workspace

    @property
    def tools_dir(self) -> Path | None:
        """The real tools directory, as last checked."""
        return self.settings.tools_dir

    @property
    def skills_dir(self) -> Path | None:
        """The real skills directory, as last checked."""
        return self.settings.skills_dir

    @property
    def has_skills(self) -> bool:
        """Whether the executor was given a skills directory."""
        return self._given.skills_dir is not None

    def kernel_writable(self) -> list[Path]:
        """Host directories kernel code can write to (where it could plant symlinks)."""
        return kernel_writable(self.workspace, resolved_sandbox(self._given))

    # -- the first kernel -----------------------------------------------------------------

    def begin(self, stack: AsyncExitStack) -> Path:
        """Make the private directory; removed (the one in use then) when ``stack`` closes."""
        self.home = new_home(None)
        stack.callback(lambda: shutil.rmtree(self.home, ignore_errors=True) if self.home else None)
        return self.home

    def serve(self, tools: ToolServer, proxy: NetworkProxy | None) -> None:
        """The executor's tool server and network proxy, which follow the kernel's private directory."""
        self._tools, self._proxy = tools, proxy

    # -- directories ----------------------------------------------------------------------

    def check_tools_dir(self) -> None:
        """Check the tools directory before a kernel starts (see `resolve_tools_dir`).

        Raises:
            UsageError: The tools directory cannot be trusted; the message names the fix.
        """
        given = self._given.tools_dir
        if given is not None:
            real = resolve_tools_dir(given, kernel_writable=self.kernel_writable())
            self.settings = dataclasses.replace(self.settings, tools_dir=real)

    def prepare_dirs(self) -> None:
        """Check the tools directory and the mounts and link them into the kernel's import root.

        Raises:
            UsageError: A directory cannot be trusted; the message names the fix.
        """
        assert self.home is not None
        self.check_tools_dir()
        if self.tools_dir is not None:
            link_tools_dir(self.home, self.tools_dir)
        self.prepare_mounts()

    def prepare_mounts(self) -> None:
        """Create and check the mounts' directories (the skills directory), as `check_tools_dir` does
        the tools directory, and link each into the import root under its package name.

        Raises:
            UsageError: A directory cannot be trusted; the message names the fix.
        """
        assert self.home is not None
        given = dataclasses.replace(self._given, tools_dir=self.tools_dir)
        prepared = prepare_mounts(given, kernel_writable=self.kernel_writable(), tools_dir=self.tools_dir)
        for mount, path in mounted(prepared):
            link_tools_dir(self.home, path, name=mount.package)
        self.settings = prepared

    async def save_skill(self, name: str, code: str, description: str, *, overwrite: bool) -> Skill:
        """Check and write a skill (see `CodeExecutor.save_skill`).

        Raises:
            InvalidSkill: The name, code or description cannot be used, or the skill exists.
            UsageError: There is no skills directory, or it cannot be trusted any more.
        """
        if not self.has_skills:
            raise UsageError("this CodeExecutor has no skills directory; pass skills_dir='skills' (or another path)")
        # A skill must not shadow the tools package in the kernel's import root.
        check_skill(name, code, description, reserved=[self.tools_dir.name] if self.tools_dir is not None else [])
        # The directory may have been deleted, or a symlink planted on its way, since the kernel started.
        self.prepare_mounts()
        assert self.skills_dir is not None
        return await anyio.to_thread.run_sync(
            functools.partial(write_skill, self.skills_dir, name, code, description, overwrite=overwrite)
        )

    def _recheck_dirs(self) -> None:
        """`prepare_dirs` before a restart, where a failure is a start error of that kernel.

        Raises:
            KernelStartError: The tools directory or a mount's can no longer be trusted.
        """
        what = "tools"
        try:
            self.check_tools_dir()
            if self.tools_dir is not None:
                assert self.home is not None
                link_tools_dir(self.home, self.tools_dir)
            what = "skills"
            self.prepare_mounts()
        except (OSError, UsageError) as exc:
            raise KernelStartError(f"the {what} directory cannot be used any more: {exc}") from exc

    # -- kernels ------------------------------------------------------------------------

    @asynccontextmanager
    async def open(
        self, restarting: bool, via: Callable[[KernelHost], AbstractAsyncContextManager[KernelHandle]] | None = None
    ) -> AsyncGenerator[KernelHandle]:
        """Prepare the host side and open a kernel from the source (see `KernelOpener`), or by ``via``
        (a kernel a suspended execution left, say)."""
        assert self.home is not None and self._tools is not None
        restore_home(self.home, self._tools)
        if restarting:
            self._recheck_dirs()
        if self._proxy is not None:
            self._proxy.rebind()
        host = KernelHost(
            settings=self.settings,
            home=self.home,
            token=self.token,
            tool_socket=self.home / "tools.sock",
            restarting=restarting,
            start_timeout=self._start_timeout,
            adopt=self._adopt,
        )
        async with (self._source.open if via is None else via)(host) as kernel:
            yield kernel

    def _adopt(self, started: StartedHome) -> bool:
        """Move the private directory over to a kernel started ahead of time with its own (see
        `KernelHost.adopt`): its installed packages (into the kernel's packages directory, which its
        sandbox mounts), its tool and proxy sockets and its token, which the tool server and the
        proxy check from then on; and its workspace and tools directory, if it has its own.

        False, with nothing moved, if that failed: the source then gives the kernel back.
        """
        assert self.home is not None and self._tools is not None
        old = self.home
        moved: list[str] = []
        net = started.net_listener
        try:
            for name in os.listdir(old / "packages"):
                os.rename(old / "packages" / name, started.home / "packages" / name)
                moved.append(name)
            # The tool socket's file is there (a /tmp cleaner?) before anything moves; the proxy checks
            # its own before it moves.
            os.stat(started.home / "tools.sock")
            if self._proxy is not None:
                self._proxy.move(started.home / NET_SOCKET, started.token, listener=net)
                net = None
            self._tools.move(started.home / "tools.sock", started.token, listener=started.tools_listener)
        except (OSError, UsageError) as exc:
            for name in moved:
                os.rename(started.home / "packages" / name, old / "packages" / name)
            logger.warning("could not take a pooled kernel (%s); starting one", exc)
            return False
        finally:
            if net is not None:
                # Never served, so that a forwarder without this executor's policy behind it reaches
                # nothing (a listener nobody accepts on still takes connections into its backlog).
                net.close()
        self.home, self.token = started.home, started.token
        if started.workspace is not None:
            self._given = dataclasses.replace(self._given, workspace=started.workspace, tools_dir=started.tools_dir)
            self.settings = dataclasses.replace(self.settings, workspace=started.workspace, tools_dir=started.tools_dir)
        shutil.rmtree(old, ignore_errors=True)
        return True
