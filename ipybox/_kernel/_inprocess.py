"""`InProcessShell`: a kernel that runs code in a thread of this process, for tests (not a sandbox).

It implements `KernelHandle` with an IPython `InteractiveShell` of its own, run by one worker
thread: the executor drives it exactly as it drives a sandboxed kernel, and kernel code reaches the
executor's real tool server and approval gate over the same socket, with the same token, the same
execution id and the same output marks. What differs is everything the sandbox and the separate
process give: the code runs with the host's privileges, memory, environment, working directory and
network, and can read or change anything the host can (`ipybox.testing` says so, and who may use it).

How a real kernel's parts are stood in for:

- the cell's output: ``sys.stdout``/``sys.stderr`` are wrapped once (`_CellStream`) and route what
  the cell (and any thread carrying its context) writes to that cell's events; other threads write
  to the streams as before. Output written to file descriptors 1 and 2 (subprocesses, C code) is
  not the cell's and goes where the host's goes.
- results, ``display()`` and errors: the shell's display hook, display publisher and traceback
  printer emit `Display` and `Error` events instead of printing.
- the execution id and the tool channel: each cell runs in a context holding an
  `ipybox_kernel._transport.InProcess` with the tool socket, the token and the cell's id, which
  ``ipybox_kernel`` reads in place of the environment (the host's here, shared by every in-process
  kernel of the process).
- output marks: before each tool call the cell's output so far is already queued as events, so a
  `Mark` behind it is enough (none when nothing was written since the last one).
- interrupt: KeyboardInterrupt is raised in the worker thread (`PyThreadState_SetAsyncExc`), and
  the tool calls in flight are aborted, since a thread blocked on a reply would not see it.
- kill: a thread cannot be killed; the kernel is marked gone (``exited``), its thread is
  interrupted and told to stop, and whatever it still does goes nowhere: its tool calls name an
  execution that is over and are refused.

What one process holds once is shared by its in-process kernels: ``sys.modules`` (a tools package
imported by one kernel is the one the next imports, so each kernel drops the tools and skills
packages from it when it starts and stops), ``sys.path``, the working directory (the workspace of
the kernel that started last, until the last one stops), IPython's global
instance (``get_ipython()`` outside a cell's own namespace) and the builtins IPython installs while
a cell runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import functools
import itertools
import os
import queue
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from ipybox._engine._waiting import wait_any
from ipybox._exceptions import KernelDied, KernelStartError, UsageError
from ipybox._kernel._home import IMPORT_ROOT
from ipybox._settings import KernelSettings
from ipybox_kernel._protocol import EXECUTION_ENV, SOCKET_ENV, TOKEN_ENV
from ipybox_kernel._transport import IN_PROCESS, InProcess, close_connections

from ._handle import KernelHandle
from ._messages import Display, Error, KernelEvent, Mark, Reply, Stream
from ._source import KernelHost

__all__ = ("InProcessKernel", "InProcessShell", "forbid_in_process_kernels")

# The cell whose context the calling code runs in (None: not a cell of an in-process kernel).
_CELL: contextvars.ContextVar[_Cell | None] = contextvars.ContextVar("ipybox_in_process_cell", default=None)
# Live in-process kernels; the last one to stop gives back the streams and IPython's global instance.
_live: set[InProcessShell] = set()
_live_lock = threading.Lock()
# The process's working directory before the first of the live kernels moved it to its workspace.
_cwd_before = os.getcwd()


class _Cell:
    """One execution's events, written by the worker thread (and threads in the cell's context) and
    read by the host's event loop."""

    def __init__(self, msg_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.msg_id = msg_id
        self._loop = loop
        self._events: deque[KernelEvent] = deque()
        self._arrived = anyio.Event()
        self.lock = threading.Lock()
        self._pending: dict[Literal["stdout", "stderr"], str] = {"stdout": "", "stderr": ""}
        # Output events sent, and how many there were at the latest mark (see `InProcessShell._mark`).
        self.outputs = 0
        self.mark: int | None = None
        self.marked_outputs = 0

    def write(self, name: Literal["stdout", "stderr"], text: str) -> None:
        """Printed text, sent line by line as a stream sends it (the rest at the next flush)."""
        with self.lock:
            self._pending[name] += text
            pending = self._pending[name]
            cut = pending.rfind("\n") + 1
            if not cut:
                return
            self._pending[name] = pending[cut:]
            self._add(Stream(name, pending[:cut]))
        self._notify()

    def emit(self, event: KernelEvent) -> None:
        """An event after what was printed before it."""
        with self.lock:
            self._flush()
            self._add(event)
        self._notify()

    def flush(self) -> None:
        with self.lock:
            self._flush()
        self._notify()

    def _flush(self) -> None:
        for name, text in self._pending.items():
            if text:
                self._pending[name] = ""
                self._add(Stream(name, text))

    def _add(self, event: KernelEvent) -> None:
        if not isinstance(event, Mark | Reply):
            self.outputs += 1
        self._events.append(event)

    def _notify(self) -> None:
        # From any thread; the loop may be gone already (output of code that outlived its executor).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._arrived.set()

    async def events(self, exited: anyio.Event) -> AsyncGenerator[KernelEvent]:
        """The cell's events until its `Reply`.

        Raises:
            KernelDied: The kernel was killed first.
        """
        while True:
            while self._events:
                event = self._events.popleft()
                yield event
                if isinstance(event, Reply):
                    return
            if exited.is_set():
                raise KernelDied(None, reason="the in-process kernel was stopped")
            self._arrived = anyio.Event()
            if self._events:
                continue
            await wait_any(self._arrived, exited)


class _CellStream:
    """``sys.stdout``/``sys.stderr``: a cell's writes become its events, everyone else's go on."""

    def __init__(self, name: str, target: TextIO) -> None:
        self.name = name
        self.target = target

    def write(self, text: str) -> int:
        cell = _CELL.get()
        if cell is None:
            return self.target.write(text)
        if text:
            cell.write("stderr" if self.name == "stderr" else "stdout", str(text))
        return len(text)

    def writelines(self, lines: Sequence[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        cell = _CELL.get()
        if cell is None:
            self.target.flush()
        else:
            cell.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def _route_streams() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _CellStream):
            setattr(sys, name, _CellStream(name, stream))


def _unroute_streams() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _CellStream):
            setattr(sys, name, stream.target)


class _Publisher(DisplayPublisher):
    """``display()``: a `Display` event of the running cell."""

    def publish(
        self, data: Mapping[str, Any], metadata: Mapping[str, Any] | None = None, *args: Any, **kwargs: Any
    ) -> None:
        cell = _CELL.get()
        if cell is not None:
            cell.emit(Display("display_data", dict(data), dict(metadata or {})))

    def clear_output(self, wait: bool = False) -> None:
        """Not recorded: the host keeps every output of an execution."""


class _ResultHook(DisplayHook):
    """The value of a cell's last expression: an ``execute_result`` event, as ipykernel sends."""

    def start_displayhook(self) -> None:
        pass

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: Mapping[str, Any], md_dict: Mapping[str, Any] | None = None) -> None:
        cell = _CELL.get()
        if cell is not None:
            cell.emit(Display("execute_result", dict(format_dict), dict(md_dict or {})))

    def finish_displayhook(self) -> None:
        pass


