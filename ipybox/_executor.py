"""`CodeExecutor`: runs code actions in a stateful, sandboxed IPython kernel."""

# The executor drives Execution objects through their private driver interface.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast

import anyio
import anyio.abc

from ._approval import Approval, check_approval, decide_by_policy
from ._config import Limits, SandboxConfig, Timeouts, check_seconds
from ._events import wait_any
from ._exceptions import (
    CodeExecutionError,
    ExecutionCancelled,
    ExecutionLost,
    ExecutionTimeout,
    IpyboxError,
    KernelDied,
    KernelStartError,
    UsageError,
)
from ._execution import Execution
from ._kernel import (
    Display,
    Dropped,
    Error,
    Kernel,
    KernelEvent,
    Reply,
    Stream,
    bytecode_missing,
    default_python,
    strip_ansi,
)
from ._manifest import MANIFEST_DIR, load_manifest
from ._mcp import HttpServer, StdioServer
from ._packages import install_package
from ._results import IMAGE_TYPES, CodeExecutionChunk, CodeExecutionResult, Image, Output
from ._sandbox import resolve_sandbox
from ._tooldir import prepare_tools_dir, tools_dir_path
from ._toolserver import ToolCall, ToolCallDenied, ToolServer
from ._workspace import copy_file, write_file

__all__ = ("CodeExecutor",)

logger = logging.getLogger(__name__)

# Variables the kernel needs from the host's environment; nothing else is passed on.
_PASSED_ENV = ("LANG", "LC_ALL", "TZ")
# The tool server's name for ipybox's own tools (package installs from kernel code).
BUILTIN_SERVER = "ipybox"
# The default cap of `CodeExecutor.download`: a workspace file larger than this is more likely a
# runaway or sparse file (made in an instant with os.truncate) than something to copy to the host.
DOWNLOAD_LIMIT = 1024**3
# Why a tool call from code that outlived its execution is refused.
_STRAY_CALL = (
    "this tool call comes from code left running after the code action that started it ended (a "
    "thread or task it did not wait for); tool calls are only allowed from the code action that is "
    "running: join such threads or await such tasks before the code action ends"
)
# Marker the kernel uses to report output it dropped at the source (see ipybox_kernel._launch).
_TRUNCATED_MIME = "application/vnd.ipybox.truncated+json"
# The executor's private directory that holds only a link to the tools directory, for PYTHONPATH.
_IMPORT_ROOT = "imports"
# How many keys of released executions are remembered, so that starting one of them again is refused
# (the code must never run twice for one key) while memory stays bounded over any number of keys.
_RELEASED_KEYS = 4096


