"""A code action and its tool calls as LangSmith runs under the LangChain tool run that ran it.

LangChain makes no OpenTelemetry spans; LangSmith records the runs of a LangChain agent (the tool's
run among them) and, with ``tracing_mode="otel"``, exports each as a span. It gives those spans ids
of its own, so an OpenTelemetry span of ipybox's cannot be put under the tool's: instead the code
action is written to LangSmith as what LangSmith nests, a child run ``ipybox.code_action`` of the
tool's run and under it a ``tool`` run ``server.tool`` per tool call (and asked connection). LangSmith
shows them in its UI and exports them as nested spans.

Each part of a code action the tool drives in one run of the tool (to its end, or to an approval
the graph pauses for) is a run of its own; a part that takes up a paused action says so
(``ipybox.resumed``) and carries the action's key, which joins the parts. The runs carry what ipybox's
OpenTelemetry spans carry, under the same names (as run metadata): ids, decisions, waits, the call's
line number, the account; argument values and the line's text only when the application opted in
(`Tracing.values`). Tool results are not sent: the observer of tool calls is not given them.

When the tool's run is not traced (no LangSmith tracer, or tracing disabled) this is one
context-variable read per code action.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any, Literal, Protocol, cast

from langgraph.errors import GraphInterrupt

from ipybox import (
    ApprovalRequest,
    Execution,
    ExecutionLost,
    ToolCallDecided,
    ToolCallEvent,
    ToolCallFinished,
    ToolCallRequested,
)
from ipybox._engine._tracing import ACTION_SPAN, account_attributes, bounded, value_json
from ipybox.network._request import NETWORK_SERVER, NETWORK_TOOL

from ._core import ActionOutcome, Suspended

__all__ = ("Ended", "action_runs")

logger = logging.getLogger(__name__)

Ended = Callable[[ActionOutcome], None]
"""Records how the part of the code action ended, when it ended with the action's outcome."""

# A connection to an unlisted destination has no ToolCallFinished: its run ends with its decision.
_CONNECTION = (NETWORK_SERVER, NETWORK_TOOL)