class _Shell(InteractiveShell):
    """An IPython shell whose output becomes events, and which leaves the host's ``__main__`` alone."""

    displayhook_class = _ResultHook
    display_pub_class = _Publisher

    def init_sys_modules(self) -> None:
        """Not ``sys.modules['__main__']``: that is the host's (as for an embedded IPython)."""

    def init_virtualenv(self) -> None:
        """The host's interpreter and paths are the kernel's already."""

    def _showtraceback(self, etype: type[BaseException], evalue: BaseException, stb: list[str]) -> None:
        cell = _CELL.get()
        if cell is not None:
            cell.emit(Error(etype.__name__, str(evalue), list(stb)))


class InProcessShell:
    """A kernel in a thread of this process (see the module doc). Create with ``async with
    InProcessShell.start(...)``.

    Attributes:
        exited: Set once the kernel was killed.
    """

    # Not a sandbox: its code is the tester's own, and its threads are the host process's.
    unseen = False

    def __init__(self, shell: Any, settings: Mapping[str, str], import_paths: Sequence[Path]) -> None:
        self._shell: Any = shell
        self._settings = dict(settings)
        self._import_paths = [str(path) for path in import_paths]
        self._jobs: queue.SimpleQueue[tuple[_Cell, str] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="ipybox-in-process-kernel", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: _Cell | None = None
        self._running_lock = threading.Lock()
        self._marks = itertools.count(1)
        self._in_process = InProcess(settings, output_mark=self._mark)
        self.exited = anyio.Event()

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        *,
        tool_socket: Path,
        token: str,
        ipython_dir: Path,
        workspace: Path,
        import_paths: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[InProcessShell]:
        """Start a shell whose tool calls go to ``tool_socket`` with ``token``.

        Args:
            tool_socket: The executor's tool server socket.
            token: The tool token.
            ipython_dir: A private directory for IPython's profile.
            workspace: The working directory (the process's, from now until the last in-process
                kernel stops; then the one before is restored).
            import_paths: Put first on ``sys.path`` while the kernel runs (its import root and its
                packages directory).
            env: Further settings ``ipybox_kernel`` reads in place of the environment
                (``IPYBOX_TOOLS_DIR``, ...).

        Raises:
            KernelStartError: IPython could not be set up.
        """
        settings = {**(env or {}), SOCKET_ENV: str(tool_socket), TOKEN_ENV: token}
        try:
            shell = await anyio.to_thread.run_sync(_new_shell, ipython_dir)
        except Exception as exc:
            raise KernelStartError(f"the in-process kernel could not start IPython: {exc!r}") from exc
        kernel = cls(shell, settings, import_paths)
        kernel._loop = asyncio.get_running_loop()
        global _cwd_before
        with _live_lock:
            if not _live:
                _cwd_before = os.getcwd()
            _live.add(kernel)
        os.chdir(workspace)
        kernel._enter_imports()
        kernel._thread.start()
        try:
            yield kernel
        finally:
            with anyio.CancelScope(shield=True):
                await kernel.kill_and_wait()
            kernel._leave_imports()
            # This process holds the kernel's idle tool connections: they end with the kernel.
            close_connections(str(tool_socket))
            with _live_lock:
                _live.discard(kernel)
                last = not _live
            if last:
                _unroute_streams()
                with contextlib.suppress(OSError):
                    os.chdir(_cwd_before)
            _drop_shell(shell, last=last)

    # -- KernelHandle -----------------------------------------------------------------------

    def new_msg_id(self) -> str:
        return uuid.uuid4().hex

    async def execute(self, code: str, *, msg_id: str | None = None) -> AsyncGenerator[KernelEvent]:
        if self.exited.is_set():
            raise KernelDied(None, reason="the in-process kernel was stopped")
        assert self._loop is not None
        cell = _Cell(msg_id or self.new_msg_id(), self._loop)
        self._jobs.put((cell, code))
        async for event in cell.events(self.exited):
            yield event

    def interrupt(self) -> None:
        with self._running_lock:
            if self._running is None or self._thread.ident is None:
                return
            # The calls first, then the exception: on Python 3.11, while an asynchronous exception
            # waits for a thread that holds no GIL (blocked on a reply), every other thread that
            # enters a function under a trace function (coverage, a debugger) re-checks it in a busy
            # loop until that thread runs again; aborted calls wake it at once.
            for call in list(self._in_process.calls):
                call.abort()
            _raise_in_thread(self._thread.ident, KeyboardInterrupt)

    def cpu_seconds(self) -> float | None:
        ident = self._thread.ident
        if ident is None or not self._thread.is_alive():
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, AttributeError):
            return None

    def live_tasks(self) -> None:
        """None: the host process's own threads are not the kernel's to count (ipybox._kernel._leftrunning
        flags nothing here; this kernel is no sandbox, and its cells' threads do not carry the cell)."""
        return None

    async def kill_and_wait(self) -> None:
        if self.exited.is_set():
            return
        self.exited.set()
        self._jobs.put(None)
        self.interrupt()

    # -- the worker thread ------------------------------------------------------------------

    def _work(self) -> None:
        loop = asyncio.new_event_loop()
        self._shell.loop_runner = functools.partial(_run_on, loop)
        try:
            while True:
                try:
                    job = self._jobs.get()
                    if job is None or self.exited.is_set():
                        return
                    cell, code = job
                    status = self._run(cell, code)
                    cell.emit(Reply(status, self._shell.execution_count - 1))
                except KeyboardInterrupt:
                    continue  # an interrupt that came as the cell ended
        finally:
            with contextlib.suppress(BaseException):
                loop.close()

    def _run(self, cell: _Cell, code: str) -> Literal["ok", "error"]:
        context = contextvars.copy_context()
        context.run(_CELL.set, cell)
        settings = {**self._settings, EXECUTION_ENV: cell.msg_id}
        context.run(IN_PROCESS.set, InProcess(settings, self._mark, self._in_process.calls))
        _route_streams()
        with self._running_lock:
            self._running = cell
        try:
            try:
                result = context.run(self._shell.run_cell, code, store_history=True)
            except BaseException as exc:  # KeyboardInterrupt outside the code, or the shell failing
                cell.emit(Error(type(exc).__name__, str(exc), [f"{type(exc).__name__}: {exc}"]))
                return "error"
            return "ok" if result.success else "error"
        finally:
            with self._running_lock:
                self._running = None

    def _mark(self, execution: str | None) -> int | None:
        """The mark a tool request of ``execution`` carries (see ``ipybox._engine._outputmarks``)."""
        cell = _CELL.get()
        if cell is None or execution != cell.msg_id:
            return None
        cell.flush()
        with cell.lock:
            if cell.outputs == cell.marked_outputs:
                return cell.mark
            mark = next(self._marks)
            cell.mark, cell.marked_outputs = mark, cell.outputs
        cell.emit(Mark(mark))
        return mark

    # -- imports ----------------------------------------------------------------------------

    def _enter_imports(self) -> None:
        for path in reversed(self._import_paths):
            sys.path.insert(0, path)
        self._forget_packages()

    def _leave_imports(self) -> None:
        for path in self._import_paths:
            with contextlib.suppress(ValueError):
                sys.path.remove(path)
        self._forget_packages()

    def _forget_packages(self) -> None:
        """Drop the packages of the import roots from ``sys.modules`` (another kernel's tools
        package of the same name may be loaded)."""
        names: set[str] = set()
        for path in self._import_paths:
            with contextlib.suppress(OSError):
                names.update(name.removesuffix(".py") for name in os.listdir(path))
        for module in [m for m in sys.modules if m.split(".", 1)[0] in names]:
            del sys.modules[module]


