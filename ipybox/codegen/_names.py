"""Python identifiers for MCP server and tool names, and deterministic collision resolution.

MCP names are arbitrary strings chosen by whoever wrote the server: dashes, dots, spaces, camelCase,
unicode, keywords and leading digits all occur. Generated packages and modules need plain ASCII
identifiers (they are file names too, and agents type them), so names are folded to ``snake_case``
ASCII. Folding can map two names to one identifier (``a-b`` and ``a_b``); `assign_identifiers`
resolves that the same way whatever order the server lists its tools in, and says what it renamed.
The original name is always kept for the MCP call itself.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ("Renamed", "assign_identifiers", "python_identifier")

# Long enough for any sensible tool name (MCP suggests <= 128 chars), short enough to stay far below
# file name limits once a suffix and ".py" are added.
MAX_IDENTIFIER_LENGTH = 64

_CAMEL_LOWER_UPPER = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]+")


@dataclass(frozen=True)
class Renamed:
    """A name that could not get the identifier it folds to, because another name had it.

    Attributes:
        original: The name as the MCP server gave it.
        identifier: The identifier it was given instead.
        wanted: The identifier it folds to, taken by `taken_by`.
        taken_by: The original name that got `wanted` (empty when `wanted` is reserved).
    """

    original: str
    identifier: str
    wanted: str
    taken_by: str


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def python_identifier(name: str, *, prefix: str) -> str:
    """Fold any string to a lowercase ASCII Python identifier that is not a keyword.

    ``getUser`` and ``get-user`` become ``get_user``; accents are dropped (``café`` → ``cafe``);
    a leading digit gets ``prefix`` (``1password`` → ``tool_1password``); keywords get a trailing
    underscore (``class`` → ``class_``); a name with no ASCII letters or digits at all becomes
    ``prefix`` plus a short hash of the name, so it is still stable and distinct.

    Args:
        name: The name to fold.
        prefix: A lowercase identifier put in front of names that would start with a digit or
            that have no usable characters, e.g. ``"tool"`` or ``"server"``.
    """
    decomposed = unicodedata.normalize("NFKD", name)
    text = "".join(c for c in decomposed if not unicodedata.combining(c))
    text = _CAMEL_ACRONYM.sub(r"\1_\2", _CAMEL_LOWER_UPPER.sub(r"\1_\2", text))
    text = _NOT_ALNUM.sub("_", text).strip("_").lower()
    if not text:
        return f"{prefix}_{_digest(name)}"
    if text[0].isdigit():
        text = f"{prefix}_{text}"
    if len(text) > MAX_IDENTIFIER_LENGTH:
        # Keep a readable head and make the cut name distinct from other names sharing that head.
        text = f"{text[: MAX_IDENTIFIER_LENGTH - 9].rstrip('_')}_{_digest(name)}"
    if keyword.iskeyword(text) or keyword.issoftkeyword(text):
        text += "_"
    return text


def assign_identifiers(
    names: Iterable[str], *, prefix: str, reserved: Iterable[str] = ()
) -> tuple[dict[str, str], list[Renamed]]:
    """Give each distinct name its own identifier, deterministically.

    A name that already is its folded identifier keeps it (``a_b`` stays ``a_b`` even when ``a-b``
    is listed first). Other names that fold to a taken identifier get the first free numbered
    variant (``a_b_2``, ``a_b_3``, ...), handed out in sorted order of the original names, so the
    result does not depend on the order the names are listed in.

    Args:
        names: Original names; duplicates are treated as one name.
        prefix: See `python_identifier`.
        reserved: Identifiers no name may get.

    Returns:
        The identifier of every distinct name, and what was renamed and why.
    """
    unique = sorted(set(names))
    wanted = {name: python_identifier(name, prefix=prefix) for name in unique}
    taken: dict[str, str] = dict.fromkeys(reserved, "")
    result: dict[str, str] = {}
    # Exact matches first, so an identifier-shaped name is never displaced by a look-alike.
    for name in unique:
        if wanted[name] == name and name not in taken:
            taken[name] = name
            result[name] = name
    renamed: list[Renamed] = []
    for name in unique:
        if name in result:
            continue
        base = wanted[name]
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}_{n}"
        if candidate != base:
            renamed.append(Renamed(name, candidate, base, taken[base]))
        taken[candidate] = name
        result[name] = candidate
    return result, renamed
