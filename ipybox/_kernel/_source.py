"""`KernelSource`: where an executor's kernels come from, and `KernelHost`: what the executor gives
each of them.

An executor keeps one kernel running (`KernelSupervisor`) and does not care how it is made: started
here in the sandbox, taken from a `KernelPool`, started on a gateway, or run in this process for
tests. Each of those is a source; the executor's host side (its private directory, tool token, tool
server, network proxy and checked directories) is the same for all of them and is handed to the
source as a `KernelHost` at every start.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ipybox._settings import KernelSettings

from ._handle import KernelHandle

__all__ = ("KernelHost", "KernelSource", "StartedHome")


@dataclass(frozen=True, kw_only=True)
class StartedHome:
    """A private directory a kernel was started with ahead of time (by a pool), for the executor to
    move its host side over to (`KernelHost.adopt`).

    Attributes:
        home: The kernel's private directory (the layout of `KernelHost.home`).
        token: The tool token the kernel was started with.
        tools_listener: The tool socket, bound in ``home`` before the kernel started (its sandbox
            mounts the file), for the executor's tool server to serve from now on.
        net_listener: The network proxy socket likewise, if the kernel was started ready for one.
        workspace: The kernel's own workspace, if it has one (a pool with separate workspaces);
            None: the executor's.
        tools_dir: The kernel's own tools directory, with its own workspace.
    """

    home: Path
    token: str
    tools_listener: socket.socket | None = None
    net_listener: socket.socket | None = None
    workspace: Path | None = None
    tools_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class KernelHost:
    """What an executor gives its kernel source for one kernel: the host side the kernel talks to.

    Everything here is ready when `KernelSource.open` is called: the private directory exists (made
    again if a ``/tmp`` cleaner removed it), the tool server listens on ``tool_socket`` and accepts
    ``token``, and the tools and skills directories were checked again for planted symlinks and
    linked into the import root.

    Attributes:
        settings: What the kernel is started with: the source's `KernelSource.settings_for`, with
            ``tools_dir`` and ``skills_dir`` the real, checked directories (None: none).
        home: The executor's private directory (0700): the tool socket, the network proxy's socket
            (``settings.network``), ``packages/`` (what `CodeExecutor.install` installed, for
            ``PYTHONPATH``) and ``imports/`` (links to the tools and skills directories, for
            ``PYTHONPATH``). A sandboxed kernel gets them mounted read-only.
        token: The tool token kernel code must present on the tool socket (and the proxy's).
        tool_socket: The tool server's Unix socket, in ``home``.
        restarting: Whether this kernel replaces one (False for the executor's first kernel).
        start_timeout: How long the start may take (the executor's ``timeouts.start``).
        adopt: Moves the executor's host side over to a kernel started ahead of time with a private
            directory of its own (a pool's): its installed packages, its tool server and network
            proxy (which check that kernel's token from then on), and its workspace if it has one.
            True once done; False if that failed, with nothing moved: the source then gives the
            pooled kernel back and opens another. Other sources never call it.
    """

    settings: KernelSettings
    home: Path
    token: str
    tool_socket: Path
    restarting: bool
    start_timeout: float
    adopt: Callable[[StartedHome], bool]


class KernelSource(Protocol):
    """Where an executor's kernels come from (``CodeExecutor(kernel=...)``).

    The executor asks `settings_for` once, when it is made, and calls `open` for its first kernel
    and again for each replacement (after `reset`, a kernel's death, or a timeout that had to kill
    it), one kernel at a time: the previous one's context has exited before the next `open`.
    """

    @property
    def remote(self) -> bool:
        """Whether the kernel runs where the host's workspace and environment are not (a gateway):
        the executor then copies files over the kernel protocol, and refuses `install`."""
        ...

    def settings_for(self, requested: KernelSettings) -> KernelSettings:
        """The settings this source's kernels run with, for an executor that asks for ``requested``.

        Returns them resolved: ``sandbox`` is a `SandboxConfig` or None, never ``"auto"``. A source
        may take them as they are (a local kernel), or replace what it decides itself (a pool: its
        own settings; a gateway: its sandbox).

        Raises:
            UsageError: ``requested`` conflicts with what this source decides; the message names the
                fix. Never silently ignored.
            SandboxUnavailable: The sandbox asked for cannot be used here.
        """
        ...

    def open(self, host: KernelHost) -> AbstractAsyncContextManager[KernelHandle]:
        """A running kernel for ``host``, until the context exits.

        Entering starts (or takes) a kernel ready to run code: it imports kernel-side ipybox, talks
        to the tool server at ``host.tool_socket`` with ``host.token`` and runs in
        ``host.settings.workspace``. Exiting stops it for good and returns once it is gone; the
        kernel may also go by itself (its ``exited`` event is set), and the executor then exits the
        context and opens another.

        Raises:
            KernelStartError: The kernel did not start; the message says why (the executor reports
                it to the caller waiting for a kernel).
        """
        ...