def _new_shell(ipython_dir: Path) -> Any:
    """IPython's types are partly unknown to the type checker; the shell is used as `Any`."""
    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    ipython_dir.mkdir(mode=0o700, exist_ok=True)
    # The first one is IPython's global instance, which `display()` publishes through (the
    # publisher routes to whichever cell runs); later ones are not, while it lives.
    shell: Any
    if InteractiveShell.initialized():
        shell = _Shell(config=config, ipython_dir=str(ipython_dir))
    else:
        shell = _Shell.instance(config=config, ipython_dir=str(ipython_dir))
    from ipybox_kernel._launch import _pip_magic  # pyright: ignore[reportPrivateUsage]

    # `%pip install` asks the host for approval, as in a real kernel, instead of running pip here.
    shell.register_magic_function(_pip_magic, "line", "pip")
    return shell


def _drop_shell(shell: Any, *, last: bool) -> None:
    import atexit

    atexit.unregister(shell.atexit_operations)
    if last and _Shell.initialized():
        _Shell.clear_instance()


def _run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    """IPython's runner for cells with top-level ``await``: the kernel's own loop, kept between
    cells as ipykernel keeps its own (IPython's default loop is one per process)."""
    return loop.run_until_complete(coro)


def _raise_in_thread(ident: int, exc: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))


