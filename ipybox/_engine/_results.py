"""What a code action produces: streamed chunks and the final result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ("ActionAccount", "CodeExecutionChunk", "CodeExecutionResult", "Image", "Output")

IMAGE_TYPES: dict[str, str] = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}


@dataclass(frozen=True, kw_only=True)
class CodeExecutionChunk:
    """A piece of text output, delivered while the code runs.

    The chunks of one execution, joined, are the result's ``text`` (up to the output cap).
    """

    text: str
    stream: Literal["stdout", "stderr", "result"]
    """Where the text came from: a stream, or the text form of a result or display."""


@dataclass(frozen=True, kw_only=True)
class Output:
    """One rich output (``execute_result`` or ``display_data``) as a MIME bundle."""

    data: Mapping[str, Any]
    """MIME type → content, e.g. ``{"text/plain": "42", "text/html": "<b>42</b>"}``."""
    metadata: Mapping[str, Any] = field(default_factory=dict[str, Any])
    kind: Literal["execute_result", "display_data"] = "display_data"


@dataclass(frozen=True, kw_only=True)
class Image:
    """An image the code displayed, e.g. a matplotlib figure."""

    mime: str
    """``image/png``, ``image/jpeg`` or ``image/svg+xml``."""
    data: bytes
    path: Path | None
    """Where the image was saved under the workspace (None if it could not be saved there)."""


@dataclass(frozen=True, kw_only=True)
class ActionAccount:
    """What one code action came to, counted by the host: its tool calls, connections and output.

    Times of calls made at once (``acall_tool`` gathered, threads) add up, so they can exceed the
    code action's duration.
    """

    tool_calls: int = 0
    """Tool calls that reached the host, refused ones included."""
    approved: int = 0
    """Calls approved (by a policy, a callback, a person or an adapter)."""
    rejected: int = 0
    """Calls refused: rejected, timed out, over a budget, or refused by ipybox."""
    approval_wait: float = 0.0
    """Seconds the calls waited for their approval decisions, summed."""
    tool_time: float = 0.0
    """Seconds from the approvals to the calls' ends (the tools' runs, their servers' starts), summed."""
    connections: int = 0
    """Network connections opened through the executor's proxy (`Network`)."""
    network_bytes: int = 0
    """Bytes those connections moved, both ways, until the code action ended."""
    output_bytes: int = 0
    """Bytes of output the host received from the code: stdout, stderr, results and displays (text as
    UTF-8, rich data as its JSON), and messages it dropped unread as the kernel sent them. Output the
    kernel dropped at the source past the output cap is not received, so not counted
    (`CodeExecutionResult.truncated_chars` counts it)."""


@dataclass(frozen=True, kw_only=True)
class CodeExecutionResult:
    """The outcome of a code action that completed without raising."""

    text: str
    """stdout, stderr and the text form of results and displays, in the order they were produced."""
    images: tuple[Image, ...] = ()
    outputs: tuple[Output, ...] = ()
    """Every rich output in order, as MIME bundles."""
    execution_count: int | None = None
    duration: float = 0.0
    """Seconds from the start of the code to its end, not counting time waiting for approvals."""
    truncated_chars: int = 0
    """How many characters of output were dropped because the execution exceeded its output cap."""
    account: ActionAccount = field(default_factory=ActionAccount)
    """What the code action came to: its tool calls' counts and times, its connections and output."""