class CodeExecutor:
    """Runs Python code actions in a stateful IPython kernel inside an OS sandbox.

    Use it as an async context manager::

        async with CodeExecutor() as executor:
            result = await executor.execute("print(1 + 1)")
            print(result.text)

    Variables persist between executions. The kernel runs in a bubblewrap sandbox by default:
    no network, a read-only system, and only ``workspace`` writable. The kernel's environment
    holds only what Python needs plus ``env``: the host's variables (API keys above all) do not
    leak into it.

    Args:
        workspace: The kernel's working directory, the only place it can write. Must exist.
        sandbox: ``"auto"`` (bubblewrap; refuses to start if it is not usable), a
            `SandboxConfig`, or None to run without a sandbox (code can then do anything your
            user can).
        env: Environment variables for the kernel.
        limits: Resource limits of the kernel and of one execution's output.
        timeouts: How long executions, approvals, tool calls and kernel starts may take.
        tools_dir: Where `generate_mcp_sources` wrote the typed tool packages (default
            ``mcptools``). Mounted read-only into the sandbox and importable by the kernel
            (``from mcptools.<server> import <tool>``); the servers it lists are registered.
            Created if it is missing inside the workspace (so kernel code cannot create it). It
            must be a directory of your own that others cannot write, and neither it nor a
            directory on its way from the workspace may be a symlink: `__aenter__` raises
            `UsageError` otherwise.
        approval: How tool calls from the kernel are approved: ``"ask"`` (each one becomes an
            `ApprovalRequest` event of the execution, answered by the application), ``"auto"``,
            `ApprovalRules`, or a callback that receives the `ApprovalRequest`.
    """

    def __init__(
        self,
        *,
        workspace: Path | str = ".",
        sandbox: SandboxConfig | Literal["auto"] | None = "auto",
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        timeouts: Timeouts | None = None,
        tools_dir: Path | str | None = "mcptools",
        approval: Approval = "ask",
    ) -> None:
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise UsageError(f"workspace {str(workspace)!r} is not an existing directory; create it first")
        if env is not None:
            for name, value in env.items():
                if not isinstance(name, str) or not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
                    raise UsageError(f"env must map str to str; {name!r}: {value!r} is not")
        if timeouts is not None and not isinstance(timeouts, Timeouts):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"timeouts must be a Timeouts, got {timeouts!r}")
        if limits is not None and not isinstance(limits, Limits):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"limits must be a Limits, got {limits!r}")
        check_approval(approval)
        self.sandbox = resolve_sandbox(sandbox)
        # As given (made absolute, not resolved): every start checks it again for planted symlinks.
        self._tools_given = Path(os.path.join(os.getcwd(), tools_dir)) if tools_dir is not None else None
        self.tools_dir: Path | None = None
        if self._tools_given is not None:
            self.tools_dir = tools_dir_path(self._tools_given, kernel_writable=self._kernel_writable())
            if self.tools_dir.exists() and not self.tools_dir.is_dir():
                raise UsageError(f"tools_dir {str(tools_dir)!r} is not a directory")
            if self.tools_dir.parent == self.tools_dir:
                raise UsageError("tools_dir cannot be the filesystem root")
        self.approval: Approval = approval
        self.limits = limits or Limits()
        self.timeouts = timeouts or Timeouts()
        self._env = dict(env or {})
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._kernel: Kernel | None = None
        self._kernel_changed = anyio.Event()
        self._restart = anyio.Event()
        self._start_error: KernelStartError | None = None
        # Whether a caller has been given _start_error; the next caller then gets a fresh attempt.
        self._start_error_reported = False
        self._by_key: dict[str, Execution] = {}
        # Keys of executions that ended and were forgotten, oldest first: key -> why.
        self._released: OrderedDict[str, str] = OrderedDict()
        self._current: Execution | None = None
        # The kernel's id for the running execution, which its tool calls must carry.
        self._current_msg_id: str | None = None
        self._home: Path | None = None
        self._tools: ToolServer | None = None
        self._token = secrets.token_urlsafe(32)

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise UsageError("this CodeExecutor is already running; create a new one")
        stack = AsyncExitStack()
        try:
            await self._start(stack)
        except BaseException:
            # Unwind without passing the error into the task group, which would wrap it in an
            # ExceptionGroup: the caller gets KernelStartError (or whatever failed) as it is.
            self._tg = None
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _start(self, stack: AsyncExitStack) -> None:
        if self.sandbox is not None:
            _check_bytecode()
        # Private to this executor: the tool socket and the packages installed for the kernel.
        self._home = Path(tempfile.mkdtemp(prefix="ipybox-"))
        stack.callback(shutil.rmtree, self._home, ignore_errors=True)
        (self._home / "packages").mkdir()
        self._tools = ToolServer(
            socket_path=self._home / "tools.sock",
            token=self._token,
            gate=self._gate,
            call_timeout=self.timeouts.tool,
        )
        self._tools.register_builtin(BUILTIN_SERVER, "install_package", self._install_from_kernel)
        self._prepare_tools_dir()
        if self.tools_dir is not None:
            for name, params in load_manifest(self.tools_dir).items():
                self._tools.register(name, params)
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(self._tg.cancel_scope.cancel)
        await self._tg.start(self._tools.run)
        await self._tg.start(self._run_kernels)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            # The body's own exception propagates as it is: our tasks are cancelled, not failed, so
            # it is not passed into the task group (which would wrap it in an ExceptionGroup).
            await stack.aclose()

    def _kernel_writable(self) -> list[Path]:
        """Host directories kernel code can write to (where it could plant symlinks)."""
        extra = [Path(p) for p in self.sandbox.rw_paths] if self.sandbox is not None else []
        return [self.workspace, *extra]

    def _prepare_tools_dir(self) -> None:
        """Check the tools directory before a kernel starts (creating it where the kernel could),
        and link it into the kernel's import root.

        A missing one inside the workspace is created, so that the sandbox mounts it read-only:
        the kernel would otherwise create it, manifest included, for the next executor to trust.
        Its manifest directory too, so that it is hidden even when sources are generated while
        the kernel runs (the mount is live). Checked at every start: a symlink planted since would
        redirect the mount and the host's writes.

        Raises:
            UsageError: The tools directory cannot be trusted; the message names the fix.
        """
        if self._tools_given is None:
            return
        assert self._home is not None
        writable = self._kernel_writable()
        real = tools_dir_path(self._tools_given, kernel_writable=writable)
        reachable = any(real.is_relative_to(os.path.realpath(w)) for w in writable)
        if reachable or os.path.lexists(real):
            real = prepare_tools_dir(self._tools_given, kernel_writable=writable)
        # else: out of the kernel's reach, and nothing to mount until sources are generated there.
        self.tools_dir = real
        # The kernel imports the tools package from a directory holding nothing else, not from the
        # tools directory's parent: that is often the workspace, where kernel code can plant a
        # ``pydantic.py`` that would then shadow what generated modules import.
        imports = self._home / _IMPORT_ROOT
        imports.mkdir(mode=0o700, exist_ok=True)
        link = imports / real.name
        if not link.is_symlink() or os.readlink(link) != str(real):
            link.unlink(missing_ok=True)
            link.symlink_to(real, target_is_directory=True)

    def _kernel_env(self) -> dict[str, str]:
        env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
        env.setdefault("LANG", "C.UTF-8")
        env.update(
            {
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
                "PYTHONNOUSERSITE": "1",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                "TERM": "dumb",
                "NO_COLOR": "1",
            }
        )
        assert self._home is not None
        # Host-owned directories only: the workspace is appended to the end of sys.path by the
        # kernel's launcher, so nothing planted there shadows the tools or installed packages.
        paths = [str(self._home / "packages")]
        if self.tools_dir is not None:
            paths.insert(0, str(self._home / _IMPORT_ROOT))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        if self.tools_dir is not None:
            # Where ipybox_kernel.search_tools reads the generated packages (mounted read-only).
            env["IPYBOX_TOOLS_DIR"] = str(self.tools_dir)
        env["IPYBOX_TOOL_SOCKET"] = str(self._home / "tools.sock")
        env["IPYBOX_TOOL_TOKEN"] = self._token
        if self.sandbox is not None:
            # ipykernel's parent poller would see the PID namespace's init as its parent and exit;
            # the sandbox's --die-with-parent does that job instead.
            env["JPY_PARENT_PID"] = "1"
            env["HOME"] = "/tmp"
            env["IPYTHONDIR"] = "/tmp/.ipython"
        env.update(self._env)
        return env

    def _kernel_sandbox(self) -> SandboxConfig | None:
        if self.sandbox is None:
            return None
        assert self._home is not None
        # The socket, the packages and the import root are host-owned: the kernel may use them, not
        # change them.
        extra = [self._home / "tools.sock", self._home / "packages"]
        if self.tools_dir is not None:
            extra.append(self._home / _IMPORT_ROOT)
        return dataclasses.replace(self.sandbox, ro_paths=[*self.sandbox.ro_paths, *extra])

    def _mounted_tools_dir(self) -> Path | None:
        return self.tools_dir if self.tools_dir is not None and self.tools_dir.is_dir() else None

    def _hidden_paths(self) -> list[Path]:
        tools = self._mounted_tools_dir()
        # The manifest holds server parameters (commands, URLs, maybe secrets): host only.
        if tools is not None and (tools / MANIFEST_DIR).is_dir():
            return [tools / MANIFEST_DIR]
        return []

    async def _run_kernels(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Keep one kernel running: start it, and start a fresh one after it dies or on reset."""
        started = False
        while True:
            self._restart = anyio.Event()
            try:
                self._restore_home()
                if started:
                    self._recheck_tools_dir()
                async with Kernel.start(
                    python=default_python(),
                    env=self._kernel_env(),
                    workspace=self.workspace,
                    sandbox=self._kernel_sandbox(),
                    tools_dir=self._mounted_tools_dir(),
                    hidden=self._hidden_paths(),
                    limits=self.limits,
                    start_timeout=self.timeouts.start,
                ) as kernel:
                    self._set_kernel(kernel)
                    self._start_error = None
                    if not started:
                        started = True
                        task_status.started()
                    await wait_any(kernel.exited, self._restart)
                    self._set_kernel(None)
            except KernelStartError as exc:
                if not started:
                    raise
                self._start_failed(exc)
                await self._restart.wait()
            finally:
                self._set_kernel(None)

    def _start_failed(self, error: KernelStartError) -> None:
        """Record a failed restart and wake whoever waits for a kernel."""
        self._start_error = error
        self._start_error_reported = False
        self._kernel_changed.set()
        self._kernel_changed = anyio.Event()

    def _restore_home(self) -> None:
        """Recreate the executor's private directory and tool socket if they were deleted (a
        ``/tmp`` cleaner), so that the next kernel can mount them.

        Raises:
            KernelStartError: They cannot be restored; the message names the cause.
        """
        home, tools = self._home, self._tools
        assert home is not None and tools is not None
        try:
            try:
                os.mkdir(home, 0o700)
            except FileExistsError:
                info = os.lstat(home)
                # A /tmp name: after a deletion anyone may have created it, and it would hold the
                # tool socket and the kernel's importable packages.
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
                    raise KernelStartError(
                        f"the executor's private directory {str(home)!r} was replaced by one this process "
                        f"does not own exclusively (uid {info.st_uid}, mode {oct(info.st_mode)}); remove it, "
                        "or start a new CodeExecutor"
                    ) from None
            (home / "packages").mkdir(exist_ok=True)
            tools.rebind()
        except (OSError, UsageError) as exc:
            raise KernelStartError(
                f"the executor's private directory {str(home)!r} (tool socket, packages) was deleted and "
                f"cannot be recreated ({exc}); free the cause, or start a new CodeExecutor"
            ) from exc

    def _recheck_tools_dir(self) -> None:
        """`_prepare_tools_dir` before a restart, where a failure is a start error of that kernel.

        Raises:
            KernelStartError: The tools directory can no longer be trusted.
        """
        try:
            self._prepare_tools_dir()
        except (OSError, UsageError) as exc:
            raise KernelStartError(f"the tools directory cannot be used any more: {exc}") from exc

    def _set_kernel(self, kernel: Kernel | None) -> None:
        if kernel is self._kernel:
            return
        self._kernel = kernel
        self._kernel_changed.set()
        self._kernel_changed = anyio.Event()

    async def _get_kernel(self) -> Kernel:
        """The running kernel, waiting for a replacement if it has died or is being reset."""
        while True:
            kernel = self._kernel
            if kernel is not None and not kernel.exited.is_set():
                return kernel
            if kernel is None and self._start_error is not None:
                if not self._start_error_reported:
                    self._start_error_reported = True
                    raise self._start_error
                # Reported before: this caller gets a fresh attempt, the cause may be gone by now.
                self._start_error = None
                self._restart.set()
            await self._kernel_changed.wait()

    async def reset(self) -> None:
        """Replace the kernel with a fresh one. Variables are lost; workspace files are kept."""
        self._require_running()
        async with self._lock:
            if self._tools is not None:
                await self._tools.reset()
            old = self._kernel
            self._restart.set()
            while self._kernel is old or self._kernel is None:
                if self._kernel is None and self._start_error is not None:
                    break
                await self._kernel_changed.wait()
            await self._get_kernel()

    def interrupt(self) -> None:
        """Interrupt the code that is running now (it raises KeyboardInterrupt in the kernel)."""
        self._require_running()
        if self._kernel is not None:
            self._kernel.interrupt()

    def _require_running(self) -> anyio.abc.TaskGroup:
        if self._tg is None or self._stack is None:
            raise UsageError("the CodeExecutor is not running; use it as 'async with CodeExecutor() as ex:'")
        return self._tg

    # -- executions ---------------------------------------------------------------------

    def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        key: str | None = None,
        approval: Approval | None = None,
        ttl: float | None = None,
    ) -> Execution:
        """Start running ``code`` in the kernel and return its `Execution` at once.

        Executions run one at a time, in the order they were started. ``await`` the execution for
        its result or iterate it for events.

        Args:
            code: Python source; IPython syntax (magics, top-level ``await``) works.
            timeout: Seconds the code may run (not counting approval waits); defaults to the
                executor's ``timeouts.execution``. When it runs out the kernel is interrupted, and
                restarted if it does not stop within ``timeouts.interrupt_grace`` seconds.
            key: Makes starting idempotent: while this executor runs, the same key returns the same
                execution, and the code runs once. A keyed execution also outlives the cancellation
                of the task awaiting it (re-attach with `attach`); one without a key is cancelled
                when the last task awaiting or iterating it is cancelled (see `Execution`). Once it
                has ended and its outcome was delivered, the executor forgets it: `attach` and
                starting the key again raise `ExecutionLost`.
            approval: This execution's approval policy, instead of the executor's (same values
                as ``CodeExecutor(approval=...)``).
            ttl: Seconds the execution may wait for one approval decision; then it is cancelled
                (`ExecutionCancelled`, with ``execution.expired`` set), its key is forgotten and
                `attach` raises `ExecutionLost`. None: it waits as long as the approval timeout
                allows.

        Raises:
            UsageError: ``code`` is not a string, a timeout is not positive, the approval policy is
                not valid, or ``key`` was used for different code.
            ExecutionLost: ``key`` belongs to an execution that already ended and was forgotten.
        """
        tg = self._require_running()
        if not isinstance(code, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"code must be a str, got {type(code).__name__}")
        check_seconds(timeout, "timeout")
        check_seconds(ttl, "ttl")
        if approval is not None:
            check_approval(approval)
        if key is not None:
            existing = self._by_key.get(key)
            if existing is not None:
                if existing.code != code:
                    raise UsageError(f"execution key {key!r} was already used for different code")
                return existing
            if key in self._released:
                raise ExecutionLost(f"the execution with key {key!r} {self._released[key]}; it is not run again")
        execution = Execution(
            code,
            key=key,
            timeout=timeout if timeout is not None else self.timeouts.execution,
            approval=approval,
            ttl=ttl,
        )
        if key is not None:
            self._by_key[key] = execution
            execution._on_consumed = self._release
        tg.start_soon(self._drive, execution)
        return execution

    def attach(self, key: str) -> Execution:
        """The execution started with this key.

        Raises:
            ExecutionLost: No execution with this key is known to this executor (any more).
        """
        try:
            return self._by_key[key]
        except KeyError:
            why = self._released.get(key)
            if why is not None:
                raise ExecutionLost(f"the execution with key {key!r} {why}; it is not run again") from None
            raise ExecutionLost(
                f"no execution with key {key!r} in this executor (it was never started here, or the "
                "executor was restarted); it is not run again automatically"
            ) from None

    def _release(self, execution: Execution, why: str = "ended and its outcome was already delivered") -> None:
        """Forget a keyed execution, remembering only its key (within `_RELEASED_KEYS`)."""
        key = execution.key
        if key is None or self._by_key.get(key) is not execution:
            return
        del self._by_key[key]
        self._released[key] = why
        while len(self._released) > _RELEASED_KEYS:
            self._released.popitem(last=False)

    async def _drive(self, execution: Execution) -> None:
        with anyio.CancelScope() as scope:
            execution._cancel_scope = scope
            if execution._cancel_requested:
                scope.cancel()
            async with self._lock:
                try:
                    kernel = await self._get_kernel()
                except KernelStartError as exc:
                    execution._fail(exc)
                    return
                await self._run(kernel, execution)
        if not execution.done:
            execution._fail(ExecutionCancelled("the execution was cancelled"))

    async def _run(self, kernel: Kernel, execution: Execution) -> None:
        self._current, self._current_msg_id = execution, kernel.new_msg_id()
        try:
            await self._run_current(kernel, execution, self._current_msg_id)
        finally:
            self._current = self._current_msg_id = None

    async def _run_current(self, kernel: Kernel, execution: Execution, msg_id: str) -> None:
        collector = _Collector(self.workspace, execution, self.limits.output_chars)
        finished = anyio.Event()
        error: IpyboxError | None = None
        timed_out = restarted = False

        async def consume() -> None:
            nonlocal error
            try:
                async for event in kernel.execute(execution.code, msg_id=msg_id):
                    collector.add(event)
            except KernelDied as exc:
                error = exc
            finally:
                finished.set()

        start = anyio.current_time()
        try:
            if execution.timeout is None:
                # Nothing to watch, so no watcher task: it would cost a few event-loop turns per execution.
                await consume()
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    timed_out = not await _wait_budget(finished, execution)
                    if timed_out:
                        kernel.interrupt()
                        with anyio.move_on_after(self.timeouts.interrupt_grace):
                            await finished.wait()
                        if not finished.is_set():
                            restarted = True
                            await kernel.kill_and_wait()
                            tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            # Cancelled by Execution.cancel() or executor shutdown: stop the code, keep the kernel.
            with anyio.CancelScope(shield=True):
                kernel.interrupt()
                with anyio.move_on_after(self.timeouts.interrupt_grace):
                    await finished.wait()
                if not finished.is_set():
                    await kernel.kill_and_wait()
            if execution.expired:
                execution._fail(
                    ExecutionCancelled(
                        f"the execution waited for an approval longer than its ttl of {execution.ttl:g} s and "
                        "was cancelled; the kernel was interrupted and keeps its state"
                    )
                )
                self._release(execution, f"was cancelled after waiting longer than its ttl of {execution.ttl:g} s")
            else:
                execution._fail(ExecutionCancelled("the execution was cancelled; the kernel was interrupted"))
            raise
        duration = anyio.current_time() - start
        text = collector.text()
        if timed_out:
            assert execution.timeout is not None
            execution._fail(ExecutionTimeout(execution.timeout, restarted=restarted, output=text))
        elif error is not None:
            execution._fail(error)
        elif collector.error is not None:
            e = collector.error
            execution._fail(CodeExecutionError(e.ename, e.evalue, _clean_traceback(e.traceback), output=text))
        else:
            execution._succeed(collector.result(duration))

    # -- tools --------------------------------------------------------------------------

    def register_mcp_server(self, name: str, params: StdioServer | HttpServer | Mapping[str, object]) -> None:
        """Make an MCP server callable from the kernel under ``name`` (host-side configuration).

        Use `generate_mcp_sources` to give kernel code a typed API for its tools.
        """
        if self._tools is None:
            raise UsageError("register_mcp_server needs a running CodeExecutor ('async with CodeExecutor() as ex')")
        if name == BUILTIN_SERVER:
            raise UsageError(f"the server name {BUILTIN_SERVER!r} is reserved for ipybox's own tools")
        self._tools.register(name, params)

    async def install(self, package: str) -> str:
        """Install a package from the package index for the kernel (on the host; the kernel has
        no network). It is importable in the kernel right away and survives `reset`.

        Returns:
            The installer's output.

        Raises:
            UsageError: ``package`` is not a plain requirement (URLs and options are refused).
            PackageInstallError: The installer failed.
        """
        self._require_running()
        assert self._home is not None
        return await install_package(package, self._home / "packages")

    async def _install_from_kernel(self, arguments: Mapping[str, object]) -> str:
        package = arguments.get("package")
        if not isinstance(package, str):
            raise UsageError("install_package needs a 'package' string")
        return await self.install(package)

    async def _gate(self, call: ToolCall) -> None:
        execution = self._current
        # A thread or task keeps the id of the execution that started it (ipybox_kernel._context):
        # a call from one that outlived its execution must not be shown as the running one's.
        if execution is None or call.execution is None or call.execution != self._current_msg_id:
            raise ToolCallDenied(_STRAY_CALL)
        request = execution._new_request(
            server_name=call.server_name,
            tool_name=call.tool_name,
            tool_args=call.arguments,
            server=call.server,
            annotations=call.annotations,
        )
        policy: Approval = self.approval if execution.policy is None else execution.policy
        decision = await decide_by_policy(policy, request)
        if decision is None:
            decision = await execution._ask(request, self.timeouts.approval)
        else:
            request.decide(decision)
        if not decision.approved:
            raise ToolCallDenied(decision.reason)

    # -- files --------------------------------------------------------------------------

    async def upload(self, src: Path | str, dst: Path | str) -> Path:
        """Copy a host file into the workspace; ``dst`` is relative to the workspace.

        Returns:
            The path of the written file.
        """
        data = await anyio.Path(src).read_bytes()
        return await anyio.to_thread.run_sync(write_file, self.workspace, dst, data)

    async def download(self, src: Path | str, dst: Path | str, *, max_bytes: int | None = DOWNLOAD_LIMIT) -> Path:
        """Copy a workspace file (``src``, relative to the workspace) to a host path.

        Symlinks in the workspace are not followed: the kernel cannot make the host read files
        outside it. The file is copied in chunks, and ``dst`` is replaced only by a complete copy.

        Args:
            src: The file, relative to the workspace.
            dst: Where to write it on the host.
            max_bytes: The largest file to copy (None: no limit). The kernel can make a file of
                any size in an instant, and grow it while it is copied; the cap holds either way.

        Raises:
            UsageError: ``src`` is not a regular file in the workspace, or has more than
                ``max_bytes``.
        """
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"max_bytes must be a number of bytes (>= 0) or None, got {max_bytes!r}")
        fix = "pass a larger max_bytes to download() (None for no limit) if you do want all of it"
        await anyio.to_thread.run_sync(
            functools.partial(copy_file, self.workspace, src, Path(dst), max_bytes=max_bytes, fix=fix)
        )
        return Path(dst)


@functools.cache
def _check_bytecode() -> None:
    """Warn once per process when sandboxed kernels will compile ipykernel & co. on every start."""
    if bytecode_missing():
        logger.warning(
            "the Python environment has no compiled bytecode for ipykernel; each sandboxed kernel start "
            "compiles it again (~0.3 s). Install with bytecode: pip does by default, uv needs "
            "'--compile-bytecode' (or UV_COMPILE_BYTECODE=1); or run 'python -m compileall' on site-packages."
        )


async def _wait_budget(finished: anyio.Event, execution: Execution) -> bool:
    """Wait until ``finished``; False if the execution's time ran out first.

    The clock stops while tool calls wait for approval.
    """
    if execution.timeout is None:
        await finished.wait()
        return True
    remaining = execution.timeout
    while not finished.is_set():
        changed = execution._pending_changed
        if execution._pending:
            await wait_any(finished, changed)
            continue
        if remaining <= 0:
            return False
        begin = anyio.current_time()
        with anyio.move_on_after(remaining):
            await wait_any(finished, changed)
        remaining -= anyio.current_time() - begin
    return True


def _clean_traceback(lines: list[str]) -> str:
    kept = [strip_ansi(line) for line in lines if "ipybox_kernel" not in line]
    return "\n".join(kept)


class _Collector:
    """Turns kernel events into chunks and the result, within the output cap."""

    def __init__(self, workspace: Path, execution: Execution, cap: int) -> None:
        self._workspace = workspace
        self._execution = execution
        self._room = cap
        self._text: list[str] = []
        self._images: list[Image] = []
        self._outputs: list[Output] = []
        self.truncated = 0
        self.error: Error | None = None
        self.execution_count: int | None = None

    def _take(self, size: int) -> int:
        """Claim room for ``size`` characters; returns how many fit."""
        fits = min(size, self._room)
        self._room -= fits
        self.truncated += size - fits
        return fits

    def _emit_text(self, text: str, stream: Literal["stdout", "stderr", "result"]) -> None:
        fits = self._take(len(text))
        if fits:
            text = text[:fits]
            self._text.append(text)
            self._execution._emit(CodeExecutionChunk(text=text, stream=stream))

    def add(self, event: KernelEvent) -> None:
        match event:
            case Stream(name=name, text=text):
                self._emit_text(text, name)
            case Display(data=data) if _TRUNCATED_MIME in data:
                report: object = data[_TRUNCATED_MIME]
                dropped = cast("dict[str, object]", report).get("dropped") if isinstance(report, dict) else None
                if isinstance(dropped, int) and dropped > 0:
                    self.truncated += dropped
            case Display(kind=kind, data=data, metadata=metadata):
                size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())
                if self._take(size) < size:
                    return
                self._outputs.append(Output(data=dict(data), metadata=dict(metadata), kind=kind))
                self._save_images(data)
                plain = data.get("text/plain")
                if isinstance(plain, str) and not any(m in data for m in IMAGE_TYPES):
                    self._room += len(plain)  # already paid for as part of the bundle
                    self._emit_text(plain + "\n", "result")
            case Error():
                self.error = event
            case Reply(execution_count=count):
                self.execution_count = count
            case Dropped(size=size):
                # Dropped unread by the host, so counted in bytes as sent rather than in characters.
                self.truncated += size

    def _save_images(self, data: Mapping[str, Any]) -> None:
        for mime, suffix in IMAGE_TYPES.items():
            content = data.get(mime)
            if not isinstance(content, str):
                continue
            try:
                raw = content.encode() if mime == "image/svg+xml" else base64.b64decode(content, validate=False)
            except ValueError:
                continue
            name = f"images/{self._execution.id}-{len(self._images) + 1}{suffix}"
            try:
                path: Path | None = write_file(self._workspace, name, raw)
            except (OSError, UsageError):
                path = None
            self._images.append(Image(mime=mime, data=raw, path=path))

    def text(self) -> str:
        return "".join(self._text)

    def result(self, duration: float) -> CodeExecutionResult:
        text = self.text()
        if self.truncated:
            text += f"\n[ipybox: output truncated, {self.truncated} characters dropped]\n"
        return CodeExecutionResult(
            text=text,
            images=tuple(self._images),
            outputs=tuple(self._outputs),
            execution_count=self.execution_count,
            duration=duration,
            truncated_chars=self.truncated,
        )
