"""The text a person reads before approving a request: every string kernel code chose is shown as data.

Kernel code chooses a tool call's arguments (keys and values), the tool name of a server not yet
listed, the host of a network connection, and the code around the call; an MCP server chooses its
tool names and annotations. None of it may start a new line of the approval text, fake a heading
(``Arguments:``, ``Code:``) or hide characters from the reader. So:

- keys, names and hosts are ASCII-only JSON strings unless they are plain identifiers (a Cyrillic
  ``а`` shows as ``\\u0430``);
- values are JSON with every control, format (bidi overrides, zero-width), line/paragraph separator,
  private-use, unassigned and non-ASCII space character escaped, and long runs of combining marks
  escaped after the second;
- multi-line text shown as a block (code) has each line escaped the same way and prefixed, so no
  line of it can start at the margin;
- nothing is cut without a note that says how much was shown and where the whole is.

Every rendering of a request uses `request_text` (the SDK's ``ApprovalRequest.description``, the MCP
server's elicitation, the adapters' payloads).
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from ipybox._mcp._schemacheck import regex_search

if TYPE_CHECKING:
    from ipybox._mcp._serverasks import ElicitationRequest

    from ._decisions import ApprovalRequest

__all__ = (
    "LEFT_RUNNING_WARNING",
    "MESSAGE_CHARS",
    "VALUE_CHARS",
    "WHOLE_IN_REQUEST",
    "elicitation_text",
    "escape",
    "quote",
    "request_text",
    "safe_json",
    "shown_name",
    "text_block",
)

# Characters of one argument value shown in the SDK's text; the whole is in the request's data.
VALUE_CHARS = 4_000
WHOLE_IN_REQUEST = "the whole arguments are in ApprovalRequest.tool_args (an adapter's approval payload: 'args')"
# Characters of a server's elicitation message shown; the whole is in ElicitationRequest.message.
MESSAGE_CHARS = 4_000
# Opens the host's statement that code of an earlier code action may have made the request.
LEFT_RUNNING_WARNING = "WARNING, ORIGIN UNCERTAIN:"
# The tool whose code argument is shown whole, as a block: a skill is code that later runs unasked.
SKILL_TOOL = ("ipybox", "save_skill")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
# Combining marks after this many in a row are escaped: legitimate text needs few, stacks of them
# draw over neighbouring lines.
_MAX_MARKS = 2
_BLOCK_PREFIX = "    | "


def _escape_char(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # as JSON does: a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every character that could hide, reorder or break lines escaped as ``\\uXXXX``.

    Backslashes and quotes are left alone: JSON output has them escaped already, and in a block
    they are the code's own.
    """
    if text.isascii() and text.isprintable():
        return text  # the common case, without a look at each character
    out: list[str] = []
    marks = 0
    for char in text:
        category = unicodedata.category(char)
        marks = marks + 1 if category in ("Mn", "Me") else 0
        unsafe = (
            category in _UNSAFE_CATEGORIES
            or (category == "Zs" and char != " ")
            or marks > _MAX_MARKS
            or (marks and not out)  # a mark at the start would combine with the text before it
        )
        out.append(_escape_char(char) if unsafe else char)
    return "".join(out)


def quote(text: str) -> str:
    """``text`` as an ASCII-only JSON string: quoted, every non-ASCII character escaped."""
    return json.dumps(text, ensure_ascii=True)


def shown_name(text: str) -> str:
    """A server, tool or host name as shown: itself when it is plain (letters, digits, ``_.-``),
    otherwise quoted with `quote`."""
    return text if _PLAIN_NAME.match(text) else quote(text)


def safe_json(value: Any) -> str:
    """``value`` as compact JSON on one line: non-ASCII text stays readable, and is escaped as by `escape`."""
    # Every non-ASCII character of json.dumps' output is inside a string, where \\uXXXX is valid JSON.
    return escape(json.dumps(value, ensure_ascii=False, default=repr))


def text_block(text: str) -> list[str]:
    """Multi-line text (code) as lines that each start with a prefix, each escaped as by `escape`."""
    lines = text.split("\n")
    return [_BLOCK_PREFIX + escape(line) for line in lines]


