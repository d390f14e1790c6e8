"""Server-provided text (MCP descriptions, names) made safe to show on one line.

Standard library only: the kernel's tool search uses it as well as the host's code generation and
stubs (`ipybox._pysource` re-exports it), so both flatten text the same way.
"""

from __future__ import annotations

import re

__all__ = ("comment_text", "first_line", "normalize_text")

_LINE_BREAKS = re.compile(r"\r\n|\r")


def normalize_text(text: str) -> str:
    """Normalize line breaks to ``\\n``, drop trailing spaces on each line and blank edges."""
    lines = [line.rstrip() for line in _LINE_BREAKS.sub("\n", text).split("\n")]
    return "\n".join(lines).strip("\n")


def comment_text(text: str, *, limit: int = 200) -> str:
    """`text` on one line, safe to put after ``#``: no line breaks or other unprintable characters."""
    flat = "".join(c if c.isprintable() else " " for c in text)
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def first_line(text: str | None, *, limit: int = 200) -> str:
    """The first non-blank line of `text`, on one line and safe as a comment, cut to `limit`."""
    for line in normalize_text(text or "").split("\n"):
        if line.strip():
            return comment_text(line, limit=limit)
    return ""
