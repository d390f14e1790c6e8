"""How an executor is configured: its timeouts, its resource limits and its sandbox.

Every default is written here once; `CodeExecutor` and the MCP server's configuration take these
objects (or their defaults) rather than declaring their own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal, cast

from ._exceptions import UsageError

__all__ = (
    "KernelSettings",
    "Limits",
    "SandboxConfig",
    "Timeouts",
    "check_kernel_settings",
    "check_seconds",
    "resolved_sandbox",
    "take_settings",
)


def check_seconds(value: object, what: str) -> None:
    """Raises UsageError unless ``value`` is None or a positive, finite number of seconds."""
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and value > 0 and math.isfinite(value)):  # type: ignore[operator]
        raise UsageError(f"{what} must be a positive number of seconds or None, got {value!r}")


def check_kernel_settings(env: object, limits: object, timeouts: object) -> None:
    """Raises UsageError unless ``env`` maps str to str (or is None) and ``limits`` and ``timeouts``
    are a `Limits` and a `Timeouts` (or None)."""
    if env is not None:
        _check_env(env)
    if timeouts is not None and not isinstance(timeouts, Timeouts):
        raise UsageError(f"timeouts must be a Timeouts, got {timeouts!r}")
    if limits is not None and not isinstance(limits, Limits):
        raise UsageError(f"limits must be a Limits, got {limits!r}")


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """How long things may take, in seconds (None: no limit).

    Attributes:
        execution: Default time one code action may run (`CodeExecutor.execute` can set its own);
            while a call waits for approval only the CPU time the kernel uses counts. When it runs
            out the kernel is interrupted.
        approval: Time an ``"ask"`` approval waits for the application's decision before the call
            is rejected (the code goes on and sees `ToolCallRejected`).
        tool: Time one MCP tool call may take once approved.
        start: Time a kernel may take to become ready (normally ~0.5 s; this allows for a loaded
            machine).
        interrupt_grace: Time an interrupted kernel gets to stop the code before it is killed and
            restarted (its state is then lost).
    """

    execution: float | None = None
    approval: float | None = None
    tool: float | None = 300.0
    start: float = 30.0
    interrupt_grace: float = 2.0

    def __post_init__(self) -> None:
        for item in fields(self):
            check_seconds(getattr(self, item.name), f"Timeouts.{item.name}")
        for name in ("start", "interrupt_grace"):
            if getattr(self, name) is None:
                raise UsageError(f"Timeouts.{name} must be a positive number of seconds, not None")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Resource limits of the kernel's sandbox and of what one execution may return.

    Attributes:
        memory: Bytes of memory the sandbox may use in total: its processes, the kernel memory they
            cause, and what is stored in its ``/tmp`` and ``/dev/shm`` (a memory cgroup, where the
            host has a writable memory controller; see SECURITY.md). Past it the out-of-memory killer
            ends a process, the kernel included (`KernelDied` names this limit). Each process's
            address space is also capped at it (RLIMIT_AS), so that one oversized allocation raises
            MemoryError instead; a kernel needs about 1 GiB of address space to start.
        cpu_seconds: CPU time the kernel may use over its lifetime (RLIMIT_CPU); past it, it dies.
        open_files: Open file descriptors (RLIMIT_NOFILE).
        output_chars: Characters of output one execution may return; the rest is dropped and
            counted in ``CodeExecutionResult.truncated_chars``.
        tmp_bytes: Size of the sandbox's private ``/tmp`` and ``/dev/shm`` each (they live in host
            memory, and count towards ``memory``).
        processes: Processes and threads the kernel may have at once (a fork bomb stops there).
            Enforced with a pids cgroup where the host has a writable pids controller; see SECURITY.md.
        tool_calls: Tool calls one code action may make (refused ones count); further calls fail
            in the kernel with ``ipybox_kernel.ToolCallBudgetExceeded``, without asking anyone.
            None: no limit.
        approval_wait: Seconds one code action's tool calls may wait for approval decisions in
            all; a call asked about waits at most what is left, and once it is used up further
            calls fail with ``ToolCallBudgetExceeded``. None: no limit (``Timeouts.approval``
            still bounds each wait).
    """

    memory: int | None = 4 * 1024**3
    cpu_seconds: int | None = None
    open_files: int | None = 1024
    output_chars: int = 1_000_000
    tmp_bytes: int | None = 1024**3
    processes: int | None = 512
    tool_calls: int | None = None
    approval_wait: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            optional = item.name != "output_chars"
            if value is None and optional:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                what = "a positive whole number" + (" or None" if optional else "")
                raise UsageError(f"Limits.{item.name} must be {what}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """How the kernel is sandboxed.

    Attributes:
        backend: The sandbox implementation; ``"bwrap"`` (bubblewrap) is the one on Linux.
        ro_paths: Extra host paths the kernel may read (mounted read-only at the same path).
        rw_paths: Extra host paths the kernel may write (mounted read-write at the same path).
    """

    backend: Literal["bwrap"] = "bwrap"
    ro_paths: Sequence[Path | str] = field(default=())
    rw_paths: Sequence[Path | str] = field(default=())

    def __post_init__(self) -> None:
        for path in (*self.ro_paths, *self.rw_paths):
            if not Path(path).is_absolute():
                raise UsageError(f"sandbox paths must be absolute, got {str(path)!r}")
            if not Path(path).exists():
                raise UsageError(f"sandbox path {str(path)!r} does not exist; create it or remove it")


def _check_env(env: object) -> dict[str, str]:
    """``env`` as a dict, or UsageError unless it maps str to str."""
    if not isinstance(env, Mapping):
        raise UsageError(f"env must be a mapping of str to str, got {env!r}")
    for name, value in cast("Mapping[object, object]", env).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise UsageError(f"env must map str to str; {name!r}: {value!r} is not")
    return dict(cast("Mapping[str, str]", env))


def _dir_given(value: object, what: str) -> Path | None:
    """A tools or skills directory as given: made absolute, not resolved (every kernel start checks
    it again for symlinks planted since)."""
    if value is None:
        return None
    path = cast("str | os.PathLike[str]", value)
    if not isinstance(value, str | os.PathLike) or not os.fspath(path):
        raise UsageError(f"KernelSettings.{what} must be a path or None, got {value!r}")
    return Path(os.path.join(os.getcwd(), path))


@dataclass(frozen=True, kw_only=True)
class KernelSettings:
    """What a kernel is started with: one value shared by `CodeExecutor`, `KernelPool` and the MCP
    server's configuration, checked when it is made.

    Attributes:
        workspace: The kernel's working directory, the only place it can write; must exist (kept
            resolved).
        sandbox: ``"auto"`` (bubblewrap; a start refuses if it is not usable), a `SandboxConfig`, or
            None for no sandbox (code can then do anything your user can).
        env: Extra environment variables for the kernel (the host's own are not passed on).
        limits: The kernel's resource limits and one execution's output cap.
        tools_dir: Where `generate_mcp_sources` writes the typed tool packages, mounted read-only
            and importable (None: none); kept absolute, not resolved: each start checks it again.
        skills_dir: Where skills are saved, mounted read-only and importable as ``skills`` (None:
            none); kept like ``tools_dir``.
        network: Whether the kernel is started ready for a network proxy (the forwarder, its
            environment and the proxy socket): what a `Network` policy needs in the kernel. The
            policy itself is each executor's.
    """

    workspace: Path = field(default_factory=Path)
    sandbox: SandboxConfig | Literal["auto"] | None = "auto"
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType[str, str]({}))
    limits: Limits = field(default_factory=lambda: Limits())
    tools_dir: Path | None = Path("mcptools")
    skills_dir: Path | None = None
    network: bool = False

    def __post_init__(self) -> None:
        given = cast("object", self.workspace)
        if not isinstance(given, str | os.PathLike):
            raise UsageError(f"KernelSettings.workspace must be a path, got {given!r}")
        path = cast("str | os.PathLike[str]", given)
        workspace = Path(path).resolve()
        if not workspace.is_dir():
            raise UsageError(f"workspace {os.fspath(path)!r} is not an existing directory; create it first")
        sandbox = cast("object", self.sandbox)
        if sandbox is not None and sandbox != "auto" and not isinstance(sandbox, SandboxConfig):
            raise UsageError(f"sandbox must be 'auto', a SandboxConfig or None, got {sandbox!r}")
        limits = cast("object", self.limits)
        if not isinstance(limits, Limits):
            raise UsageError(f"limits must be a Limits, got {limits!r}")
        network = cast("object", self.network)
        if not isinstance(network, bool):
            raise UsageError(
                f"network must be True or False (whether the kernel is started ready for a network proxy), "
                f"got {network!r}; the policy, Network(...), is each CodeExecutor's"
            )
        # Normalized in place (frozen: through object.__setattr__), so that equal settings compare equal.
        if isinstance(sandbox, SandboxConfig):
            sandbox = replace(
                sandbox,
                ro_paths=tuple(Path(p) for p in sandbox.ro_paths),
                rw_paths=tuple(Path(p) for p in sandbox.rw_paths),
            )
            object.__setattr__(self, "sandbox", sandbox)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "env", MappingProxyType(_check_env(self.env)))
        object.__setattr__(self, "tools_dir", _dir_given(self.tools_dir, "tools_dir"))
        object.__setattr__(self, "skills_dir", _dir_given(self.skills_dir, "skills_dir"))

    def differences(self, other: KernelSettings, *, dirs: bool = True) -> list[str]:
        """The names of the settings that differ; ``dirs=False`` leaves out the workspace and the
        tools directory (a pool with separate workspaces gives each kernel its own)."""
        names = [item.name for item in fields(self)]
        if not dirs:
            names = [name for name in names if name not in ("workspace", "tools_dir")]
        # getattr with a default: settings extended with one more mount compare with plain ones.
        return [name for name in names if getattr(self, name) != getattr(other, name, None)]


def resolved_sandbox(settings: KernelSettings) -> SandboxConfig | None:
    """The sandbox of settings a source resolved (`KernelSource.settings_for`), never ``"auto"``."""
    sandbox = settings.sandbox
    if sandbox == "auto":
        raise RuntimeError("the kernel settings were not resolved by their source (sandbox='auto')")
    return sandbox


def take_settings(own: KernelSettings, requested: KernelSettings, *, owner: str, dirs: bool = True) -> KernelSettings:
    """``own``, the settings of a kernel source, for an executor that asked for ``requested``.

    A setting the executor left at its default takes the source's; one it set to another value is
    an error rather than a kernel started some other way than asked. ``network`` has no default to
    take (an executor without a `Network` cannot serve a kernel started for one, nor the other way
    round), and neither has a source's ``sandbox=None``: the default ``"auto"`` asks for the
    sandbox, so running without one must be asked for on the executor too. ``dirs=False`` leaves
    out the workspace and the tools directory (a pool with separate workspaces gives each kernel
    its own): the requested ones are kept.

    Raises:
        UsageError: The settings conflict; the message names them and the fix.
    """
    # The workspace's default is the current directory: given as ".", it is taken as left out.
    default = KernelSettings()
    # Never taken by default: an executor left at sandbox="auto" asks for the sandbox, and one
    # without a Network cannot serve a kernel started for one (nor the other way round).
    unsandboxed = own.sandbox is None
    strict = {"network", *(["sandbox"] if unsandboxed else [])}
    conflicts = [
        name
        for name in own.differences(requested, dirs=dirs)
        if name in strict or getattr(requested, name, None) != getattr(default, name, None)
    ]
    problems: list[str] = []
    if others := [name for name in conflicts if name not in strict]:
        problems.append(
            f"the executor's kernel settings differ from its {owner}'s in {', '.join(others)}: leave them out "
            f"of CodeExecutor(...) to take the {owner}'s, or give the {owner} the same"
        )
    if "sandbox" in conflicts and unsandboxed:
        problems.append(
            f"the {owner}'s kernels run without a sandbox: give the executor sandbox=None too to accept that, "
            f"or use a {owner} with the sandbox"
        )
    if "network" in conflicts:
        fix = "give the executor a Network(...)" if own.network else "drop the executor's network="
        problems.append(
            f"the {owner}'s kernels are started {'with' if own.network else 'without'} a network forwarder: "
            f"{fix}, or use another {owner}"
        )
    if problems:
        raise UsageError("; ".join(problems))
    if not dirs:
        return replace(own, workspace=requested.workspace, tools_dir=requested.tools_dir)
    return own
