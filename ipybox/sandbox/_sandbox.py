"""The OS sandbox the kernel runs in: bubblewrap on Linux.

The kernel sees a read-only system (``/usr``, ``/etc`` minus its secrets, the Python installation),
its own writable workspace, a private ``/tmp``, no network at all, no capabilities and no way to
create namespaces. Nothing else of the host's filesystem is mounted: home directories, other
projects and ``.env`` files are simply absent.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ipybox._exceptions import SandboxUnavailable, UsageError
from ipybox._settings import SandboxConfig

from ._kerneluid import KernelUid
from ._seccomp import filter_pipe, syscall_filter

__all__ = ("bwrap_argv", "bwrap_probe_argv", "resolve_sandbox", "sandbox_filter_fd")

# Secrets under /etc that are world-readable on some systems; masked whatever their mode.
_ETC_SECRETS = ("shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "security/opasswd")
_ETC_SECRET_DIRS = ("ssh", "ssl/private", "sudoers.d")
# Top-level system directories; on merged-/usr systems most are symlinks into /usr.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /proc entries that act on the whole host rather than on the sandbox's processes (see _proc_covers).
_PROC_HOST_WIDE = ("sys", "sysrq-trigger", "pressure", "irq", "bus", "fs", "acpi", "scsi", "driver", "tty")
# How long the one-off probe of bwrap may take before we call it broken.
_PROBE_TIMEOUT = 10.0


def resolve_sandbox(sandbox: SandboxConfig | Literal["auto"] | None) -> SandboxConfig | None:
    """Turn the ``sandbox=`` argument into a config, checking the backend works here.

    Raises:
        SandboxUnavailable: The sandbox cannot run on this machine; the message says how to
            install it or how to opt out with ``sandbox=None``.
        UsageError: ``sandbox`` is not a SandboxConfig, ``"auto"`` or None.
    """
    if sandbox is None:
        return None
    if sandbox == "auto":
        sandbox = SandboxConfig()
    if not isinstance(sandbox, SandboxConfig):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"sandbox must be 'auto', a SandboxConfig or None, got {sandbox!r}")
    _check_bwrap()
    return sandbox


@functools.cache
def _bwrap_path() -> str:
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(
            "bwrap",
            f"there is no sandbox backend for {sys.platform!r} yet; "
            "pass sandbox=None to run the kernel without a sandbox, knowing that code can then "
            "do anything your user can",
        )
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bwrap",
            "bubblewrap is not installed; install it (Debian/Ubuntu: 'apt-get install bubblewrap', "
            "Fedora: 'dnf install bubblewrap') or pass sandbox=None to run the kernel without a "
            "sandbox, knowing that code can then do anything your user can",
        )
    return path


@functools.cache
def _check_bwrap() -> None:
    bwrap = _bwrap_path()
    probe = [bwrap, *_isolation_flags(), "--ro-bind", "/", "/"]
    # With the seccomp filter: a kernel built without seccomp support fails here, not at kernel start.
    fd = sandbox_filter_fd()
    if fd is not None:
        probe += ["--seccomp", str(fd)]
    try:
        done = subprocess.run(
            [*probe, "--", "true"],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=False,
            pass_fds=() if fd is None else (fd,),
        )
    except subprocess.TimeoutExpired:
        raise SandboxUnavailable("bwrap", "a test run of bwrap did not finish") from None
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        raise SandboxUnavailable(
            "bwrap",
            f"a test run of bwrap failed ({done.stderr.strip()}); user namespaces may be disabled "
            "(check 'sysctl kernel.unprivileged_userns_clone' or AppArmor's userns restriction), "
            "or pass sandbox=None to run without a sandbox",
        )


def bwrap_probe_argv(binds: Sequence[str]) -> list[str]:
    """A bwrap command line that only starts, with the host's root read-only and ``binds`` over it."""
    return [_bwrap_path(), *_isolation_flags(), "--ro-bind", "/", "/", *binds, "--", "true"]


def sandbox_filter_fd() -> int | None:
    """A descriptor holding the sandbox's seccomp filter, for `bwrap_argv`'s ``seccomp_fd``; None
    where ipybox has no syscall table for this machine. The caller closes it once bwrap started."""
    program = syscall_filter()
    return filter_pipe(program) if program is not None else None


def _etc_secrets(*, by_mode: bool = True) -> tuple[list[str], list[str]]:
    """Files and directories under /etc to mask: the known secrets, and with ``by_mode`` everything
    that is not world-readable. A kernel that reads as the host's root needs the latter, since file
    modes alone would not stop it; one with a uid of its own is stopped by them."""
    files = [f"/etc/{name}" for name in _ETC_SECRETS if os.path.isfile(f"/etc/{name}")]
    dirs = [f"/etc/{name}" for name in _ETC_SECRET_DIRS if os.path.isdir(f"/etc/{name}")]
    pending = ["/etc"] if by_mode else []
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            # Most of /etc is symlinks (alternatives, rc*.d). Neither followed nor masked, and the
            # directory entry's type says so without a stat: this halves the scan's time.
            if entry.is_symlink():
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                (pending if info.st_mode & stat.S_IROTH else dirs).append(entry.path)
            elif stat.S_ISREG(info.st_mode) and not info.st_mode & stat.S_IROTH:
                files.append(entry.path)
    return sorted(set(files)), sorted(set(dirs) - set(files))


