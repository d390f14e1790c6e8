"""`ServedSocket`: the listening-socket lifecycle the tool server and the network proxy share.

Real unix sockets in a temporary directory, connected to from threads as the kernel would.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from deadline_support import patient

from ipybox._exceptions import UsageError
from ipybox._unixsocket import ServedSocket, bind_socket

pytestmark = pytest.mark.anyio


class Echo:
    """Serves each connection: reads one line, answers it, then holds the connection until released."""

    def __init__(self) -> None:
        self.serving = 0
        self.most = 0
        self.release = anyio.Event()

    async def __call__(self, sock: socket.socket) -> None:
        self.serving += 1
        self.most = max(self.most, self.serving)
        try:
            stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
            async with stream:
                line = await stream.receive()
                await stream.send(b"echo " + line)
                await self.release.wait()
        finally:
            self.serving -= 1


def _ask(path: Path, line: bytes = b"hi\n") -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(patient(30))
        sock.connect(os.fspath(path))
        sock.sendall(line)
        return sock.recv(100)


async def test_it_binds_0600_serves_and_removes_its_file_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    echo = Echo()
    echo.release.set()
    served = ServedSocket(path, echo, what="test")
    served.bind()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with anyio.fail_after(patient(30)):
        async with anyio.create_task_group() as tg:
            served.start(tg)
            assert served.serving
            assert await anyio.to_thread.run_sync(_ask, path) == b"echo hi\n"
            tg.cancel_scope.cancel()
    served.stop()
    assert not served.serving
    assert not os.path.lexists(path)


async def test_connections_beyond_the_limit_wait_until_one_closes(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    echo = Echo()
    served = ServedSocket(path, echo, max_connections=2, what="test")
    with anyio.fail_after(patient(30)):
        async with anyio.create_task_group() as tg:
            served.start(tg)
            answers: list[bytes] = []
            two, three = anyio.Event(), anyio.Event()

            async def ask() -> None:
                answers.append(await anyio.to_thread.run_sync(_ask, path))
                (two if len(answers) == 2 else three if len(answers) == 3 else anyio.Event()).set()

            for _ in range(3):
                tg.start_soon(ask)
            await two.wait()
            # The third waits in the backlog: it is not served while two are.
            for _ in range(20):
                await anyio.sleep(0.01)
                assert echo.serving == 2 and len(answers) == 2
            echo.release.set()
            await three.wait()
            assert answers == [b"echo hi\n"] * 3 and echo.most == 2
            tg.cancel_scope.cancel()
    served.stop()


async def test_a_move_serves_the_new_path_and_removes_only_the_old_file_it_bound(tmp_path: Path) -> None:
    old, new = tmp_path / "old.sock", tmp_path / "new.sock"
    echo = Echo()
    echo.release.set()
    served = ServedSocket(old, echo, what="test")
    stranger: socket.socket | None = None
    with anyio.fail_after(patient(30)):
        async with anyio.create_task_group() as tg:
            served.start(tg)
            served.move(new, listener=bind_socket(new))
            assert served.path == new
            assert await anyio.to_thread.run_sync(_ask, new) == b"echo hi\n"
            assert not os.path.lexists(old)  # the old listener ended with the move
            # A /tmp cleaner deletes the file; a rebind makes a new one at the same path.
            new.unlink()
            served.rebind()
            assert await anyio.to_thread.run_sync(_ask, new) == b"echo hi\n"
            served.rebind()  # the file is there: nothing to do
            # Another server's socket at the old path is not the served socket's to remove.
            stranger = bind_socket(old)
            tg.cancel_scope.cancel()
    served.stop()
    try:
        assert os.path.lexists(old) and not os.path.lexists(new)
    finally:
        if stranger is not None:
            stranger.close()


async def test_a_path_in_use_or_not_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    other = bind_socket(path)
    try:
        with pytest.raises(UsageError, match="another process serves"):
            ServedSocket(path, Echo(), what="test").bind()
    finally:
        other.close()
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(UsageError, match="is not a socket"):
        ServedSocket(plain, Echo(), what="test").bind()
