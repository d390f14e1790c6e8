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
from agents.tracing import custom_span
from pydantic import BaseModel

from ipybox import CodeExecutionChunk, Execution
from ipybox.integrations._core import ActionOutcome, ApprovalPayload

__all__ = ("CodeArgs", "NeedsApproval", "OutputHandler", "action_step_span", "output_sink", "tool_output")

OutputHandler: TypeAlias = Callable[[ToolContext[Any], CodeExecutionChunk], "Awaitable[None] | None"]
"""Receives the code's output while it runs, each chunk once, with the tool's context."""

NeedsApproval: TypeAlias = bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]
"""The SDK's own ``needs_approval``: the code action as a whole waits for approval before it runs;
a callable gets ``(run context, {"code": ...}, call id)``."""


StepOutcome: TypeAlias = ActionOutcome | ApprovalPayload
"""Where a run's part of a code action ended: the action's end, or an approval the run is asked for."""

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

    with custom_span("ipybox.code_action", data=data):
        yield ended