def _isolation_flags() -> list[str]:
    return [
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        # --unshare-all only *tries* a user namespace; --disable-userns needs one for sure.
        "--unshare-user",
        # As root, bwrap leaves every capability inside the namespace; without this, code can
        # remount a read-only bind read-write and write to the host.
        "--cap-drop",
        "ALL",
        "--disable-userns",
    ]


def _proc_covers() -> list[str]:
    """Mounts that make the host-wide parts of the sandbox's ``/proc`` read-only.

    The kernel runs as the host's uid 0 without capabilities, and several ``/proc`` files check only
    the uid: ``/proc/sys`` (``kernel.core_pattern`` set to ``|/workspace/script`` runs that script as
    host root on the next crash; ``kernel.modprobe``, ``vm.drop_caches`` and the rest change the
    whole host), ``/proc/sysrq-trigger`` (reboot, crash), ``/proc/pressure`` (kernel-side
    triggers). bwrap covers ``/proc/sys`` only if its own ``access()`` probe says it is writable,
    and the directory's mode makes that probe fail, so cover them here. The source is the host's
    ``/proc``: bind sources always are; read-only, these files show what they show everywhere.
    """
    argv: list[str] = []
    for name in _PROC_HOST_WIDE:
        argv += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    return argv


def _python_roots() -> list[Path]:
    """Directories the kernel's interpreter and packages live in."""
    import ipybox_kernel

    roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    roots |= {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    # An editable install puts the package next to the sources, outside the venv.
    kernel_pkg = Path(ipybox_kernel.__file__).resolve().parent
    if not any(kernel_pkg.is_relative_to(root) for root in roots):
        roots.add(kernel_pkg)
    return sorted(roots)


def bwrap_argv(
    config: SandboxConfig,
    *,
    workspace: Path,
    run_dir: Path,
    tools_dir: Path | None,
    hidden: Sequence[Path] = (),
    tmp_size: int | None = None,
    seccomp_fd: int | None = None,
    socket_dir: str | None = None,
    tools_dir_fd: int | None = None,
    host_dirs: Sequence[tuple[Path, int]] = (),
    own_uid: KernelUid | None = None,
) -> list[str]:
    """The bwrap command line that runs a program with the given mounts (the program follows ``--``).

    ``seccomp_fd`` is a descriptor the child inherits that yields `syscall_filter` (see
    `sandbox_filter_fd`). ``tools_dir_fd``, a descriptor of ``tools_dir`` the child inherits, is
    what gets mounted there when given; ``host_dirs`` are further host-owned directories (the skills
    directory), each mounted read-only from a descriptor the child inherits. ``socket_dir`` is
    created in the sandbox's ``/tmp`` for the kernel's sockets. With ``own_uid`` (the kernel's own
    host uid), every source bwrap could not reach as that uid is staged, writable ones idmapped.
    """

    def ro(source: Path | str) -> str:
        return own_uid.ro(source) if own_uid is not None else str(source)

    def rw(source: Path | str) -> str:
        return own_uid.rw(source) if own_uid is not None else str(source)

    def ro_fd(fd: int, dest: Path) -> list[str]:
        if own_uid is not None:
            # bwrap resolves an fd's path again with its own uid: root stages it instead.
            return ["--ro-bind", own_uid.ro_fd(fd), str(dest)]
        return ["--ro-bind-fd", str(fd), str(dest)]

    argv = [_bwrap_path(), *_isolation_flags()]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", ro(top), top]
    argv += ["--ro-bind", ro("/etc"), "/etc"]
    empty = run_dir / "empty"
    empty.touch()
    # Under its own uid the kernel cannot read what is not world-readable: no scan, and no race
    # with a file that is deleted between the scan and bwrap's mount over it.
    files, dirs = _etc_secrets(by_mode=own_uid is None)
    for path in files:
        # An empty regular file: a device node like /dev/null would be unreadable (nodev).
        argv += ["--ro-bind", ro(empty), path]
    for path in dirs:
        argv += ["--tmpfs", path, "--remount-ro", path]
    # /tmp and /dev/shm are tmpfs, held in host memory: cap them, and make the rest of the /dev
    # tmpfs read-only (device nodes stay usable), or a write there could fill the host's RAM.
    size = ["--size", str(tmp_size)] if tmp_size is not None else []
    argv += ["--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += ["--proc", "/proc", *_proc_covers(), *size, "--tmpfs", "/tmp"]
    for root in _python_roots():
        argv += ["--ro-bind", ro(root), str(root)]
    for path in config.ro_paths:
        argv += ["--ro-bind", ro(path), str(path)]
    argv += ["--bind", rw(workspace), str(workspace)]
    for path in config.rw_paths:
        argv += ["--bind", rw(path), str(path)]
    if tools_dir is not None:
        # Mounted after the workspace, so a tools dir inside the workspace stays read-only; from a
        # descriptor where there is one, so that what was checked is what gets mounted.
        if tools_dir_fd is not None:
            argv += ro_fd(tools_dir_fd, tools_dir)
        else:
            argv += ["--ro-bind", ro(tools_dir), str(tools_dir)]
    for path, fd in host_dirs:
        argv += ro_fd(fd, path)
    for path in hidden:
        argv += ["--tmpfs", str(path), "--remount-ro", str(path)]
    # The connection file and the empty file above: the kernel reads them, it writes nothing here.
    argv += ["--ro-bind", ro(run_dir), str(run_dir)]
    if socket_dir is not None:
        argv += ["--dir", socket_dir]
    # bwrap's root is a tmpfs in host memory with no size cap; nothing needs to write to it once
    # the mount points exist.
    argv += ["--remount-ro", "/", "--chdir", str(workspace), "--"]
    return argv
