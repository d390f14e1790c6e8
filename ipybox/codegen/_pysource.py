"""Putting untrusted text (MCP names, descriptions, titles) into Python source without breaking out.

Every piece of server-provided text that reaches generated code goes through one of these
functions. Docstring literals are checked by parsing them back: if the literal does not evaluate to
exactly the intended string, the plain ``repr`` is used instead, which is always safe.
"""

from __future__ import annotations

import ast
import re

__all__ = ("comment_text", "docstring_literal", "first_line", "normalize_text")

_LINE_BREAKS = re.compile(r"\r\n|\r")


def normalize_text(text: str) -> str:
    """Normalize line breaks to ``\\n``, drop trailing spaces on each line and blank edges."""
    lines = [line.rstrip() for line in _LINE_BREAKS.sub("\n", text).split("\n")]
    return "\n".join(lines).strip("\n")


def _escape_char(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _indent_lines(text: str, indent: str) -> str:
    first, *rest = text.split("\n")
    return "\n".join([first, *(indent + line if line else "" for line in rest)])


def docstring_literal(text: str, *, indent: str = "") -> str:
    """A triple-quoted string literal holding `text`, for use as a docstring.

    Continuation lines are indented by `indent` so the docstring lines up with the code around it
    (``inspect.cleandoc`` removes that indentation again). Backslashes, quotes and characters that
    are not printable are escaped, so the literal cannot end early or change the code after it.

    Args:
        text: Any text, typically an MCP tool description.
        indent: The indentation of the statement the docstring belongs to.
    """
    text = normalize_text(text)
    body = text.replace("\\", "\\\\")
    if '""' in body:
        body = body.replace('"', '\\"')
    elif body.endswith('"'):
        body = body[:-1] + '\\"'
    body = "".join(c if c in "\n\t" or c.isprintable() else _escape_char(c) for c in body)
    multiline = "\n" in body
    body = _indent_lines(body, indent)
    literal = f'"""{body}\n{indent}"""' if multiline else f'"""{body}"""'
    expected = _indent_lines(text, indent) + (f"\n{indent}" if multiline else "")
    try:
        ok = ast.literal_eval(literal) == expected
    except (SyntaxError, ValueError):
        ok = False
    return literal if ok else repr(text)


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
