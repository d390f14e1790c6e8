"""The unix sockets the host listens on for the sandboxed kernel: the tool socket, the network proxy's.

Each is bound with mode 0600 in a private directory of the host's, which the sandbox mounts
read-only; a stale socket file left by a process that is gone is replaced, and a socket file is
removed only by the server that bound it.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import anyio

from ._exceptions import UsageError

__all__ = ("LISTEN_BACKLOG", "accept_one", "bind_socket", "remove_socket")

# Connections beyond a server's limit (the ToolServer's MAX_CONNECTIONS) wait here, then in
# connect(), until a slot frees, rather than fail.
LISTEN_BACKLOG = 128
# Socket paths longer than this do not fit in sockaddr_un on Linux (108 bytes including the NUL).
_MAX_SOCKET_PATH = 107


async def accept_one(listener: socket.socket) -> socket.socket:
    """The next connection on a non-blocking ``listener``."""
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            await anyio.wait_readable(listener)
            continue
        return sock


def bind_socket(path: Path) -> socket.socket:
    """Bind a listening unix socket that only this user can connect to."""
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise UsageError(
            f"the tool socket path {str(path)!r} is longer than {_MAX_SOCKET_PATH} bytes; use a shorter run directory"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise UsageError(f"{str(path)!r} exists and is not a socket; choose another tool socket path")
        if _socket_in_use(path):
            raise UsageError(f"another process serves the tool socket {str(path)!r}; choose another path")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        # Nobody can connect before listen(), so tightening the mode here leaves no window.
        os.chmod(path, 0o600)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _socket_in_use(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def remove_socket(path: Path, inode: int) -> None:
    """Remove the socket file, unless another server has bound a new one there since."""
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
