"""What a kernel on a gateway can see of the other kernels and of the gateway (run by the host at start).

On a stock Jupyter Kernel Gateway every kernel is a process of the gateway's user, started with the
gateway's environment: it can read the other kernels' connection files (their HMAC keys) in the
runtime directory, read their variables through them, and read the gateway's token from the
gateway's command line or environment. The host runs `findings` in each new remote kernel (its
source, sent as an expression, so an image's older ipybox_kernel does not matter) and refuses the
kernel when it reports anything. The kernel reports on itself: a hostile kernel could lie, but the
check is there for an honest kernel on a misconfigured gateway, before any code of the user runs.

Stdlib only, and nothing here returns a secret: only names of files, variables and processes.
"""

from __future__ import annotations

import os
import sys

__all__ = ("findings",)

# Environment variables that hold a gateway's or Jupyter server's token.
TOKEN_VARIABLES = (
    "KG_AUTH_TOKEN",
    "JUPYTER_TOKEN",
    "JUPYTER_GATEWAY_AUTH_TOKEN",
    "JPY_API_TOKEN",
    "JUPYTERHUB_API_TOKEN",
    "EG_AUTH_TOKEN",
)
# Command-line options that carry one (``--KernelGatewayApp.auth_token=...``, ``--ServerApp.token=...``).
_TOKEN_OPTIONS = ("auth_token=", ".token=", "--token=")
_MAX_NAMES = 3


def _own_connection_file() -> str | None:
    for i, arg in enumerate(sys.argv):
        if arg == "-f" and i + 1 < len(sys.argv):
            return os.path.realpath(sys.argv[i + 1])
        if arg.startswith("--f="):
            return os.path.realpath(arg[4:])
    return None


def _runtime_dirs(own: str | None) -> set[str]:
    dirs: set[str] = {os.path.dirname(own)} if own else set()
    if os.environ.get("JUPYTER_RUNTIME_DIR"):
        dirs.add(os.environ["JUPYTER_RUNTIME_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    dirs.add(os.path.join(data, "jupyter", "runtime"))
    return {os.path.realpath(d) for d in dirs}


def _readable(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return bool(f.read(1))
    except OSError:
        return False


def _connection_files(own: str | None) -> list[str]:
    found: list[str] = []
    for directory in sorted(_runtime_dirs(own)):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".json") and path != own and _readable(path):
                found.append(path)
    return found


def _ancestors() -> set[int]:
    found: set[int] = set()
    pid = os.getppid()
    while pid > 0 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # The parent's pid follows the command's name, which is in parentheses and may hold any byte.
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _processes() -> tuple[list[str], list[str], list[str]]:
    """Other processes whose command line holds a token, those with a token variable in an environment
    this process can read, and other kernels whose environment it can read (so it is their user, and
    could read their memory too), each as ``pid (program)``."""
    with_option: list[str] = []
    with_variable: list[str] = []
    kernels: list[str] = []
    # Not its parent: on a stock gateway that is the gateway, whose command line may hold the token.
    mine = os.getpid()
    ancestors = _ancestors()  # what started this kernel (a sandbox's init names the kernel's command)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == mine:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not args[0]:
            continue  # a kernel thread, or a process that exited
        who = f"{entry} ({os.path.basename(args[0])})"
        if any(option in arg for arg in args for option in _TOKEN_OPTIONS):
            with_option.append(who)
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                names = {item.split(b"=", 1)[0].decode(errors="replace") for item in f.read().split(b"\0")}
        except OSError:
            continue
        if names.intersection(TOKEN_VARIABLES):
            with_variable.append(who)
        if any("ipykernel" in arg for arg in args) and int(entry) not in ancestors:
            kernels.append(who)
    return with_option, with_variable, kernels


def _some(items: list[str]) -> str:
    more = f" and {len(items) - _MAX_NAMES} more" if len(items) > _MAX_NAMES else ""
    return ", ".join(items[:_MAX_NAMES]) + more


def findings() -> list[str]:
    """What this kernel can see that a kernel isolated from the others and from the gateway could not."""
    found: list[str] = []
    files = _connection_files(_own_connection_file())
    if files:
        found.append(f"it can read {len(files)} other kernels' connection files ({_some(files)})")
    variables = sorted(name for name in TOKEN_VARIABLES if os.environ.get(name))
    if variables:
        found.append(f"its environment holds the token variable(s) {', '.join(variables)}")
    with_option, with_variable, kernels = _processes()
    if with_option:
        found.append(f"it can read a token on the command line of process(es) {_some(with_option)}")
    if with_variable:
        found.append(f"it can read a token variable in the environment of process(es) {_some(with_variable)}")
    if kernels:
        found.append(f"it runs as the same user as other kernel process(es) it can see: {_some(kernels)}")
    return found