def _shown_value(value: Any, limit: int, whole_at: str) -> str:
    """``value`` as `safe_json`, cut to ``limit`` characters of its JSON with a note saying so."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    if len(text) <= limit:
        return escape(text)
    # Cut before escaping: a large value costs only what is shown.
    return f"{escape(text[:limit])}... (value truncated: {limit:,} of {len(text):,} characters shown; {whole_at})"


def request_text(
    request: ApprovalRequest,
    *,
    value_chars: int = VALUE_CHARS,
    whole_at: str = WHOLE_IN_REQUEST,
    code: str | None = None,
    code_chars: int | None = None,
    code_whole_at: str = "",
) -> str:
    """What a person reads before approving ``request``, as lines of text no kernel string can break.

    Args:
        request: The tool call or network request.
        value_chars: Characters of one argument value to show; a longer value is cut with a note.
        whole_at: Where the whole arguments can be seen, for that note.
        code: The code action that made the request, shown as a block after the arguments.
        code_chars: Characters of ``code`` to show (None: all).
        code_whole_at: Where the whole code can be seen, for the note when it is cut.
    """
    from ipybox.network._request import NetworkRequest  # imports this module

    lines = [request.headline]
    if request.left_running is not None:
        # Host-written, not kernel data: shown as it is, right under what will run.
        lines.append(f"{LEFT_RUNNING_WARNING} {request.left_running}")
    if request.call_site is not None:
        # The host's rendering: the line's text from its own copy of the code, escaped (ipybox._engine._callsite).
        lines.append(f"Made at: {request.call_site}")
    hints = ", ".join(f"{shown_name(str(k))}={safe_json(v)}" for k, v in (request.annotations or {}).items())
    if hints:
        lines.append(f"Tool hints (from the MCP server, not guarantees): {hints}")
    if not isinstance(request, NetworkRequest):
        lines += _argument_lines(request, value_chars, whole_at)
    if code is not None:
        if code_chars is not None and len(code) > code_chars:
            lines.append(f"Code (truncated: {code_chars:,} of {len(code):,} characters shown; {code_whole_at}):")
            lines += text_block(code[:code_chars])
        else:
            lines.append("Code:")
            lines += text_block(code)
    return "\n".join(lines)


def elicitation_text(request: ElicitationRequest, *, message_chars: int = MESSAGE_CHARS) -> str:
    """What a person reads before answering a server's question: who asks, during which call, the
    server's message as a block no line of which starts at the margin, then the form's fields or
    the URL with its host spelled unambiguously."""
    lines = [request.headline]
    if request.left_running is not None:
        lines.append(f"{LEFT_RUNNING_WARNING} {request.left_running}")
    message = request.message
    if len(message) > message_chars:
        lines.append(
            f"Message (truncated: {message_chars:,} of {len(message):,} characters shown; the whole is in "
            "ElicitationRequest.message):"
        )
        message = message[:message_chars]
    else:
        lines.append("Message:")
    lines += text_block(message)
    if request.url is not None:
        host = request.host
        # ASCII only: a look-alike letter in the URL shows as its escape, not as the letter it imitates.
        lines.append(f"URL (ipybox does not open it): {quote(request.url)}")
        lines.append(f"It leads to the host: {shown_name(host) if host else 'unknown'}")
        shown = _unicode_host(host)
        if shown is not None:
            lines.append(f"  (an internationalised name: written {quote(shown)}, which may imitate another)")
        lines.append("Answer with {} only if the person went to this URL themselves; decline otherwise.")
        return "\n".join(lines)
    schema = request.requested_schema or {}
    properties = cast("Mapping[str, Any]", schema.get("properties") or {})
    required = set(cast("tuple[str, ...]", schema.get("required") or ()))
    if not properties:
        lines.append("Fields: none (the server asks only for a yes or no)")
    else:
        lines.append("Fields (names and text quoted and escaped):")
    for key, spec in properties.items():
        spec = cast("Mapping[str, Any]", spec)
        facts = {k: v for k, v in spec.items() if k not in ("title", "description")}
        words = [w for w in (spec.get("title"), spec.get("description")) if isinstance(w, str)]
        said = f" -- {_shown_value(' / '.join(words), VALUE_CHARS, 'see requested_schema')}" if words else ""
        need = "required" if key in required else "optional"
        lines.append(f"  {quote(key)} ({need}): {_shown_value(facts, VALUE_CHARS, 'see requested_schema')}{said}")
    lines.append("Answer only what you would tell this server; decline otherwise.")
    return "\n".join(lines)


def _unicode_host(host: str | None) -> str | None:
    """The Unicode spelling of an internationalised (punycode) host, or None for a plain one."""
    if host is None or "xn--" not in host:
        return None
    try:
        return host.encode("ascii").decode("idna")
    except UnicodeError:
        return None


def _argument_lines(request: ApprovalRequest, value_chars: int, whole_at: str) -> list[str]:
    args = request.tool_args
    if request.input_schema is None:
        check = (
            "NOT checked against the tool's input schema: ipybox starts a server only for an approved "
            "call, and this one has not been listed yet"
        )
    else:
        check = "checked against the tool's input schema"
    if not args:
        return [f"Arguments: none ({check})"]
    lines = [f"Arguments ({check}; keys and text quoted and escaped):"]
    undeclared = set(request.undeclared_args)
    skill = (request.server_name, request.tool_name) == SKILL_TOOL
    for key, value in args.items():
        flag = " [UNDECLARED: not in the tool's input schema]" if key in undeclared else ""
        if skill and key == "code" and isinstance(value, str):
            count = value.count("\n") + 1
            lines.append(f"  {quote(key)}{flag}: the skill's whole code, {count} lines, {len(value):,} characters:")
            lines += text_block(value)
            lines.append(f"{_BLOCK_PREFIX[:-2]}(end of the skill's code)")
            continue
        lines.append(f"  {quote(key)}{flag}: {_shown_value(value, value_chars, whole_at)}")
    return lines


def undeclared_keys(schema: Mapping[str, Any] | None, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of ``arguments`` that ``schema`` does not declare (all of them without a schema's
    ``properties``); see `forbidden_keys` for the ones it refuses."""
    if schema is None:
        return ()
    return tuple(key for key in arguments if not _declared(schema, key))


