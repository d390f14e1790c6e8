"""One code action as two halves: the `Execution` its consumers hold and the `ExecutionDriver` the
engine holds, created together by `open_execution` (the way anyio pairs a memory stream's send and
receive ends).

Consumers can only read (await, iterate, replay), answer approval requests and cancel. Only the
driver can add events, ask for approvals, end the execution, and run the clock that counts only
the kernel's CPU time while an approval is pending.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import anyio

from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest
from ipybox._approval._policies import Approval
from ipybox._exceptions import ExecutionCancelled, ExecutionLost, IpyboxError

from ._outputmarks import ReceivedMarks
from ._results import ActionAccount, CodeExecutionChunk, CodeExecutionResult
from ._toolevents import ToolCallHook
from ._waiting import wait_any

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ("UNANSWERED_WARNING_AFTER", "Execution", "ExecutionDriver", "ExecutionEvent", "Tally", "open_execution")

logger = logging.getLogger(__name__)

ExecutionEvent = CodeExecutionChunk | ApprovalRequest | CodeExecutionResult

# A person reading a prompt answers within seconds; a request still open this long after every
# consumer has gone back to waiting for the next event is one nobody is going to answer.
UNANSWERED_WARNING_AFTER = 10.0

_ids = itertools.count(1)

# Seconds between two readings of the kernel's CPU time while an approval is pending: how late a
# timeout may come then.
CPU_SAMPLE_INTERVAL = 0.1


@dataclass(eq=False)
class _State:
    """What both halves of one execution share."""

    log: list[ExecutionEvent] = field(default_factory=list[ExecutionEvent])
    changed: anyio.Event = field(default_factory=anyio.Event)
    """Set (and replaced) whenever an event is added or the execution ends."""
    done: anyio.Event = field(default_factory=anyio.Event)
    result: CodeExecutionResult | None = None
    error: IpyboxError | None = None
    approvals: dict[str, ApprovalRequest] = field(default_factory=dict[str, ApprovalRequest])
    pending: int = 0
    """Approval requests waiting for a decision; the execution's clock counts only the kernel's CPU
    time meanwhile (`ExecutionDriver.within_budget`)."""
    pending_changed: anyio.Event = field(default_factory=anyio.Event)
    iterating: int = 0
    awaiting: int = 0
    idle: int = 0
    """Iterating consumers that have seen every event and wait for the next one."""
    idle_changed: anyio.Event = field(default_factory=anyio.Event)
    cancel_scope: anyio.CancelScope | None = None
    cancel_requested: bool = False
    expired: bool = False
    on_delivered: Callable[[Execution], None] | None = None
    """Called once when the outcome has been delivered to a consumer."""
    watchers: list[ToolCallHook] = field(default_factory=list[ToolCallHook])
    """Observers of this execution's tool calls (`Execution.on_tool_call`)."""

    def bump_idle(self, by: int) -> None:
        self.idle += by
        self.idle_changed.set()
        self.idle_changed = anyio.Event()


