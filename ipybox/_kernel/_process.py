"""The kernel's process: its command line, its stderr, and finding it inside the sandbox."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import resource
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc

from ipybox._settings import Limits

from ._messages import message_limit

__all__ = (
    "StderrTail",
    "bytecode_missing",
    "close_fd",
    "default_python",
    "launcher_argv",
    "limit_sandbox_init",
    "live_tasks",
    "sandboxed_kernel_pid",
    "tree_cpu_seconds",
    "wait_for_exit",
)

logger = logging.getLogger(__name__)

# Signals queued and not yet delivered, for the whole sandbox (RLIMIT_SIGPENDING). The kernel counts
# them per user in every enclosing user namespace and compares each sender's own limit with that
# total, so what the sandbox queues is taken from the host's user too (root has no exemption for
# real-time signals; the default limit is ~96,000 here). Python queues a handful at most.
SIGPENDING = 1024
# bwrap, bwrap's PID-namespace init, then the kernel: never deeper than this below our child.
_SANDBOX_DEPTH = 4
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Bytes of the kernel's raw stderr kept for error messages.
_STDERR_TAIL = 8192


def _rlimits(limits: Limits) -> list[tuple[str, int, int]]:
    """The resource limits of every process in the sandbox: launcher flag, resource, value."""
    found = [
        ("--memory", resource.RLIMIT_AS, limits.memory),
        ("--cpu", resource.RLIMIT_CPU, limits.cpu_seconds),
        ("--files", resource.RLIMIT_NOFILE, limits.open_files),
        ("--sigpending", resource.RLIMIT_SIGPENDING, SIGPENDING),
    ]
    return [(flag, which, value) for flag, which, value in found if value is not None]


def launcher_argv(python: Sequence[str], connection_file: str, ready_fd: int, limits: Limits) -> list[str]:
    """The command line of ipybox_kernel._launch, which applies ``limits`` and starts the kernel."""
    argv = [*python, "-m", "ipybox_kernel._launch", "-f", connection_file, "--ready-fd", str(ready_fd)]
    for flag, _, value in _rlimits(limits):
        argv += [flag, str(value)]
    return [*argv, "--output", str(limits.output_chars), "--message-bytes", str(message_limit(limits.output_chars))]


class StderrTail:
    """The last bytes the kernel process wrote to its stderr, for error messages."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

    async def read(self, stream: anyio.abc.ByteReceiveStream) -> None:
        """Keep the tail of ``stream`` until it ends."""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            while True:
                chunk = await stream.receive()
                self._chunks.append(chunk)
                self._size += len(chunk)
                while self._size > _STDERR_TAIL and len(self._chunks) > 1:
                    self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", "replace")


async def wait_for_exit(pid: int) -> None:
    """Return once the process ``pid`` (not our child) has exited."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        # A pidfd turns readable when its process exits.
        await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def bytecode_missing() -> bool:
    """Whether ipykernel was installed without compiled bytecode.

    A sandboxed kernel sees the environment read-only, so it cannot cache what it compiles and
    compiles IPython, ipykernel and their dependencies from source on every start.
    """
    spec = importlib.util.find_spec("ipykernel")
    if spec is None or spec.origin is None:
        return False
    cached = Path(importlib.util.cache_from_source(str(Path(spec.origin).with_name("kernelapp.py"))))
    return not cached.exists()


def sandboxed_kernel_pid(root: int, executable: str) -> int | None:
    """The host pid of the kernel process below ``root`` (our bwrap child): the first descendant
    running ``executable``. None if there is none."""
    target = os.path.realpath(executable)
    pids = [root]
    for _ in range(_SANDBOX_DEPTH):
        below: list[int] = []
        for pid in pids:
            try:
                if os.readlink(f"/proc/{pid}/exe") == target:
                    return pid
            except OSError:
                continue
            below += _children(pid)
        pids = below
    return None


def launcher_rlimits(limits: Limits) -> list[tuple[int, int]]:
    """The resource limits (resource, value) a launcher that becomes bwrap sets on itself, so that the
    sandbox's init has them from its start (see `limit_sandbox_init`)."""
    return [(which, value) for _, which, value in _rlimits(limits)]


def limit_sandbox_init(kernel_pid: int, limits: Limits) -> None:
    """Give the sandbox's init (the kernel's parent) the resource limits the launcher gave the kernel.

    Kernel code can write to the init's memory (same uid) and make it do what it likes; with the
    limits it started with (the host's), it could queue signals or hold memory past them. Called
    before any kernel code runs. ipybox without root may be refused by a security module; that
    leaves the init as it was, and is logged.
    """
    try:
        init = int(Path(f"/proc/{kernel_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        for _, which, value in _rlimits(limits):
            resource.prlimit(init, which, (value, value))
    except (OSError, IndexError, ValueError) as exc:
        logger.warning("could not apply the resource limits to the sandbox's init: %s", exc)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        pass  # a kernel built without CONFIG_PROC_CHILDREN: look at every process's parent
    except OSError:
        return []
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process below it (each thread's, and those of
    the children they waited for), read from /proc.

    Children are found through every thread's ``children`` file: a process started by a thread
    other than the main one is listed only in that thread's. What a process reaped without being
    waited for (its parent ignores SIGCHLD) used is lost when it goes.
    """
    ticks = 0
    pids = [root]
    while pids:
        pid = pids.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            # utime, stime, cutime, cstime: fields 14-17 of proc_pid_stat(5), counted from the state.
            ticks += sum(int(value) for value in fields[11:15])
            tasks = os.listdir(f"/proc/{pid}/task")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        for task in tasks:
            with contextlib.suppress(OSError, ValueError):
                pids += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return ticks / _CLOCK_TICKS


def live_tasks(root: int) -> frozenset[tuple[int, int]]:
    """Every live thread of ``root`` and of every process below it, as (host tid, start time in clock
    ticks since boot): the pair names one thread for good, since tids are reused but never within a tick.

    Zombies (exited, not yet reaped) are left out: they run nothing. Read from /proc like
    `tree_cpu_seconds`, so a thread that starts and ends while the walk runs may be missed; callers
    that need every thread compare two walks (see ipybox._kernel._leftrunning).
    """
    found: set[tuple[int, int]] = set()
    pids = [root]
    while pids:
        pid = pids.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for task in tasks:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
                # state, then starttime: fields 3 and 22 of proc_pid_stat(5), counted from the state.
                if fields[0] not in ("Z", "X"):
                    found.add((int(task), int(fields[19])))
                pids += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return frozenset(found)


def close_fd(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def default_python() -> list[str]:
    """The kernel's interpreter command line.

    ``-P``: ``python -m`` would put the working directory (the workspace, which kernel code writes)
    first on ``sys.path``, so a planted ``ipybox_kernel.py`` or ``argparse.py`` would run as the
    launcher. The launcher appends the workspace at the end of ``sys.path`` instead.

    The interpreter's directory is resolved (a path through ``..`` or a directory that exists only
    on the host would not exist in the sandbox), its file name kept: a venv's ``python`` is a
    symlink, and its own path is how it finds the venv.
    """
    executable = Path(sys.executable)
    return [str(executable.parent.resolve() / executable.name), "-P"]
