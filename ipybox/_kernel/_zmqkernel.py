"""One IPython kernel process, optionally sandboxed, and the code it runs.

The kernel speaks the Jupyter protocol over ZMQ ``ipc://`` sockets in a private run directory
(they work across the sandbox's empty network namespace). The host launches the process itself
rather than through jupyter_client's manager so that it can wait on the process's exit instead of
polling it: a kernel that dies mid-execution is noticed at once.

The host's end of each channel is ipybox's own ZMTP reader (`._zmtp`), not libzmq: kernel code
holds the kernel's key and sockets, so every message it sends is attacker-controlled, and the host's
memory stays bounded whatever arrives. A frame larger than `message_limit` (derived from the output
limit) ends the connection and the kernel is killed with the reason; a message of more frames or
bytes than that is read past without being held; each request's queue is bounded in messages and
bytes, and output beyond an execution's byte budget is dropped before it is parsed. The kernel trims
what legitimate code sends to fit (ipybox_kernel._launch).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import anyio.abc
from jupyter_client.connect import write_connection_file
from jupyter_client.session import Session

from ipybox._exceptions import KernelDied, KernelStartError, UsageError
from ipybox._settings import Limits, SandboxConfig
from ipybox._tooldir import open_tools_dir
from ipybox.sandbox._cgroup import SandboxCgroup
from ipybox.sandbox._kerneluid import KernelUid, kernel_uid
from ipybox.sandbox._sandbox import bwrap_argv, sandbox_filter_fd

from ._messages import Inbox, KernelEvent, decode, message_limit
from ._process import (
    StderrTail,
    close_fd,
    launcher_argv,
    launcher_rlimits,
    limit_sandbox_init,
    live_tasks,
    sandboxed_kernel_pid,
    tree_cpu_seconds,
    wait_for_exit,
)
from ._requests import ChannelName, Requests
from ._zmtp import Channel, FrameLimits, ProtocolViolation

__all__ = ("SANDBOX_SOCKET_DIR", "Kernel")

# How long one kernel_info request may go unanswered before it is sent again: the iopub
# subscription may not be connected yet, and a reply alone does not prove it is.
_READY_RETRY = 0.05
_READY_RETRY_MAX = 1.0
# Once the kernel has answered, the iopub subscription is at most moments away: retry that soon.
_READY_RESEND = 0.01
# Frames in one Jupyter message the host reads: routing identities, the delimiter, five parts. A
# message of more (binary buffers, as widgets send) is read past, not held.
_MAX_FRAMES = 16
# A kernel that dies closes its connections first; its exit follows within this. One still running
# after it closed a connection on purpose.
_CLOSE_GRACE = 2.0
# A SIGKILLed process is reaped within milliseconds; this only bounds a pathological case.
_KILL_WAIT = 5.0
# After the sandboxed kernel process exits, bwrap normally follows within milliseconds with the
# kernel's exit code; past this it is stuck (a stopped or hung init) and the sandbox is killed.
_SANDBOX_EXIT_GRACE = 2.0

_ChannelName = Literal["shell", "iopub", "control"]
# Where a sandboxed kernel binds its ZMQ sockets: inside its own size-capped /tmp.
SANDBOX_SOCKET_DIR = "/tmp/.ipybox-kernel"


class Kernel:
    """A running kernel. Create with ``async with Kernel.start(...)``."""

    unseen = False

    def __init__(
        self,
        process: anyio.abc.Process,
        session: Session,
        channels: Mapping[_ChannelName, Channel],
        run_dir: Path,
        limits: Limits,
        cgroup: SandboxCgroup | None = None,
    ) -> None:
        self._process = process
        self._limits = limits
        self._cgroup = cgroup
        # Whether the host killed the kernel (then a memory cgroup's OOM count does not say why it died).
        self._killed = False
        self._session = session
        self._signer = hmac.new(session.key, digestmod=hashlib.sha256)
        self._channels = channels
        self.run_dir = run_dir
        self._message_limit = message_limit(limits.output_chars)
        self._stderr = StderrTail()
        self.exit_code: int | None = None
        # Why the host killed the kernel, when it did so because the kernel misbehaved.
        self.stop_reason: str | None = None
        self.exited = anyio.Event()
        # The host pid of the kernel process inside the sandbox, once found.
        self._sandbox_pid: int | None = None
        self._requests = Requests(
            self,
            budget=self._message_limit,
            exited=self.exited,
            lost=lambda: KernelDied(self.exit_code, reason=self.stop_reason),
            new_msg_id=self.new_msg_id,
        )
        self._waiters = self._requests.waiters

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
        host_dirs: Sequence[tuple[Path, str]] = (),
        private: Sequence[Path] = (),
    ) -> AsyncGenerator[Kernel]:
        """Launch a kernel and wait until it answers on every channel it uses.

        ``host_dirs`` are further host-owned directories mounted read-only (the skills directory),
        each with the setting that names it in errors; each is checked again as it is opened.
        ``private`` are the executor's own files the sandboxed kernel uses (the tool and proxy
        sockets, the import root): when it runs under a host uid of its own, they are given to its group.

        Raises:
            KernelStartError: The kernel exited or did not become ready within ``start_timeout``.
        """
        run_dir = run_dir or Path(tempfile.mkdtemp(prefix="ipybox-"))
        cgroup: SandboxCgroup | None = None
        seccomp_fd: int | None = None
        ready_read: int | None = None
        ready_write: int | None = None
        tools_fd: int | None = None
        dir_fds: list[tuple[Path, int]] = []
        own_uid: KernelUid | None = None
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
            # The kernel writes to this pipe once its sockets are bound: the host connects then.
            ready_read, ready_write = os.pipe()
            argv = launcher_argv(python, connection_file, ready_write, limits)
            if sandbox is not None:
                if tools_dir is not None:
                    try:
                        tools_fd = open_tools_dir(tools_dir)
                    except UsageError as exc:
                        raise KernelStartError(str(exc)) from None
                for path, what in host_dirs:
                    try:
                        dir_fds.append((path, open_tools_dir(path, what=what)))
                    except UsageError as exc:
                        raise KernelStartError(str(exc)) from None
                own_uid = kernel_uid([workspace, *map(Path, sandbox.rw_paths)])
                if own_uid is not None:
                    for path in (run_dir, Path(connection_file), *private):
                        own_uid.grant(path, _group_mode(path))
                    # The uid has no account: getpass.getuser() and the like read these first.
                    env = {"USER": "ipybox", "LOGNAME": "ipybox", **env}
                seccomp_fd = sandbox_filter_fd()
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
                        host_dirs=dir_fds,
                        own_uid=own_uid,
                    ),
                    *argv,
                ]
                if own_uid is not None:
                    argv = [*own_uid.launcher(processes=limits.processes, rlimits=launcher_rlimits(limits)), *argv]
            session = Session(key=key, signature_scheme="hmac-sha256")
            limit = message_limit(limits.output_chars)
            frame_limits = FrameLimits(frame_bytes=limit, message_bytes=limit, message_frames=_MAX_FRAMES)
            channels: dict[_ChannelName, Channel] = {
                "shell": Channel("DEALER", frame_limits, identity=session.bsession),
                "control": Channel("DEALER", frame_limits, identity=session.bsession),
                "iopub": Channel("SUB", frame_limits),
            }
            cgroup = SandboxCgroup.create(processes=limits.processes, memory=limits.memory)
            if cgroup.procs_files:
                # The launcher joins the cgroups before it becomes bwrap, so nothing escapes them.
                argv = [*_join_cgroups(cgroup.procs_files), *argv]
            process = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                cwd=workspace,
                start_new_session=True,
                pass_fds=tuple(
                    fd for fd in (seccomp_fd, ready_write, tools_fd, *(fd for _, fd in dir_fds)) if fd is not None
                ),
            )
            # bwrap has its own copies; ours must not leak into later children, and the ready pipe
            # must reach end-of-file when the sandbox exits.
            close_fd(seccomp_fd)
            close_fd(ready_write)
            close_fd(tools_fd)
            for _, fd in dir_fds:
                close_fd(fd)
            dir_fds.clear()
            seccomp_fd = ready_write = tools_fd = None
            kernel = cls(process, session, channels, run_dir, limits, cgroup)
            failure: KernelStartError | None = None
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(kernel._watch_process)
                    assert process.stderr is not None
                    tg.start_soon(kernel._stderr.read, process.stderr)
                    try:
                        with anyio.fail_after(start_timeout):
                            await kernel._connect(
                                ready_read,
                                python[0],
                                info,
                                sandboxed=sandbox is not None,
                                init_limited=own_uid is not None,
                            )
                            # Control replies are read too (nothing waits for them) so they do not pile up.
                            for name in channels:
                                tg.start_soon(kernel._run_channel, name)
                            await kernel._wait_ready()
                    except TimeoutError:
                        failure = KernelStartError(
                            f"the kernel did not become ready within {start_timeout:g} s", output=kernel.stderr_tail()
                        )
                    except KernelStartError as exc:
                        failure = exc
                    if failure is None and sandbox is not None:
                        tg.start_soon(kernel._watch_sandboxed_kernel)
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
            for fd in (seccomp_fd, ready_read, ready_write, tools_fd, *(fd for _, fd in dir_fds)):
                close_fd(fd)
            if cgroup is not None:
                with anyio.CancelScope(shield=True):
                    await cgroup.remove()
            if own_uid is not None:
                own_uid.remove()
            shutil.rmtree(run_dir, ignore_errors=True)

    def kill(self) -> None:
        """Kill the kernel and everything it started (the process group, or the whole sandbox)."""
        if self._process.returncode is None:
            self._killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)

    async def kill_and_wait(self) -> None:
        """Kill the kernel and wait until its exit has been seen."""
        self.kill()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_WAIT):
            await self.exited.wait()

    def stderr_tail(self) -> str:
        return self._stderr.text()

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code (by message: signals do
        not reach a kernel inside a PID namespace)."""
        self._requests.interrupt()

    def cpu_seconds(self) -> float:
        """CPU seconds used by the kernel and everything it started (the whole sandbox)."""
        return tree_cpu_seconds(self._process.pid)

    def live_tasks(self) -> frozenset[tuple[int, int]]:
        """Every live thread of the kernel and of every process it started (the whole sandbox)."""
        return live_tasks(self._process.pid)

    def new_msg_id(self) -> str:
        """A fresh id for a request to this kernel (see `execute`)."""
        return self._session.msg_id

    def execute(self, code: str, *, msg_id: str | None = None) -> AsyncGenerator[KernelEvent]:
        """Run code and yield its events until the kernel is idle again.

        Args:
            code: The code.
            msg_id: The request's id (default: a fresh one). The kernel gives it to the code as the
                running cell's id, and sends it back with each tool call that code makes.

        Raises:
            KernelDied: The kernel exited before the execution completed.
        """
        return self._requests.execute(code, msg_id=msg_id)

    async def evaluate(self, expressions: dict[str, str]) -> dict[str, object] | None:
        """Evaluate expressions in the kernel (see `Requests.evaluate`).

        Raises:
            KernelDied: The kernel exited before it replied.
        """
        return await self._requests.evaluate(expressions)

    def send(self, channel: ChannelName, msg_type: str, content: dict[str, Any], msg_id: str) -> None:
        """Send a request on a channel (the `ChannelTransport` of this kernel's requests)."""
        self._send(channel, self._msg(msg_type, content, msg_id=msg_id))

    async def _wait_ready(self) -> None:
        """Return once the kernel answers on shell and iopub; the caller bounds the wait.

        kernel_info requests are repeated (the iopub subscription may not be connected when the
        first answer is published), and an answer to any of them counts: on a busy machine the
        kernel may answer an earlier request only after a later one was sent.

        Raises:
            KernelStartError: The kernel exited first.
        """
        inbox = Inbox(self._message_limit)
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
        if self.stop_reason is None and not self._killed and self._cgroup is not None and self._cgroup.oom_kills():
            limit = self._cgroup.memory_limit or 0
            self.stop_reason = (
                f"its sandbox reached Limits.memory ({limit / 1024**2:g} MiB for its processes and its "
                "/tmp and /dev/shm together) and the out-of-memory killer ended it; use less memory "
                "(delete large objects and files in /tmp) or raise Limits.memory"
            )
        self.exited.set()
        self._requests.close_all()

    async def _connect(
        self, ready: int, executable: str, info: object, *, sandboxed: bool, init_limited: bool = False
    ) -> None:
        """Connect to the kernel's sockets once it says they are bound.

        A sandboxed kernel's live in the sandbox's private ``/tmp``, which the host reaches through
        the kernel process's root (``/proc/PID/root``). Only after the kernel has written to
        ``ready`` is that root the sandbox's for certain; before bwrap's pivot it would still be the
        host's. ``init_limited``: the sandbox's init already has the kernel's resource limits (its
        launcher set them before it became bwrap; root without ``CAP_SYS_RESOURCE`` could not set them
        on another uid's process).

        Raises:
            KernelStartError: The kernel exited before binding its sockets, or they cannot be reached.
        """
        await anyio.wait_readable(ready)
        if not os.read(ready, 1):
            raise KernelStartError(
                f"the kernel exited during start-up (exit code {await self._process.wait()})",
                output=self.stderr_tail(),
            )
        fields = cast("dict[str, object]", info)
        base = str(fields["ip"])
        if sandboxed:
            self._sandbox_pid = sandboxed_kernel_pid(self._process.pid, executable)
            if self._sandbox_pid is None:
                message = "the sandboxed kernel process could not be found in /proc"
                raise KernelStartError(message, output=self.stderr_tail())
            if not init_limited:
                limit_sandbox_init(self._sandbox_pid, self._limits)
            base = f"/proc/{self._sandbox_pid}/root{base}"
        for name, channel in self._channels.items():
            path = f"{base}-{fields[f'{name}_port']}"
            try:
                await channel.connect(path)
            except OSError as exc:
                message = f"the kernel's {name} socket ({path}) refused the host: {exc}"
                raise KernelStartError(message, output=self.stderr_tail()) from None

    async def _run_channel(self, name: _ChannelName) -> None:
        """Read a channel until it ends; kill a kernel that broke it or closed it while running.

        Whatever the kernel would send on a channel it broke, an execution's end among it, is lost,
        and the execution would wait forever. The kernel's output guard keeps legitimate messages
        within the limits, so such a kernel has gone around it.
        """
        try:
            await self._channels[name].run(self._deliver)
        except ProtocolViolation as exc:
            reason = (
                f"it broke its {name} connection to the host: it sent {exc.reason}; code that does not go "
                "around ipybox's output guard never does"
            )
        else:
            reason = f"it closed its {name} connection to the host while it kept running"
            with anyio.move_on_after(_CLOSE_GRACE):
                await self.exited.wait()
        if not self.exited.is_set():
            self.stop_reason = reason
            self.kill()

    async def _watch_sandboxed_kernel(self) -> None:
        """Kill the sandbox when the kernel process inside it exits and the sandbox does not follow.

        The process we wait on is bwrap; it exits when the kernel does only if bwrap's init in the
        PID namespace reaps it. A stopped or hung init (kernel code can reach it: same uid) would
        leave a dead kernel unnoticed, so the kernel's own host pid is watched.
        """
        if self._sandbox_pid is None:
            return
        await wait_for_exit(self._sandbox_pid)
        with anyio.move_on_after(_SANDBOX_EXIT_GRACE):
            await self.exited.wait()
        self.kill()

    def _send(self, channel: _ChannelName, msg: dict[str, Any]) -> None:
        self._channels[channel].send(self._session.serialize(msg))

    async def _deliver(self, frames: list[bytes]) -> None:
        delivery = decode(frames, self._signer, self._waiters)
        if delivery is not None:
            await self._requests.deliver(*delivery)


def _group_mode(path: Path) -> int:
    """What the kernel's group may do with one of the host's files: enter and read a directory,
    connect to a socket, read a file; never change any of them."""
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        return 0o750
    return 0o620 if stat.S_ISSOCK(mode) else 0o640


def _join_cgroups(procs_files: Sequence[Path]) -> list[str]:
    """A shell prefix that writes its own pid into each ``cgroup.procs`` file, then execs the rest."""
    joins = " && ".join(f'echo $$ > "${i}"' for i in range(len(procs_files)))
    shift = f" && shift {len(procs_files) - 1}" if len(procs_files) > 1 else ""
    return ["/bin/sh", "-c", f'{joins}{shift} && exec "$@"', *map(str, procs_files)]
