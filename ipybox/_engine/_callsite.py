"""The line of a code action that made a tool call: reported by the kernel as a number, shown by the host.

Kernel code reports only a line number (and the module a call came through); the text comes from the
host's own copy of the code it ran. So a forged report can point at another line of the same code,
or at none, but cannot put text of its own into the approval: a number outside the code shows as
unknown, the line's text is escaped like every kernel string (`ipybox._approval._rendering`), and the
module's name is shown quoted unless it is a plain dotted name.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ipybox._approval._rendering import escape, shown_name

__all__ = ("LINE_CHARS", "CallSite", "call_site_of")

# Characters of the line's text shown; a longer line is cut with a note.
LINE_CHARS = 200
# Python's own line ends: a line number the kernel reports counts these, and no others.
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, kw_only=True)
class CallSite:
    """Where in the code action a tool call was made."""

    line: int | None
    """The line of the code action's code (from 1) the kernel reported, None when it reported none or
    one the code does not have. Reported by kernel code: it can point at another line of the same
    code."""
    text: str | None
    """That line of the code, from the host's copy of the code it ran, without its indentation."""
    module: str | None = None
    """The module the call came through, when the kernel reported one (a skill, a library): the
    line is then where the code action called into it. Kernel code's text."""

    def __str__(self) -> str:
        """One line of text that no kernel string can break: the line, its text, the module."""
        if self.line is None or self.text is None:
            where = "an unknown line (the kernel reported no line of this code action's code)"
        else:
            text = self.text
            if len(text) > LINE_CHARS:
                text = f"{text[:LINE_CHARS]}... (line cut: {LINE_CHARS} of {len(text):,} characters shown)"
            where = f"line {self.line} of the code action: {escape(text)}"
        if self.module is not None:
            where += f", through module {shown_name(self.module)}"
        return where


def call_site_of(code: str, line: object, module: object) -> CallSite:
    """The call site for what the kernel reported (``line``, ``module``) about a call of ``code``."""
    lines = _lines(code)
    # A bool is an int to Python, not a line number; anything out of range is no line at all (never
    # printed: a huge number may not even convert to text).
    known = isinstance(line, int) and not isinstance(line, bool) and 1 <= line <= len(lines)
    shown = module if isinstance(module, str) and module else None
    if not known:
        return CallSite(line=None, text=None, module=shown)
    assert isinstance(line, int)
    return CallSite(line=line, text=lines[line - 1].strip(), module=shown)


@functools.lru_cache(maxsize=4)
def _lines(code: str) -> tuple[str, ...]:
    """The lines of ``code`` as the kernel numbers them, split once per code action rather than once
    per call: a loop's calls all come with the same code (the running executions' codes, a few at
    most, are kept). IPython drops a cell's leading blank lines before it compiles it (its
    ``leading_empty_lines`` transform), so line 1 is the first line that is not blank."""
    lines = _LINE_END.split(code)
    first = next((i for i, line in enumerate(lines) if line and not line.isspace()), 0)
    return tuple(lines[first:])
