"""`KernelSpec`: everything a kernel is started with that cannot change once it runs, and starting
a kernel from one. The executor starts its own kernels from its spec; a `KernelPool` starts them
ahead of time and hands one over only to an executor whose spec is the same."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from ._config import Limits, SandboxConfig
from ._kernel import Kernel, default_python
from ._kernelhome import hidden_paths, kernel_env, kernel_sandbox
from .network._setup import network_env, with_network_mount

__all__ = ("KernelSpec", "start_kernel")


@dataclass(frozen=True, kw_only=True)
class KernelSpec:
    """What a kernel is started with, compared field by field.

    Attributes:
        python: The interpreter's command line.
        sandbox: The sandbox (paths as strings in tuples, so that equal settings compare equal).
        limits: The kernel's resource limits.
        env: The extra environment variables, sorted.
        workspace: The kernel's working directory (bind-mounted, and its current directory).
        tools_dir: The real tools directory linked into the import root, if there is one.
        mounted_tools: ``tools_dir`` if it existed at the start (then it is mounted read-only).
        hidden: Paths under the mounted tools directory the kernel does not see.
        skills_dir: The real skills directory (mounted read-only, importable as ``skills``).
        network: Whether the kernel has the network forwarder, its environment and the proxy socket
            mounted: what a `Network` needs in the kernel. Not the policy, which is the executor's.
    """

    python: tuple[str, ...]
    sandbox: SandboxConfig | None
    limits: Limits
    env: tuple[tuple[str, str], ...]
    workspace: Path
    tools_dir: Path | None
    mounted_tools: Path | None
    hidden: tuple[Path, ...]
    skills_dir: Path | None = None
    network: bool = False

    @classmethod
    def of(
        cls,
        *,
        sandbox: SandboxConfig | None,
        limits: Limits,
        env: Mapping[str, str],
        workspace: Path,
        tools_dir: Path | None,
        skills_dir: Path | None = None,
        network: bool = False,
    ) -> KernelSpec:
        """The spec of a kernel started now with these settings (``tools_dir`` already checked)."""
        if sandbox is not None:
            sandbox = dataclasses.replace(
                sandbox,
                ro_paths=tuple(str(p) for p in sandbox.ro_paths),
                rw_paths=tuple(str(p) for p in sandbox.rw_paths),
            )
        mounted = tools_dir if tools_dir is not None and tools_dir.is_dir() else None
        return cls(
            python=tuple(default_python()),
            sandbox=sandbox,
            limits=limits,
            env=tuple(sorted(env.items())),
            workspace=workspace,
            tools_dir=tools_dir,
            mounted_tools=mounted,
            hidden=tuple(hidden_paths(mounted)),
            skills_dir=skills_dir,
            network=network,
        )

    def differences(self, other: KernelSpec, *, dirs: bool = True) -> list[str]:
        """The names of the fields that differ; ``dirs=False`` leaves out each kernel's own
        directories (workspace and tools), not the skills directory, which its executors share."""
        names = ["python", "sandbox", "limits", "env", "skills_dir", "network"]
        if dirs:
            names += ["workspace", "tools_dir", "mounted_tools", "hidden"]
        return [name for name in names if getattr(self, name) != getattr(other, name)]


def start_kernel(
    spec: KernelSpec, *, home: Path, token: str, start_timeout: float
) -> AbstractAsyncContextManager[Kernel]:
    """Start a kernel as ``spec`` says, with the private directory ``home`` and the tool token."""
    extra = dict(spec.env)
    sandbox = kernel_sandbox(spec.sandbox, home, tools=spec.tools_dir, skills=spec.skills_dir)
    if spec.network:
        extra = {**network_env(home), **extra}
        sandbox = with_network_mount(sandbox, home)
    return Kernel.start(
        python=spec.python,
        env=kernel_env(
            home,
            token,
            tools=spec.tools_dir,
            sandboxed=spec.sandbox is not None,
            extra=extra,
            skills=spec.skills_dir,
        ),
        workspace=spec.workspace,
        sandbox=sandbox,
        tools_dir=spec.mounted_tools,
        hidden=spec.hidden,
        limits=spec.limits,
        start_timeout=start_timeout,
        skills_dir=spec.skills_dir,
    )
