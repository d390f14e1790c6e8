"""``ipybox kernel-host``: a long-lived kernel host on this machine, for durable approvals without a
gateway of one's own.

A suspended code action waits in its kernel (DESIGN.md §12), so the kernel must outlive the process
that started the action. A local kernel ends with its executor; this host keeps kernels in a process
of their own that any worker on the machine reaches like a gateway (`GatewayKernel`). It is a stock
Jupyter Kernel Gateway, started as a child process and set up the one way ipybox trusts:

- bound to 127.0.0.1 only (there is no option to change that), with ``--port_retries=0``: a port
  another process holds is an error, not a quiet move to the next one;
- always with a token (32 random bytes), handed to the gateway in its environment
  (``KG_AUTH_TOKEN``), never on its command line, which every local user reads in ``/proc``; and
  written to a file only its owner may read, for the application's workers;
- serving only the shipped sandboxed kernelspec (``deploy/gateway/ipybox-sandboxed``) on the ``ipc``
  transport: each kernel runs in a bubblewrap sandbox of its own, as local kernels do, and the
  executor's isolation check verifies it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from ipybox._exceptions import UsageError
from ipybox._privatefile import replace_private_file

__all__ = ("KERNEL_NAME", "kernelspec_dir", "run_kernel_host")

KERNEL_NAME = "ipybox-sandboxed"
# The loopback address, the only one the host listens on: other machines, and containers with their
# own network, cannot reach it.
HOST = "127.0.0.1"
# jupyter_server's IOPub rate limit drops a chatty kernel's output; ipybox bounds output itself.
_OPTIONS = (
    "--KernelManager.transport=ipc",
    "--ZMQChannelsWebsocketConnection.limit_rate=False",
    f"--KernelGatewayApp.default_kernel_name={KERNEL_NAME}",
    f"--KernelSpecManager.allowed_kernelspecs={KERNEL_NAME}",
    "--KernelSpecManager.ensure_native_kernel=False",
)


def kernelspec_dir() -> Path:
    """The shipped sandboxed kernelspec: in the wheel beside this module, in a checkout under deploy/.

    Raises:
        UsageError: Neither is there (an installation without it).
    """
    for candidate in (
        Path(__file__).parent / "kernelspec" / KERNEL_NAME,
        Path(__file__).resolve().parents[2] / "deploy" / "gateway" / KERNEL_NAME,
    ):
        if (candidate / "kernel.json").is_file() and (candidate / "launch.py").is_file():
            return candidate
    raise UsageError(f"the sandboxed kernelspec {KERNEL_NAME!r} is not installed with this ipybox")


def run_kernel_host(port: int, token_file: Path) -> int:
    """Run the kernel host on ``127.0.0.1:port`` until it is stopped (SIGINT, SIGTERM); its exit status.

    The token is written to ``token_file`` (0600, replaced if it exists, removed when the host ends).

    Raises:
        UsageError: The gateway is not installed, the port is not valid, or the token file's
            directory does not exist.
    """
    if importlib.util.find_spec("kernel_gateway") is None:
        raise UsageError("the kernel host needs Jupyter Kernel Gateway: pip install 'ipybox[kernel-host]'")
    if not 0 < port < 65536:
        raise UsageError(f"port must be 1-65535, got {port}")
    token = secrets.token_urlsafe(32)
    token_file = token_file.absolute()
    try:
        directory = os.open(token_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot write the token file in {token_file.parent}: {exc.strerror}") from None
    try:
        replace_private_file(directory, token_file.name, token + "\n")
        with tempfile.TemporaryDirectory(prefix="ipybox-kernel-host-") as home:
            jupyter = Path(home) / "jupyter"
            shutil.copytree(kernelspec_dir(), jupyter / "kernels" / KERNEL_NAME)
            runtime = Path(home) / "runtime"
            runtime.mkdir(mode=0o700)
            command = [
                sys.executable,
                "-m",
                "kernel_gateway",
                f"--ip={HOST}",
                f"--port={port}",
                "--port_retries=0",
                *_OPTIONS,
            ]
            env = {
                **os.environ,
                "KG_AUTH_TOKEN": token,
                # Only the shipped kernelspec, and connection files in a directory of this host's own.
                "JUPYTER_PATH": str(jupyter),
                "JUPYTER_RUNTIME_DIR": str(runtime),
            }
            # A variable that would change what the gateway serves or where it listens is not taken
            # from the caller's environment.
            for name in ("KG_IP", "KG_PORT", "KG_PORT_RETRIES", "KG_LIST_KERNELS", "KG_ALLOW_ORIGIN"):
                env.pop(name, None)
            print(f"ipybox kernel host: http://{HOST}:{port} (token in {token_file})", flush=True)
            return _run_until_stopped(command, env, cwd=home)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(token_file.name, dir_fd=directory)
        os.close(directory)


def _run_until_stopped(command: list[str], env: dict[str, str], *, cwd: str) -> int:
    """Run the gateway; SIGINT or SIGTERM stop it (and its kernels) and return."""
    process = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL)

    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        process.send_signal(signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if process.poll() is None:
            process.kill()
            process.wait()
