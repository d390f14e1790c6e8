"""`ApprovalGate`: one executor's decision on every request its kernel makes of the host.

Tool calls (through the `ToolServer`) and connections to unlisted destinations (through the network
proxy) reach the host on their own channels, while the code action that made them runs. The gate
ties each one to the running execution, refuses those of code that outlived its execution, and
decides the rest by the execution's policy, else the executor's, else by asking the application
(an `ApprovalRequest` event of the execution).

Which code made a request cannot be established from inside the kernel: every execution leaves its
state behind (threads, processes, callbacks, signal handlers, patched functions), and any of it can
read the running execution's id from the kernel's memory. So a request is decided by the running
execution's policy only when that gives earlier code no more than it had: every code action since
the kernel started ran under the same policy, or under ``"auto"``. Otherwise it is refused, naming
the earlier code action and the fix (SECURITY.md, "Attribution of requests").
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from time import perf_counter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest
from ipybox._approval._policies import Approval, decide_by_policy, policy_name
from ipybox._kernel import KernelHandle
from ipybox._kernel._leftrunning import LeftRunning
from ipybox._mcp._serverasks import ELICIT_METHOD, ElicitationRequest, settled
from ipybox._toolserver._boundary import ToolCallFailed
from ipybox._toolserver._channel import ToolRequest, ToolResultReply
from ipybox.network._policy import NetworkEvent
from ipybox.network._request import NetworkRequest, network_request_fields

from ._callsite import CallSite, call_site_of
from ._execution import ExecutionDriver, Tally
from ._toolevents import ToolCallDecided, ToolCallEvent, ToolCallFinished, ToolCallHook, ToolCallRequested, notify
from ._tracing import ActionTracer

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ("ApprovalGate",)

logger = logging.getLogger(__name__)

# Why a tool call from code that outlived its execution is refused.
_STRAY_CALL = (
    "this tool call comes from code left running after the code action that started it ended (a "
    "thread or task it did not wait for); tool calls are only allowed from the code action that is "
    "running: join such threads or await such tasks before the code action ends"
)


@dataclass(eq=False)
class _OpenCall:
    """A request reported as requested and not yet as finished."""

    fields: dict[str, Any]
    """What every event of it says (`_fields`)."""
    began: float
    span: Span | None
    trace: Span | None
    """What the MCP server is told the call belongs to: its span, else its code action's (which,
    recording nothing, still carries the trace of the caller of ``execute()``)."""
    account: Tally | None
    """Its code action's count, for a tool call of the running execution."""
    watchers: list[ToolCallHook] | None
    """Its execution's own observers (`Execution.on_tool_call`); None for a stray call."""
    decided: float | None = None


