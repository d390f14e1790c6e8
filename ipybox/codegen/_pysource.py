"""Putting untrusted text (MCP names, descriptions, titles) into Python source without breaking out.

Every piece of server-provided text that reaches generated code goes through one of these
functions. Docstring literals are checked by parsing them back: if the literal does not evaluate to
exactly the intended string, the plain ``repr`` is used instead, which is always safe.
"""

from __future__ import annotations

import ast
from typing import TypeVar

from ipybox_kernel._text import comment_text, first_line, normalize_text

_Node = TypeVar("_Node", bound=ast.AST)

__all__ = ("comment_text", "copy_tree", "docstring_literal", "first_line", "normalize_text")


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


def copy_tree(node: _Node) -> _Node:
    """A deep copy of ``node`` that copies only its AST fields and positions.

    Not `copy.deepcopy`: ``ast.parse`` shares one ``Load()``/``Store()`` instance across every tree
    in the process, and tools that walk trees (IPython's tracebacks through ``executing``) set a
    ``parent`` on it; a deep copy of any name then copies that whole foreign tree, which made
    rendering the stubs of a dozen tools take seconds in a host that had shown a traceback.
    """
    if isinstance(node, ast.expr_context):
        return node  # the shared singletons, immutable by use
    fields = {name: _copy_value(getattr(node, name)) for name in node._fields if hasattr(node, name)}
    positions = {name: getattr(node, name) for name in node._attributes if hasattr(node, name)}
    return type(node)(**fields, **positions)


def _copy_value(value: object) -> object:
    if isinstance(value, ast.AST):
        return copy_tree(value)
    if isinstance(value, list):
        items: list[object] = value  # pyright: ignore[reportUnknownVariableType]
        return [_copy_value(item) for item in items]
    return value
