"""The kernel's stdout/stderr: ipykernel's stream with a flush that returns at once when empty.

ipykernel flushes both streams after every execution, and each flush waits for two hand-offs to
the IOPub thread even when nothing was written. For a cell like ``1+1`` that is most of a
millisecond per execution. Installed through ``IPKernelApp.outstream_class``.

Output written straight to file descriptors 1 and 2 (``os.system``, subprocesses, C extensions)
goes through a pipe that a watcher thread moves into the stream. `FdDrain`, run when an execution
ends, moves what the pipes still hold itself, so that such output belongs to the execution that
wrote it. (With ipykernel's own watcher it depended on the thread getting there first.)
"""

from __future__ import annotations

import codecs
import os
import select
import threading
from io import StringIO
from typing import Any, cast

from ipykernel.iostream import OutStream

_PIPE_READ = 65536


class QuickFlushStream(OutStream):
    # Set by the IOPub thread while a flush it runs is between taking the buffers and queueing the
    # message: an empty buffer does not mean "sent" then, and returning early could let the
    # execution's idle status be queued ahead of this output.
    _ipybox_flushing = False

    _fd_lock: threading.Lock | None = None

    def flush(self) -> None:
        # The order of the reads matters: a write fills the buffer and then sets _flush_pending; the
        # IOPub thread sets _ipybox_flushing, then clears _flush_pending, then takes the buffers.
        try:
            empty = not self._flush_pending and not self._ipybox_flushing and not self._buffered()
        except AttributeError:  # an ipykernel without these internals: flush the way it does
            empty = False
        if not empty:
            super().flush()

    def _flush(self) -> None:
        self._ipybox_flushing = True
        try:
            super()._flush()
        finally:
            self._ipybox_flushing = False

    def _buffered(self) -> bool:
        with self._buffer_lock:
            buffers = cast("dict[object, StringIO]", self._buffers)  # pyright: ignore[reportUnknownMemberType]
            return any(buffer.tell() for buffer in buffers.values())

    # -- output written to the file descriptor ---------------------------------------------------

    def _setup_stream_redirects(self, name: str) -> None:
        # Called by ipykernel's __init__ when it redirects the descriptor; it starts the watcher.
        self._fd_lock = threading.Lock()
        self._fd_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        super()._setup_stream_redirects(name)  # pyright: ignore[reportUnknownMemberType]

    def _watch_pipe_fd(self) -> None:
        """The watcher thread: moves output from the pipe whenever there is some."""
        fid: int | None = self._fid
        lock = self._fd_lock
        if fid is None or lock is None:
            return
        os.set_blocking(fid, False)
        poller = select.poll()
        poller.register(fid, select.POLLIN)
        try:
            while self._should_watch:
                poller.poll()
                with lock:
                    if not self._move_fd_output(fid):
                        return
        except Exception as exc:  # ipykernel's close() reports it, as for its own watcher
            self._exc = (type(exc), exc, exc.__traceback__)

    @property
    def fd_pipe(self) -> int | None:
        """The pipe behind the file descriptor, when this stream watches one."""
        fid: int | None = getattr(self, "_fid", None)
        # The lock exists only when ipykernel set up the redirect through our override.
        return fid if self._fd_lock is not None else None

    def take_fd_output(self) -> None:
        """Move what waits in the pipe into the stream now."""
        lock = self._fd_lock
        fid = self.fd_pipe
        # Not in a forked child: the watcher thread is not there (it may have held the lock when
        # the process forked), and the pipe is the parent's to read.
        if fid is not None and lock is not None and self._is_master_process():
            with lock:
                self._move_fd_output(fid)

    def _move_fd_output(self, fid: int) -> bool:
        """Move everything the pipe holds into the stream (and on to the kernel's own descriptor,
        as ipykernel does). False once the pipe is closed or the stream has stopped watching."""
        while True:
            try:
                data = os.read(fid, _PIPE_READ)
            except BlockingIOError:
                return True
            if not data or not self._should_watch:
                return False
            # Incremental: a multi-byte character split between two reads is not garbled.
            text: str = self._fd_decoder.decode(data)
            if text:
                self.write(text)
            os.write(self._original_stdstream_copy, data)


class FdDrain:
    """Moves what waits in the pipes behind fd 1 and 2 into their streams (a post_execute hook).

    One ``poll`` for both pipes per execution: every system call lets the IOPub thread take the
    interpreter lock, and a read per flush (four per execution) added ~0.2 ms to each ``1+1``.
    """

    def __init__(self, *streams: object) -> None:
        self._streams: dict[int, QuickFlushStream] = {}
        self._poller = select.poll()
        for stream in streams:
            if isinstance(stream, QuickFlushStream) and (fid := stream.fd_pipe) is not None:
                self._streams[fid] = stream
                self._poller.register(fid, select.POLLIN)

    def __call__(self, *_: Any) -> None:
        if self._streams:
            for fid, _events in self._poller.poll(0):
                self._streams[fid].take_fd_output()