class ApprovalGate:
    """Decides the kernel's requests for the execution that runs now.

    Args:
        policy: The executor's approval policy (already checked), for executions without their own.
        timeout: Seconds an asked request waits for the application's answer (None: no limit).
        hook: Observes every request: requested, decided and, for tool calls, finished (`finished`
            is the `ToolServer`'s report). None costs nothing on a call's path.
        tracer: Makes a span of every request, a child of its execution's span (`ExecutionDriver.span`).
        transport_of: The transport of a server by name (``"stdio"``, ``"streamable-http"``, ...),
            None when the host does not know the name; for the spans.
        max_tool_calls: Tool calls one execution may make (`Limits.tool_calls`).
        max_approval_wait: Seconds one execution's tool calls may wait for approval in all
            (`Limits.approval_wait`).
    """

    def __init__(
        self,
        policy: Approval,
        timeout: float | None,
        hook: ToolCallHook | None = None,
        *,
        tracer: ActionTracer | None = None,
        transport_of: Callable[[str], str | None] | None = None,
        max_tool_calls: int | None = None,
        max_approval_wait: float | None = None,
    ) -> None:
        self.policy: Approval = policy
        self._timeout = timeout
        self.hook = hook
        self.tracer = tracer
        self.transport_of = transport_of
        self._max_tool_calls = max_tool_calls
        self._max_approval_wait = max_approval_wait
        # The tool calls reported as requested and not yet as finished, by the ToolRequest the
        # ToolServer holds until it reports them.
        self._open: dict[int, _OpenCall] = {}
        self._driver: ExecutionDriver | None = None
        # The kernel's id for the running execution, which its tool calls must carry.
        self._msg_id: str | None = None
        # The kernel the earlier executions ran in, and the policies other than "auto" they ran
        # under with the first execution of each: at most two, since two different ones already
        # differ from any third.
        self._kernel: object = None
        self._earlier: list[tuple[Approval, str]] = []
        self._warned: str | None = None
        # The threads and processes earlier executions left in the kernel, seen by the host; and
        # what the running execution's requests say about them (ApprovalRequest.left_running).
        self._left: LeftRunning | None = None
        self._left_running: str | None = None
        # Decisions made before their requests were asked (a resumed execution's), for the running
        # execution's calls with exactly these requests (`preset`), each taken once.
        self._presets: dict[str, ApprovalDecision] = {}
        # The running execution's tool-call requests: each `ApprovalRequest` id with its call, to tell
        # which request a call waiting in the kernel is (`request_for`; compared by `_preset_key`,
        # which is made only then: a JSON dump of every call would cost each call more than the
        # rest of the gate).
        self._asked: dict[str, ToolRequest] = {}

    @asynccontextmanager
    async def running(self, driver: ExecutionDriver, msg_id: str, kernel: KernelHandle) -> AsyncGenerator[None]:
        """Route requests to ``driver``'s execution while the block runs (the kernel's ``msg_id``).

        ``kernel`` is the kernel it runs in: what earlier executions left behind lives as long as
        that kernel does, and no longer. Before the block, the host looks for threads and processes
        of earlier executions still alive in it (ipybox._kernel._leftrunning).
        """
        if kernel is not self._kernel or self._left is None:
            self._kernel, self._earlier, self._left = kernel, [], LeftRunning(kernel.live_tasks, unseen=kernel.unseen)
        self._left_running = await self._left.begin()
        self._driver, self._msg_id = driver, msg_id
        began = self._policy_of(driver)
        try:
            yield
        finally:
            self._driver = self._msg_id = self._left_running = None
            self._presets.clear()
            self._asked.clear()
            self._left.end(driver.execution.id)
            # Both: the executor's policy may have been changed while it ran.
            self._remember(began, driver.execution.id)
            self._remember(self._policy_of(driver), driver.execution.id)

    def current(self) -> tuple[ExecutionDriver, str] | None:
        """The driver of the execution that runs now and the kernel's id for it, if one runs."""
        if self._driver is None or self._msg_id is None:
            return None
        return self._driver, self._msg_id

    def preset(self, call: ToolRequest, decision: ApprovalDecision) -> None:
        """Decide the running execution's next request for exactly ``call`` (the token aside) with
        ``decision`` instead of asking: a decision given with a resumed execution for its pending
        call. Taken once; dropped when the execution ends."""
        self._presets[_preset_key(call)] = decision

    def request_for(self, call: ToolRequest, among: Sequence[str]) -> str | None:
        """Of the running execution's request ids ``among``, the first whose call was exactly ``call``
        (the token aside): which request a call still waiting in the kernel was asked as."""
        key = _preset_key(call)
        for request_id in among:
            asked = self._asked.get(request_id)
            if asked is not None and _preset_key(asked) == key:
                return request_id
        return None

    def unmarked(self, call: ToolRequest) -> bool:
        """Whether the running execution's later calls may come without an output mark: ``call`` is
        its own, and its policy is ``"auto"``, which never shows a call to anyone (the `ToolServer`
        tells the kernel so in the reply, and the kernel then skips flushing and marking its output
        before each call: ipybox_kernel._marks)."""
        driver = self._driver
        return driver is not None and call.execution == self._msg_id and self._policy_of(driver) == "auto"

    def running_id(self) -> str | None:
        """The id of the execution that runs now, if one does."""
        return self._driver.execution.id if self._driver is not None else None

    async def tool(
        self,
        call: ToolRequest,
        *,
        server: str,
        annotations: Mapping[str, Any] | None,
        input_schema: Mapping[str, Any] | None,
    ) -> ApprovalDecision:
        """The `ToolServer`'s gate: a decision on one tool call."""
        driver = self._driver
        # A thread or task keeps the id of the execution that started it (ipybox_kernel._context):
        # a call from one that outlived its execution must not be shown as the running one's.
        if driver is None or call.execution is None or call.execution != self._msg_id:
            return await self._refused(call, None, ApprovalDecision(approved=False, reason=_STRAY_CALL, by="ipybox"))
        unknown = self._origin_unknown(driver, f"tool call {call.server}.{call.tool}")
        if unknown is not None:
            return await self._refused(call, driver, unknown)
        over = self._over_budget(driver.account)
        if over is not None:
            # Not a decision anyone made: the call fails as over budget, not as rejected.
            await self._refused(call, driver, ApprovalDecision(approved=False, reason=over, by="ipybox"))
            raise ToolCallFailed("over_budget", f"the tool call {call.server}.{call.tool} was not made: {over}")
        request = driver.new_request(
            server_name=call.server,
            tool_name=call.tool,
            tool_args=call.arguments,
            server=server,
            annotations=annotations,
            input_schema=input_schema,
            call_site=call_site_of(driver.execution.code, call.line, call.module),
            left_running=self._left_running,
        )
        self._asked[request.id] = call
        preset = self._presets.pop(_preset_key(call), None) if self._presets else None
        return await self._decide(driver, request, after_mark=call.mark, call=call, preset=preset)

    async def elicitation(
        self, call: ToolRequest, *, server: str, fields: Mapping[str, Any], refusal: str | None = None
    ) -> ApprovalDecision:
        """The `ToolServer`'s asker for a question a server asks during ``call`` (`ElicitationRequest`
        fields: mode, message, schema or URL): decided like the call itself, by the same execution's
        policy or its application, never by kernel code. With ``refusal`` (what ipybox found wrong
        with it) it is declined unasked, and the hook still sees it."""
        driver = self._driver
        if driver is None or call.execution is None or call.execution != self._msg_id:
            why = "the tool call it came with has no running code action"
            return ApprovalDecision(approved=False, reason=why, by="ipybox")
        unknown = self._origin_unknown(driver, f"question of MCP server {call.server}")
        if unknown is not None:
            return unknown
        words = ("mode", "message", "requested_schema", "url")
        args = {key: fields[key] for key in words if fields.get(key) is not None}
        request = driver.new_request(
            ElicitationRequest,
            server_name=call.server,
            tool_name=ELICIT_METHOD,
            tool_args=args,
            server=server,
            during_tool=call.tool,
            left_running=self._left_running,
            **fields,
        )
        preset = None if refusal is None else ApprovalDecision(approved=False, reason=refusal, by="ipybox")
        return await self._decide(driver, request, preset=preset)

    async def network(self, host: str, port: int, execution_id: str, line: int | None = None) -> ApprovalDecision:
        """The network proxy's asker: a decision on a connection to an unlisted destination; ``line``:
        the line of the code action the kernel says opened it, shown from the host's copy of the code."""
        driver = self._driver
        if driver is None or driver.execution.id != execution_id:
            return ApprovalDecision(approved=False, reason="its code action has ended", by="ipybox")
        unknown = self._origin_unknown(driver, f"connection to {host}:{port}")
        if unknown is not None:
            return unknown
        fields = network_request_fields(host, port)
        request = driver.new_request(
            NetworkRequest,
            **fields,
            execution_id=execution_id,
            call_site=call_site_of(driver.execution.code, line, None),
            left_running=self._left_running,
        )
        return await self._decide(driver, request)

    async def _decide(
        self,
        driver: ExecutionDriver,
        request: ApprovalRequest,
        *,
        after_mark: int | None = None,
        call: ToolRequest | None = None,
        preset: ApprovalDecision | None = None,
    ) -> ApprovalDecision:
        opened = await self._requested(
            call,
            driver,
            request.id,
            request.server_name,
            request.tool_name,
            request.tool_args,
            request.annotations,
            request.call_site,
        )
        if preset is None:
            decision, decider = await decide_by_policy(self._policy_of(driver), request)
        else:
            decision, decider = preset, None
        if decision is not None and request.left_running is not None:
            # The same policy decided the earlier code's requests (else _origin_unknown refused this
            # one): it decides this one as it would have decided that code's. Logged, since no one saw it.
            logger.info("%s decided by policy (approved=%s) while %s", request, decision.approved, request.left_running)
        if decision is None:
            limit = self._timeout
            if call is not None and self._max_approval_wait is not None:
                # What is left of the execution's approval budget (some is, or the call was refused).
                left = self._max_approval_wait - driver.account.approval_wait
                limit = left if limit is None else min(limit, left)
            # Shown to the application: after what the code printed before the call (ipybox._engine._outputmarks).
            decision = await driver.ask(request, limit, after_mark=after_mark)
        else:
            request.decide(decision)
        if isinstance(request, ElicitationRequest):
            decision = settled(request, decision)
        if opened is not None:
            await self._decided(call, opened, decision, None if decider is None else policy_name(decider))
        return decision

    async def _refused(
        self, call: ToolRequest, driver: ExecutionDriver | None, decision: ApprovalDecision
    ) -> ApprovalDecision:
        """``decision``, a refusal of ``call`` before it became a request, reported to the hook."""
        # The kernel's dict: read-only for the hook, though the refused call never runs with it.
        opened = await self._requested(call, driver, None, call.server, call.tool, MappingProxyType(call.arguments))
        if opened is not None:
            await self._decided(call, opened, decision, None)
        return decision

    async def _requested(
        self,
        call: ToolRequest | None,
        driver: ExecutionDriver | None,
        call_id: str | None,
        server: str,
        tool: str,
        arguments: Mapping[str, Any],
        annotations: Mapping[str, Any] | None = None,
        call_site: CallSite | None = None,
    ) -> _OpenCall | None:
        """Report a request to the hook and start its span; None when neither is wanted."""
        hook, tracer = self.hook, self.tracer
        # The span's parent is the running execution's, the host's own record: a call with a stale or
        # forged execution id (driver None) still belongs to the code action that runs.
        running = driver or self._driver
        parent = None if running is None else running.span
        account = driver.account if driver is not None and call is not None else None
        watchers = driver.watchers if driver is not None else None
        if tracer is None or not tracer.traces_under(parent):
            tracer = None
            if hook is None and account is None and not watchers:
                return None
        fields = _fields(driver, call_id, server, tool)
        span = None
        if tracer is not None:
            span = tracer.start_tool(
                parent,
                call_id=call_id,
                server=server,
                tool=tool,
                transport=None if self.transport_of is None else self.transport_of(server),
                arguments=arguments,
                stray=driver is None,
                call_site=call_site,
            )
        opened = _OpenCall(fields, perf_counter(), span, span or parent, account, watchers)
        if account is not None:
            account.tool_calls += 1
        if call is not None:
            self._open[id(call)] = opened
        if hook is not None or watchers:
            await self._tell(opened, ToolCallRequested(**fields, arguments=arguments, annotations=annotations))
        return opened

    async def _decided(
        self, call: ToolRequest | None, opened: _OpenCall, decision: ApprovalDecision, policy: str | None
    ) -> None:
        opened.decided = decided = perf_counter()
        waited = decided - opened.began
        account = opened.account
        if account is not None:
            account.approval_wait += waited
            if decision.approved:
                account.approved += 1
            else:
                account.rejected += 1
        if opened.span is not None:
            ActionTracer.decided(opened.span, decision, policy, waited)
            if call is None and self.tracer is not None:  # a connection: its span ends with its decision
                self.tracer.finished(opened.span, None if decision.approved else "rejected", 0.0)
        if self.hook is not None or opened.watchers:
            # A copy: the ToolServer reads the gate's own decision after the hook has run, so not even a
            # hook that writes past the frozen dataclass can change what is done.
            event = ToolCallDecided(**opened.fields, decision=replace(decision), policy=policy, waited=waited)
            await self._tell(opened, event)

    def network_event(self, event: NetworkEvent) -> None:
        """The network proxy's report of a connection of the running execution: counted on its
        account, and an event on its span (none of code that outlived its execution)."""
        driver = self._driver
        if driver is None or driver.execution.id != event.execution_id:
            return
        if event.kind == "allowed":
            driver.account.connections += 1
        if driver.span is not None and driver.span.is_recording():
            ActionTracer.network_event(driver.span, event)

    def trace_context(self, call: ToolRequest) -> otel_context.Context | None:
        """The `ToolServer`'s context of an approved call: its span's, which the MCP SDK passes on to
        the server (``traceparent`` in the request's ``_meta``); None if it has none.

        The span alone, not the context ``execute()`` was called in: that context's baggage is the
        application's, and MCP servers are not told it.
        """
        opened = self._open.get(id(call))
        if opened is None or opened.trace is None or not opened.trace.get_span_context().is_valid:
            return None
        return trace.set_span_in_context(opened.trace, otel_context.Context())

    async def finished(self, call: ToolRequest, error: str | None, result: ToolResultReply | None = None) -> None:
        """The `ToolServer`'s report that ``call`` ended (``error``: None or its error kind)."""
        opened = self._open.pop(id(call), None)
        if opened is None:
            return  # refused before the gate was asked: nothing was reported of it
        duration = perf_counter() - (opened.began if opened.decided is None else opened.decided)
        if opened.account is not None:
            opened.account.tool_time += duration
        if opened.span is not None and self.tracer is not None:
            outcome = None if result is None else result.structured if result.structured is not None else result.text
            self.tracer.finished(opened.span, error, duration, outcome)
        if self.hook is not None or opened.watchers:
            await self._tell(opened, ToolCallFinished(**opened.fields, error=error, duration=duration))

    async def _tell(self, opened: _OpenCall, event: ToolCallEvent) -> None:
        """Hand ``event`` to the executor's hook and to the call's execution's own observers."""
        if self.hook is not None:
            await notify(self.hook, event)
        for watcher in tuple(opened.watchers or ()):  # one may stop observing meanwhile
            await notify(watcher, event)

    def _over_budget(self, account: Tally) -> str | None:
        """Why the running execution may make no more tool calls, or None."""
        calls, wait = self._max_tool_calls, self._max_approval_wait
        if calls is not None and account.tool_calls >= calls:
            return f"this code action has made {account.tool_calls} tool calls, its limit (Limits.tool_calls={calls})"
        if wait is not None and account.approval_wait >= wait:
            return (
                f"this code action's tool calls have waited {account.approval_wait:.1f} s for approval, its "
                f"limit (Limits.approval_wait={wait})"
            )
        return None

    def _policy_of(self, driver: ExecutionDriver) -> Approval:
        own = driver.execution.policy
        return self.policy if own is None else own

    def _remember(self, policy: Approval, execution: str) -> None:
        # "auto" gave its code everything already: no later policy can give it more.
        if policy == "auto" or len(self._earlier) >= 2 or any(_same(policy, p) for p, _ in self._earlier):
            return
        self._earlier.append((policy, execution))

    def _origin_unknown(self, driver: ExecutionDriver, what: str) -> ApprovalDecision | None:
        """The refusal of a request that code of an earlier execution, run under another policy,
        may have made; None if the running execution's policy may decide it."""
        policy = self._policy_of(driver)
        earlier = next((execution for p, execution in self._earlier if not _same(p, policy)), None)
        if earlier is None:
            return None
        reason = (
            f"ipybox cannot tell this request from one made by code that code action {earlier} left in the "
            "kernel (a thread, a process, a callback or a patched function), and that code action ran under "
            "another approval policy, so it is refused rather than decided by this code action's policy. Call "
            "reset() before running code under an approval policy that differs from the earlier code's in "
            "the same kernel, or run them all under the same policy"
        )
        if self._warned != driver.execution.id:
            self._warned = driver.execution.id
            logger.warning("refused the %s of execution %s: %s", what, driver.execution.id, reason)
        return ApprovalDecision(approved=False, reason=reason, by="ipybox")


def _fields(driver: ExecutionDriver | None, call_id: str | None, server: str, tool: str) -> dict[str, Any]:
    """What every event of one call says about it."""
    execution = None if driver is None else driver.execution
    return {
        "call_id": call_id,
        "server": server,
        "tool": tool,
        "execution_id": None if execution is None else execution.id,
        "execution_key": None if execution is None else execution.key,
    }


def _preset_key(call: ToolRequest) -> str:
    """What identifies one call's request for `ApprovalGate.preset`: all of it but the token."""
    return json.dumps(call.model_dump(exclude={"token"}), sort_keys=True, default=str)


def _same(a: Approval, b: Approval) -> bool:
    """Whether two policies decide alike: the same mode, equal `ApprovalRules`, the same callback."""
    return a is b or a == b
