"""The unix sockets the host listens on for the sandboxed kernel: the tool socket, the network proxy's.

Each is bound with mode 0600 in a private directory of the host's, which the sandbox mounts
read-only; a stale socket file left by a process that is gone is replaced, and a socket file is
removed only by the server that bound it. `ServedSocket` is that lifecycle for a server; the
functions are its non-blocking steps (and `connect_socket` the client's, for the gateway's bridge).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc

from ._exceptions import UsageError

__all__ = ("LISTEN_BACKLOG", "ServedSocket", "accept_one", "bind_socket", "connect_socket", "remove_socket")

logger = logging.getLogger(__name__)

# Connections beyond a server's limit (the ToolServer's MAX_CONNECTIONS) wait here, then in
# connect(), until a slot frees, rather than fail.
LISTEN_BACKLOG = 128
# accept() can fail when the process runs out of descriptors; wait for one of ours to close, or this long.
ACCEPT_RETRY_DELAY = 0.5
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


async def connect_socket(sock: socket.socket, path: str) -> None:
    """Connect the non-blocking ``sock`` to the unix socket at ``path``, waiting while its backlog is full.

    Raises:
        OSError: The connection failed.
    """
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            # The listener's backlog is full: its connection slots are taken; wait for one.
            await anyio.wait_writable(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err == 0:
                return
            raise OSError(err, "connect() to the unix socket failed") from None


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


class ServedSocket:
    """A unix socket a host server listens on for its kernel, from bind to removal.

    The one lifecycle the tool server and the network proxy share: bind with mode 0600 (or take over
    a listener already bound, a pooled kernel's), accept in the server's task group and serve each
    connection in a task of its own, bind again if a ``/tmp`` cleaner deleted the file (`rebind`),
    move to another path for another kernel (`move`), and on the way out close each listener and
    remove its file if it is still the one it bound. A listener that was moved away from, or replaced
    by a rebind, keeps serving until `move` or the end of the task group: a sandbox bind-mounts the
    file's inode, not the path.

    Args:
        path: Where the socket file is (or will be) bound.
        serve: Serves one accepted connection (a non-blocking socket it must close); the
            connection's slot frees when it returns.
        max_connections: Connections served at once; more wait in the backlog (then in the
            kernel's ``connect()``) until one closes. None: no limit here (the server refuses).
        listener: A listening socket already bound at ``path``, served instead of binding one; owned
            from then on.
        what: What the connections are, for the log (``"tool-call"``).
    """

    def __init__(
        self,
        path: Path,
        serve: Callable[[socket.socket], Awaitable[None]],
        *,
        max_connections: int | None = None,
        listener: socket.socket | None = None,
        what: str,
    ) -> None:
        self._path = path
        self._serve = serve
        self._max_connections = max_connections
        self._given = listener
        self._what = what
        self._tg: anyio.abc.TaskGroup | None = None
        # The cancel scope of each listener serving now (more than one after a rebind).
        self._listeners: list[anyio.CancelScope] = []
        self._connection_closed = anyio.Event()

    @property
    def path(self) -> Path:
        """Where the socket file is (or will be) bound."""
        return self._path

    @property
    def serving(self) -> bool:
        """Between `start` and `stop`."""
        return self._tg is not None

    def bind(self) -> None:
        """Bind the socket now (unless given a listener), before the task group that will serve it.

        Raises:
            UsageError: The socket path is unusable or in use.
            OSError: The socket could not be bound.
        """
        if self._given is None:
            self._given = bind_socket(self._path)

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Accept in ``task_group`` until it ends or `move` (binding first, if `bind` was not called).

        Raises:
            UsageError: The socket path is unusable or in use.
            OSError: The socket could not be bound.
        """
        self.bind()
        listener, self._given = self._given, None
        assert listener is not None
        self._tg = task_group
        self._listen(listener, self._path)

    def stop(self) -> None:
        """Forget the listeners once the task group that served them has ended (closing a
        listener that never got to serve)."""
        self._tg = None
        self._listeners.clear()
        if self._given is not None:
            self._given.close()
            self._given = None

    def rebind(self) -> None:
        """Bind the socket file again if it is gone; the socket's directory must exist.

        Raises:
            UsageError: The socket path is unusable.
            OSError: The socket could not be bound.
        """
        if self._tg is None or os.path.lexists(self._path):
            return
        self._listen(bind_socket(self._path), self._path)

    def move(self, path: Path, *, listener: socket.socket | None = None) -> None:
        """Listen at ``path`` from now on (on ``listener`` if given, bound there and owned from then
        on), and stop listening where it listened before; connections already open stay.

        Raises:
            UsageError: The socket path is unusable.
            OSError: The socket could not be bound, or its file is gone.
        """
        listener = listener or bind_socket(path)
        old = self._listeners
        self._listeners = []
        try:
            self._listen(listener, path)
        except BaseException:
            self._listeners = old
            raise
        self._path = path
        for scope in old:
            scope.cancel()

    def _listen(self, listener: socket.socket, path: Path) -> None:
        """Accept on ``listener`` until `move` or the end of the task group; then close it and
        remove its socket file, unless another was bound there since."""
        assert self._tg is not None
        try:
            inode = os.stat(path).st_ino
        except OSError:
            listener.close()
            raise
        scope = anyio.CancelScope()
        self._listeners.append(scope)

        async def accept() -> None:
            try:
                with scope:
                    await self._accept(listener, path)
            finally:
                listener.close()
                remove_socket(path, inode)

        self._tg.start_soon(accept)

    async def _accept(self, listener: socket.socket, path: Path) -> None:
        assert self._tg is not None
        slots = anyio.Semaphore(self._max_connections) if self._max_connections is not None else None
        while True:
            if slots is not None:
                await slots.acquire()
            try:
                sock = await accept_one(listener)
            except OSError as exc:
                if slots is not None:
                    slots.release()
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    logger.debug("accept() on %s failed: %s", path, exc)
                    continue
                # Out of descriptors: wait for one of ours to close, or a while.
                logger.warning("cannot accept a %s connection: %s", self._what, exc)
                with anyio.move_on_after(ACCEPT_RETRY_DELAY):
                    await self._connection_closed.wait()
                continue
            self._tg.start_soon(self._connection, sock, slots)

    async def _connection(self, sock: socket.socket, slots: anyio.Semaphore | None) -> None:
        try:
            await self._serve(sock)
        finally:
            sock.close()  # a no-op when served; one that failed before taking it must not leak
            if slots is not None:
                slots.release()
            self._connection_closed.set()
            self._connection_closed = anyio.Event()
