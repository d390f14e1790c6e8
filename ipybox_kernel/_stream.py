"""The kernel's stdout/stderr: ipykernel's stream with a flush that returns at once when empty.

ipykernel flushes both streams after every execution, and each flush waits for two hand-offs to
the IOPub thread even when nothing was written. For a cell like ``1+1`` that is most of a
millisecond per execution. Installed through ``IPKernelApp.outstream_class``.

Output written straight to file descriptors 1 and 2 (``os.system``, subprocesses, C extensions)
goes through a pipe that a watcher thread moves into the stream. `FdDrain`, run when an execution
ends, moves what the pipes still hold itself, so that such output belongs to the execution that
wrote it. (With ipykernel's own watcher it depended on the thread getting there first.)

Then it gives fds 1 and 2 fresh pipes, when a process may hold the current ones. A subprocess
inherits the pipe of the execution that started it and keeps it after that execution ends, so what
it writes later lands in a retired pipe, which the watcher empties into the kernel's own
stdout/stderr (as ipykernel echoes all fd output there) and closes once no process holds it: it
never reaches a later execution. Still not told apart from the running execution's output: a
thread's write to fd 1 or 2 and a subprocess started by a thread left running (the descriptor
table is the whole process's, and an fd write carries no context), and a process that opens
``/proc/<kernel>/fd/1`` itself.
"""

from __future__ import annotations

import codecs
import os
import select
import sys
import threading
from io import StringIO
from typing import Any, cast

from ipykernel.iostream import OutStream

_PIPE_READ = 65536