class Execution:
    """A code action that was started with `CodeExecutor.execute`.

    Await it for the `CodeExecutionResult` (or the exception the code raised), or iterate it for
    `CodeExecutionChunk` and `ApprovalRequest` events as they happen, ending with the
    `CodeExecutionResult`; a request comes after the chunks of the output the code sent before
    its call. The code runs whether or not anyone consumes it. Every event is kept,
    so any number of consumers can iterate, each from the start or from any index
    (`events(start)`); iteration ends by raising the execution's exception, if it failed.

    Cancelling the task that awaits or iterates an execution (a timeout around ``await``, a
    cancelled request) depends on whether it was started with a ``key``:

    - without a key, nobody could come back to it: once no other task awaits or iterates it, it
      is cancelled like `cancel` does (the kernel is interrupted and keeps its state);
    - with a key, it keeps running (or keeps waiting for approval) and stays attachable with
      `CodeExecutor.attach`; stop it with `cancel` or bound it with a timeout.

    Leaving an ``async for`` early (``break``) only stops consuming; the code runs on.

    An `ApprovalRequest` that stays unanswered for `UNANSWERED_WARNING_AFTER` seconds while no
    consumer is busy with an event (all of them wait for the next one, or there are none) is logged
    as a warning (logger ``ipybox._engine._execution``), naming the request and the fix: such an execution would
    otherwise wait silently until the approval timeout. Executions with both a ``key`` and a ``ttl``
    are not warned about: framework adapters leave those paused on purpose, and the ttl bounds them.

    A keyed execution is forgotten by its executor once it has ended and its outcome was delivered
    (an ``await`` returned or raised, or an iteration reached the end), and when it was cancelled
    after waiting for an approval longer than its ``ttl``; `CodeExecutor.attach` then raises
    `ExecutionLost`.
    """

    def __init__(
        self,
        state: _State,
        code: str,
        *,
        key: str | None,
        timeout: float | None,
        approval: Approval | None,
        ttl: float | None,
    ) -> None:
        self._state = state
        self.id = f"x{next(_ids)}"
        self.code = code
        self.key = key
        self.timeout = timeout
        self.policy: Approval | None = approval
        """This execution's approval policy (``execute(approval=...)``); None: the executor's."""
        self.ttl = ttl
        """Seconds this execution may wait for an approval decision before it is cancelled."""

    def on_tool_call(self, hook: ToolCallHook) -> Callable[[], None]:
        """Observe this execution's tool calls and asked connections from now on: ``hook`` gets the
        same `ToolCallEvent`s as the executor's ``on_tool_call`` hook, for this execution's calls only
        (a framework adapter puts them in its framework's trace). An observer like that hook: what it
        raises is logged and dropped, and it cannot change a decision.

        Returns:
            A function that stops the observing.
        """
        watchers = self._state.watchers
        watchers.append(hook)

        def stop() -> None:
            if hook in watchers:
                watchers.remove(hook)

        return stop

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<Execution {self.id} {state}, {len(self._state.log)} events>"

    @property
    def done(self) -> bool:
        """True once the execution has completed, failed or been cancelled."""
        return self._state.done.is_set()

    @property
    def expired(self) -> bool:
        """True once the execution was cancelled because an approval waited longer than ``ttl``."""
        return self._state.expired

    @property
    def cancel_requested(self) -> bool:
        """True once `cancel` was called, or the execution was cancelled for lack of consumers."""
        return self._state.cancel_requested

    @property
    def log(self) -> tuple[ExecutionEvent, ...]:
        """The events so far, in order."""
        return tuple(self._state.log)

    async def events(self, start: int = 0) -> AsyncGenerator[ExecutionEvent]:
        """Yield the events from index ``start`` on, waiting for new ones until the end.

        Raises:
            ExecutionError: The execution failed (after all its events were yielded).
            KernelDied: The kernel died while running it.
        """
        state = self._state
        index = start
        state.iterating += 1
        abandoned = False
        try:
            while True:
                changed = state.changed
                while index < len(state.log):
                    yield state.log[index]
                    index += 1
                if state.done.is_set() and index >= len(state.log):
                    self._delivered()
                    if state.error is not None:
                        raise state.error
                    return
                state.bump_idle(1)
                try:
                    await changed.wait()
                except anyio.get_cancelled_exc_class():
                    abandoned = True
                    raise
                finally:
                    state.bump_idle(-1)
        finally:
            state.iterating -= 1
            if abandoned:
                self._abandoned()

    def __aiter__(self) -> AsyncIterator[ExecutionEvent]:
        return self.events(0)

    def __await__(self) -> Generator[Any, None, CodeExecutionResult]:
        return self.result().__await__()

    async def result(self) -> CodeExecutionResult:
        """Wait for the end and return the result.

        Raises:
            CodeExecutionError: The code raised.
            ExecutionTimeout: The code ran past its timeout.
            ExecutionCancelled: The execution was cancelled.
            KernelDied: The kernel died while running it.
        """
        state = self._state
        state.awaiting += 1
        abandoned = False
        try:
            _reject_unanswerable(state)
            await state.done.wait()
        except anyio.get_cancelled_exc_class():
            abandoned = True
            raise
        finally:
            state.awaiting -= 1
            if abandoned:
                self._abandoned()
        self._delivered()
        if state.error is not None:
            raise state.error
        assert state.result is not None
        return state.result

    def cancel(self) -> None:
        """Stop the execution: the kernel is interrupted and the execution ends with
        `ExecutionCancelled`. Does nothing if it has already ended."""
        state = self._state
        if state.done.is_set():
            return
        state.cancel_requested = True
        if state.cancel_scope is not None:
            state.cancel_scope.cancel()
        else:
            _end(state, error=ExecutionCancelled("the execution was cancelled before it started"))

    def approval(self, request_id: str) -> ApprovalRequest:
        """The approval request with this id (stable: ``f"{execution.id}:{n}"``).

        Raises:
            ExecutionLost: No such request in this execution.
        """
        try:
            return self._state.approvals[request_id]
        except KeyError:
            raise ExecutionLost(f"execution {self.id} has no approval request {request_id!r}") from None

    def answer(self, request_id: str, approved: bool, reason: str | None = None) -> bool:
        """Decide an approval request by id. Idempotent: returns False if it was already decided.

        Raises:
            ExecutionLost: No such request in this execution.
        """
        return self.approval(request_id).decide(ApprovalDecision(approved=approved, reason=reason))

    def _delivered(self) -> None:
        callback, self._state.on_delivered = self._state.on_delivered, None
        if callback is not None:
            callback(self)

    def _abandoned(self) -> None:
        """A waiting task was cancelled: cancel an execution nobody can come back to (see the
        class docstring)."""
        if self.key is None and not self._state.iterating and not self._state.awaiting:
            self.cancel()


