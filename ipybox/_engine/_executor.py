"""`CodeExecutor`: runs code actions in a stateful, sandboxed IPython kernel."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, NoReturn, Self, cast

import anyio
import anyio.abc
from opentelemetry import context as otel_context
from opentelemetry import trace

from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest
from ipybox._approval._policies import Approval, check_approval
from ipybox._exceptions import (
    ExecutionCancelled,
    ExecutionLost,
    ExecutionSuspended,
    InvalidLocator,
    KernelStartError,
    UsageError,
)
from ipybox._gateway._held import HeldCall
from ipybox._gateway._transfer import RemoteFiles
from ipybox._kernel import KernelHandle, KernelSource
from ipybox._kernel._home import check_bytecode
from ipybox._kernel._local import LocalKernel
from ipybox._kernel._pool import KernelPool
from ipybox._kernel._side import KernelSide
from ipybox._kernel._supervisor import KernelSupervisor
from ipybox._manifest import load_manifest
from ipybox._mcp._oauth import OAuth
from ipybox._mcp._serverasks import ClientFeatures
from ipybox._mcp._servers import HttpServer, StdioServer
from ipybox._mcp._tokenstore import FileTokenStore, refuse_token_dir_in
from ipybox._packages import install_package
from ipybox._settings import (
    KernelSettings,
    Limits,
    SandboxConfig,
    Timeouts,
    check_kernel_settings,
    check_seconds,
    resolved_sandbox,
)
from ipybox._toolserver._server import ToolServer
from ipybox._workspace import copy_file, write_file
from ipybox.network._policy import Network
from ipybox.network._proxy import NetworkProxy
from ipybox.network._setup import NET_SOCKET, check_network
from ipybox.skills._store import SAVE_SKILL_SCHEMA, Skill, skill_arguments

from ._execution import Execution, ExecutionDriver, open_execution
from ._gate import ApprovalGate
from ._keyed import KeyedExecutions
from ._results import CodeExecutionChunk
from ._running import run_execution
from ._toolevents import ToolCallHook
from ._tracing import ActionTracer, Tracing
from ._waiting import wait_any

if TYPE_CHECKING:
    from ipybox._gateway._held import HeldKernel
    from ipybox._gateway._remotekernel import RemoteKernel

    from ._suspension import Suspension

__all__ = ("CodeExecutor",)

logger = logging.getLogger(__name__)

# The tool server's name for ipybox's own tools (package installs from kernel code).
BUILTIN_SERVER = "ipybox"
# The arguments of ipybox.install_package as kernel code sends them (ipybox_kernel's %pip).
_INSTALL_SCHEMA = {
    "type": "object",
    "properties": {"package": {"type": "string"}},
    "required": ["package"],
    "additionalProperties": False,
}
# The default cap of `CodeExecutor.download`: a workspace file larger than this is more likely a
# runaway or sparse file (made in an instant with os.truncate) than something to copy to the host.
DOWNLOAD_LIMIT = 1024**3


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
            `ApprovalRules`, an `ApprovalChain` of policies (the first decision wins; what they all
            pass on is asked), any `ApprovalPolicy`, or a callback that receives the `ApprovalRequest`.
        skills_dir: Where skills are saved (`save_skill`), or None for no skills. Importable by the
            kernel as the package ``skills`` (``from skills.<name> import run``), whatever the
            directory is called; kernel code lists them with ``ipybox_kernel.list_skills()`` and
            saves one with ``ipybox_kernel.save_skill(...)``, a call to the host approved like any
            tool call. Created if missing, mounted read-only, and held to the same rules as
            ``tools_dir``.
        network: None (the default): the kernel has no network at all. A `Network`: HTTP(S)
            clients in the kernel reach the destinations it allows through a proxy on the host,
            and unlisted ones are denied or asked as a `NetworkRequest` (needs the sandbox).
        pool: A `KernelPool` to take kernels from (the first one, and each one after `reset` or a
            kernel's death) instead of starting them: short for ``kernel=pool``.
        kernel: Where the kernels come from (a `KernelSource`): None for kernels started here from
            the settings above (`LocalKernel`), a `LocalKernel` with settings of its own, a
            `KernelPool`, or a `GatewayKernel` for one on Jupyter Kernel Gateway or Enterprise
            Gateway. A source with settings of its own (a pool's, a `LocalKernel`'s) decides them:
            settings left out here take its values, and one given here that differs is a
            `UsageError`. From a pool with ``separate_workspaces``, the executor works in the kernel's
            own workspace and tools directory, not in ``workspace`` and ``tools_dir``. A remote
            kernel's sandbox is the gateway's (leave ``sandbox`` at ``"auto"``); ``workspace`` then
            only receives the images of results, `upload` and `download` copy files to and from the
            kernel's working directory over the kernel protocol (in turn with executions), and
            `install` is refused (see the "Remote kernels" documentation). In tests of your own
            code only: `ipybox.testing.InProcessKernel` with ``sandbox=None`` (not a sandbox).
        oauth: For MCP servers with ``"oauth"`` in their parameters: how a person authorizes
            (a callback that gets the authorization URL) and where tokens are kept, on the host
            only (`ipybox.oauth.OAuth`; default: the default token store, no person to ask). One
            token per server, shared by all its sessions and refreshed without the kernel
            noticing; kernel code never sees it.
        on_tool_call: Observes every tool call and every asked network connection: called with a
            `ToolCallRequested`, a `ToolCallDecided` and (tool calls) a `ToolCallFinished` event,
            sync or async, where each happens (for metrics, logs and traces). It cannot change a
            decision: what it raises is logged and dropped. The events hold the call's arguments,
            which may be personal data.
        mcp_client: What ipybox's MCP client offers the servers beyond tool calls (`ClientFeatures`:
            a sampling handler, roots); default none. A question a server asks during a call
            (elicitation) needs nothing here: it is an `ElicitationRequest`, decided like a call.
        tracing: Where the OpenTelemetry spans of code actions and their tool calls go, and whether
            they hold argument values and results (`Tracing`; default: OpenTelemetry's global
            tracer provider, a no-op until the application configures an SDK, and no values).
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
        skills_dir: Path | str | None = None,
        network: Network | None = None,
        pool: KernelPool | None = None,
        kernel: KernelSource | None = None,
        oauth: OAuth | None = None,
        on_tool_call: ToolCallHook | None = None,
        mcp_client: ClientFeatures | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        check_kernel_settings(env, limits, timeouts)
        check_approval(approval)
        if on_tool_call is not None and not callable(on_tool_call):
            raise UsageError(f"on_tool_call must be a callable that takes a ToolCallEvent, got {on_tool_call!r}")
        self.kernel = _kernel_source(kernel, pool)
        """Where the executor's kernels come from."""
        requested = KernelSettings(
            workspace=Path(workspace),
            sandbox=sandbox,
            env=env or {},
            limits=limits or Limits(),
            tools_dir=Path(tools_dir) if tools_dir is not None else None,
            skills_dir=Path(skills_dir) if skills_dir is not None else None,
            network=network is not None,
        )
        settings = self.kernel.settings_for(requested)
        self.sandbox = resolved_sandbox(settings)
        self.network = check_network(network, self.sandbox)
        self._proxy: NetworkProxy | None = None
        self.limits = settings.limits
        self.timeouts = timeouts or Timeouts()
        self._side = KernelSide(source=self.kernel, settings=settings, start_timeout=self.timeouts.start)
        self.tracing = tracing or Tracing()
        """How code actions are traced; framework adapters read ``values`` from it for their own traces."""
        self._tracer = ActionTracer(self.tracing)
        self._gate = ApprovalGate(
            approval,
            self.timeouts.approval,
            on_tool_call,
            tracer=self._tracer,
            transport_of=self._transport_of,
            max_tool_calls=self.limits.tool_calls,
            max_approval_wait=self.limits.approval_wait,
        )
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._kernels = KernelSupervisor(self._side.open)
        self._remote_files = None
        if self.kernel.remote:
            self._remote_files = RemoteFiles(self._kernels, self._lock, self.timeouts.interrupt_grace)
        self._keyed = KeyedExecutions()
        # The drivers of keyed executions until they end, for the span of one taken up again (`_resumed`).
        self._keyed_drivers: dict[Execution, ExecutionDriver] = {}
        self._tools: ToolServer | None = None
        self._oauth = oauth
        if mcp_client is not None and not isinstance(mcp_client, ClientFeatures):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"mcp_client must be a ClientFeatures, got {mcp_client!r}")
        self._client_features = mcp_client

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
        side = self._side
        if self.sandbox is not None:
            check_bytecode()
        home = side.begin(stack)
        if self.sandbox is not None:
            visible = [self.workspace, *self.sandbox.ro_paths, *self.sandbox.rw_paths]
            refuse_token_dir_in(self._oauth.store if self._oauth is not None else FileTokenStore(), visible)
        self._tools = ToolServer(
            socket_path=home / "tools.sock",
            token=side.token,
            gate=self._gate.tool,
            call_timeout=self.timeouts.tool,
            oauth=self._oauth,
            on_finished=self._gate.finished,
            elicitation=self._gate.elicitation,
            features=self._client_features,
            trace_context=self._gate.trace_context,
            unmarked=self._gate.unmarked,
        )
        self._tools.register_builtin(
            BUILTIN_SERVER, "install_package", self._install_from_kernel, input_schema=_INSTALL_SCHEMA
        )
        if side.has_skills:
            self._tools.register_builtin(
                BUILTIN_SERVER, "save_skill", self._save_skill_from_kernel, input_schema=SAVE_SKILL_SCHEMA
            )
        side.prepare_dirs()
        if side.tools_dir is not None:
            for name, params in load_manifest(side.tools_dir).items():
                self._tools.register(name, params)
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(self._tg.cancel_scope.cancel)
        await self._tg.start(self._tools.run)
        if self.network is not None:
            self._proxy = NetworkProxy(
                self.network,
                socket_path=home / NET_SOCKET,
                token=side.token,
                running=self._gate.running_id,
                ask=self._gate.network,
                observe=self._gate.network_event,
            )
            await self._tg.start(self._proxy.run)
        side.serve(self._tools, self._proxy)
        await self._tg.start(self._kernels.run)

    def __enter__(self) -> NoReturn:
        # Without this, a plain `with` fails with a TypeError that does not say what to write instead.
        raise UsageError(
            "CodeExecutor is an async context manager: write 'async with CodeExecutor(...) as executor:' "
            "inside an async function (run it with asyncio.run(main()))"
        )

    def __exit__(self, *exc_info: object) -> None:
        """Never called: `__enter__` raises (Python looks both up before a `with` starts)."""

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            # The body's own exception propagates as it is: our tasks are cancelled, not failed, so
            # it is not passed into the task group (which would wrap it in an ExceptionGroup).
            await stack.aclose()

    @property
    def approval(self) -> Approval:
        """The approval policy of executions started without their own (assignable)."""
        return self._gate.policy

    @approval.setter
    def approval(self, approval: Approval) -> None:
        check_approval(approval)
        self._gate.policy = approval

    @property
    def workspace(self) -> Path:
        """The kernel's working directory (a pooled kernel's own with ``separate_workspaces``)."""
        return self._side.workspace

    @property
    def tools_dir(self) -> Path | None:
        """The real tools directory, as checked before the last kernel start (None: none)."""
        return self._side.tools_dir

    @property
    def skills_dir(self) -> Path | None:
        """The real skills directory, as checked last (None: none)."""
        return self._side.skills_dir

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
            timeout: Seconds the code may run; defaults to the executor's ``timeouts.execution``.
                While a call waits for approval only the CPU time the kernel uses counts (a
                kernel on a gateway: none, for at most ``limits.approval_wait`` seconds in all,
                else the timeout once more). When it runs out the kernel is interrupted, and
                restarted if it does not stop within ``timeouts.interrupt_grace`` seconds.
            key: Makes starting idempotent: while this executor runs, the same key returns the same
                execution, and the code runs once. A keyed execution also outlives the cancellation
                of the task awaiting it (re-attach with `attach`); one without a key is cancelled
                when the last task awaiting or iterating it is cancelled (see `Execution`). Once it
                has ended and its outcome was delivered, the executor forgets it: `attach` and
                starting the key again raise `ExecutionLost`.
            approval: This execution's approval policy, instead of the executor's (same values
                as ``CodeExecutor(approval=...)``). Code an earlier execution left in the kernel
                can act while this one runs, so if an earlier execution in the same kernel ran
                under a different policy (other than ``"auto"``), this execution's tool calls and
                connections are refused: call `reset` first, or use one policy throughout.
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
                return self._resumed(existing)
        execution, driver = open_execution(
            code,
            key=key,
            timeout=timeout if timeout is not None else self.timeouts.execution,
            approval=approval,
            ttl=ttl,
        )
        if key is not None:
            self._keyed.add(execution)
            self._keyed_drivers[execution] = driver
            driver.on_delivered(self._keyed.release)
        # The caller's context (a framework's tool span, say): the code action's span goes under it.
        tg.start_soon(self._drive, driver, otel_context.get_current())
        return execution

    async def suspend(self, execution: Execution, *, secret: bytes, ttl: float, shown: str | None = None) -> str:
        """Hand a paused execution over to another process: return its locator, and let it go here.

        The execution must be the one running, on a `GatewayKernel`, with every tool call it makes
        waiting for approval (iterate it until an `ApprovalRequest`, then suspend instead of
        answering); while a call of it is approved and running, or made and not asked yet, this
        waits for it to end or be asked. The kernel stays on the gateway, blocked in those calls; this executor sends it
        nothing more and does not delete it, and the execution ends here with `ExecutionSuspended`
        (the next execution here gets a fresh kernel). Any process can then `resume` it from the
        locator with the same ``secret``, once, within ``ttl``: it is asked again for the pending
        calls (or given a decision), and gets the rest of the output and the result.

        Store the locator where your framework keeps its state; it holds the code, the pending
        calls' arguments and the output so far (which may be personal data), nothing secret, and is
        signed with ``secret`` (HMAC-SHA256): a changed one is refused. See "Durable approvals" in
        the documentation.

        Args:
            execution: The running execution, paused at its approval requests.
            secret: The application's key for locators: at least 32 random bytes, the same on every
                worker, and never where kernel code can read it.
            ttl: Seconds the kernel holds the execution for a resume (hours are fine); then the
                kernel's process ends and resuming raises `ExecutionLost`.
            shown: The id of the pending `ApprovalRequest` the application shows a person: a
                ``decision`` given on resume answers this call and no other (the other pending
                calls are asked again). None: the first pending request.

        Raises:
            UsageError: The execution is not running here, not paused at tool-call approvals only,
                or not on a gateway kernel; ``shown`` is not one of its pending requests; or
                ``secret`` or ``ttl`` is not valid.
            KernelConnectionLost: The kernel was lost before it took the hold.
        """
        from ._suspension import check_hold, check_secret, seal_locator

        self._require_running()
        secret, hold = check_secret(secret), check_hold(ttl)
        await self._until_every_call_asked(execution)
        kernel, driver, msg_id, held, requests = await self._pending_held(execution)
        shown = requests[0] if shown is None else shown
        if shown not in requests:
            raise UsageError(f"{shown!r} is not a pending tool-call request of {execution!r}")
        from ipybox._gateway._held import HeldLost

        try:
            await kernel.hold(hold)
        except HeldLost as exc:
            raise kernel.lost_error() from exc
        if self._gate.current() != (driver, msg_id) or [call.call_id for call in kernel.in_flight()] != [
            call.call_id for call in held.calls
        ]:
            # Decided (or ended) while the kernel was asked to hold: its answer went through, so the
            # execution goes on here.
            await kernel.unhold()
            raise UsageError("a pending call was decided while the execution was being suspended; it goes on here")
        locator = seal_locator(
            held,
            code=execution.code,
            key=execution.key,
            timeout=execution.timeout,
            ttl=execution.ttl,
            output=[event for event in execution.log if isinstance(event, CodeExecutionChunk)],
            hold=hold,
            secret=secret,
            requests=requests,
            shown=shown,
        )
        if execution.key is not None:
            self._keyed.release(execution, "was suspended; resume it from its locator")
        # Together, with no await between: ending the execution rejects its pending calls, and those
        # rejections must not reach the kernel, which takes nothing more from this host.
        driver.fail(ExecutionSuspended(f"execution {execution.id} was suspended; it goes on where it is resumed"))
        kernel.let_go()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeouts.interrupt_grace):
            # The websocket closed: the gateway keeps the kernel's messages for the resuming host.
            await kernel.closed.wait()
        logger.info("suspended execution %s (msg %s) on kernel %s", execution.id, msg_id, held.kernel_id)
        return locator

    async def _until_every_call_asked(self, execution: Execution) -> None:
        """Wait while a tool call of the running execution is in flight without waiting for approval:
        decided and running (it ends), or not asked yet (its request comes, or it ends)."""
        from ipybox._gateway._remotekernel import RemoteKernel

        while True:
            current, kernel = self._gate.current(), self._kernels.kernel
            if current is None or current[0].execution is not execution or not isinstance(kernel, RemoteKernel):
                return  # _pending_held says why it cannot be suspended
            driver = current[0]
            # Taken before looking, with no await in between: an end or an event after the look sets them.
            ended, changed = kernel.call_end(), driver.change()
            pending = [e for e in execution.log if isinstance(e, ApprovalRequest) and e.decision is None]
            if driver.done or len(kernel.in_flight()) <= len(pending):
                return
            await wait_any(ended, changed)

    async def _pending_held(
        self, execution: Execution
    ) -> tuple[RemoteKernel, ExecutionDriver, str, HeldKernel, tuple[str, ...]]:
        """The running execution's kernel, driver and request id, what a locator holds of it, and the
        `ApprovalRequest` id each held call was asked as.

        Raises:
            UsageError: It cannot be suspended now (see `suspend`).
        """
        from ipybox._gateway._gatewaykernel import GatewayKernel
        from ipybox._gateway._held import HeldKernel
        from ipybox._gateway._remotekernel import RemoteKernel

        current = self._gate.current()
        if current is None or current[0].execution is not execution:
            raise UsageError(f"only the running execution can be suspended; {execution!r} is not running here")
        driver, msg_id = current
        kernel = self._kernels.kernel
        if not isinstance(self.kernel, GatewayKernel) or not isinstance(kernel, RemoteKernel):
            raise UsageError(
                "only an execution on a GatewayKernel can be suspended: its kernel outlives this process on "
                "the gateway (a local kernel ends with its executor)"
            )
        pending = [
            request for request in execution.log if isinstance(request, ApprovalRequest) and request.decision is None
        ]
        if not pending or any(type(request) is not ApprovalRequest for request in pending):
            raise UsageError(
                "an execution can be suspended while tool calls wait for approval, and only then (not while "
                "a network connection or an MCP server's question waits); iterate it to an ApprovalRequest"
            )
        calls = kernel.in_flight()
        if len(calls) != len(pending) or kernel.kernel_session is None:
            raise UsageError(
                "a tool call of this execution is running or being checked: suspend once every call waits for approval"
            )
        held = HeldKernel(
            url=self.kernel.base,
            kernel_id=kernel.kernel_id,
            session=kernel.link.session,
            kernel_session=kernel.kernel_session,
            msg_id=msg_id,
            calls=tuple(calls),
        )
        return kernel, driver, msg_id, held, self._asked_as(calls, [request.id for request in pending])

    def _asked_as(self, calls: list[HeldCall], pending: list[str]) -> tuple[str, ...]:
        """The pending request each call waiting in the kernel was asked as, each request taken once
        (two identical calls pair with their requests in order: they are the same call twice).

        Raises:
            UsageError: A call matches no pending request (it was not asked here).
        """
        from ._suspension import pending_request

        free = list(pending)
        requests: list[str] = []
        for call in calls:
            parsed = pending_request(call.line, self._side.token)
            request_id = None if parsed is None else self._gate.request_for(parsed, free)
            if request_id is None:
                raise UsageError("a tool call waiting in the kernel was not asked here: suspend once every call waits")
            free.remove(request_id)
            requests.append(request_id)
        return tuple(requests)

    def resume(
        self,
        locator: str,
        *,
        secret: bytes,
        decision: ApprovalDecision | None = None,
        request_id: str | None = None,
        key: str | None = None,
    ) -> Execution:
        """Resume a suspended execution from its locator, in this process, and return it.

        The locator is verified with ``secret`` first (nothing runs unless it was made with it and
        is unchanged, and not expired). This executor's kernel is then replaced by the suspended
        one on the gateway (re-attached with the same session, so the gateway replays what the
        kernel sent meanwhile), the pending tool calls are raised again as `ApprovalRequest` events
        of the returned execution, decided by this executor's policy or the application as usual,
        or by ``decision`` if given, and the rest of the code runs once. The execution's events
        start with the output sent before it was suspended.

        This executor needs the same `GatewayKernel` URL and the MCP servers the suspended one had
        (its tools directory); its approval policy and tool token are its own.

        Args:
            locator: What `suspend` returned.
            secret: The secret it was made with.
            decision: The answer a person gave meanwhile to the request the execution was
                suspended showing (``suspend``'s ``shown``), applied to that call only, once per
                locator in this process, without an `ApprovalRequest` event (the tool-call hook and
                the trace record it); the other pending calls are asked again. None: ask again.
            request_id: The id of the request ``decision`` answers, as the person saw it: it must
                be the one the locator was suspended showing (a decision stored for one call is
                never applied to another). None: not checked.
            key: The key the suspended execution must have (None: any). An application that keeps
                locators in per-action state passes the action's key, so that a locator copied
                from another action's or conversation's state is refused.

        Raises:
            InvalidLocator: Not made with ``secret``, changed, not a locator, of an execution
                with another key than ``key``, or suspended showing another request than
                ``request_id``.
            ExecutionLost: It expired, or this process applied a decision to it already. If the
                kernel is gone (its hold ran out, the gateway restarted, it was resumed elsewhere
                already), the returned execution fails with `ExecutionLost` instead; in both cases
                nothing was re-run.
            UsageError: This executor's kernel is not a `GatewayKernel` at the locator's URL.
        """
        from ipybox._gateway._gatewaykernel import GatewayKernel

        from ._suspension import check_secret, decide_once, read_locator

        tg = self._require_running()
        suspension = read_locator(locator, check_secret(secret))
        if key is not None and suspension.key != key:
            # Genuine, but another action's: its state was swapped for this one's.
            raise InvalidLocator("the locator is of another code action than the one resumed; nothing was run")
        if not isinstance(self.kernel, GatewayKernel) or self.kernel.base != suspension.held.url:
            raise UsageError(
                f"the suspended execution's kernel is on the gateway at {suspension.held.url}; resume it with an "
                "executor whose kernel is GatewayKernel at that URL"
            )
        if decision is not None and not isinstance(decision, ApprovalDecision):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"decision must be an ApprovalDecision or None, got {decision!r}")
        if request_id is not None and request_id != suspension.shown:
            # Genuine, but the answer stored with it was given to another request (an edited state).
            raise InvalidLocator(
                f"the decision answers request {request_id!r}, but the execution was suspended showing "
                f"{suspension.shown!r}; nothing was run"
            )
        if suspension.key is not None:
            existing = self._keyed.existing(suspension.key, suspension.code)
            if existing is not None:
                return existing  # resumed in this executor already
        if decision is not None:
            decide_once(suspension)
        execution, driver = open_execution(
            suspension.code, key=suspension.key, timeout=suspension.timeout, ttl=suspension.ttl
        )
        if suspension.key is not None:
            self._keyed.add(execution)
            driver.on_delivered(self._keyed.release)
        tg.start_soon(self._drive_resumed, driver, suspension, decision, otel_context.get_current())
        return execution

    async def _drive_resumed(
        self,
        driver: ExecutionDriver,
        suspension: Suspension,
        decision: ApprovalDecision | None,
        parent: otel_context.Context,
    ) -> None:
        from ipybox._gateway._gatewaykernel import GatewayKernel
        from ipybox._gateway._opening import open_held_kernel
        from ipybox._gateway._remotekernel import RemoteKernel

        from ._suspension import pending_request, request_mark, with_token

        execution, held = driver.execution, suspension.held
        assert isinstance(self.kernel, GatewayKernel)
        driver.span = self._tracer.start_action(
            execution_id=execution.id, key=execution.key, code=execution.code, parent=parent
        )
        try:
            with driver.cancel_scope():
                async with self._lock:
                    via = functools.partial(open_held_kernel, self.kernel, held)
                    try:
                        kernel = await self._kernels.replace(functools.partial(self._side.open, via=via))
                    except KernelStartError as exc:
                        driver.fail(ExecutionLost(f"the suspended execution is lost; nothing was re-run: {exc}"))
                        return
                    assert isinstance(kernel, RemoteKernel)
                    calls = [HeldCall(call.call_id, with_token(call.line, self._side.token)) for call in held.calls]
                    for call in calls:
                        mark = request_mark(call.line)
                        if mark is not None:
                            driver.marks.add(mark)  # its output came before the suspension, to the other host
                    try:
                        async with self._gate.running(driver, held.msg_id, kernel):
                            if decision is not None:
                                # The shown call only: a decision answers what a person saw.
                                shown = calls[suspension.requests.index(suspension.shown)]
                                request = pending_request(shown.line, self._side.token)
                                if request is not None:
                                    self._gate.preset(request, decision)
                            for call in calls:
                                kernel.feed(call)
                            await run_execution(
                                kernel,
                                driver,
                                held.msg_id,
                                workspace=self.workspace,
                                output_chars=self.limits.output_chars,
                                interrupt_grace=self.timeouts.interrupt_grace,
                                approval_wait=self.limits.approval_wait,
                                on_expired=self._keyed.release,
                                events=kernel.follow(held.msg_id),
                                before=suspension.output,
                            )
                    finally:
                        if self._proxy is not None:
                            self._proxy.end_execution(execution.id)
            if not driver.done:
                driver.fail(ExecutionCancelled("the execution was cancelled"))
        finally:
            ActionTracer.end_action(driver.span, *driver.outcome, driver.account.snapshot())

    def attach(self, key: str) -> Execution:
        """The execution started with this key.

        Raises:
            ExecutionLost: No execution with this key is known to this executor (any more).
        """
        return self._resumed(self._keyed.attach(key))

    def _resumed(self, execution: Execution) -> Execution:
        """``execution``, taken up again where the caller runs: its span links to the caller's span
        (a framework's run that resumed a paused code action), since a span's parent cannot change."""
        driver = self._keyed_drivers.get(execution)
        if driver is not None:
            ActionTracer.resumed(driver.span, driver.linked)
        return execution

    async def _drive(self, driver: ExecutionDriver, parent: otel_context.Context) -> None:
        execution = driver.execution
        driver.span = self._tracer.start_action(
            execution_id=execution.id, key=execution.key, code=execution.code, parent=parent
        )
        # The run that started it is its parent, not a run that resumes it.
        driver.linked.add(trace.get_current_span(parent).get_span_context().span_id)
        try:
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
        finally:
            self._keyed_drivers.pop(execution, None)
            ActionTracer.end_action(driver.span, *driver.outcome, driver.account.snapshot())

    def _transport_of(self, server: str) -> str | None:
        """How the host reaches the server registered as ``server`` (for spans)."""
        if server == BUILTIN_SERVER:
            return "host"
        params = None if self._tools is None else self._tools.servers.get(server)
        return None if params is None else params.type

    async def _run(self, kernel: KernelHandle, driver: ExecutionDriver) -> None:
        msg_id = kernel.new_msg_id()
        if self._proxy is not None:
            driver.account.network = functools.partial(self._proxy.bytes_moved, driver.execution.id)
        try:
            async with self._gate.running(driver, msg_id, kernel):
                await run_execution(
                    kernel,
                    driver,
                    msg_id,
                    workspace=self.workspace,
                    output_chars=self.limits.output_chars,
                    interrupt_grace=self.timeouts.interrupt_grace,
                    approval_wait=self.limits.approval_wait,
                    on_expired=self._keyed.release,
                )
        finally:
            if self._proxy is not None:
                self._proxy.end_execution(driver.execution.id)

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
        assert self._side.home is not None
        if self.kernel.remote:
            raise UsageError(
                "CodeExecutor.install() works on the host's workspace and environment, which a remote kernel "
                "does not see; install packages in the kernel's image"
            )
        return await install_package(package, self._side.home / "packages")

    async def _install_from_kernel(self, arguments: Mapping[str, object]) -> str:
        package = arguments.get("package")
        if not isinstance(package, str):
            raise UsageError("install_package needs a 'package' string")
        return await self.install(package)

    async def save_skill(self, name: str, code: str, *, description: str, overwrite: bool = False) -> Skill:
        """Save ``code`` as the skill ``name`` in the skills directory, importable by the kernel as
        ``skills.<name>`` at once (also after `reset` and in later executors on this directory).

        To keep a code action that worked, save its code (``execution.code``) once it defines
        ``run``: a skill is a module with an entry point, not a script that runs on import. Saving
        from the host needs no approval; kernel code saves through ``ipybox_kernel.save_skill``,
        which does.

        Args:
            name: The skill's name and module name: a lowercase identifier that is not a keyword
                and shadows no module kernel code imports.
            code: A Python module defining ``run``; give the module and ``run`` docstrings and
                ``run`` typed parameters, which prompts show (`render_skill_stubs`). Compiled on the
                host, never imported there.
            description: One line on what the skill does and when to use it (``SKILL.md``).
            overwrite: Replace a skill of the same name. A module the kernel imported already stays
                loaded until `reset` (or ``importlib.reload``).

        Returns:
            The saved skill.

        Raises:
            InvalidSkill: The name, code or description cannot be used, or the skill exists and
                ``overwrite`` is false; the message says what to change.
            UsageError: The executor is not running or has no skills directory, or the directory
                cannot be trusted any more.
        """
        self._require_running()
        return await self._side.save_skill(name, code, description, overwrite=overwrite)

    async def _save_skill_from_kernel(self, arguments: Mapping[str, object]) -> str:
        name, code, description, overwrite = skill_arguments(arguments)
        skill = await self.save_skill(name, code, description=description, overwrite=overwrite)
        return f"saved skill {skill.name!r}; import it with `from {skill.module} import run`"

    # -- files --------------------------------------------------------------------------

    async def upload(self, src: Path | str, dst: Path | str) -> Path:
        """Copy a host file into the workspace; ``dst`` is relative to the workspace.

        Returns:
            The path of the written file (with a `GatewayKernel`: relative to the kernel's working
            directory, where the file was written over the kernel protocol).

        Raises:
            UsageError: ``dst`` leaves the workspace or goes through a symlink.
            FileTransferError: With a `GatewayKernel`: the kernel failed or broke the copy.
        """
        if self._remote_files is not None:
            self._require_running()
            return await self._remote_files.upload(src, dst)
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

        With a `GatewayKernel`, ``src`` is relative to the kernel's working directory, and the file
        comes over the kernel protocol in chunks under the same rules.

        Raises:
            UsageError: ``src`` is not a regular file in the workspace, or has more than
                ``max_bytes``.
            FileTransferError: With a `GatewayKernel`: the kernel failed or broke the copy.
        """
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"max_bytes must be a number of bytes (>= 0) or None, got {max_bytes!r}")
        fix = "pass a larger max_bytes to download() (None for no limit) if you do want all of it"
        if self._remote_files is not None:
            self._require_running()
            await self._remote_files.download(src, Path(dst), max_bytes=max_bytes, fix=fix)
            return Path(dst)
        await anyio.to_thread.run_sync(
            functools.partial(copy_file, self.workspace, src, Path(dst), max_bytes=max_bytes, fix=fix)
        )
        return Path(dst)


def _kernel_source(kernel: object, pool: object) -> KernelSource:
    """``CodeExecutor(kernel=..., pool=...)`` as one kernel source.

    Raises:
        UsageError: Both are given, or one is not what it should be.
    """
    if pool is not None:
        if not isinstance(pool, KernelPool):
            raise UsageError(f"pool must be a KernelPool, got {pool!r}")
        if kernel is not None:
            raise UsageError("give the executor's kernels one source: kernel=... or pool=..., not both")
        return pool
    if kernel is None:
        return LocalKernel()
    if not all(callable(getattr(kernel, name, None)) for name in ("settings_for", "open")):
        raise UsageError(
            f"kernel must be a kernel source (LocalKernel, KernelPool, GatewayKernel) or None, got {kernel!r}"
        )
    return cast("KernelSource", kernel)
