"""Run one ipykernel of a stock Jupyter Kernel Gateway in a bubblewrap sandbox of its own.

Install with ``jupyter kernelspec install deploy/gateway/ipybox-sandboxed`` on the gateway's host and
start the gateway with ``--KernelManager.transport=ipc`` (see "Isolating kernels on Kernel Gateway"
in docs/remote.md). The gateway runs ``python3 launch.py CONNECTION_FILE`` (jupyter_client puts its
own interpreter for ``python3``); this script, which runs as the gateway's user outside the sandbox,
starts the kernel so that it sees:

- its own connection information only: a copy with its socket directory rewritten, bound read-only
  at ``/run/ipybox/connection.json``; neither the gateway's runtime directory (the other kernels'
  keys) nor the host's home, ``/tmp`` or ``/run``;
- its own processes only (a PID namespace and a fresh ``/proc``): not the gateway's command line
  or environment, nor other kernels;
- a fixed environment (``--clearenv``): no token variable of the gateway's;
- no network (a network namespace with only ``lo``). Its ZMQ sockets are unix sockets in a private
  directory bound into the sandbox; the gateway reaches them through links at the paths its
  connection file names (``<ip>-<port>``, the ``ipc`` transport's);
- a read-only system (``/usr``, ``/etc`` minus its secrets: the known ones, ``/etc/jupyter`` (a
  gateway's configuration may hold its token) and whatever is not world-readable, since the kernel
  reads as the gateway's user, root maybe), the Python installation, a private ``/tmp`` as its only
  writable place, no capabilities, no new user namespaces, a new session (no terminal);
- under a gateway that runs as root, a host uid and gid of its own (a random number no account,
  group or running process has, as ipybox does for local kernels: ipybox/sandbox/_kerneluid.py),
  with no supplementary groups: what it takes from a per-user kernel counter (inotify instances,
  pipe pages, processes, ...) is that uid's, neither root's nor another kernel's, root-only files
  are other people's files to it, and RLIMIT_NPROC bounds its processes and threads (512). Where
  the host cannot run bwrap as another uid (no unprivileged user namespaces, a ``TMPDIR`` that uid
  cannot reach), it says so loudly on stderr (the gateway's log) and runs the kernel as root, as
  before.

Stdlib only. Nothing of ipybox is needed on the gateway's host: the executor pushes ipybox_kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import json
import os
import pwd
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import NoReturn

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
INSIDE = "/run/ipybox"
TMP_BYTES = 1024**3
KERNEL_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
}


# systemd's table of uid ranges leaves 0x70000000..0x7FFDFFFF unassigned (as ipybox/sandbox/_kerneluid.py).
UID_RANGE = (0x70000000, 0x7FFDFFFF)
CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
SYSTEM_DIRS = [arg for d in ("/bin", "/sbin", "/lib", "/lib64", "/lib32") for arg in ("--ro-bind-try", d, d)]
# Processes and threads a kernel of its own uid may have (RLIMIT_NPROC, counted per uid; ipybox's
# default Limits.processes): a fork bomb stops there, where the gateway's service manager sets no limit.
PROCESSES = 512
# How long the one-off check that bwrap runs as another uid may take.
PROBE_TIMEOUT = 30.0


def fail(message: str) -> NoReturn:
    print(f"ipybox-sandboxed kernel: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def python_dirs() -> list[str]:
    """The interpreter and its packages (a venv and the installation it is made from), bound read-only
    at their own paths; ``/usr`` is bound anyway."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    return sorted(path for path in paths if not path.startswith("/usr/"))


