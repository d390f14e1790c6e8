"""`Execution`: a handle on one running code action, with a replayable event log."""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from typing import Any

import anyio

from ._approval import Approval, ApprovalDecision, ApprovalRequest
from ._exceptions import ExecutionCancelled, ExecutionLost, IpyboxError
from ._results import CodeExecutionChunk, CodeExecutionResult

__all__ = ("Execution", "ExecutionEvent")

ExecutionEvent = CodeExecutionChunk | ApprovalRequest | CodeExecutionResult

_ids = itertools.count(1)


class Execution:
    """A code action that was started with `CodeExecutor.execute`.

    Await it for the `CodeExecutionResult` (or the exception the code raised), or iterate it for
    `CodeExecutionChunk` and `ApprovalRequest` events as they happen, ending with the
    `CodeExecutionResult`. The code runs whether or not anyone consumes it. Every event is kept,
    so any number of consumers can iterate, each from the start or from any index
    (`events(start)`); iteration ends by raising the execution's exception, if it failed.

    Cancelling the task that awaits or iterates an execution (a timeout around ``await``, a
    cancelled request) depends on whether it was started with a ``key``:

    - without a key, nobody could come back to it: once no other task awaits or iterates it, it
      is cancelled like `cancel` does (the kernel is interrupted and keeps its state);
    - with a key, it keeps running (or keeps waiting for approval) and stays attachable with
      `CodeExecutor.attach`; stop it with `cancel` or bound it with a timeout.

    Leaving an ``async for`` early (``break``) only stops consuming; the code runs on.

    A keyed execution is forgotten by its executor once it has ended and its outcome was delivered
    (an ``await`` returned or raised, or an iteration reached the end), and when it was cancelled
    after waiting for an approval longer than its ``ttl``; `CodeExecutor.attach` then raises
    `ExecutionLost`.
    """

    def __init__(
        self,
        code: str,
        *,
        key: str | None,
        timeout: float | None,
        approval: Approval | None = None,
        ttl: float | None = None,
    ) -> None:
        self.id = f"x{next(_ids)}"
        self.code = code
        self.key = key
        self.timeout = timeout
        self.policy: Approval | None = approval
        """This execution's approval policy (``execute(approval=...)``); None: the executor's."""
        self.ttl = ttl
        """Seconds this execution may wait for an approval decision before it is cancelled."""
        self.expired = False
        """True once the execution was cancelled because an approval waited longer than ``ttl``."""
        # Called once when the outcome has been delivered to a consumer (the executor forgets the key).
        self._on_consumed: Callable[[Execution], None] | None = None
        self._log: list[ExecutionEvent] = []
        self._changed = anyio.Event()
        self._done = anyio.Event()
        self._result: CodeExecutionResult | None = None
        self._error: IpyboxError | None = None
        self._cancel_scope: anyio.CancelScope | None = None
        self._cancel_requested = False
        self._approvals: dict[str, ApprovalRequest] = {}
        self._pending = 0
        self._pending_changed = anyio.Event()
        self._iterating = 0
        self._awaiting = 0

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<Execution {self.id} {state}, {len(self._log)} events>"

    @property
    def done(self) -> bool:
        """True once the execution has completed, failed or been cancelled."""
        return self._done.is_set()

    @property
    def log(self) -> tuple[ExecutionEvent, ...]:
        """The events so far, in order."""
        return tuple(self._log)

    async def events(self, start: int = 0) -> AsyncGenerator[ExecutionEvent]:
        """Yield the events from index ``start`` on, waiting for new ones until the end.

        Raises:
            ExecutionError: The execution failed (after all its events were yielded).
            KernelDied: The kernel died while running it.
        """
        index = start
        self._iterating += 1
        abandoned = False
        try:
            while True:
                changed = self._changed
                while index < len(self._log):
                    yield self._log[index]
                    index += 1
                if self._done.is_set() and index >= len(self._log):
                    self._consumed()
                    if self._error is not None:
                        raise self._error
                    return
                try:
                    await changed.wait()
                except anyio.get_cancelled_exc_class():
                    abandoned = True
                    raise
        finally:
            self._iterating -= 1
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
        self._awaiting += 1
        abandoned = False
        try:
            self._reject_unanswerable()
            await self._done.wait()
        except anyio.get_cancelled_exc_class():
            abandoned = True
            raise
        finally:
            self._awaiting -= 1
            if abandoned:
                self._abandoned()
        self._consumed()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Stop the execution: the kernel is interrupted and the execution ends with
        `ExecutionCancelled`. Does nothing if it has already ended."""
        if self.done:
            return
        self._cancel_requested = True
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()
        else:
            self._fail(ExecutionCancelled("the execution was cancelled before it started"))

    def _consumed(self) -> None:
        callback, self._on_consumed = self._on_consumed, None
        if callback is not None:
            callback(self)

    def _abandoned(self) -> None:
        """A waiting task was cancelled: cancel an execution nobody can come back to (see the
        class docstring)."""
        if self.key is None and not self._iterating and not self._awaiting:
            self.cancel()

    def approval(self, request_id: str) -> ApprovalRequest:
        """The approval request with this id (stable: ``f"{execution.id}:{n}"``).

        Raises:
            ExecutionLost: No such request in this execution.
        """
        try:
            return self._approvals[request_id]
        except KeyError:
            raise ExecutionLost(f"execution {self.id} has no approval request {request_id!r}") from None

    def answer(self, request_id: str, approved: bool, reason: str | None = None) -> bool:
        """Decide an approval request by id. Idempotent: returns False if it was already decided.

        Raises:
            ExecutionLost: No such request in this execution.
        """
        return self.approval(request_id).decide(ApprovalDecision(approved=approved, reason=reason))

    # -- used by the executor -------------------------------------------------------------

    def _new_request(self, **fields: Any) -> ApprovalRequest:
        request = ApprovalRequest(id=f"{self.id}:{len(self._approvals) + 1}", **fields)
        self._approvals[request.id] = request
        return request

    async def _ask(self, request: ApprovalRequest, limit: float | None) -> ApprovalDecision:
        """Surface ``request`` as an event and wait for the application's decision.

        The execution's timeout clock stands still meanwhile. Past ``limit`` the call is rejected
        and the code goes on; past the execution's ``ttl`` the whole execution is cancelled.
        """
        self._emit(request)
        self._pending += 1
        self._pending_changed.set()
        self._pending_changed = anyio.Event()
        ttl = math.inf if self.ttl is None else self.ttl
        wait = math.inf if limit is None else limit
        try:
            self._reject_unanswerable()
            with anyio.move_on_after(min(wait, ttl)):
                return await request.wait()
            if ttl <= wait:
                self.expired = True
                request.decide(
                    ApprovalDecision(
                        approved=False,
                        reason=f"nobody answered within the execution's ttl of {ttl:g} s; it was cancelled",
                        by="timeout",
                    )
                )
                self.cancel()
            else:
                request.decide(
                    ApprovalDecision(approved=False, reason=f"no approval decision within {limit:g} s", by="timeout")
                )
            return await request.wait()
        finally:
            self._pending -= 1
            self._pending_changed.set()
            self._pending_changed = anyio.Event()

    def _reject_unanswerable(self) -> None:
        """Reject pending requests when the execution is awaited and nobody iterates it: no one
        would ever see them."""
        if self._iterating or not self._awaiting:
            return
        for request in self._approvals.values():
            request.decide(
                ApprovalDecision(
                    approved=False,
                    by="policy",
                    reason=(
                        "approval is 'ask' but this execution is awaited, not iterated, so nobody can answer "
                        "its ApprovalRequest; iterate it ('async for event in executor.execute(code)') and "
                        "accept or reject each request, or give CodeExecutor an approval policy "
                        "(approval='auto', ApprovalRules(...) or a callback)"
                    ),
                )
            )

    def _close_approvals(self) -> None:
        for request in self._approvals.values():
            request.decide(ApprovalDecision(approved=False, reason="the execution ended", by="policy"))

    def _emit(self, event: ExecutionEvent) -> None:
        self._log.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    def _succeed(self, result: CodeExecutionResult) -> None:
        if self.done:
            return
        self._close_approvals()
        self._result = result
        self._emit(result)
        self._done.set()

    def _fail(self, error: IpyboxError) -> None:
        if self.done:
            return
        self._close_approvals()
        self._error = error
        self._done.set()
        self._changed.set()