def forbidden_keys(schema: Mapping[str, Any] | None, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of ``arguments`` that ``schema`` certainly refuses: it says ``additionalProperties:
    false`` at its top, with nothing (``$ref``, ``allOf``/``anyOf``/``oneOf``, ``patternProperties``)
    that could declare them elsewhere. Anything less certain is not refused: ipybox must not refuse
    what the server accepts."""
    if schema is None or schema.get("additionalProperties") is not False:
        return ()
    properties: object = schema.get("properties")
    if isinstance(properties, Mapping) and all(key in properties for key in arguments):
        return ()  # the common case: every key declared
    if any(word in schema for word in ("$ref", "allOf", "anyOf", "oneOf", "patternProperties", "if")):
        return ()
    return undeclared_keys(schema, arguments)


def _declared(schema: Mapping[str, Any], key: str) -> bool:
    if "$ref" in schema:
        return True  # declared elsewhere, maybe: not flagged without certainty
    properties: object = schema.get("properties")
    if isinstance(properties, Mapping) and key in properties:
        return True
    patterns: object = schema.get("patternProperties")
    if isinstance(patterns, Mapping):
        for pattern in cast("Mapping[object, object]", patterns):
            # RE2, linear in the key: the pattern is the server's, the key the kernel's. A pattern
            # RE2 cannot read may well match.
            if regex_search(str(pattern), key) is not False:
                return True
    for word in ("allOf", "anyOf", "oneOf"):
        parts: object = schema.get(word)
        if isinstance(parts, list):
            for part in cast("list[object]", parts):
                if isinstance(part, Mapping) and _declared(cast("Mapping[str, Any]", part), key):
                    return True
    return False


def closest_key(schema: Mapping[str, Any], key: str) -> str | None:
    """The declared key most like ``key``, for an error message."""
    properties: object = schema.get("properties")
    if not isinstance(properties, Mapping):
        return None
    names = [str(name) for name in cast("Mapping[object, object]", properties)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    return close[0] if close else None
