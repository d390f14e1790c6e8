"""`LocalKernel`: kernels started on this host from their `KernelSettings` (the default source), and
`LaunchSpec`: what one start uses, which a `KernelPool` compares before handing a kernel over.

("Kernelspec" is Jupyter's word for how a kernel is launched on a gateway: see ``deploy/gateway``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from ipybox._mounts import mounted
from ipybox._settings import KernelSettings, resolved_sandbox, take_settings
from ipybox.network._setup import NET_SOCKET, network_env, with_network_mount
from ipybox.sandbox._sandbox import resolve_sandbox

from . import Kernel, KernelHandle, KernelHost, default_python
from ._home import IMPORT_ROOT, hidden_paths, kernel_env, kernel_sandbox

__all__ = ("LaunchSpec", "LocalKernel", "start_kernel")


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """What one kernel start uses, compared field by field: its settings (resolved, with the real
    directories) and what the tools directory looked like then.

    Attributes:
        settings: The kernel's settings, resolved (`KernelSource.settings_for`) and checked.
        mounted_tools: ``settings.tools_dir`` if it existed at the start (then it is mounted read-only).
        hidden: Paths under the mounted tools directory the kernel does not see.
    """

    settings: KernelSettings
    mounted_tools: Path | None
    hidden: tuple[Path, ...]

    @classmethod
    def of(cls, settings: KernelSettings) -> LaunchSpec:
        """The spec of a kernel started now with ``settings`` (its directories already checked)."""
        tools = settings.tools_dir
        mounted_tools = tools if tools is not None and tools.is_dir() else None
        return cls(settings=settings, mounted_tools=mounted_tools, hidden=tuple(hidden_paths(mounted_tools)))

    def differences(self, other: LaunchSpec, *, dirs: bool = True) -> list[str]:
        """The names of what differs; ``dirs=False`` leaves out each kernel's own directories
        (workspace and tools), not the mounts, which all kernels of a pool share."""
        names = self.settings.differences(other.settings, dirs=dirs)
        if dirs:
            names += [name for name in ("mounted_tools", "hidden") if getattr(self, name) != getattr(other, name)]
        return names


def private_paths(home: Path) -> list[Path]:
    """The executor's own files in ``home`` a sandboxed kernel uses: the tool socket, the import root
    and the proxy socket."""
    return [home / "tools.sock", home / IMPORT_ROOT, home / NET_SOCKET]


def start_kernel(
    spec: LaunchSpec, *, home: Path, token: str, start_timeout: float
) -> AbstractAsyncContextManager[Kernel]:
    """Start a kernel as ``spec`` says, with the private directory ``home`` and the tool token."""
    settings = spec.settings
    mounts = list(mounted(settings))
    extra = dict(settings.env)
    sandbox = kernel_sandbox(resolved_sandbox(settings), home, tools=settings.tools_dir, imports=bool(mounts))
    if settings.network:
        extra = {**network_env(home), **extra}
        sandbox = with_network_mount(sandbox, home)
    return Kernel.start(
        python=default_python(),
        env=kernel_env(
            home,
            token,
            tools=settings.tools_dir,
            sandboxed=sandbox is not None,
            extra=extra,
            mounts=mounts,
        ),
        workspace=settings.workspace,
        sandbox=sandbox,
        tools_dir=spec.mounted_tools,
        hidden=spec.hidden,
        limits=settings.limits,
        start_timeout=start_timeout,
        host_dirs=[(path, mount.setting) for mount, path in mounts],
        private=[path for path in private_paths(home) if path.exists()],
    )


class LocalKernel:
    """Kernels started on this host, in the sandbox their settings ask for: what `CodeExecutor` uses
    unless told otherwise.

    ``CodeExecutor(kernel=LocalKernel(settings))`` runs with ``settings``; ``LocalKernel()`` with the
    executor's own (``workspace=``, ``sandbox=``, ...).

    Args:
        settings: What its kernels are started with; None: the executor's. Settings given to the
            executor as well must be the same (left at their defaults, they take these).
    """

    remote = False

    def __init__(self, settings: KernelSettings | None = None) -> None:
        self.settings = settings

    def settings_for(self, requested: KernelSettings) -> KernelSettings:
        """``requested``, or these settings if given (see `KernelSource.settings_for`).

        Raises:
            UsageError: ``requested`` sets something to another value than these settings.
            SandboxUnavailable: ``sandbox="auto"`` and bubblewrap cannot be used here.
        """
        settings = requested if self.settings is None else take_settings(self.settings, requested, owner="LocalKernel")
        return dataclasses.replace(settings, sandbox=resolve_sandbox(settings.sandbox))

    @asynccontextmanager
    async def open(self, host: KernelHost) -> AsyncGenerator[KernelHandle]:
        """Start a kernel with ``host``'s settings and private directory (see `KernelSource.open`)."""
        async with start_kernel(
            LaunchSpec.of(host.settings), home=host.home, token=host.token, start_timeout=host.start_timeout
        ) as kernel:
            yield kernel
