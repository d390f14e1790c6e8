"""The kernel's own unprivileged host uid, when ipybox runs as root.

Under host root, a sandbox whose user namespace bwrap makes as root is host uid 0 to everything
that counts per user (inotify instances and watches, fanotify groups, epoll watches, message queue
bytes, RLIMIT_NPROC, keys) and owns every root-owned file mounted into it. So each sandboxed kernel
gets a uid (and a gid of the same number) of its own, picked at random from a range no
distribution or systemd assigns, and bwrap is started as that uid by ``_dropuid``:

- its user namespace maps that uid only, so whatever the sandbox takes from a per-user counter is
  that uid's, and no other kernel's or root's;
- the workspace and the other writable paths are mounted as idmapped mounts that show their owner's
  files as the kernel's and write what the kernel creates as their owner's: nothing on disk changes
  owner, no ACL is left behind (the trade-off against POSIX ACLs or a ``chown``, which would either
  leave files of a uid nobody has, or give the kernel's uid the workspace for good);
- sources it cannot reach (a venv under ``/root``, a ``0700`` temporary directory) are bind-mounted
  by root at a staging path in a mount namespace of the launcher's own first;
- the host-owned files it must use (the connection file, the tool and proxy sockets, the import
  root) are given to its group, with only the permission it needs.

Where any of that cannot be done (no unprivileged user namespaces, a filesystem without idmapped
mounts), the kernel runs as host root as before and the start logs a warning once, the way a missing
pids cgroup is reported.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ("KernelUid", "kernel_uid")

logger = logging.getLogger(__name__)

# systemd's table of uid ranges leaves 0x70000000..0x7FFDFFFF unassigned: above the container
# ranges (nspawn's end at 0x6FFFFFFF), below the "foreign" range and the signed-int boundary.
_UID_RANGE = (0x70000000, 0x7FFDFFFF)
# The launcher, run by path with ``-I -S`` (never imported here: it loads libc at import).
_LAUNCHER = Path(__file__).with_name("_dropuid.py")
# How long the one-off probe may take before it counts as failed.
_PROBE_TIMEOUT = 10.0
# Problems already reported by this process: a pool starts many kernels.
_reported: set[str] = set()
# The outcome of the probe for each set of filesystems the writable paths live on (idmapped mounts
# are a filesystem's feature), so that a new workspace on a known filesystem costs no probe.
_probed: dict[frozenset[int], str | None] = {}


@dataclass
class KernelUid:
    """One kernel's host uid and gid, and the staging plan `_dropuid` carries out before bwrap.

    Attributes:
        uid: The kernel's host uid.
        gid: The kernel's host gid (the same number).
        stage: The directory the launcher mounts unreachable sources under (only the kernel's group
            may enter it); removed by `remove`.
    """

    uid: int
    gid: int
    stage: Path
    binds: list[dict[str, object]] = field(default_factory=list[dict[str, object]])

    @classmethod
    def new(cls) -> KernelUid:
        """A uid no account, group or running process of this host has, and its empty staging directory."""
        uid = _pick(_random_ids())
        stage = Path(tempfile.mkdtemp(prefix="ipybox-stage-"))
        own = cls(uid=uid, gid=uid, stage=stage)
        own.grant(stage, 0o710)
        return own

    def grant(self, path: Path, mode: int) -> None:
        """Give a host-owned file or directory to the kernel's group with ``mode`` (the owner stays
        the host's)."""
        os.chown(path, -1, self.gid, follow_symlinks=False)
        os.chmod(path, mode, follow_symlinks=False)

    def ro(self, source: Path | str) -> str:
        """Where bwrap finds ``source`` for a read-only bind: itself if the kernel's uid can reach
        it, else a staged bind of it."""
        real = os.path.realpath(source)
        if _reachable(Path(real), self.gid):
            # Resolved here: bwrap resolves the path it is given with the kernel's uid, and a
            # symlink on it may pass through a directory only root can enter.
            return real
        return self._staged(real, is_dir=os.path.isdir(real))

    def ro_fd(self, fd: int) -> str:
        """Where bwrap finds the directory open as ``fd`` (inherited by the launcher)."""
        return self._staged(None, fd=fd, is_dir=True)

    def rw(self, source: Path | str) -> str:
        """Where bwrap finds writable ``source``: an idmapped bind showing its owner's files as the
        kernel's."""
        info = os.stat(source)
        return self._staged(
            os.path.realpath(source), is_dir=stat.S_ISDIR(info.st_mode), idmap=[info.st_uid, info.st_gid]
        )

    def launcher(self, *, processes: int | None, rlimits: Sequence[tuple[int, int]] = ()) -> list[str]:
        """The command that stages, sets ``rlimits`` (resource, value) and RLIMIT_NPROC to
        ``processes``, drops to the kernel's uid and execs what follows it."""
        plan = {"uid": self.uid, "gid": self.gid, "binds": self.binds, "nproc": processes, "rlimits": list(rlimits)}
        return [sys.executable, "-I", "-S", str(_LAUNCHER), json.dumps(plan), "--"]

    def remove(self) -> None:
        """Remove the staging directory (its mounts live only in the sandbox's launcher's namespace)."""
        shutil.rmtree(self.stage, ignore_errors=True)

    def _staged(
        self, source: str | None, *, is_dir: bool, fd: int | None = None, idmap: list[int] | None = None
    ) -> str:
        target = str(self.stage / str(len(self.binds)))
        self.binds.append({"src": source, "fd": fd, "dst": target, "dir": is_dir, "idmap": idmap})
        return target


