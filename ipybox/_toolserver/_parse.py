"""From one request line to a `ToolRequest`: its JSON's shape, then validation, then the token.

The line is kernel code's: its nesting and its number of values are checked before any parser sees
it (`shape_problem`), and nothing of a request with a missing or wrong token is acted on. Every
refusal is a `ToolCallFailed` that becomes the request's error reply.
"""

from __future__ import annotations

import hmac
import itertools
import json
import operator
import re
from typing import Any

from pydantic import ValidationError

from ._boundary import ToolCallFailed
from ._channel import MAX_JSON_DEPTH, MAX_JSON_VALUES, ToolRequest

__all__ = ("parse_request", "shape_problem")

# A JSON string, its escaped backslashes and quotes removed first, and unterminated ones to the end
# of the line: it always matches once it has started, which keeps the scan linear.
_JSON_STRING = re.compile(rb'"[^"]*"?')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
# An opening bracket counts 2 and a closing one 0: depth after n brackets = running sum - n.
_BRACKET_WEIGHTS = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")


def parse_request(line: bytes, token: bytes) -> ToolRequest:
    """The request on ``line``, if it is one and carries ``token``.

    Raises:
        ToolCallFailed: ``bad_request`` (with the request's ``seq`` when it has one), or
            ``unauthorized`` (and the connection is to be closed).
    """
    problem = shape_problem(line, MAX_JSON_DEPTH, MAX_JSON_VALUES)
    if problem is not None:
        raise ToolCallFailed("bad_request", problem)
    try:
        request = ToolRequest.model_validate_json(line)
    except ValidationError as exc:
        invalid = exc
    else:
        # Parsing and validating in one step takes a third of the time of json.loads and then validating.
        _check_token(request.token, token)
        return request
    # Parsed again only to tell a bad token from a bad request; a request that runs is always
    # what the step above made of the line (json.loads takes more, e.g. lone surrogates, which
    # no MCP client can send on).
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ToolCallFailed("bad_request", "the tool-call request is not valid JSON") from None
    if not isinstance(data, dict):
        raise ToolCallFailed("bad_request", "a tool-call request must be a JSON object")
    fields: dict[str, Any] = data  # pyright: ignore[reportUnknownVariableType]
    _check_token(fields.get("token"), token)
    seq = fields.get("seq")
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'request'}: {err['msg']}" for err in invalid.errors()
    )
    raise ToolCallFailed(
        "bad_request", f"invalid tool-call request: {problems}", seq=seq if isinstance(seq, int) else None
    )


def _check_token(given: object, token: bytes) -> None:
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token):
        message = "the tool server refused the request: missing or wrong token"
        raise ToolCallFailed("unauthorized", message, close=True)


def shape_problem(line: bytes, depth: int, values: int) -> str | None:
    """Why the JSON in ``line`` is refused before parsing (deeper than ``depth`` levels, or ``values``
    values or more), or None.

    Parsers recurse per level of arrays and objects (json.loads runs out of stack), and every value
    becomes a Python object several times its size in the line (a 16 MiB line of ``[],`` parsed into
    428 MiB). Brackets and commas inside strings do not count; it runs in C. Exact for valid JSON;
    for invalid JSON it may count more than a parser would get to before failing, which only refuses
    a line that fails anyway.
    """
    brackets = line.count(b"[") + line.count(b"{")
    if brackets <= depth and brackets + line.count(b",") < values:
        return None  # the common case: too few brackets and commas to matter
    # Inside strings every backslash escapes the next byte: drop escaped backslashes, then escaped
    # quotes, and the strings are what lies between plain quotes.
    text = _JSON_STRING.sub(b"", line.replace(b"\\\\", b"").replace(b'\\"', b""))
    if text.count(b",") + text.count(b"[") + text.count(b"{") >= values:
        return f"the tool-call request holds {values} or more JSON values; pass large data as a file in the workspace"
    weights = text.translate(None, _NOT_BRACKETS).translate(_BRACKET_WEIGHTS)
    levels = map(operator.sub, itertools.accumulate(weights), itertools.count(1))
    if any(map(depth.__lt__, levels)):
        return f"the tool-call request is nested deeper than {depth} levels of arrays and objects"
    return None
