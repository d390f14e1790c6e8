"""`CodeExecutor`: runs code actions in a stateful, sandboxed IPython kernel."""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.abc

from ._approval import Approval, ApprovalDecision, check_approval, decide_by_policy
from ._channel import ToolRequest
from ._config import Limits, SandboxConfig, Timeouts, check_seconds
from ._exceptions import (
    ExecutionCancelled,
    KernelStartError,
    UsageError,
)
from ._execution import Execution, ExecutionDriver, open_execution
from ._gateway._config import GatewayKernel
from ._gateway._executor import check_gateway, open_gateway_kernel, refuse_remote
from ._kernel import (
    Kernel,
    KernelHandle,
    default_python,
)
from ._kernelhome import IMPORT_ROOT, check_bytecode, hidden_paths, kernel_env, kernel_sandbox, restore_home
from ._keyed import KeyedExecutions
from ._manifest import load_manifest
from ._mcp import HttpServer, StdioServer
from ._packages import install_package
from ._running import run_execution
from ._supervisor import KernelSupervisor
from ._tooldir import prepare_tools_dir, tools_dir_path
from ._toolserver import ToolServer
from ._workspace import copy_file, write_file
from .sandbox._sandbox import resolve_sandbox

__all__ = ("CodeExecutor",)

logger = logging.getLogger(__name__)

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
        kernel: Where the kernel runs: None for a local kernel (sandboxed as ``sandbox`` says), or a
            `GatewayKernel` for one on Jupyter Kernel Gateway or Enterprise Gateway. A remote
            kernel's sandbox is the gateway's (leave ``sandbox`` at ``"auto"``); ``workspace`` then
            only receives the images of results, and `upload`, `download` and `install` are
            refused (see the "Remote kernels" documentation).
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
        kernel: GatewayKernel | None = None,
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
        self.gateway = check_gateway(kernel, sandbox)
        self.sandbox = resolve_sandbox(sandbox) if self.gateway is None else None
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
        self._kernels = KernelSupervisor(self._open_kernel)
        self._keyed = KeyedExecutions()
        self._current: ExecutionDriver | None = None
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
            check_bytecode()
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
        await self._tg.start(self._kernels.run)

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
        imports = self._home / IMPORT_ROOT
        imports.mkdir(mode=0o700, exist_ok=True)
        link = imports / real.name
        if not link.is_symlink() or os.readlink(link) != str(real):
            link.unlink(missing_ok=True)
            link.symlink_to(real, target_is_directory=True)

    def _mounted_tools_dir(self) -> Path | None:
        return self.tools_dir if self.tools_dir is not None and self.tools_dir.is_dir() else None

    def _open_kernel(self, restarting: bool) -> AbstractAsyncContextManager[KernelHandle]:
        """Prepare the host side and start a kernel (see `KernelOpener`)."""
        assert self._home is not None and self._tools is not None
        restore_home(self._home, self._tools)
        if restarting:
            self._recheck_tools_dir()
        if self.gateway is not None:
            return open_gateway_kernel(
                self.gateway,
                limits=self.limits,
                start_timeout=self.timeouts.start,
                tool_socket=self._tools.socket_path,
                token=self._token,
                tools_dir=self._mounted_tools_dir(),
            )
        return Kernel.start(
            python=default_python(),
            env=kernel_env(
                self._home, self._token, tools=self.tools_dir, sandboxed=self.sandbox is not None, extra=self._env
            ),
            workspace=self.workspace,
            sandbox=kernel_sandbox(self.sandbox, self._home, tools=self.tools_dir),
            tools_dir=self._mounted_tools_dir(),
            hidden=hidden_paths(self._mounted_tools_dir()),
            limits=self.limits,
            start_timeout=self.timeouts.start,
        )

    def _recheck_tools_dir(self) -> None:
        """`_prepare_tools_dir` before a restart, where a failure is a start error of that kernel.

        Raises:
            KernelStartError: The tools directory can no longer be trusted.
        """
        try:
            self._prepare_tools_dir()
        except (OSError, UsageError) as exc:
            raise KernelStartError(f"the tools directory cannot be used any more: {exc}") from exc

    async def reset(self) -> None:
        """Replace the kernel with a fresh one. Variables are lost; workspace files are kept."""
        self._require_running()
        async with self._lock:
            if self._tools is not None:
                await self._tools.reset()
            await self._kernels.restart()

    def interrupt(self) -> None:
        """Interrupt the code that is running now (it raises KeyboardInterrupt in the kernel)."""
        self._require_running()
        kernel = self._kernels.kernel
        if kernel is not None:
            kernel.interrupt()

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
            existing = self._keyed.existing(key, code)
            if existing is not None:
                return existing
        execution, driver = open_execution(
            code,
            key=key,
            timeout=timeout if timeout is not None else self.timeouts.execution,
            approval=approval,
            ttl=ttl,
        )
        if key is not None:
            self._keyed.add(execution)
            driver.on_delivered(self._keyed.release)
        tg.start_soon(self._drive, driver)
        return execution

    def attach(self, key: str) -> Execution:
        """The execution started with this key.

        Raises:
            ExecutionLost: No execution with this key is known to this executor (any more).
        """
        return self._keyed.attach(key)

    async def _drive(self, driver: ExecutionDriver) -> None:
        with driver.cancel_scope():
            async with self._lock:
                try:
                    kernel = await self._kernels.get()
                except KernelStartError as exc:
                    driver.fail(exc)
                    return
                await self._run(kernel, driver)
        if not driver.done:
            driver.fail(ExecutionCancelled("the execution was cancelled"))

    async def _run(self, kernel: KernelHandle, driver: ExecutionDriver) -> None:
        self._current, self._current_msg_id = driver, kernel.new_msg_id()
        try:
            await run_execution(
                kernel,
                driver,
                self._current_msg_id,
                workspace=self.workspace,
                output_chars=self.limits.output_chars,
                interrupt_grace=self.timeouts.interrupt_grace,
                on_expired=self._keyed.release,
            )
        finally:
            self._current = self._current_msg_id = None

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
        refuse_remote(self.gateway, "install")
        return await install_package(package, self._home / "packages")

    async def _install_from_kernel(self, arguments: Mapping[str, object]) -> str:
        package = arguments.get("package")
        if not isinstance(package, str):
            raise UsageError("install_package needs a 'package' string")
        return await self.install(package)

    async def _gate(self, call: ToolRequest, *, server: str, annotations: Mapping[str, Any] | None) -> ApprovalDecision:
        driver = self._current
        # A thread or task keeps the id of the execution that started it (ipybox_kernel._context):
        # a call from one that outlived its execution must not be shown as the running one's.
        if driver is None or call.execution is None or call.execution != self._current_msg_id:
            return ApprovalDecision(approved=False, reason=_STRAY_CALL, by="policy")
        request = driver.new_request(
            server_name=call.server,
            tool_name=call.tool,
            tool_args=call.arguments,
            server=server,
            annotations=annotations,
        )
        own = driver.execution.policy
        decision = await decide_by_policy(self.approval if own is None else own, request)
        if decision is None:
            return await driver.ask(request, self.timeouts.approval)
        request.decide(decision)
        return decision

    # -- files --------------------------------------------------------------------------

    async def upload(self, src: Path | str, dst: Path | str) -> Path:
        """Copy a host file into the workspace; ``dst`` is relative to the workspace.

        Returns:
            The path of the written file.
        """
        refuse_remote(self.gateway, "upload")
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
        refuse_remote(self.gateway, "download")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"max_bytes must be a number of bytes (>= 0) or None, got {max_bytes!r}")
        fix = "pass a larger max_bytes to download() (None for no limit) if you do want all of it"
        await anyio.to_thread.run_sync(
            functools.partial(copy_file, self.workspace, src, Path(dst), max_bytes=max_bytes, fix=fix)
        )
        return Path(dst)
