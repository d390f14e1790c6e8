"""Checking a tool call's arguments (and a tool's structured result) against the tool's schema, safely
for the host.

The schema comes from an MCP server (a remote one is untrusted) and the arguments from kernel code
(the result from the server): either may be built to make the check hang or crash the host. The
MCP SDK's own check of results runs Python's ``re`` on the server's patterns in the host's event
loop, so ipybox's sessions check results here instead (``ipybox._mcp._servers``). So the check is bounded:

- a schema larger than `MAX_SCHEMA_CHARS` of JSON or nested deeper than `MAX_SCHEMA_DEPTH` is not
  used: the call is refused, saying why;
- regular expressions (``pattern``, ``patternProperties``, and ``additionalProperties`` next to
  them) run on RE2, whose time is linear in the input, never on Python's backtracking ``re``; a
  pattern RE2 cannot read (lookaround, backreferences) or that needs more than `REGEX_MEMORY` bytes
  is not used to refuse anything;
- ``uniqueItems`` compares canonical JSON texts by hashing, linear in the items;
- every keyword evaluated counts against `MAX_STEPS` (``anyOf`` over recursive ``$ref`` grows
  exponentially with nesting); past it, or past `MAX_SECONDS`, or on endless ``$ref`` recursion,
  the call is refused as too costly to check;
- ``$ref`` resolves within the schema only: nothing is fetched;
- ``unevaluatedProperties``/``unevaluatedItems`` and ``format`` are left to the server.

A listed schema is prepared once (its size and depth measured, ``check_schema`` run, the validator
built: ~0.35 ms for a small schema, more than the check itself) and kept by the schema object's
identity for the next call: `SchemaChecks`, bounded by count and by the JSON size of what it holds,
so a server that lists ever new or huge schemas cannot make it grow without end. A new listing
replaces the schema objects, and the tool server forgets the old ones (`forget_schemas`).

Most tools' schemas say no more than which keys an object has, which it needs, and their JSON types
(``type``, ``properties``, ``required``, ``additionalProperties`` true or false, ``items``). For
those, preparing also makes a `_Shape`, and a value is first checked against it in a few plain
comparisons: when it fits, it fits the schema too (types are matched exactly, so ``True`` is no
integer and ``1.0`` is left to the validator), and the validator is not run. Anything else, a value
that does not fit or one of more than `_SHAPE_NODES` values, goes to the validator, which decides and
says why. Every tool call checks its arguments, and most check a result too: jsonschema took ~0.03
ms of the host's event loop per check of a two-integer object, the shape ~2 us.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import re2
import referencing.exceptions

__all__ = (
    "MAX_SCHEMA_CHARS",
    "MAX_SCHEMA_DEPTH",
    "MAX_STEPS",
    "SchemaChecks",
    "forget_schemas",
    "regex_search",
    "schema_problem",
    "value_problem",
)

MAX_SCHEMA_CHARS = 1_000_000
MAX_SCHEMA_DEPTH = 64
MAX_STEPS = 100_000
MAX_SECONDS = 1.0
REGEX_MEMORY = 8 << 20
# Characters of the schema's complaint the kernel code is told.
_MESSAGE_CHARS = 400

# jsonschema's types are partly unknown to pyright: reached through this.
_jsonschema: Any = jsonschema

_steps: ContextVar[list[float]] = ContextVar("_steps")


class _TooCostly(Exception):
    pass


@cache
def _compiled(pattern: str) -> Any:
    """The RE2 program for ``pattern``, or None when RE2 cannot read it."""
    options: Any = re2.Options()
    options.log_errors = False
    options.max_mem = REGEX_MEMORY
    try:
        return re2.compile(pattern, options)  # pyright: ignore[reportUnknownMemberType]
    except Exception:  # re2.error: a pattern RE2 cannot read (lookaround, backreferences, too big)
        return None


def regex_search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` (a JSON schema regex) matches somewhere in ``text``, in time linear in
    ``text``; None when RE2 cannot read the pattern."""
    program = _compiled(pattern)
    if program is None:
        return None
    return program.search(text) is not None


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if isinstance(instance, str) and isinstance(pattern, str) and regex_search(pattern, instance) is False:
        yield jsonschema.ValidationError(f"the text does not match the pattern {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(instance, dict) or not isinstance(patterns, dict):
        return
    for pattern, subschema in cast("dict[str, Any]", patterns).items():
        for key, value in cast("dict[str, Any]", instance).items():
            if regex_search(str(pattern), key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra_schema: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(instance, dict):
        return
    declared: object = schema.get("properties", {})
    patterns = [str(p) for p in cast("dict[object, object]", schema.get("patternProperties", {}) or {})]
    extras: list[str] = []
    for key in cast("dict[str, Any]", instance):
        if isinstance(declared, dict) and key in declared:
            continue
        # A pattern RE2 cannot read may match: the key is not counted as extra.
        if any(regex_search(p, key) is not False for p in patterns):
            continue
        extras.append(key)
    if isinstance(extra_schema, dict):
        for key in extras:
            yield from validator.descend(instance[key], extra_schema, path=key)
    elif extra_schema is False and extras:
        yield jsonschema.ValidationError(f"keys the schema does not allow: {', '.join(map(repr, sorted(extras)))}")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if unique is True and isinstance(instance, list):
        items = cast("list[Any]", instance)
        seen = {json.dumps(item, sort_keys=True, default=repr) for item in items}
        if len(seen) != len(items):
            yield jsonschema.ValidationError("the array has repeated items")


def _not_checked(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    return iter(())


_REPLACED: dict[str, Callable[..., Iterator[Any]]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "unevaluatedProperties": _not_checked,
    "unevaluatedItems": _not_checked,
}


def _counted(keyword: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        budget = _steps.get()
        budget[0] += 1
        if budget[0] > MAX_STEPS or (budget[0] % 1000 == 0 and time.monotonic() > budget[1]):
            raise _TooCostly
        return keyword(validator, value, instance, schema)

    return run


@cache
def _safe_validator(base: type[Any]) -> type[Any]:
    keywords = {**cast("dict[str, Callable[..., Iterator[Any]]]", base.VALIDATORS), **_REPLACED}
    counted = {name: _counted(function) for name, function in keywords.items()}
    return cast("type[Any]", _jsonschema.validators.extend(base, counted))


def _too_big(schema: Mapping[str, Any], size: int | None) -> str | None:
    """Why ``schema`` (``size`` characters of JSON, None when it cannot be written) is not used."""
    if size is None:
        return "it cannot be written as JSON"
    if size > MAX_SCHEMA_CHARS:
        return f"it is {size:,} characters of JSON, over ipybox's limit of {MAX_SCHEMA_CHARS:,}"
    stack: list[tuple[object, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return f"it is nested deeper than ipybox's limit of {MAX_SCHEMA_DEPTH} levels"
        if isinstance(node, Mapping):
            stack += [(child, depth + 1) for child in cast("Mapping[str, object]", node).values()]
        elif isinstance(node, list):
            stack += [(child, depth + 1) for child in cast("list[object]", node)]
    return None


# The JSON types of a `_Shape`, matched by exact Python type: subclasses (bool of int, an IntEnum, a
# dict subclass) are left to the validator.
_SHAPE_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "integer": frozenset({int}),
    "number": frozenset({int, float}),
    "boolean": frozenset({bool}),
    "null": frozenset({type(None)}),
    "object": frozenset({dict}),
    "array": frozenset({list}),
}
# Words that say nothing about validity (annotations); any other word makes a schema no `_Shape`.
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
# The dialects whose type, properties, required, additionalProperties and (one-schema) items mean
# what `_fits` does (draft 3's "required" is a boolean of each property).
_SHAPE_DIALECTS = (
    jsonschema.Draft4Validator,
    jsonschema.Draft6Validator,
    jsonschema.Draft7Validator,
    jsonschema.Draft201909Validator,
    jsonschema.Draft202012Validator,
)
# Values a shape check visits at most; a larger value goes to the validator and its budget. Each one
# visited costs the validator at most 5 steps, far within `MAX_STEPS`, so a value the shape lets
# through is one the validator would have let through too, not stopped as too costly.
_SHAPE_NODES = 1000


@dataclass(frozen=True, slots=True)
class _Shape:
    """A schema that says only types, keys and required keys (see the module doc)."""

    types: frozenset[type] | None
    """The Python types a value may have; None: any."""
    properties: Mapping[str, _Shape]
    required: tuple[str, ...]
    closed: bool
    """``additionalProperties: false``: keys beyond ``properties`` are refused."""
    items: _Shape | None


_ANY_SHAPE = _Shape(None, {}, (), False, None)


def _shape(schema: object, depth: int = 1, *, top: bool = True) -> _Shape | None:
    """``schema`` as a `_Shape`, or None when it says anything a shape cannot."""
    if schema is True:
        return _ANY_SHAPE
    if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH:
        return None
    types: frozenset[type] | None = None
    properties: dict[str, _Shape] = {}
    required: tuple[str, ...] = ()
    closed = False
    items: _Shape | None = None
    for word, value in cast("Mapping[str, object]", schema).items():
        if word in _ANNOTATIONS or (top and word == "$schema"):
            continue
        if word == "type":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list | tuple) or not names:
                return None
            allowed: set[type] = set()
            for name in cast("list[object]", names):
                kinds = _SHAPE_TYPES.get(name) if isinstance(name, str) else None
                if kinds is None:
                    return None
                allowed |= kinds
            types = frozenset(allowed)
        elif word == "properties" and isinstance(value, Mapping):
            for key, sub in cast("Mapping[object, object]", value).items():
                inner = _shape(sub, depth + 1, top=False)
                if inner is None or not isinstance(key, str):
                    return None
                properties[key] = inner
        elif word == "required" and isinstance(value, list | tuple):
            keys = cast("list[object]", value)
            if not all(isinstance(key, str) for key in keys):
                return None
            required = tuple(cast("list[str]", keys))
        elif word == "additionalProperties" and isinstance(value, bool):
            closed = not value
        elif word == "items" and not isinstance(value, list | tuple):
            items = _shape(value, depth + 1, top=False)
            if items is None:
                return None
        else:
            return None
    return _Shape(types, properties, required, closed, items)


def _fits(shape: _Shape, value: object, budget: list[int]) -> bool:
    """Whether ``value`` certainly fits ``shape``; False: not certain (the validator decides)."""
    budget[0] -= 1
    if budget[0] < 0:
        return False
    kind = type(value)
    if shape.types is not None and kind not in shape.types:
        return False
    if kind is dict:
        entries = cast("dict[object, object]", value)
        for key in shape.required:
            if key not in entries:
                return False
        properties = shape.properties
        for key, item in entries.items():
            inner = properties.get(key) if type(key) is str else None
            if inner is None:
                if shape.closed or type(key) is not str:
                    return False
            elif not _fits(inner, item, budget):
                return False
    elif kind is list and shape.items is not None:
        for item in cast("list[object]", value):
            if not _fits(shape.items, item, budget):
                return False
    return True


@dataclass(frozen=True)
class _Prepared:
    """What a schema's checks need, made once: the validator, or why there is none."""

    schema: Mapping[str, Any]
    """Held so that no other object takes its id while it is cached."""
    chars: int
    """Its JSON size (at least 1): what it weighs in the cache."""
    too_big: str | None
    validator: Any | None
    """None with ``too_big`` None: not a schema ipybox can judge by (the server checks)."""
    shape: _Shape | None = None
    """The schema as a `_Shape`, when it is one: checked first, without the validator."""


def _prepare(schema: Mapping[str, Any]) -> _Prepared:
    try:
        size: int | None = len(json.dumps(schema, default=repr))
    except (ValueError, RecursionError):
        size = None
    chars = max(1, size or 0)
    too_big = _too_big(schema, size)
    if too_big is not None:
        return _Prepared(schema, chars, too_big, None)
    try:
        base: Any = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        base.check_schema(dict(schema))
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable, RecursionError):
        return _Prepared(schema, chars, None, None)
    shape = _shape(schema) if base in _SHAPE_DIALECTS else None
    return _Prepared(schema, chars, None, _safe_validator(base)(schema), shape)


class SchemaChecks:
    """Prepared schemas by the schema object's identity, least recently used dropped first.

    Identity, not content: a hash of the canonical JSON would cost a serialization per call, about
    what the preparation saves for small schemas. It is safe because each entry holds its schema
    (its id cannot be reused while the entry lives) and listed schemas are not changed in place; a
    new listing brings new objects. Bounded by ``max_entries`` and by ``max_chars`` of JSON in all;
    a schema heavier than ``max_chars`` alone is prepared for each check and not kept.
    """

    def __init__(self, max_entries: int = 256, max_chars: int = 8_000_000) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.prepared_count = 0
        """How many schemas were prepared (a validator built or refused), cached or not."""
        self._entries: OrderedDict[int, _Prepared] = OrderedDict()
        self._chars = 0
        # Checks run in the event loop and in worker threads (the MCP server's, the SDK's).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def chars(self) -> int:
        """The JSON size of the schemas held."""
        return self._chars

    def get(self, schema: Mapping[str, Any]) -> _Prepared:
        """The prepared ``schema``, made now if it is not held."""
        key = id(schema)
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found.schema is schema:
                self._entries.move_to_end(key)
                return found
        prepared = _prepare(schema)
        with self._lock:
            self.prepared_count += 1
            if prepared.chars > self.max_chars:
                return prepared
            old = self._entries.pop(key, None)
            if old is not None:
                self._chars -= old.chars
            self._entries[key] = prepared
            self._chars += prepared.chars
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                _, dropped = self._entries.popitem(last=False)
                self._chars -= dropped.chars
        return prepared

    def forget(self, schemas: Iterable[Mapping[str, Any] | None]) -> None:
        """Drop these schemas (a listing that was replaced)."""
        with self._lock:
            for schema in schemas:
                found = self._entries.get(id(schema))
                if found is not None and found.schema is schema:
                    del self._entries[id(schema)]
                    self._chars -= found.chars


_CHECKS = SchemaChecks()


def forget_schemas(schemas: Iterable[Mapping[str, Any] | None]) -> None:
    """Forget the prepared checks of schemas a new listing replaced (they are kept by identity)."""
    _CHECKS.forget(schemas)


def value_problem(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's input ``schema`` (what the kernel code is told), or None
    when they fit or the schema gives no certain answer (an invalid schema, a ``$ref`` it cannot resolve).

    The schema's validator is kept for the next call with the same schema object (`SchemaChecks`).
    """
    return schema_problem(schema, dict(arguments), "input", "the arguments")


def schema_problem(
    schema: Mapping[str, Any], instance: object, which: str, what: str, *, listed: bool = True
) -> str | None:
    """Why ``instance`` (``what``, e.g. "the arguments") does not fit the tool's ``which`` ("input",
    "output") ``schema``, within the bounds above; None when it fits or the schema gives no certain answer.

    ``listed``: the schema is a listing's, unchanged while it is listed, so its validator is kept for
    the next check; False for a schema made for one check (it would only push others out).
    """
    prepared = _CHECKS.get(schema) if listed else _prepare(schema)
    if prepared.too_big is not None:
        return f"the tool's {which} schema is too large for ipybox to check {what} against ({prepared.too_big})"
    validator = prepared.validator
    if validator is None:
        return None  # not a schema ipybox can judge by: the server checks
    if prepared.shape is not None and _fits(prepared.shape, instance, [_SHAPE_NODES]):
        return None
    token = _steps.set([0, time.monotonic() + MAX_SECONDS])
    try:
        error: Any = _jsonschema.exceptions.best_match(validator.iter_errors(instance))
    except (_TooCostly, RecursionError):
        return (
            f"checking {what} against the tool's {which} schema took more than ipybox allows "
            f"({MAX_STEPS:,} steps or {MAX_SECONDS:g} s)"
        )
    except (referencing.exceptions.Unresolvable, jsonschema.exceptions.SchemaError):
        return None
    finally:
        _steps.reset(token)
    if error is None:
        return None
    parts: list[object] = list(cast("list[object]", error.absolute_path))
    where = "".join(f"[{json.dumps(part)}]" for part in parts) or what
    message = str(cast("object", error.message))
    if len(message) > _MESSAGE_CHARS:
        message = f"{message[:_MESSAGE_CHARS]}... ({len(message) - _MESSAGE_CHARS:,} more characters)"
    return f"{where}: {message}"
