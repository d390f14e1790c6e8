"""A pids cgroup per kernel, where the host offers one: bounds fork bombs.

RLIMIT_NPROC does nothing for root, and the sandboxed kernel runs as the host's root when ipybox
does. A pids cgroup counts every process and thread of the sandbox whatever its uid. It needs a
writable pids controller (cgroup v1 ``pids`` or cgroup v2 with ``pids`` enabled); without one the
kernel runs without a process limit, and `PidsCgroup.create` says so by returning None.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
from pathlib import Path

import anyio

__all__ = ("PidsCgroup", "pids_cgroups_available")

logger = logging.getLogger(__name__)

# A killed sandbox's processes are reaped within milliseconds; the cgroup can only be removed then.
_REMOVE_WAIT = 2.0
# How often to look whether the cgroup has emptied (the kernel offers no event for it on v1).
_REMOVE_POLL = 0.01


def _pids_parent() -> Path | None:
    """The cgroup directory under which this process may create a pids-limited child."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
            if (candidate / "cgroup.procs").exists():
                return candidate
    for line in lines:
        if line.startswith("0::"):
            candidate = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            try:
                if "pids" in (candidate / "cgroup.subtree_control").read_text().split():
                    return candidate
            except OSError:
                return None
    return None


def pids_cgroups_available() -> bool:
    """Whether this process can create pids-limited cgroups here."""
    parent = _pids_parent()
    return parent is not None and os.access(parent, os.W_OK)


class PidsCgroup:
    """One cgroup that caps the number of processes and threads of one sandboxed kernel."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """Create the cgroup, or return None when the host has no usable pids controller."""
        parent = _pids_parent()
        if parent is None:
            return None
        path = parent / f"ipybox-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(max_pids))
        except OSError as exc:
            logger.info("no pids cgroup for the kernel (%s); processes are not limited", exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def add(self, pid: int) -> None:
        """Put a process (and so everything it starts from now on) into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def _pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    async def remove(self) -> None:
        """Kill what is left in the cgroup and remove it."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with anyio.move_on_after(_REMOVE_WAIT):
            while True:
                try:
                    self.path.rmdir()
                    return
                except FileNotFoundError:
                    return
                except OSError:
                    await anyio.sleep(_REMOVE_POLL)
        logger.warning("could not remove the kernel's pids cgroup %s", self.path)