@dataclass(eq=False)
class Tally:
    """The running count behind an `ActionAccount`."""

    tool_calls: int = 0
    approved: int = 0
    rejected: int = 0
    approval_wait: float = 0.0
    tool_time: float = 0.0
    connections: int = 0
    network_bytes: int = 0
    output_bytes: int = 0
    network: Callable[[], int] | None = None
    """The network proxy's count of the execution's bytes so far (0 once it forgot them)."""

    def snapshot(self) -> ActionAccount:
        if self.network is not None:
            # The proxy forgets an execution's count when it ends: the largest seen stands.
            self.network_bytes = max(self.network_bytes, self.network())
        # The account's fields are the tally's counts, so a new count is added in two places, not three.
        return ActionAccount(**{f.name: getattr(self, f.name) for f in fields(ActionAccount)})


class ExecutionDriver:
    """The engine's half of an `Execution`: it adds events, asks for approvals and ends it."""

    def __init__(self, state: _State, execution: Execution) -> None:
        self._state = state
        self.execution = execution
        self.marks = ReceivedMarks()
        """The kernel's output marks read so far; the output collector adds them (ipybox._engine._outputmarks)."""
        self.span: Span | None = None
        """The execution's span while it runs (ipybox._engine._tracing), the parent of its tool calls' spans."""
        self.linked: set[int] = set()
        """Span ids the execution's span links to as resumed by, and its parent's (ipybox._engine._tracing)."""
        self.watchers = state.watchers
        """The execution's own observers of its tool calls (`Execution.on_tool_call`); the gate tells them."""
        self.account = Tally()
        """What its tool calls came to so far; the gate counts (`CodeExecutionResult.account`)."""

    def change(self) -> anyio.Event:
        """Set when the execution next gets an event or ends (take it before looking at the log)."""
        return self._state.changed

    def on_delivered(self, callback: Callable[[Execution], None]) -> None:
        """Call ``callback`` once, when the outcome has first been delivered to a consumer."""
        self._state.on_delivered = callback

    @property
    def done(self) -> bool:
        return self._state.done.is_set()

    @property
    def outcome(self) -> tuple[CodeExecutionResult | None, IpyboxError | None]:
        """The result or the error, once the execution has ended (both None before)."""
        return self._state.result, self._state.error

    @contextmanager
    def cancel_scope(self) -> Generator[anyio.CancelScope]:
        """The scope `Execution.cancel` cancels; cancelled at once if that was asked for already."""
        with anyio.CancelScope() as scope:
            self._state.cancel_scope = scope
            if self._state.cancel_requested:
                scope.cancel()
            try:
                yield scope
            finally:
                self._state.cancel_scope = None

    def emit(self, event: CodeExecutionChunk) -> None:
        _add(self._state, event)

    def succeed(self, result: CodeExecutionResult) -> None:
        _end(self._state, result=replace(result, account=self.account.snapshot()))

    def fail(self, error: IpyboxError) -> None:
        _end(self._state, error=error)

    def new_request(self, kind: type[ApprovalRequest] = ApprovalRequest, /, **fields: Any) -> ApprovalRequest:
        """An approval request of this execution (of ``kind``), with the next id."""
        approvals = self._state.approvals
        request = kind(id=f"{self.execution.id}:{len(approvals) + 1}", **fields)
        approvals[request.id] = request
        return request

    async def ask(
        self, request: ApprovalRequest, limit: float | None, *, after_mark: int | None = None
    ) -> ApprovalDecision:
        """Surface ``request`` as an event and wait for the application's decision.

        With ``after_mark``, the request comes only after the kernel output up to that mark (for at
        most `OUTPUT_MARK_WAIT`; see ipybox._engine._outputmarks). While the decision is pending the execution's
        clock counts only the CPU time the kernel uses (see `within_budget`). Past ``limit`` the
        call is rejected and the code goes on; past the execution's ``ttl`` the whole execution is
        cancelled.
        """
        await self.marks.wait_for(after_mark)
        state, ttl_given = self._state, self.execution.ttl
        _add(state, request)
        self._pending_by(1)
        ttl = math.inf if ttl_given is None else ttl_given
        wait = math.inf if limit is None else limit
        try:
            _reject_unanswerable(state)
            async with anyio.create_task_group() as tg:
                if not (self.execution.key is not None and ttl_given is not None):
                    tg.start_soon(self._warn_if_unanswered, request)
                with anyio.move_on_after(min(wait, ttl)):
                    decision = await request.wait()
                    tg.cancel_scope.cancel()
                    return decision
                tg.cancel_scope.cancel()
            if ttl <= wait:
                state.expired = True
                reason = f"nobody answered within the execution's ttl of {ttl:g} s; it was cancelled"
                request.decide(ApprovalDecision(approved=False, reason=reason, by="timeout"))
                self.execution.cancel()
            else:
                reason = f"no approval decision within {limit:g} s"
                request.decide(ApprovalDecision(approved=False, reason=reason, by="timeout"))
            return await request.wait()
        finally:
            self._pending_by(-1)

    async def _warn_if_unanswered(self, request: ApprovalRequest) -> None:
        state = self._state
        # Cancelled by `ask` as soon as the request is decided.
        await anyio.sleep(UNANSWERED_WARNING_AFTER)
        # A consumer that holds an event (between two steps of its loop) may be asking a person now.
        while state.iterating > state.idle:
            await state.idle_changed.wait()
        if request.decision is not None:
            return  # decided just now; `ask` has not yet had its turn to cancel this task
        logger.warning(
            "approval request %s for %s of execution %s has waited %g s with no answer and no consumer "
            "busy with it; the code is paused until it is answered or times out. Iterate the execution and "
            "'await request.accept()' or 'await request.reject(reason)' for each ApprovalRequest, or give "
            "the executor or execute() an approval policy (approval='auto', ApprovalRules(...) or a callback)",
            request.id,
            request,
            self.execution.id,
            UNANSWERED_WARNING_AFTER,
        )

    def _pending_by(self, by: int) -> None:
        state = self._state
        state.pending += by
        state.pending_changed.set()
        state.pending_changed = anyio.Event()

    async def within_budget(
        self, finished: anyio.Event, cpu: Callable[[], float | None], *, unseen_pause: float | None = None
    ) -> bool:
        """Wait until ``finished``; False if the execution's timeout ran out first.

        The clock runs on wall time, except while approval requests are pending: then it runs as
        fast as the kernel uses CPU (``cpu()``: the CPU seconds of the kernel and everything it
        started), never faster than wall time. Code blocked on its approval uses none, so a long
        wait costs nothing, while a thread of it that computes meanwhile is charged as if nothing
        waited. Where ``cpu()`` is None (the host cannot see the kernel, a gateway's) the clock
        stops instead, but for at most ``unseen_pause`` seconds in all (the application's approval
        budget, `Limits.approval_wait`; None: the execution's timeout), so code that computes while
        a call waits runs for at most the timeout plus that, whatever the kernel does or asks.
        """
        state, remaining = self._state, self.execution.timeout
        if remaining is None:
            await finished.wait()
            return True
        pause = remaining if unseen_pause is None else unseen_pause
        while not finished.is_set():
            if remaining <= 0:
                return False
            changed = state.pending_changed
            begin = anyio.current_time()
            if not state.pending:
                with anyio.move_on_after(remaining):
                    await wait_any(finished, changed)
                remaining -= anyio.current_time() - begin
                continue
            used = cpu()
            if used is None:
                with anyio.move_on_after(pause + remaining):
                    await wait_any(finished, changed)
                spent = anyio.current_time() - begin
                paused = min(spent, pause)
                pause -= paused
                remaining -= spent - paused
                continue
            with anyio.move_on_after(min(remaining, CPU_SAMPLE_INTERVAL)):
                await wait_any(finished, changed)
            now = cpu()
            if now is not None:
                # A process reaped without being waited for takes its CPU time along: never negative.
                remaining -= max(0.0, min(now - used, anyio.current_time() - begin))
        return True


