"""What a kernel gets from its executor's host side: its environment, its read-only mounts, and the
executor's private directory (tool socket, installed packages, import root), restored if deleted."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ipybox._exceptions import KernelStartError, UsageError
from ipybox._manifest import MANIFEST_DIR
from ipybox._mounts import ReadOnlyMount
from ipybox._settings import SandboxConfig
from ipybox._tooldir import prepare_tools_dir, tools_dir_path
from ipybox._toolserver._server import ToolServer
from ipybox_kernel._protocol import SOCKET_ENV, TOKEN_ENV, TOOLS_DIR_ENV

from . import bytecode_missing

__all__ = (
    "IMPORT_ROOT",
    "check_bytecode",
    "hidden_paths",
    "kernel_env",
    "kernel_sandbox",
    "kernel_writable",
    "link_tools_dir",
    "new_home",
    "resolve_tools_dir",
    "restore_home",
)

logger = logging.getLogger(__name__)

# Variables the kernel needs from the host's environment; nothing else is passed on.
_PASSED_ENV = ("LANG", "LC_ALL", "TZ")
# The executor's private directory that holds only links to the tools and skills directories, for PYTHONPATH.
IMPORT_ROOT = "imports"


def kernel_env(
    home: Path,
    token: str,
    *,
    tools: Path | None,
    sandboxed: bool,
    extra: Mapping[str, str],
    mounts: Sequence[tuple[ReadOnlyMount, Path]] = (),
) -> dict[str, str]:
    """The kernel's whole environment: what Python needs, the tool channel, and ``extra``."""
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
            "PYTHONNOUSERSITE": "1",
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }
    )
    # Host-owned directories only: the workspace is appended to the end of sys.path by the
    # kernel's launcher, so nothing planted there shadows the tools or installed packages.
    paths = [str(home / "packages")]
    if tools is not None or mounts:
        paths.insert(0, str(home / IMPORT_ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if tools is not None:
        # Where ipybox_kernel.search_tools reads the generated packages (mounted read-only).
        env[TOOLS_DIR_ENV] = str(tools)
    for mount, path in mounts:
        # Where ipybox_kernel finds it (the skills: list_skills), mounted read-only.
        env[mount.env] = str(path)
    env[SOCKET_ENV] = str(home / "tools.sock")
    env[TOKEN_ENV] = token
    if sandboxed:
        # ipykernel's parent poller would see the PID namespace's init as its parent and exit;
        # the sandbox's --die-with-parent does that job instead.
        env["JPY_PARENT_PID"] = "1"
        env["HOME"] = "/tmp"
        env["IPYTHONDIR"] = "/tmp/.ipython"
    env.update(extra)
    return env


def kernel_sandbox(
    sandbox: SandboxConfig | None, home: Path, *, tools: Path | None, imports: bool = False
) -> SandboxConfig | None:
    """``sandbox`` with the executor's private paths added read-only (the import root with ``tools``,
    or when ``imports`` says a mount is linked into it)."""
    if sandbox is None:
        return None
    # The socket, the packages and the import root are host-owned: the kernel may use them, not
    # change them. Each is mounted, not the directory: a mount holds its inode, so the running
    # kernel keeps its tools when a /tmp cleaner deletes the directory.
    extra = [home / "tools.sock", home / "packages"]
    if tools is not None or imports:
        extra.append(home / IMPORT_ROOT)
    return dataclasses.replace(sandbox, ro_paths=[*sandbox.ro_paths, *extra])


def kernel_writable(workspace: Path, sandbox: SandboxConfig | None) -> list[Path]:
    """Host directories kernel code can write to (where it could plant symlinks): the workspace and
    the sandbox's writable paths."""
    extra = [Path(p) for p in sandbox.rw_paths] if sandbox is not None else []
    return [workspace, *extra]


def new_home(tools: Path | None) -> Path:
    """A new private directory for one kernel: its packages directory and its import root."""
    home = Path(tempfile.mkdtemp(prefix="ipybox-"))
    try:
        (home / "packages").mkdir()
        if tools is not None:
            link_tools_dir(home, tools)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    return home


def resolve_tools_dir(given: Path, *, kernel_writable: Sequence[Path]) -> Path:
    """The real tools directory, checked; created if it is missing where the kernel could write.

    A missing one inside the workspace is created, so that the sandbox mounts it read-only: the
    kernel would otherwise create it, manifest included, for the next executor to trust. Its
    manifest directory too, so that it is hidden even when sources are generated while the kernel
    runs (the mount is live). Checked at every start: a symlink planted since would redirect the
    mount and the host's writes.

    Raises:
        UsageError: The tools directory cannot be trusted; the message names the fix.
    """
    real = tools_dir_path(given, kernel_writable=kernel_writable)
    reachable = any(real.is_relative_to(os.path.realpath(w)) for w in kernel_writable)
    if reachable or os.path.lexists(real):
        real = prepare_tools_dir(given, kernel_writable=kernel_writable)
    # else: out of the kernel's reach, and nothing to mount until sources are generated there.
    return real


def link_tools_dir(home: Path, tools: Path, *, name: str | None = None) -> None:
    """Link the tools directory (or the skills directory, as package ``name``) into the import
    root of ``home``.

    The kernel imports the tools package from a directory holding nothing else, not from the
    tools directory's parent: that is often the workspace, where kernel code can plant a
    ``pydantic.py`` that would then shadow what generated modules import.
    """
    imports = home / IMPORT_ROOT
    imports.mkdir(mode=0o700, exist_ok=True)
    link = imports / (name or tools.name)
    if not link.is_symlink() or os.readlink(link) != str(tools):
        link.unlink(missing_ok=True)
        link.symlink_to(tools, target_is_directory=True)


def hidden_paths(tools: Path | None) -> list[Path]:
    """Paths under the mounted tools directory that the kernel must not see."""
    # The manifest holds server parameters (commands, URLs, maybe secrets): host only.
    if tools is not None and (tools / MANIFEST_DIR).is_dir():
        return [tools / MANIFEST_DIR]
    return []


def restore_home(home: Path, tools: ToolServer) -> None:
    """Recreate the executor's private directory and tool socket if they were deleted (a ``/tmp``
    cleaner), so that the next kernel can mount them.

    Raises:
        KernelStartError: They cannot be restored; the message names the cause.
    """
    try:
        try:
            os.mkdir(home, 0o700)
        except FileExistsError:
            info = os.lstat(home)
            # A /tmp name: after a deletion anyone may have created it, and it would hold the
            # tool socket and the kernel's importable packages.
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise KernelStartError(
                    f"the executor's private directory {str(home)!r} was replaced by one this process "
                    f"does not own exclusively (uid {info.st_uid}, mode {oct(info.st_mode)}); remove it, "
                    "or start a new CodeExecutor"
                ) from None
        (home / "packages").mkdir(exist_ok=True)
        tools.rebind()
    except (OSError, UsageError) as exc:
        raise KernelStartError(
            f"the executor's private directory {str(home)!r} (tool socket, packages) was deleted and "
            f"cannot be recreated ({exc}); free the cause, or start a new CodeExecutor"
        ) from exc


@functools.cache
def check_bytecode() -> None:
    """Warn once per process when sandboxed kernels will compile ipykernel & co. on every start."""
    if bytecode_missing():
        logger.warning(
            "the Python environment has no compiled bytecode for ipykernel; each sandboxed kernel start "
            "compiles it again (~0.3 s). Install with bytecode: pip does by default, uv needs "
            "'--compile-bytecode' (or UV_COMPILE_BYTECODE=1); or run 'python -m compileall' on site-packages."
        )