class RunTree(Protocol):
    """What is used here of LangSmith's `langsmith.RunTree` (whose dicts are untyped)."""

    extra: dict[str, Any]

    def create_child(
        self,
        name: str,
        run_type: Literal["chain", "tool"] = "chain",
        *,
        inputs: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> RunTree: ...

    def post(self) -> None: ...

    def add_metadata(self, metadata: dict[str, Any]) -> None: ...

    def end(
        self, *, outputs: dict[str, Any] | None = None, error: str | None = None, metadata: dict[str, Any] | None = None
    ) -> None: ...

    def patch(self) -> None: ...


def _traced_run() -> RunTree | None:
    """The LangSmith run current here (the tool's, inside its ``_arun``), if it is traced."""
    # langchain-core depends on langsmith and imports these when it runs a tool: no cost here.
    from langsmith import utils
    from langsmith.run_helpers import get_current_run_tree

    run = get_current_run_tree()
    # A run is current without a LangSmith tracer only inside `@traceable`; `tracing_context(enabled=False)` wins.
    enabled = cast("Callable[[], object]", utils.tracing_is_enabled)  # pyright: ignore[reportUnknownMemberType]
    if run is None or not enabled():
        return None
    return cast("RunTree", run)


def _ignore(outcome: ActionOutcome) -> None:
    pass


@contextmanager
def action_runs(execution: Execution, *, resumed: bool, values: bool) -> Generator[Ended]:
    """A LangSmith run ``ipybox.code_action`` under the current (the tool's) run for the part of
    ``execution`` the block drives, with a run per tool call under it; nothing when the tool's run is
    not traced.

    Args:
        execution: The code action.
        resumed: This part takes up an action that paused for an approval in an earlier run of the tool.
        values: Send argument values and the call's line text (`Tracing.values`).

    Yields:
        The recorder of the action's outcome; a block that ends without it ended at a pause
        (an interrupt, a suspension) or failed.
    """
    parent = _traced_run()
    if parent is None:
        yield _ignore
        return
    metadata: dict[str, Any] = {"ipybox.execution.id": execution.id, "ipybox.resumed": resumed}
    if execution.key is not None:
        metadata["ipybox.execution.key"] = bounded(execution.key)
    try:
        action = parent.create_child(ACTION_SPAN, "chain", extra={"metadata": metadata})
        action.post()
    except Exception:  # a trace must never fail the code action (its tool calls' runs: `notify` logs)
        logger.exception("could not record code action %s in LangSmith", execution.id)
        yield _ignore
        return
    outcome: list[ActionOutcome] = []
    calls = _ToolCallRuns(execution, action, values)
    stop = execution.on_tool_call(calls.observe)
    try:
        yield outcome.append
    except (GraphInterrupt, Suspended):
        stop()
        _end_action(action, None, paused=True, calls=calls)
        raise
    except BaseException as exc:
        stop()
        _end_action(action, None, paused=False, calls=calls, failure=type(exc).__name__)
        raise
    stop()
    _end_action(action, outcome[-1] if outcome else None, paused=False, calls=calls)


def _end_action(
    action: RunTree,
    outcome: ActionOutcome | None,
    *,
    paused: bool,
    calls: _ToolCallRuns,
    failure: str | None = None,
) -> None:
    """End the calls' runs still open, then the action's run, with what the part came to; a failure
    to send them is logged, never raised (the block's own outcome or exception goes on)."""
    try:
        _end_runs(action, outcome, paused=paused, calls=calls, failure=failure)
    except Exception:
        logger.exception("could not end the LangSmith runs of a code action")


def _end_runs(
    action: RunTree,
    outcome: ActionOutcome | None,
    *,
    paused: bool,
    calls: _ToolCallRuns,
    failure: str | None,
) -> None:
    calls.close(paused=paused)
    metadata: dict[str, Any] = {}
    error: str | None = None
    if paused:
        state = "paused"
    elif outcome is None:
        state, error = "error", failure or "unknown"
    else:
        state = "ok" if outcome.error is None else "error"
        if outcome.error is not None:
            error = type(outcome.error).__name__  # the class only: an error's text may hold the code's output
        if outcome.result is not None:
            metadata |= account_attributes(outcome.result.account)
    metadata["ipybox.execution.outcome"] = state
    if error is not None:
        metadata["error.type"] = error
    action.end(outputs={"outcome": state}, error=error, metadata=metadata)
    action.patch()


class _ToolCallRuns:
    """The runs of one part's tool calls: opened at a call's first event seen, ended with the call.

    The events come on the `ToolServer`'s task; the parent is this part's action run, a host object,
    so kernel code cannot put a run elsewhere.
    """

    def __init__(self, execution: Execution, action: RunTree, values: bool) -> None:
        self._execution = execution
        self._action = action
        self._values = values
        self._open: dict[str, RunTree] = {}
        self._ended: set[str] = set()
        self._at_end: list[ToolCallEvent] = []

    def observe(self, event: ToolCallEvent) -> None:
        if self._execution.done and not isinstance(event, ToolCallRequested):
            # Decided by the end of the execution here (its pending calls are rejected as it ends): for
            # an action suspended at an approval, not what happens to the call, which waits in the
            # kernel for the host that resumes it. Kept until the part's end says which it was.
            self._at_end.append(event)
            return
        self._record(event)

    def _record(self, event: ToolCallEvent) -> None:
        run = self._run_of(event)
        if run is None:
            return
        metadata: dict[str, Any] = {}
        error: str | None = None
        if isinstance(event, ToolCallDecided):
            metadata |= _decided(event.decision.approved, event.decision.by, event.decision.reason)
            metadata["ipybox.approval.wait"] = event.waited
            if event.policy is not None:
                metadata["ipybox.approval.policy"] = bounded(event.policy)
            if (event.server, event.tool) != _CONNECTION:
                run.add_metadata(metadata)
                return  # a tool call's run ends with the call, rejected or run (ToolCallFinished)
            if not event.decision.approved:
                error = "rejected"
        elif isinstance(event, ToolCallFinished):
            metadata["ipybox.tool.duration"] = event.duration
            error = None if event.error is None else bounded(event.error)
        else:
            return
        if error is not None:
            metadata["error.type"] = error
        assert event.call_id is not None
        del self._open[event.call_id]
        self._ended.add(event.call_id)
        run.end(error=error, metadata=metadata)
        run.patch()

    def _run_of(self, event: ToolCallEvent) -> RunTree | None:
        call_id = event.call_id
        if call_id is None or call_id in self._ended:
            return None  # refused before it was a request of this execution (not its call), or over
        run = self._open.get(call_id)
        if run is not None:
            return run
        try:
            request: ApprovalRequest | None = self._execution.approval(call_id)
        except ExecutionLost:
            request = None
        metadata: dict[str, Any] = {
            "gen_ai.tool.call.id": call_id,
            "ipybox.mcp.server": bounded(event.server),
        }
        inputs: dict[str, Any] = {}
        if request is not None:
            site = request.call_site
            if site is not None and site.line is not None:
                metadata["code.line.number"] = site.line
            if site is not None and site.module is not None:
                metadata["ipybox.call_site.module"] = bounded(site.module)
            if self._values:
                inputs["arguments"] = value_json(request.tool_args)
                if site is not None and site.text is not None:
                    inputs["call_site"] = bounded(site.text)  # the line may hold argument values too
            if not isinstance(event, ToolCallDecided) and request.decision is not None:
                # A call paused at an approval in an earlier part, decided before this part observed it.
                decision = request.decision
                metadata |= _decided(decision.approved, decision.by, decision.reason)
        run = self._action.create_child(
            bounded(f"{event.server}.{event.tool}"), "tool", inputs=inputs, extra={"metadata": metadata}
        )
        run.post()
        self._open[call_id] = run
        return run

    def close(self, *, paused: bool) -> None:
        """End the runs of calls still undecided or running when the part ends (an approval the graph
        pauses for: its decision comes in the run of the part that continues the action)."""
        if not paused:
            for event in self._at_end:
                self._record(event)
        self._at_end.clear()
        for run in self._open.values():
            metadata: dict[str, Any] = run.extra.get("metadata") or {}
            run.end(metadata={"ipybox.approval.decision": metadata.get("ipybox.approval.decision", "pending")})
            run.patch()
        self._open.clear()


def _decided(approved: bool, by: str, reason: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "ipybox.approval.decision": "approved" if approved else "rejected",
        "ipybox.approval.decided_by": by,
    }
    if reason is not None:
        metadata["ipybox.approval.reason"] = bounded(reason)
    return metadata