def kernel_uid(writable: list[Path]) -> KernelUid | None:
    """A uid of its own for the next sandboxed kernel, or None: ipybox does not run as root, or the
    host cannot run a sandbox as another uid with ``writable`` idmapped (then a warning says so once)."""
    if os.geteuid() != 0:
        return None
    devices = frozenset(os.stat(path).st_dev for path in writable)
    if devices not in _probed:
        _probed[devices] = _probe([str(path) for path in writable])
    problem = _probed[devices]
    if problem is None:
        return KernelUid.new()
    if problem not in _reported:
        _reported.add(problem)
        logger.warning(
            "the sandboxed kernel runs as host uid 0 (%s): the kernel's per-user resources (inotify, "
            "epoll watches, processes, ...) are counted as root's, and root-owned files mounted into "
            "the sandbox are its own; run ipybox as an unprivileged user, or on a host with unprivileged "
            "user namespaces and a filesystem with idmapped mounts for the workspace",
            problem,
        )
    return None


def _probe(writable: list[str]) -> str | None:
    """None if bwrap runs as a fresh uid with ``writable`` idmapped here, else what failed."""
    from ._sandbox import bwrap_probe_argv

    own = KernelUid.new()
    try:
        # Each at a path of the probe's own tmpfs: the real one's parents may be out of the uid's reach.
        binds = ["--tmpfs", "/tmp"]
        for i, path in enumerate(writable):
            binds += ["--bind", own.rw(path), f"/tmp/{i}"]
        argv = [*own.launcher(processes=None), *bwrap_probe_argv(binds)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return "a test run of the sandbox as another uid did not finish"
        if done.returncode != 0:
            return f"a test run of the sandbox as another uid failed: {done.stderr.strip()}"
        return None
    finally:
        own.remove()


def _random_ids() -> Iterator[int]:
    while True:
        yield secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0]


def _pick(candidates: Iterable[int]) -> int:
    """The first candidate no account or group has and no running process holds as a uid or gid: a
    process of that uid would share the kernel's per-user counters and could signal or trace it
    (one left by a kernel of an earlier ipybox process, say, or of another host user's range)."""
    taken = _running_ids()
    for uid in candidates:
        if uid not in taken and not _known(uid):
            return uid
    raise RuntimeError("no free uid among the candidates")


def _running_ids() -> set[int]:
    """Every uid and gid a process in this PID namespace holds (real, effective, saved, filesystem)."""
    ids: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                lines = [line for line in f if line.startswith(("Uid:", "Gid:"))]
        except OSError:
            continue  # ended meanwhile
        ids.update(int(value) for line in lines for value in line.split()[1:])
    return ids


def _known(uid: int) -> bool:
    with contextlib.suppress(KeyError):
        pwd.getpwuid(uid)
        return True
    with contextlib.suppress(KeyError):
        grp.getgrgid(uid)
        return True
    return False


def _reachable(path: Path, gid: int) -> bool:
    """Whether a uid with no file of its own and group ``gid`` can look resolved ``path`` up (every
    directory above it searchable by others, or by that group)."""
    for parent in path.parents:
        try:
            info = os.stat(parent)
        except OSError:
            return False
        if not (info.st_mode & stat.S_IXOTH or (info.st_gid == gid and info.st_mode & stat.S_IXGRP)):
            return False
    return True