# As ipybox's own sandbox masks them (ipybox/sandbox/_sandbox.py; this script cannot import ipybox).
ETC_SECRETS = ("shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "security/opasswd")
ETC_SECRET_DIRS = ("ssh", "ssl/private", "sudoers.d", "jupyter")


def etc_masks(empty: str) -> list[str]:
    """bwrap arguments that hide the secrets of /etc: known ones, and every file or directory that
    is not world-readable, behind ``empty`` (an empty file) or an empty read-only tmpfs."""
    files = [f"/etc/{name}" for name in ETC_SECRETS if os.path.isfile(f"/etc/{name}")]
    dirs = [f"/etc/{name}" for name in ETC_SECRET_DIRS if os.path.isdir(f"/etc/{name}")]
    pending = ["/etc"]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                # One others cannot both list and search is masked whole: a kernel of its own uid
                # could not reach a mask inside it.
                readable = info.st_mode & stat.S_IROTH and info.st_mode & stat.S_IXOTH
                (pending if readable else dirs).append(entry.path)
            elif stat.S_ISREG(info.st_mode) and not info.st_mode & stat.S_IROTH:
                files.append(entry.path)
    masks = [arg for path in sorted(set(files)) for arg in ("--ro-bind", empty, path)]
    return masks + [arg for path in sorted(set(dirs)) for arg in ("--tmpfs", path, "--remount-ro", path)]


def warn(message: str) -> None:
    print(f"ipybox-sandboxed kernel: WARNING: {message}", file=sys.stderr, flush=True)


def running_ids() -> set[int]:
    """Every uid and gid a running process holds (real, effective, saved and filesystem ones)."""
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


def known(uid: int) -> bool:
    """Whether an account or a group of this host has the number."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        with contextlib.suppress(KeyError):
            lookup(uid)
            return True
    return False


def random_uids() -> Iterator[int]:
    while True:
        yield secrets.randbelow(UID_RANGE[1] - UID_RANGE[0]) + UID_RANGE[0]


def pick_uid(candidates: Iterable[int]) -> int:
    """The first candidate that no account, group or running process has: a process of that uid
    (or gid) would share the kernel's per-user counters and could signal or trace it."""
    taken = running_ids()
    for uid in candidates:
        if uid not in taken and not known(uid):
            return uid
    raise RuntimeError("no free uid among the candidates")


def reachable(path: str, gid: int) -> bool:
    """Whether a uid with no file of its own and group ``gid`` can look resolved ``path`` up."""
    parent = os.path.dirname(path)
    while True:
        try:
            info = os.stat(parent)
        except OSError:
            return False
        if not (info.st_mode & stat.S_IXOTH or (info.st_gid == gid and info.st_mode & stat.S_IXGRP)):
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def become(uid: int, binds: list[tuple[str, str]]) -> Callable[[], None]:
    """What the child runs before it execs bwrap: bind ``binds`` (source, staging directory) in a
    mount namespace of its own (so the host sees none of them), then take ``uid`` and its gid with
    no supplementary groups. bwrap then makes its user namespace as that uid."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def run() -> None:
        if binds:
            check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
            for source, target in binds:
                check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"binding {source}")
        # Set as root, before the uid is taken: a process may lower its limits but not raise them.
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return run


def own_uid(bwrap: str, private: str, python: list[str]) -> tuple[int, dict[str, str], Callable[[], None]] | None:
    """Under a root gateway: a uid of the kernel's own, where bwrap finds each of ``python`` (a
    staged bind for those the uid cannot reach, a Python under ``/root`` say), and what the child
    runs to take the uid; None (with a warning) where bwrap cannot run as another uid here."""
    if os.geteuid() != 0:
        return None
    uid = pick_uid(random_uids())
    os.chown(private, 0, uid)
    os.chmod(private, 0o710)
    stage = os.path.join(private, "stage")
    os.mkdir(stage, 0o710)
    os.chown(stage, 0, uid)
    sources: dict[str, str] = {}
    binds: list[tuple[str, str]] = []
    for path in python:
        if reachable(path, uid):
            sources[path] = path
        else:
            target = os.path.join(stage, str(len(binds)))
            os.mkdir(target, 0o700)
            binds.append((path, target))
            sources[path] = target
    child = become(uid, binds)
    # The interpreter started as the kernel will be, from what it is bound from; and the private
    # directory, which the kernel's mounts come from (a TMPDIR the uid cannot reach fails here).
    probe = [
        bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr", *SYSTEM_DIRS,
        "--proc", "/proc", "--dev", "/dev", "--ro-bind", private, "/mnt",
        *[arg for path in python for arg in ("--ro-bind", sources[path], path)],
        "--", sys.executable, "-I", "-S", "-c", "",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            probe, preexec_fn=child, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False
        )
        problem = done.stderr.strip() if done.returncode != 0 else None
    except (OSError, subprocess.SubprocessError) as exc:
        problem = str(exc)
    if problem is None:
        return uid, sources, child
    warn(
        f"the kernel runs as the gateway's uid 0 (root), not as a uid of its own: bwrap could not run as "
        f"another uid here ({problem}). Its per-user kernel resources (inotify, pipe pages, processes) are "
        "counted as root's and it reads what root reads of the system; enable unprivileged user namespaces, "
        "or run the gateway as an unprivileged user"
    )
    return None


def main() -> None:
    if len(sys.argv) != 2:
        fail("usage: launch.py CONNECTION_FILE")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        fail("bubblewrap (bwrap) is not installed on the gateway's host: apt-get install bubblewrap")
    with open(sys.argv[1], encoding="utf-8") as f:
        info = json.load(f)
    if info.get("transport") != "ipc":
        fail(
            "the gateway gives its kernels TCP ports, which a kernel without network cannot serve: start the "
            "gateway with --KernelManager.transport=ipc"
        )
    private = tempfile.mkdtemp(prefix="ipybox-kernel-")
    links = [f"{info['ip']}-{info[port]}" for port in PORTS]

    def clean_up() -> None:
        for link in links:
            try:
                if os.path.islink(link):
                    os.unlink(link)
            except OSError:
                pass
        shutil.rmtree(private, ignore_errors=True)

    def terminated(signum: int, frame: FrameType | None) -> None:
        # The gateway's SIGTERM (a kernel that did not shut down on request): bwrap, a child with
        # --die-with-parent, takes the sandbox with it once this process is gone.
        clean_up()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    # Interrupts are messages (kernel.json's interrupt_mode); a stray SIGINT must not stop the launcher.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sockets = os.path.join(private, "sockets")
        os.mkdir(sockets, 0o700)
        for port in PORTS:
            os.symlink(os.path.join(sockets, f"k-{info[port]}"), f"{info['ip']}-{info[port]}")
        inside = dict(info, ip=f"{INSIDE}/sockets/k")
        connection = os.path.join(private, "connection.json")
        with open(os.open(connection, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            json.dump(inside, f)
        setenv = [arg for name, value in KERNEL_ENV.items() for arg in ("--setenv", name, value)]
        empty = os.path.join(private, "empty")
        os.close(os.open(empty, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))
        python = python_dirs()
        own = own_uid(bwrap, private, python)
        sources = {path: path for path in python}
        child = None
        if own is not None:
            uid, sources, child = own
            # Its own connection information (read) and socket directory (the kernel binds there;
            # the gateway, root, connects through the links).
            os.chown(connection, 0, uid)
            os.chmod(connection, 0o640)
            os.chown(sockets, uid, uid)
        argv = [
            bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr",
            "--ro-bind", "/etc", "/etc", *etc_masks(empty),
            *SYSTEM_DIRS,
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
            "--perms", "0755", "--tmpfs", "/run",
            # After the private /tmp and /run: an interpreter or venv under them is bound over those.
            *[arg for path in python for arg in ("--ro-bind", sources[path], path)],
            "--ro-bind", connection, f"{INSIDE}/connection.json",
            "--bind", sockets, f"{INSIDE}/sockets",
            "--remount-ro", "/",
            "--clearenv", *setenv,
            "--chdir", "/tmp",
            "--",
            sys.executable, "-m", "ipykernel_launcher", "-f", f"{INSIDE}/connection.json",
        ]  # fmt: skip
        code = subprocess.call(argv, stdin=subprocess.DEVNULL, preexec_fn=child)
    finally:
        clean_up()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
