"""What both shapes of the OpenAI Agents tool use: the type of the output handler and of
``needs_approval``, the code argument, the tool output an outcome becomes, and the code action's span
in the SDK's own trace."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from typing import Any, TypeAlias

from agents import RunContextWrapper, ToolOutputImage, ToolOutputText
from agents.tool_context import ToolContext
from agents.tracing import Span, custom_span
from pydantic import BaseModel

from ipybox import (
    ApprovalDecision,
    CodeExecutionChunk,
    Execution,
    ExecutionLost,
    ToolCallDecided,
    ToolCallEvent,
    ToolCallRequested,
)
from ipybox._engine._tracing import bounded, tool_span_name
from ipybox.integrations._core import ActionOutcome, ApprovalPayload
from ipybox.network._request import NETWORK_SERVER, NETWORK_TOOL

__all__ = (
    "CodeArgs",
    "NeedsApproval",
    "OutputHandler",
    "action_step_span",
    "output_sink",
    "tool_call_spans",
    "tool_output",
)

OutputHandler: TypeAlias = Callable[[ToolContext[Any], CodeExecutionChunk], "Awaitable[None] | None"]
"""Receives the code's output while it runs, each chunk once, with the tool's context."""

NeedsApproval: TypeAlias = bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]
"""The SDK's own ``needs_approval``: the code action as a whole waits for approval before it runs;
a callable gets ``(run context, {"code": ...}, call id)``."""


StepOutcome: TypeAlias = ActionOutcome | ApprovalPayload
"""Where a run's part of a code action ended: the action's end, or an approval the run is asked for."""


def _decision_of(execution: Execution, call_id: str) -> ApprovalDecision | None:
    """The decision on an asked call of ``execution`` (None: not asked, or not decided yet)."""
    try:
        return execution.approval(call_id).decision
    except ExecutionLost:
        return None


# How a connection to an unlisted destination is reported to tool-call observers: it has no
# ToolCallFinished, so its span ends with its decision.
_CONNECTION = (NETWORK_SERVER, NETWORK_TOOL)
# Images a vision model reads; others (SVG) stay a path in the text.
_VISIBLE_IMAGES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def output_sink(
    on_output: OutputHandler | None, ctx: ToolContext[Any] | None
) -> Callable[[CodeExecutionChunk], Awaitable[None]] | None:
    if on_output is None or ctx is None:
        return None

    async def sink(chunk: CodeExecutionChunk) -> None:
        shown = on_output(ctx, chunk)
        if shown is not None:
            await shown

    return sink


def tool_output(outcome: ActionOutcome) -> str | list[ToolOutputText | ToolOutputImage]:
    images = [image for image in outcome.images if image.mime in _VISIBLE_IMAGES]
    if not images:
        return outcome.text
    parts: list[ToolOutputText | ToolOutputImage] = [ToolOutputText(text=outcome.text)]
    for image in images:
        url = f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"
        parts.append(ToolOutputImage(image_url=url))
    return parts


class CodeArgs(BaseModel):
    code: str
    """The Python code to run."""


@contextmanager
def action_step_span(execution: Execution, *, resumed: bool) -> Generator[Callable[[StepOutcome], None]]:
    """A span ``ipybox.code_action`` in the SDK's own trace, under the current span (the function
    tool's), for each part of a code action the adapter drives: to its end or to an approval the run is
    asked for. A part that continues an action paused at such an approval (in a run that resumed it,
    or in the nested run that asked) is a span of its own there, marked ``ipybox.resumed``.

    Under it, a span ``execute_tool {tool}`` per tool call (and asked connection) the code makes in
    this part (`tool_call_spans`).

    Yields the recorder of where the step ended. Its data joins the OpenTelemetry spans by the
    execution id and says what the action's account says; no code, arguments or output. A no-op
    when the SDK's tracing is off.
    """
    data: dict[str, Any] = {"ipybox.execution.id": execution.id, "ipybox.resumed": resumed}

    def ended(step: StepOutcome) -> None:
        if isinstance(step, ApprovalPayload):
            data["ipybox.execution.outcome"] = "paused"  # for a tool call's approval by the run
            return
        data["ipybox.execution.outcome"] = "ok" if step.error is None else "error"
        if step.error is not None:
            data["error.type"] = type(step.error).__name__
        if step.result is not None:
            account = step.result.account
            data["ipybox.tool_calls"] = account.tool_calls
            data["ipybox.tool_calls.approved"] = account.approved
            data["ipybox.tool_calls.rejected"] = account.rejected
            data["ipybox.approval.wait_total"] = account.approval_wait
            data["ipybox.tool.time_total"] = account.tool_time
            data["ipybox.output.bytes_total"] = account.output_bytes

    with custom_span("ipybox.code_action", data=data) as span, tool_call_spans(execution, span):
        yield ended


@contextmanager
def tool_call_spans(execution: Execution, parent: Span[Any]) -> Generator[None]:
    """A custom span ``execute_tool {tool}`` under ``parent`` for each tool call of ``execution`` while
    the block runs: the tool's and server's names (bounded), the call id, the decision, who made it
    and the wait, and how the call ended; never arguments or results. A call still undecided when the
    block ends (an approval the run is asked for) ends its span as ``pending``; its decision comes in
    the span of the part that continues it."""
    open_spans: dict[str, Span[Any]] = {}
    ended: set[str] = set()

    def opened(event: ToolCallEvent) -> Span[Any] | None:
        if event.call_id is None or event.call_id in ended:
            return None  # refused before it was a request of this execution (not its call), or over
        span = open_spans.get(event.call_id)
        if span is None:
            data: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": bounded(event.tool),
                "gen_ai.tool.call.id": event.call_id,
                "ipybox.mcp.server": bounded(event.server),
            }
            if not isinstance(event, ToolCallRequested):
                # A call paused at an approval in an earlier part: its decision may have been made
                # (by the run that resumed it) before this part began to observe.
                decided(data, _decision_of(execution, event.call_id))
            span = open_spans[event.call_id] = custom_span(tool_span_name(event.tool), data=data, parent=parent)
            span.start()
        return span

    def decided(data: dict[str, Any], decision: ApprovalDecision | None) -> None:
        if decision is not None:
            data["ipybox.approval.decision"] = "approved" if decision.approved else "rejected"
            data["ipybox.approval.decided_by"] = decision.by

    def observe(event: ToolCallEvent) -> None:
        span = opened(event)
        if span is None or isinstance(event, ToolCallRequested):
            return
        data = span.span_data.data
        if isinstance(event, ToolCallDecided):
            decided(data, event.decision)
            data["ipybox.approval.wait"] = event.waited
            if (event.server, event.tool) != _CONNECTION:
                return  # a tool call's span ends with the call, rejected or run (ToolCallFinished)
            if not event.decision.approved:
                data["error.type"] = "rejected"
        else:
            data["ipybox.tool.duration"] = event.duration
            if event.error is not None:
                data["error.type"] = bounded(event.error)
        assert event.call_id is not None
        del open_spans[event.call_id]
        ended.add(event.call_id)
        span.finish()

    stop = execution.on_tool_call(observe)
    try:
        yield
    finally:
        stop()
        for span in open_spans.values():
            span.span_data.data.setdefault("ipybox.approval.decision", "pending")
            span.finish()
        open_spans.clear()
