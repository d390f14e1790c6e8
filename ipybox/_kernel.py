"""One IPython kernel process, optionally sandboxed, and the messages of the code it runs.

The kernel speaks the Jupyter protocol over ZMQ ``ipc://`` sockets in a private run directory
(they work across the sandbox's empty network namespace). The host launches the process itself
rather than through jupyter_client's manager so that it can wait on the process's exit instead of
polling it: a kernel that dies mid-execution is noticed at once.

The host's sockets are plain (blocking-API) ZMQ sockets read with non-blocking calls when their
file descriptor signals. ZMQ's descriptor is edge-triggered and any send or ``EVENTS`` query on the
socket may consume the signal; pyzmq's asyncio sockets lose a wake-up that way now and then (seen
here: a kernel_info reply sat in the shell socket while the reader waited forever). So each reader
drains its socket until it is empty and ``EVENTS`` confirms it, and every send wakes the reader of
that socket to drain again.

Kernel code holds the kernel's key and sockets, so every message it sends is attacker-controlled;
the host's memory stays bounded whatever arrives. Each frame is bounded by ZMQ (`message_limit`,
derived from the output limit; a kernel that breaks it loses its connection and is killed), ZMQ
queues few messages, each request's queue is bounded in messages and bytes, and output beyond an
execution's byte budget is dropped before it is parsed. The kernel trims what legitimate code sends
to fit (ipybox_kernel._launch). Not bounded: the number of frames in one message, which libzmq
takes in whole before handing over the first (SECURITY.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import anyio.abc
import zmq
from jupyter_client.connect import write_connection_file
from jupyter_client.session import Session
from zmq.utils.monitor import recv_monitor_message

from ._config import Limits, SandboxConfig
from ._exceptions import KernelDied, KernelStartError, UsageError
from ._tooldir import open_tools_dir
from .sandbox._cgroup import PidsCgroup
from .sandbox._sandbox import bwrap_argv, sandbox_filter_fd

__all__ = (
    "Display",
    "Dropped",
    "Error",
    "Kernel",
    "KernelEvent",
    "Reply",
    "Stream",
)

# How long one kernel_info request may go unanswered before it is sent again: the iopub
# subscription may not be connected yet, and a reply alone does not prove it is.
_READY_RETRY = 0.05
_READY_RETRY_MAX = 1.0
# How often the host's sockets retry connecting to a kernel that has not bound them yet.
_RECONNECT_MS = 5
# Once the kernel has answered, the iopub subscription is at most moments away: retry that soon.
_READY_RESEND = 0.01
# Messages waiting for one request's consumer before the reader waits for it: by count (small
# messages) and by bytes as received (large ones; a single message always fits).
_QUEUE_MESSAGES = 1024
_QUEUE_BYTES = 8 * 1024 * 1024
# Complete messages ZMQ may hold for the host per socket before the kernel's side stops sending or
# drops; each can be a message_limit() in size, so this bounds ZMQ's share of the host's memory.
_RECEIVE_HWM = 8
# ipykernel encodes JSON with ensure_ascii=False, so one character takes at most 6 bytes (a control
# character escaped as \u001f).
_JSON_BYTES_PER_CHAR = 6
# Room in one message beyond its output: headers, metadata, field names, a trimmed traceback's markers.
_MESSAGE_OVERHEAD = 256 * 1024
# Frames in one Jupyter message the host reads: routing identities, the delimiter, five parts. Binary
# buffers (widgets) are not read at all.
_MAX_FRAMES = 16
# ZMQ retries a connection whose peer went away after its reconnect interval (_RECONNECT_MS); one it
# gave up for a protocol error sees no retry at all. This long without one, it was given up.
_RETRY_VERDICT = 0.5
# Header and parent header are a few hundred bytes; larger ones are not parsed.
_MAX_HEADER_BYTES = 64 * 1024
# A SIGKILLed process is reaped within milliseconds; this only bounds a pathological case.
_KILL_WAIT = 5.0
# Bytes of the kernel's raw stderr kept for error messages.
_STDERR_TAIL = 8192
# After the sandboxed kernel process exits, bwrap normally follows within milliseconds with the
# kernel's exit code; past this it is stuck (a stopped or hung init) and the sandbox is killed.
_SANDBOX_EXIT_GRACE = 2.0
# bwrap, bwrap's PID-namespace init, then the kernel: never deeper than this below our child.
_SANDBOX_DEPTH = 4

_Channel = Literal["shell", "iopub", "control"]
# Where a sandboxed kernel binds its ZMQ sockets: inside its own size-capped /tmp.
SANDBOX_SOCKET_DIR = "/tmp/.ipybox-kernel"
# Output messages: counted against the execution's byte budget, and dropped beyond it.
_OUTPUT_TYPES = frozenset({"stream", "display_data", "execute_result"})
# Everything the host reads; other messages (execute_input, comms, ...) are dropped unparsed.
_READ_TYPES = _OUTPUT_TYPES | {"error", "execute_reply", "status", "kernel_info_reply"}
# Separates ZMQ routing identities from the signed parts of a Jupyter message.
_DELIMITER = b"<IDS|MSG>"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True, slots=True)
class Stream:
    name: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True, slots=True)
class Display:
    kind: Literal["execute_result", "display_data"]
    data: Mapping[str, Any]
    metadata: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Error:
    ename: str
    evalue: str
    traceback: list[str]


@dataclass(frozen=True, slots=True)
class Reply:
    status: Literal["ok", "error", "aborted"]
    execution_count: int | None


@dataclass(frozen=True, slots=True)
class Dropped:
    """Output the host dropped unread because the execution's messages exceeded their budget.

    Attributes:
        size: How much, in bytes as the kernel sent it (JSON).
    """

    size: int


KernelEvent = Stream | Display | Error | Reply | Dropped


def message_limit(output_chars: int) -> int:
    """The largest message (each frame) the host takes from a kernel with this output limit, and
    the bytes of output messages it takes per execution.

    The kernel trims what it sends to fit (ipybox_kernel._launch: output, errors, echoed code);
    past this, a message can only come from code that forged it.
    """
    return _JSON_BYTES_PER_CHAR * output_chars + _MESSAGE_OVERHEAD


def limit_socket(socket: zmq.Socket[bytes], max_bytes: int) -> None:
    """Bound what ZMQ holds for the host on this socket: a frame above ``max_bytes`` makes ZMQ give
    the connection up (see `Kernel._watch_connection`), and few complete messages are queued."""
    socket.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    socket.setsockopt(zmq.RCVHWM, _RECEIVE_HWM)


class _Inbox:
    """The messages for one request, waiting for its consumer; bounded in count and bytes.

    Also the request's output budget: output messages beyond it are dropped before they are queued
    (or even parsed) and counted in ``dropped``.
    """

    def __init__(self, budget: int) -> None:
        self._queue: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._closed = False
        self._wakeup: anyio.Event | None = None
        self.budget = budget
        self.dropped = 0

    def _notify(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def _wait(self) -> None:
        if self._wakeup is None:
            self._wakeup = anyio.Event()
        await self._wakeup.wait()

    def _full(self, size: int) -> bool:
        return bool(self._queue) and (len(self._queue) >= _QUEUE_MESSAGES or self._bytes + size > _QUEUE_BYTES)

    async def put(self, msg: dict[str, Any], size: int) -> None:
        """Queue a message, waiting while the queue is full; dropped if the inbox is closed."""
        while self._full(size) and not self._closed:
            await self._wait()
        if not self._closed:
            self._queue.append((msg, size))
            self._bytes += size
            self._notify()

    def close(self) -> None:
        self._closed = True
        self._notify()

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._wait()
        msg, size = self._queue.popleft()
        self._bytes -= size
        self._notify()
        return msg


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _parse(msg: dict[str, Any]) -> KernelEvent | None:
    kind = msg["header"]["msg_type"]
    content: dict[str, Any] = msg["content"]
    if kind == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return Stream(name, str(content.get("text", "")))
    if kind in ("execute_result", "display_data"):
        return Display(kind, content.get("data") or {}, content.get("metadata") or {})
    if kind == "error":
        return Error(
            str(content.get("ename", "")),
            str(content.get("evalue", "")),
            [str(line) for line in content.get("traceback", [])],
        )
    if kind == "execute_reply":
        status = content.get("status")
        return Reply(
            status if status in ("ok", "error", "aborted") else "error",
            content.get("execution_count"),
        )
    return None


class Kernel:
    """A running kernel. Create with ``async with Kernel.start(...)``."""

    def __init__(
        self,
        process: anyio.abc.Process,
        session: Session,
        sockets: Mapping[_Channel, zmq.Socket[bytes]],
        run_dir: Path,
        limits: Limits,
    ) -> None:
        self._process = process
        self._session = session
        self._mac = hmac.new(session.key, digestmod=hashlib.sha256)
        self._sockets = sockets
        # The cancel scope a channel's reader waits in, to wake it after a send (see the module doc).
        self._idle_readers: dict[_Channel, anyio.CancelScope] = {}
        self.run_dir = run_dir
        self._waiters: dict[str, _Inbox] = {}
        self._message_limit = message_limit(limits.output_chars)
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0
        self.exit_code: int | None = None
        # Why the host killed the kernel, when it did so because the kernel misbehaved.
        self.stop_reason: str | None = None
        self.exited = anyio.Event()
        # The host pid of the kernel process inside the sandbox, once found.
        self._sandbox_pid: int | None = None

    def _msg(self, msg_type: str, content: dict[str, Any], *, msg_id: str | None = None) -> dict[str, Any]:
        header = None
        if msg_id is not None:
            header = self._session.msg_header(msg_type)
            header["msg_id"] = msg_id
        return self._session.msg(msg_type, content, header=header)  # pyright: ignore[reportUnknownMemberType]

    @property
    def pid(self) -> int:
        return self._process.pid

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        *,
        python: Sequence[str],
        env: Mapping[str, str],
        workspace: Path,
        sandbox: SandboxConfig | None,
        tools_dir: Path | None,
        hidden: Sequence[Path],
        limits: Limits,
        start_timeout: float,
        run_dir: Path | None = None,
    ) -> AsyncGenerator[Kernel]:
        """Launch a kernel and wait until it answers on every channel it uses.

        Raises:
            KernelStartError: The kernel exited or did not become ready within ``start_timeout``.
        """
        run_dir = run_dir or Path(tempfile.mkdtemp(prefix="ipybox-"))
        sockets: dict[_Channel, zmq.Socket[bytes]] = {}
        cgroup: PidsCgroup | None = None
        seccomp_fd: int | None = None
        ready_read: int | None = None
        ready_write: int | None = None
        tools_fd: int | None = None
        try:
            env = dict(env)
            if "HOME" not in env:
                # Unsandboxed: a private home and IPython dir that are deleted with the run dir.
                (run_dir / "home").mkdir()
                env["HOME"] = str(run_dir / "home")
                env.setdefault("IPYTHONDIR", str(run_dir / "home" / ".ipython"))
            connection_file = str(run_dir / "kernel.json")
            key = secrets.token_hex(32).encode()
            # Sandboxed, the kernel binds its sockets in its own size-capped /tmp, and the run dir
            # is mounted read-only: nothing the kernel writes lands in the host's filesystem.
            socket_base = f"{SANDBOX_SOCKET_DIR}/zmq" if sandbox is not None else str(run_dir / "zmq")
            _, info = write_connection_file(connection_file, transport="ipc", ip=socket_base, key=key)
            argv = [*python, "-m", "ipybox_kernel._launch", "-f", connection_file]
            for flag, value in (
                ("--memory", limits.memory),
                ("--cpu", limits.cpu_seconds),
                ("--files", limits.open_files),
                ("--output", limits.output_chars),
                ("--message-bytes", message_limit(limits.output_chars)),
            ):
                if value is not None:
                    argv += [flag, str(value)]
            if sandbox is not None:
                if tools_dir is not None:
                    try:
                        tools_fd = open_tools_dir(tools_dir)
                    except UsageError as exc:
                        raise KernelStartError(str(exc)) from None
                seccomp_fd = sandbox_filter_fd()
                ready_read, ready_write = os.pipe()
                argv += ["--ready-fd", str(ready_write)]
                argv = [
                    *bwrap_argv(
                        sandbox,
                        workspace=workspace,
                        run_dir=run_dir,
                        tools_dir=tools_dir,
                        hidden=hidden,
                        tmp_size=limits.tmp_bytes,
                        seccomp_fd=seccomp_fd,
                        socket_dir=SANDBOX_SOCKET_DIR,
                        tools_dir_fd=tools_fd,
                    ),
                    *argv,
                ]
            # Sockets before the process: a failure here leaves no kernel behind, and their connects
            # are already being retried when the kernel binds.
            session = Session(key=key, signature_scheme="hmac-sha256")
            context = cast("zmq.Context[zmq.Socket[bytes]]", zmq.Context.instance())
            channels: tuple[tuple[_Channel, int], ...] = (
                ("shell", zmq.DEALER),
                ("control", zmq.DEALER),
                ("iopub", zmq.SUB),
            )
            for name, kind in channels:
                socket = sockets[name] = context.socket(kind)
                socket.linger = 0
                limit_socket(socket, message_limit(limits.output_chars))
                # The kernel binds its sockets only after its imports; until then each connect
                # fails and is retried after this many ms (ZMQ's default, 100, delays readiness).
                socket.reconnect_ivl = _RECONNECT_MS
                if kind == zmq.DEALER:
                    socket.identity = session.bsession
                else:
                    socket.setsockopt(zmq.SUBSCRIBE, b"")
                if sandbox is None:
                    socket.connect(f"ipc://{socket_base}-{cast('dict[str, object]', info)[f'{name}_port']}")
            cgroup = PidsCgroup.create(limits.processes) if limits.processes is not None else None
            if cgroup is not None:
                # The launcher joins the cgroup before it becomes bwrap, so nothing escapes it.
                argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup.path / "cgroup.procs"), *argv]
            process = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                cwd=workspace,
                start_new_session=True,
                pass_fds=tuple(fd for fd in (seccomp_fd, ready_write, tools_fd) if fd is not None),
            )
            # bwrap has its own copies; ours must not leak into later children, and the ready pipe
            # must reach end-of-file when the sandbox exits.
            _close_fd(seccomp_fd)
            _close_fd(ready_write)
            _close_fd(tools_fd)
            seccomp_fd = ready_write = tools_fd = None
            kernel = cls(process, session, sockets, run_dir, limits)
            failure: KernelStartError | None = None
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(kernel._watch_process)
                    tg.start_soon(kernel._read_stderr)
                    tg.start_soon(kernel._read_channel, "iopub")
                    tg.start_soon(kernel._read_channel, "shell")
                    # Nothing waits for control replies; read them so that they do not pile up.
                    tg.start_soon(kernel._read_channel, "control")
                    try:
                        with anyio.fail_after(start_timeout):
                            if ready_read is not None:
                                await kernel._connect_sandboxed(ready_read, python[0], info)
                            await kernel._wait_ready()
                    except TimeoutError:
                        failure = KernelStartError(
                            f"the kernel did not become ready within {start_timeout:g} s", output=kernel.stderr_tail()
                        )
                    except KernelStartError as exc:
                        failure = exc
                    if failure is None and sandbox is not None:
                        tg.start_soon(kernel._watch_sandboxed_kernel)
                    if failure is None:
                        for name in sockets:
                            tg.start_soon(kernel._watch_connection, name)
                    if failure is not None:
                        # Raised after the task group has closed, so it is not wrapped in a group.
                        kernel.kill()
                        tg.cancel_scope.cancel()
                    else:
                        try:
                            yield kernel
                        finally:
                            kernel.kill()
                            tg.cancel_scope.cancel()
                if failure is not None:
                    raise failure
            finally:
                kernel.kill()
                with anyio.CancelScope(shield=True):
                    await process.aclose()
        finally:
            for fd in (seccomp_fd, ready_read, ready_write, tools_fd):
                _close_fd(fd)
            for socket in sockets.values():
                socket.close()
            if cgroup is not None:
                with anyio.CancelScope(shield=True):
                    await cgroup.remove()
            shutil.rmtree(run_dir, ignore_errors=True)

    def kill(self) -> None:
        """Kill the kernel and everything it started (the process group, or the whole sandbox)."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)

    async def kill_and_wait(self) -> None:
        """Kill the kernel and wait until its exit has been seen."""
        self.kill()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_WAIT):
            await self.exited.wait()

    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code (by message: signals do
        not reach a kernel inside a PID namespace)."""
        if not self.exited.is_set():
            self._send("control", self._msg("interrupt_request", {}))

    def new_msg_id(self) -> str:
        """A fresh id for a request to this kernel (see `execute`)."""
        return self._session.msg_id

    async def execute(self, code: str, *, msg_id: str | None = None) -> AsyncGenerator[KernelEvent]:
        """Run code and yield its events until the kernel is idle again.

        Args:
            code: The code.
            msg_id: The request's id (default: a fresh one). The kernel gives it to the code as the
                running cell's id, and sends it back with each tool call that code makes.

        Raises:
            KernelDied: The kernel exited before the execution completed.
        """
        msg = self._msg(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": False,
            },
            msg_id=msg_id,
        )
        replied = idle = False
        async with self._request(msg, "shell") as inbox:
            async for raw in inbox:
                if raw["header"]["msg_type"] == "status":
                    idle = raw["content"].get("execution_state") == "idle"
                else:
                    event = _parse(raw)
                    if event is not None:
                        replied = replied or isinstance(event, Reply)
                        yield event
                # Output can still arrive on iopub after execute_reply; idle is the end of it.
                if replied and idle:
                    if inbox.dropped:
                        yield Dropped(inbox.dropped)
                    return
        raise KernelDied(self.exit_code, reason=self.stop_reason)

    @asynccontextmanager
    async def _request(self, msg: dict[str, Any], channel: Literal["shell", "control"]) -> AsyncGenerator[_Inbox]:
        msg_id: str = msg["header"]["msg_id"]
        inbox = self._waiters[msg_id] = _Inbox(self._message_limit)
        try:
            if self.exited.is_set():
                inbox.close()
            else:
                self._send(channel, msg)
            yield inbox
        finally:
            self._waiters.pop(msg_id, None)
            inbox.close()

    async def _wait_ready(self) -> None:
        """Return once the kernel answers on shell and iopub; the caller bounds the wait.

        kernel_info requests are repeated (the iopub subscription may not be connected when the
        first answer is published), and an answer to any of them counts: on a busy machine the
        kernel may answer an earlier request only after a later one was sent.

        Raises:
            KernelStartError: The kernel exited first.
        """
        inbox = _Inbox(self._message_limit)
        sent: list[str] = []
        replied: set[str] = set()
        idle: set[str] = set()
        interval = _READY_RETRY
        resend = False
        try:
            while not self.exited.is_set():
                msg = self._msg("kernel_info_request", {})
                sent.append(msg["header"]["msg_id"])
                self._waiters[sent[-1]] = inbox
                self._send("shell", msg)
                with anyio.move_on_after(interval) as wait:
                    async for raw in inbox:
                        parent = raw["parent_header"].get("msg_id")
                        kind = raw["header"]["msg_type"]
                        if kind == "kernel_info_reply":
                            replied.add(parent)
                            if not replied & idle and not resend:
                                # The kernel is up, but the idle of what it answered went out before
                                # our iopub subscription reached it: ask again now, not after the backoff.
                                resend = True
                                interval = _READY_RESEND
                                wait.deadline = min(wait.deadline, anyio.current_time() + interval)
                        elif kind == "status" and raw["content"].get("execution_state") == "idle":
                            idle.add(parent)
                        if replied & idle:
                            return
                interval = min(interval * 2, _READY_RETRY_MAX)
        finally:
            for msg_id in sent:
                self._waiters.pop(msg_id, None)
            inbox.close()
        raise KernelStartError(
            f"the kernel exited during start-up (exit code {self.exit_code})", output=self.stderr_tail()
        )

    async def _watch_process(self) -> None:
        self.exit_code = await self._process.wait()
        self.exited.set()
        for inbox in list(self._waiters.values()):
            inbox.close()

    async def _watch_connection(self, name: _Channel) -> None:
        """Kill a kernel that broke its connection on this channel.

        ZMQ gives up a connection whose peer sent a frame larger than the socket's limit (see
        `limit_socket`) or anything that is not ZMTP, for good: whatever the kernel sends on it
        afterwards, an execution's end among it, is lost and the execution would wait forever. The
        kernel's output guard keeps legitimate messages within the limit, so such a kernel has gone
        around it. (A connection whose peer closed, as when the kernel dies, is retried instead.)
        """
        socket = self._sockets[name]
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        # When a drop not followed by a retry is taken for a protocol error.
        verdict: float | None = None
        try:
            while True:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
                except zmq.Again:
                    if cast("int", monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                        continue
                    with anyio.move_on_after(math.inf if verdict is None else verdict - anyio.current_time()):
                        await anyio.wait_readable(monitor.fileno())
                    if verdict is not None and anyio.current_time() >= verdict:
                        verdict = None
                        if not self.exited.is_set():
                            self.stop_reason = (
                                f"it broke its {name} connection to the host by sending a message larger than the "
                                f"host accepts ({self._message_limit} bytes, set by Limits.output_chars) or one "
                                "that is not ZMQ at all; code that does not go around ipybox's output guard does "
                                "neither"
                            )
                            self.kill()
                            return
                    continue
                verdict = anyio.current_time() + _RETRY_VERDICT if event == zmq.EVENT_DISCONNECTED else None
        finally:
            socket.disable_monitor()
            monitor.close()

    async def _connect_sandboxed(self, ready: int, executable: str, info: object) -> None:
        """Connect to a sandboxed kernel's sockets once it says they are bound.

        They live in the sandbox's private ``/tmp``, which the host reaches through the kernel
        process's root (``/proc/PID/root``). Only after the kernel has written to ``ready`` is that
        root the sandbox's for certain; before bwrap's pivot it would still be the host's.

        Raises:
            KernelStartError: The kernel exited before binding its sockets.
        """
        await anyio.wait_readable(ready)
        if not os.read(ready, 1):
            raise KernelStartError(
                f"the kernel exited during start-up (exit code {await self._process.wait()})",
                output=self.stderr_tail(),
            )
        self._sandbox_pid = _sandboxed_kernel_pid(self._process.pid, executable)
        if self._sandbox_pid is None:
            message = "the sandboxed kernel process could not be found in /proc"
            raise KernelStartError(message, output=self.stderr_tail())
        ports = cast("dict[str, object]", info)
        for name, socket in self._sockets.items():
            socket.connect(f"ipc:///proc/{self._sandbox_pid}/root{SANDBOX_SOCKET_DIR}/zmq-{ports[f'{name}_port']}")

    async def _watch_sandboxed_kernel(self) -> None:
        """Kill the sandbox when the kernel process inside it exits and the sandbox does not follow.

        The process we wait on is bwrap; it exits when the kernel does only if bwrap's init in the
        PID namespace reaps it. A stopped or hung init (kernel code can reach it: same uid) would
        leave a dead kernel unnoticed, so the kernel's own host pid is watched through a pidfd.
        """
        pid = self._sandbox_pid
        if pid is None:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = None
        if pidfd is not None:
            try:
                # A pidfd turns readable when its process exits.
                await anyio.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        with anyio.move_on_after(_SANDBOX_EXIT_GRACE):
            await self.exited.wait()
        self.kill()

    async def _read_stderr(self) -> None:
        stream = self._process.stderr
        assert stream is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            while True:
                chunk = await stream.receive()
                self._stderr.append(chunk)
                self._stderr_size += len(chunk)
                while self._stderr_size > _STDERR_TAIL and len(self._stderr) > 1:
                    self._stderr_size -= len(self._stderr.popleft())

    def _send(self, channel: _Channel, msg: dict[str, Any]) -> None:
        self._session.send(self._sockets[channel], msg)  # pyright: ignore[reportUnknownMemberType]
        # The send may have taken the descriptor's signal for a message that has already arrived.
        reader = self._idle_readers.get(channel)
        if reader is not None:
            reader.cancel()

    async def _read_channel(self, name: _Channel) -> None:
        socket = self._sockets[name]
        while True:
            try:
                frames = self._receive(socket)
            except zmq.Again:
                if cast("int", socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    continue
                # Empty, and ZMQ knows it: the next message signals the descriptor again.
                with anyio.CancelScope() as self._idle_readers[name]:
                    await anyio.wait_readable(socket.fileno())
                del self._idle_readers[name]
                continue
            if frames is None:
                continue
            delivery = self._decode(frames)
            if delivery is not None:
                inbox, msg, size = delivery
                await inbox.put(msg, size)

    def _receive(self, socket: zmq.Socket[bytes]) -> list[bytes] | None:
        """The frames of the next message; None if it broke a limit (it has been read and discarded).

        ZMQ bounds each frame (MAXMSGSIZE), not how many there are: frames past the limits are read
        and let go one at a time, never kept.

        Raises:
            zmq.Again: No message is waiting.
        """
        frames = [socket.recv(zmq.NOBLOCK)]
        size = len(frames[0])
        kept = True
        # The rest of a message is there as soon as its first frame is: ZMQ delivers whole messages.
        while socket.getsockopt(zmq.RCVMORE):
            frame = socket.recv(zmq.NOBLOCK)
            if kept:
                size += len(frame)
                if len(frames) < _MAX_FRAMES and size <= self._message_limit:
                    frames.append(frame)
                else:
                    kept = False
                    frames.clear()
        return frames if kept else None

    def _decode(self, frames: list[bytes]) -> tuple[_Inbox, dict[str, Any], int] | None:
        """The message in ``frames``, the inbox it goes to and its size; None if it is not wanted.

        Cheapest checks first: whom it is for and what it is (two small frames), then the budget,
        and only then the signature and the content. Output beyond the budget is counted, never
        parsed. jupyter_client's ``Session.deserialize`` also parses every date in the headers and
        keeps a history of signatures; neither is needed here, and skipping them halves the host's
        share of an execution's round trip.
        """
        try:
            start = frames.index(_DELIMITER) + 1
        except ValueError:
            return None
        if len(frames) < start + 5:
            return None
        signature, header, parent, metadata, content = frames[start : start + 5]
        if len(header) > _MAX_HEADER_BYTES or len(parent) > _MAX_HEADER_BYTES:
            return None
        try:
            parent_header: object = json.loads(parent)
            header_fields: object = json.loads(header)
        except ValueError:
            return None
        if not isinstance(parent_header, dict) or not isinstance(header_fields, dict):
            return None
        inbox = self._waiters.get(cast("dict[str, object]", parent_header).get("msg_id"))  # pyright: ignore[reportArgumentType]
        kind = cast("dict[str, object]", header_fields).get("msg_type")
        if inbox is None or kind not in _READ_TYPES:
            return None
        size = sum(map(len, frames))
        output = kind in _OUTPUT_TYPES
        if output and size > inbox.budget:
            inbox.dropped += len(content)
            return None
        mac = self._mac.copy()
        for part in (header, parent, metadata, content):
            mac.update(part)
        if not hmac.compare_digest(signature, mac.hexdigest().encode()):
            # Unsigned or tampered with: not from our kernel.
            return None
        try:
            body: object = json.loads(content)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        if output:
            inbox.budget -= size
        return inbox, {"header": header_fields, "parent_header": parent_header, "content": body}, size


def bytecode_missing() -> bool:
    """Whether ipykernel was installed without compiled bytecode.

    A sandboxed kernel sees the environment read-only, so it cannot cache what it compiles and
    compiles IPython, ipykernel and their dependencies from source on every start.
    """
    spec = importlib.util.find_spec("ipykernel")
    if spec is None or spec.origin is None:
        return False
    cached = Path(importlib.util.cache_from_source(str(Path(spec.origin).with_name("kernelapp.py"))))
    return not cached.exists()


def _sandboxed_kernel_pid(root: int, executable: str) -> int | None:
    """The host pid of the kernel process below ``root`` (our bwrap child): the first descendant
    running ``executable``. None if there is none."""
    target = os.path.realpath(executable)
    pids = [root]
    for _ in range(_SANDBOX_DEPTH):
        below: list[int] = []
        for pid in pids:
            try:
                if os.readlink(f"/proc/{pid}/exe") == target:
                    return pid
            except OSError:
                continue
            below += _children(pid)
        pids = below
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        pass  # a kernel built without CONFIG_PROC_CHILDREN: look at every process's parent
    except OSError:
        return []
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _close_fd(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def default_python() -> list[str]:
    """The kernel's interpreter command line.

    ``-P``: ``python -m`` would put the working directory (the workspace, which kernel code writes)
    first on ``sys.path``, so a planted ``ipybox_kernel.py`` or ``argparse.py`` would run as the
    launcher. The launcher appends the workspace at the end of ``sys.path`` instead.

    The interpreter's directory is resolved (a path through ``..`` or a directory that exists only
    on the host would not exist in the sandbox), its file name kept: a venv's ``python`` is a
    symlink, and its own path is how it finds the venv.
    """
    executable = Path(sys.executable)
    return [str(executable.parent.resolve() / executable.name), "-P"]