def open_execution(
    code: str,
    *,
    key: str | None,
    timeout: float | None,
    approval: Approval | None = None,
    ttl: float | None = None,
) -> tuple[Execution, ExecutionDriver]:
    """A new execution: the handle for its consumers and the driver for the engine."""
    state = _State()
    execution = Execution(state, code, key=key, timeout=timeout, approval=approval, ttl=ttl)
    return execution, ExecutionDriver(state, execution)


def _add(state: _State, event: ExecutionEvent) -> None:
    state.log.append(event)
    state.changed.set()
    state.changed = anyio.Event()


def _end(state: _State, *, result: CodeExecutionResult | None = None, error: IpyboxError | None = None) -> None:
    if state.done.is_set():
        return
    for request in state.approvals.values():
        request.decide(ApprovalDecision(approved=False, reason="the execution ended", by="ipybox"))
    state.result, state.error = result, error
    if result is not None:
        _add(state, result)
    state.done.set()
    state.changed.set()


def _reject_unanswerable(state: _State) -> None:
    """Reject pending requests when the execution is awaited and nobody iterates it: no one would
    ever see them."""
    if state.iterating or not state.awaiting:
        return
    for request in state.approvals.values():
        request.decide(
            ApprovalDecision(
                approved=False,
                by="ipybox",
                reason=(
                    "approval is 'ask' but this execution is awaited, not iterated, so nobody can answer "
                    "its ApprovalRequest; iterate it ('async for event in executor.execute(code)') and "
                    "accept or reject each request, or give CodeExecutor an approval policy "
                    "(approval='auto', ApprovalRules(...) or a callback)"
                ),
            )
        )
