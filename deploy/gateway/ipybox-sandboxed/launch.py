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
  writable place, no capabilities, no new user namespaces, a new session (no terminal).

Stdlib only. Nothing of ipybox is needed on the gateway's host: the executor pushes ipybox_kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
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


def fail(message: str) -> NoReturn:
    print(f"ipybox-sandboxed kernel: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def python_mounts() -> list[str]:
    """The interpreter and its packages (a venv and the installation it is made from), read-only at
    their own paths; ``/usr`` is bound anyway."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    return [arg for path in sorted(paths) if not path.startswith("/usr/") for arg in ("--ro-bind", path, path)]


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
                (pending if info.st_mode & stat.S_IROTH else dirs).append(entry.path)
            elif stat.S_ISREG(info.st_mode) and not info.st_mode & stat.S_IROTH:
                files.append(entry.path)
    masks = [arg for path in sorted(set(files)) for arg in ("--ro-bind", empty, path)]
    return masks + [arg for path in sorted(set(dirs)) for arg in ("--tmpfs", path, "--remount-ro", path)]


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
        argv = [
            bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr",
            "--ro-bind", "/etc", "/etc", *etc_masks(empty),
            *[arg for d in ("/bin", "/sbin", "/lib", "/lib64", "/lib32") for arg in ("--ro-bind-try", d, d)],
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
            "--perms", "0755", "--tmpfs", "/run",
            # After the private /tmp and /run: an interpreter or venv under them is bound over those.
            *python_mounts(),
            "--ro-bind", connection, f"{INSIDE}/connection.json",
            "--bind", sockets, f"{INSIDE}/sockets",
            "--remount-ro", "/",
            "--clearenv", *setenv,
            "--chdir", "/tmp",
            "--",
            sys.executable, "-m", "ipykernel_launcher", "-f", f"{INSIDE}/connection.json",
        ]  # fmt: skip
        code = subprocess.call(argv, stdin=subprocess.DEVNULL)
    finally:
        clean_up()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
