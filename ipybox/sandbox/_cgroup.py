"""The cgroups one kernel's sandbox runs in, where the host offers them: its processes and memory.

RLIMIT_NPROC does nothing for root, and the sandboxed kernel runs as the host's root when ipybox
does; RLIMIT_AS bounds each process alone, not the sandbox, and not its tmpfs mounts. A pids cgroup
counts every process and thread of the sandbox whatever its uid; a memory cgroup charges every page
its processes use, the kernel memory they cause and the tmpfs pages they write. Each needs a
writable controller (cgroup v1 ``pids``/``memory``, or cgroup v2 with the controller enabled for
our cgroup's children); where one is missing the kernel runs without that bound, and
`SandboxCgroup.create` logs a warning naming what is not limited.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
from pathlib import Path
from typing import Literal

import anyio

__all__ = ("SandboxCgroup", "cgroup_available", "pids_cgroups_available")

logger = logging.getLogger(__name__)

Controller = Literal["pids", "memory"]
# What the sandbox goes without when a controller is missing (for the start's warning).
_UNBOUNDED: dict[Controller, str] = {
    "pids": "the number of processes and threads (Limits.processes) is not limited",
    "memory": "the memory of the sandbox as a whole (Limits.memory) is not limited, only each process's address space",
}
# A killed sandbox's processes are reaped within milliseconds; the cgroup can only be removed then.
_REMOVE_WAIT = 2.0
# How often to look whether the cgroup has emptied (the kernel offers no event for it on v1).
_REMOVE_POLL = 0.01
_UNIFIED = Path("/sys/fs/cgroup")
# Controllers whose absence was already reported by this process: a pool starts many kernels.
_reported: set[Controller] = set()


def _parent(controller: Controller) -> tuple[Path, bool] | None:
    """The cgroup directory under which this process may create a child with ``controller``, and
    whether it is cgroup v2."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            candidate = _UNIFIED / controller / path.lstrip("/")
            if (candidate / "cgroup.procs").exists():
                return candidate, False
    for line in lines:
        if line.startswith("0::"):
            candidate = _UNIFIED / line[3:].lstrip("/")
            try:
                if controller in (candidate / "cgroup.subtree_control").read_text().split():
                    return candidate, True
            except OSError:
                return None
    return None


def cgroup_available(controller: Controller) -> bool:
    """Whether this process can create cgroups with ``controller`` here."""
    found = _parent(controller)
    return found is not None and os.access(found[0], os.W_OK)


def pids_cgroups_available() -> bool:
    """Whether this process can create pids-limited cgroups here."""
    return cgroup_available("pids")


def _limit_files(controller: Controller, value: int, v2: bool) -> list[tuple[str, str]]:
    """The files that set ``controller``'s limit to ``value``, in order; the first must exist."""
    if controller == "pids":
        return [("pids.max", str(value))]
    if v2:
        # Swap would let the sandbox hold more than the limit; no swap for it at all.
        return [("memory.max", str(value)), ("memory.swap.max", "0")]
    # v1 charges kernel memory and tmpfs pages to the same counter; memsw (RAM and swap together)
    # exists only with swap accounting, and may not be lower than the RAM limit, so it comes second.
    return [("memory.limit_in_bytes", str(value)), ("memory.memsw.limit_in_bytes", str(value))]


class SandboxCgroup:
    """The cgroup directories of one sandbox (one per controller on v1, a single one on v2)."""

    def __init__(self, dirs: dict[Controller, Path], memory_limit: int | None) -> None:
        self.dirs = dirs
        self.memory_limit = memory_limit

    @property
    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files the sandbox's first process writes its pid to, each once."""
        return sorted({path / "cgroup.procs" for path in self.dirs.values()})

    @classmethod
    def create(cls, *, processes: int | None, memory: int | None) -> SandboxCgroup:
        """Make the cgroups for the limits that are set; warn (once per process) about each
        controller the host does not offer. The result may hold no directory at all."""
        made: dict[Controller, Path] = {}
        name = f"ipybox-{os.getpid()}-{secrets.token_hex(4)}"
        limits: dict[Controller, int | None] = {"pids": processes, "memory": memory}
        wanted: list[tuple[Controller, int]] = [(c, v) for c, v in limits.items() if v is not None]
        for controller, value in wanted:
            found = _parent(controller)
            problem = "the host has no writable cgroup with this controller"
            if found is not None:
                parent, v2 = found
                path = parent / name
                try:
                    if not path.exists():
                        path.mkdir()
                    files = _limit_files(controller, value, v2)
                    (path / files[0][0]).write_text(files[0][1])
                    for file, text in files[1:]:
                        with contextlib.suppress(OSError):
                            (path / file).write_text(text)
                    made[controller] = path
                    continue
                except OSError as exc:
                    problem = str(exc)
                    if path not in made.values():
                        with contextlib.suppress(OSError):
                            path.rmdir()
            if controller not in _reported:
                _reported.add(controller)
                logger.warning(
                    "no %s cgroup for the kernel (%s): %s; run ipybox in a cgroup whose %s controller it "
                    "may write (cgroup v1, or v2 with it in cgroup.subtree_control, e.g. a systemd unit "
                    "with Delegate=yes)",
                    controller,
                    problem,
                    _UNBOUNDED[controller],
                    controller,
                )
        return cls(made, memory if "memory" in made else None)

    def oom_kills(self) -> int:
        """How many processes of the sandbox the kernel's OOM killer has ended (0 without a memory
        cgroup)."""
        path = self.dirs.get("memory")
        if path is None:
            return 0
        for file in ("memory.events", "memory.oom_control"):
            try:
                text = (path / file).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def _pids(self) -> list[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
        return sorted(pids)

    async def remove(self) -> None:
        """Kill what is left in the cgroups and remove them."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in sorted(set(self.dirs.values())):
            with anyio.move_on_after(_REMOVE_WAIT) as waited:
                while True:
                    try:
                        path.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        await anyio.sleep(_REMOVE_POLL)
            if waited.cancelled_caught:
                logger.warning("could not remove the kernel's cgroup %s", path)