# Why in-process kernels are refused in this process (None: they are not): set by what serves code
# from people or models that are not the process's own user (`forbid_in_process_kernels`).
_forbidden: str | None = None


def forbid_in_process_kernels(why: str) -> None:
    """Refuse every in-process kernel of this process from now on (the MCP server calls this).

    An in-process kernel runs code with the host's privileges; where the code comes from an MCP client
    (a model steered by whatever text reached it) that would be remote code execution on the host.
    """
    global _forbidden
    _forbidden = why


class InProcessKernel:
    """A kernel that runs code in a thread of **this** process: for testing agents, **not a sandbox**.

    ``CodeExecutor(kernel=InProcessKernel(), sandbox=None)`` runs code actions in a stateful IPython
    shell in the test's own process, in milliseconds, against the executor's real tool server and
    approval gate: generated ``mcptools`` modules and ``ipybox_kernel.call_tool`` work, approval
    requests, rejections, policies, ``Execution`` events, keyed executions and their ttl, and the
    framework adapters' interrupts behave as with a sandboxed kernel.

    The code runs with every right of the process: it can read and change the host's files,
    environment, memory and network, and the executor's own state. Use it only for code you wrote
    (tests, with test models), never for code a model or a user produced. To make that hard to get
    wrong, the executor must be given ``sandbox=None`` (the same explicit opt-out an unsandboxed
    local kernel needs), and it is refused with a ``pool`` (pools serve many executors), with a
    ``network`` policy (the code has the host's network; a policy would only seem to apply), and in a
    process that serves ipybox's MCP server, whose code comes from MCP clients.

    What a sandboxed kernel has that this one does not: a process of its own (limits, a memory cap,
    file descriptor 1/2 output, the working directory, ``sys.modules``), and the isolation tests of
    the sandbox. See the "Testing your agent" documentation.
    """

    @property
    def remote(self) -> bool:
        """False: the kernel shares the host's workspace and environment (`KernelSource.remote`)."""
        return False

    def settings_for(self, requested: KernelSettings) -> KernelSettings:
        """The executor's settings, if they say ``sandbox=None`` and no network (`KernelSource.settings_for`).

        Raises:
            UsageError: ``sandbox`` is not None, the kernel would need a network proxy, or this process
                serves ipybox's MCP server.
        """
        if _forbidden is not None:
            raise UsageError(f"InProcessKernel runs code unsandboxed in this process and is refused here: {_forbidden}")
        if requested.sandbox is not None:
            raise UsageError(
                "InProcessKernel runs code in this process, without any sandbox: pass sandbox=None to say so "
                "(CodeExecutor(kernel=InProcessKernel(), sandbox=None)); use it only for code you wrote, in tests"
            )
        if requested.network:
            raise UsageError(
                "InProcessKernel has the host's own network, so a Network policy would not apply to it; drop "
                "network= (test network approvals with a sandboxed kernel)"
            )
        return requested

    @asynccontextmanager
    async def open(self, host: KernelHost) -> AsyncGenerator[KernelHandle]:
        """A fresh in-process shell talking to ``host``'s tool server (`KernelSource.open`).

        Raises:
            KernelStartError: The process serves ipybox's MCP server, or IPython could not start.
        """
        settings = host.settings
        try:
            self.settings_for(settings)
        except UsageError as exc:
            raise KernelStartError(str(exc)) from None
        env: dict[str, str] = {}
        paths = [host.home / "packages"]
        if settings.tools_dir is not None:
            env["IPYBOX_TOOLS_DIR"] = str(settings.tools_dir)
        if settings.skills_dir is not None:
            env["IPYBOX_SKILLS_DIR"] = str(settings.skills_dir)
        if (host.home / IMPORT_ROOT).is_dir():
            paths.insert(0, host.home / IMPORT_ROOT)
        async with InProcessShell.start(
            tool_socket=host.tool_socket,
            token=host.token,
            ipython_dir=host.home / "ipython",
            workspace=settings.workspace,
            import_paths=paths,
            env=env,
        ) as shell:
            yield shell
