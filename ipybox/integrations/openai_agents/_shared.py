"""What both shapes of the OpenAI Agents tool use: the type of the output handler and of
``needs_approval``, the code argument, and the tool output an outcome becomes."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from agents import RunContextWrapper, ToolOutputImage, ToolOutputText
from agents.tool_context import ToolContext
from pydantic import BaseModel

from ipybox import CodeExecutionChunk
from ipybox.integrations._core import ActionOutcome

__all__ = ("CodeArgs", "NeedsApproval", "OutputHandler", "output_sink", "tool_output")

OutputHandler: TypeAlias = Callable[[ToolContext[Any], CodeExecutionChunk], "Awaitable[None] | None"]
"""Receives the code's output while it runs, each chunk once, with the tool's context."""

NeedsApproval: TypeAlias = bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]
"""The SDK's own ``needs_approval``: the code action as a whole waits for approval before it runs;
a callable gets ``(run context, {"code": ...}, call id)``."""


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
