"""What a code action produces: streamed chunks and the final result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ("CodeExecutionChunk", "CodeExecutionResult", "Image", "Output")

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
