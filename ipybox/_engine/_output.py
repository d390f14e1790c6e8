"""What the kernel sends while code runs, turned into an execution's chunks and result.

Kernel output is attacker-controlled and can be endless: everything kept is within the execution's
output cap (``Limits.output_chars``), and what is dropped is counted.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

from ipybox._exceptions import UsageError
from ipybox._kernel import Display, Dropped, Error, KernelEvent, Mark, Reply, Stream, strip_ansi
from ipybox._workspace import write_file

from ._execution import ExecutionDriver
from ._results import IMAGE_TYPES, CodeExecutionChunk, CodeExecutionResult, Image, Output

__all__ = ("OutputCollector", "clean_traceback")

# Marker the kernel uses to report output it dropped at the source (see ipybox_kernel._launch).
_TRUNCATED_MIME = "application/vnd.ipybox.truncated+json"


def _utf8_size(text: str) -> int:
    # surrogatepass: kernel text may hold lone surrogates, which are still bytes it sent.
    return len(text.encode("utf-8", "surrogatepass"))


def clean_traceback(lines: list[str]) -> str:
    """The traceback as plain text, without ANSI codes and without ipybox's own frames."""
    kept = [strip_ansi(line) for line in lines if "ipybox_kernel" not in line]
    return "\n".join(kept)


class OutputCollector:
    """Turns one execution's kernel events into its chunks and result, within the output cap."""

    def __init__(self, workspace: Path, driver: ExecutionDriver, cap: int) -> None:
        self._workspace = workspace
        self._driver = driver
        self._room = cap
        self._text: list[str] = []
        self._images: list[Image] = []
        self._outputs: list[Output] = []
        self.truncated = 0
        self.error: Error | None = None
        self.execution_count: int | None = None

    def _take(self, size: int) -> int:
        """Claim room for ``size`` characters; returns how many fit."""
        fits = min(size, self._room)
        self._room -= fits
        self.truncated += size - fits
        return fits

    def _emit_text(self, text: str, stream: Literal["stdout", "stderr", "result"]) -> None:
        fits = self._take(len(text))
        if fits:
            text = text[:fits]
            self._text.append(text)
            self._driver.emit(CodeExecutionChunk(text=text, stream=stream))

    def replay(self, chunk: CodeExecutionChunk) -> None:
        """Emit output an earlier host received for this execution (a resumed one), within the cap."""
        self._emit_text(chunk.text, chunk.stream)

    def _received(self, size: int) -> None:
        self._driver.account.output_bytes += size

    def add(self, event: KernelEvent) -> None:
        match event:
            case Stream(name=name, text=text):
                self._received(_utf8_size(text))
                self._emit_text(text, name)
            case Display(data=data) if _TRUNCATED_MIME in data:
                report: object = data[_TRUNCATED_MIME]
                dropped = cast("dict[str, object]", report).get("dropped") if isinstance(report, dict) else None
                if isinstance(dropped, int) and dropped > 0:
                    self.truncated += dropped
            case Display(kind=kind, data=data, metadata=metadata):
                texts = [v if isinstance(v, str) else json.dumps(v) for v in data.values()]
                self._received(sum(_utf8_size(text) for text in texts))
                size = sum(len(text) for text in texts)
                if self._take(size) < size:
                    return
                self._outputs.append(Output(data=dict(data), metadata=dict(metadata), kind=kind))
                self._save_images(data)
                plain = data.get("text/plain")
                if isinstance(plain, str) and not any(m in data for m in IMAGE_TYPES):
                    self._room += len(plain)  # already paid for as part of the bundle
                    self._emit_text(plain + "\n", "result")
            case Error():
                self.error = event
            case Reply(execution_count=count):
                self.execution_count = count
            case Dropped(size=size):
                # Dropped unread by the host, so counted in bytes as sent rather than in characters.
                self._received(size)
                self.truncated += size
            case Mark(id=mark):
                # Every chunk the kernel sent before the mark has been emitted by now.
                self._driver.marks.add(mark)

    def _save_images(self, data: Mapping[str, Any]) -> None:
        for mime, suffix in IMAGE_TYPES.items():
            content = data.get(mime)
            if not isinstance(content, str):
                continue
            try:
                raw = content.encode() if mime == "image/svg+xml" else base64.b64decode(content, validate=False)
            except ValueError:
                continue
            name = f"images/{self._driver.execution.id}-{len(self._images) + 1}{suffix}"
            try:
                path: Path | None = write_file(self._workspace, name, raw)
            except (OSError, UsageError):
                path = None
            self._images.append(Image(mime=mime, data=raw, path=path))

    def text(self) -> str:
        return "".join(self._text)

    def result(self, duration: float) -> CodeExecutionResult:
        text = self.text()
        if self.truncated:
            text += f"\n[ipybox: output truncated, {self.truncated} characters dropped]\n"
        return CodeExecutionResult(
            text=text,
            images=tuple(self._images),
            outputs=tuple(self._outputs),
            execution_count=self.execution_count,
            duration=duration,
            truncated_chars=self.truncated,
        )
