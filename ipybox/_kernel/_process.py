"""Finding the kernel's interpreter and, inside the sandbox, its process."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

__all__ = ("bytecode_missing", "close_fd", "default_python", "sandboxed_kernel_pid")

# bwrap, bwrap's PID-namespace init, then the kernel: never deeper than this below our child.
_SANDBOX_DEPTH = 4


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


def close_fd(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def default_python() -> list[str]:
    """The kernel's interpreter command line.

    ``-P``: ``python -m`` would put the working directory (the workspace, which kernel code writes)
    first on ``sys.path``, so a planted ``ipybox_kernel.py`` or ``argparse.py`` would run as the
    launcher. The launcher appends the workspace at the end of ``sys.path`` instead.
    """
    return [sys.executable, "-P"]