class QuickFlushStream(OutStream):
    # Set while a flush (the IOPub thread's, or send_buffered's) is between taking the buffers and
    # queueing the message: an empty buffer does not mean "sent" then, and returning early could let
    # the execution's idle status be queued ahead of this output.
    _ipybox_flushing = False

    _fd_lock: threading.Lock | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Held by each flush from taking the buffers until their message is queued (see send_buffered).
        self._send_lock = threading.Lock()
        # A child forked while another thread held it would wait for ever at its first flush (a
        # forked child flushes by itself).
        os.register_at_fork(after_in_child=self._new_send_lock)
        super().__init__(*args, **kwargs)  # pyright: ignore[reportUnknownMemberType]

    def _new_send_lock(self) -> None:
        self._send_lock = threading.Lock()

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
        with self._send_lock:
            self._ipybox_flushing = True
            try:
                super()._flush()
            finally:
                self._ipybox_flushing = False

    def send_buffered(self) -> None:
        """Queue what is buffered now on the IOPub thread, from the calling thread.

        Unlike `flush`, this does not wait for the IOPub thread (two thread hand-offs, ~0.5 ms on a
        busy machine): IOPub sends messages in the order they were queued, so a message queued after
        this returns (a tool call's output mark, ipybox_kernel._marks) goes out after this output.
        A flush the IOPub thread is running holds the lock until it has queued its message.
        """
        if self.pub_thread is None:
            return  # closed
        with self._send_lock:
            empty = not self._buffered()
        if not empty:
            self._flush()

    def _buffered(self) -> bool:
        with self._buffer_lock:
            buffers = cast("dict[object, StringIO]", self._buffers)  # pyright: ignore[reportUnknownMemberType]
            return any(buffer.tell() for buffer in buffers.values())

    # -- output written to the file descriptor ---------------------------------------------------

    def _setup_stream_redirects(self, name: str) -> None:
        # Called by ipykernel's __init__ when it redirects the descriptor. Ours also closes the
        # pipe's write end after the dup2 (ipykernel keeps it open), so that a retired pipe ends.
        self._fd_lock = threading.Lock()
        self._fd_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # The pipes to watch: the current one and retired ones still held by other processes.
        # Registered and unregistered from other threads while the watcher waits in it.
        self._fd_epoll = select.epoll()
        self._retired: set[int] = set()
        fno = self._original_stdstream_fd = getattr(sys, name).fileno()
        self._original_stdstream_copy = os.dup(fno)
        self._fid = self._new_pipe()
        self._exc = None
        self.watch_fd_thread = threading.Thread(target=self._watch_pipe_fd, daemon=True)
        self.watch_fd_thread.start()

    def _new_pipe(self) -> int:
        """Put a fresh pipe behind the descriptor; its read end, watched."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.dup2(write, self._original_stdstream_fd)
        os.close(write)
        self._fd_epoll.register(read, select.EPOLLIN)
        return read

    def renew_fd_pipe(self) -> None:
        """Retire the pipe behind the descriptor for a fresh one (caller holds the lock)."""
        old: int = self._fid
        self._fid = self._new_pipe()
        self._retire(old)

    def _retire(self, fid: int) -> None:
        """Empty a retired pipe into the kernel's own descriptor; close it once no process holds it."""
        self._retired.add(fid)
        while True:
            try:
                data = os.read(fid, _PIPE_READ)
            except BlockingIOError:
                return
            if not data:
                self._retired.discard(fid)
                self._fd_epoll.unregister(fid)
                os.close(fid)
                return
            os.write(self._original_stdstream_copy, data)

    def _watch_pipe_fd(self) -> None:
        """The watcher thread: moves output from the current pipe into the stream whenever there is
        some, and empties retired ones."""
        lock = self._fd_lock
        if lock is None:
            return
        try:
            while self._should_watch:
                ready = self._fd_epoll.poll()
                with lock:
                    for fid, _events in ready:
                        if fid in self._retired:
                            self._retire(fid)
                        elif fid == self._fid and not self._move_fd_output(fid):
                            return
                        # Otherwise retired and closed since poll() returned: the number may
                        # belong to a file of the code's by now, and is not touched.
        except Exception as exc:  # ipykernel's close() reports it, as for its own watcher
            self._exc = (type(exc), exc, exc.__traceback__)

    @property
    def fd_pipe(self) -> int | None:
        """The pipe behind the file descriptor, when this stream watches one."""
        fid: int | None = getattr(self, "_fid", None)
        # The lock exists only when ipykernel set up the redirect through our override.
        return fid if self._fd_lock is not None else None

    def renew_fd_pipe_if_master(self) -> None:
        """`renew_fd_pipe`, except in a forked child, whose descriptors are its own business."""
        lock = self._fd_lock
        if lock is not None and self.fd_pipe is not None and self._is_master_process():
            with lock:
                self.renew_fd_pipe()

    def take_fd_output(self, *, read: bool = True) -> None:
        """Move what waits in the pipe into the stream now.

        With ``read=False``, only wait until the watcher thread has put into the stream what it has
        read already: it reads and writes holding the lock, so a pipe that just looked empty may
        have been emptied by it a moment ago, its text not yet in the stream.
        """
        lock = self._fd_lock
        fid = self.fd_pipe
        # Not in a forked child: the watcher thread is not there (it may have held the lock when
        # the process forked), and the pipe is the parent's to read.
        if fid is not None and lock is not None and self._is_master_process():
            with lock:
                if read:
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
    """Moves what waits in the pipes behind fd 1 and 2 into their streams, then gives both fresh
    pipes if a process may have taken the current ones (a post_execute hook; see the module doc).

    One ``poll`` for both pipes per execution: every system call lets the IOPub thread take the
    interpreter lock, and a read per flush (four per execution) added ~0.2 ms to each ``1+1``.
    Fresh pipes cost ~0.09 ms more, so they are made only when the last pid the kernel's PID
    namespace handed out has changed: without a new process (or thread) since the current pipes
    were made, nothing but the kernel can hold them. Sandboxed, that namespace is the kernel's own
    and the check is one ``pread``; without the sandbox it is the host's and changes all the time.
    """

    def __init__(self, *streams: object) -> None:
        self._streams = [s for s in streams if isinstance(s, QuickFlushStream) and s.fd_pipe is not None]
        try:
            self._last_pid_file: int | None = os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY)
        except OSError:
            self._last_pid_file = None
        self._last_pid: bytes | None = None

    def __call__(self, *_: Any) -> None:
        if not self._streams:
            return
        self.take()
        last_pid = os.pread(self._last_pid_file, 32, 0) if self._last_pid_file is not None else None
        if last_pid is None or last_pid != self._last_pid:
            for stream in self._streams:
                stream.renew_fd_pipe_if_master()
        self._last_pid = last_pid

    def take(self) -> None:
        """Move what waits in the pipes into the streams now (also before each tool call's output
        mark, ipybox_kernel._marks)."""
        if not self._streams:
            return
        by_pipe = {cast("int", stream.fd_pipe): stream for stream in self._streams}
        # A poll object is only a list until poll() runs: building one per execution costs no system call.
        poller = select.poll()
        for fid in by_pipe:
            poller.register(fid, select.POLLIN)
        ready = {fid for fid, _events in poller.poll(0)}
        for fid, stream in by_pipe.items():
            stream.take_fd_output(read=fid in ready)
