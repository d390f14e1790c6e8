"""Cleaning untrusted JSON Schemas before models are generated from them.

A tool's ``inputSchema`` and ``outputSchema`` come from the MCP server and are treated as hostile.
`clean_schema` returns a copy that keeps only standard JSON Schema keywords (generator extensions
such as ``customTypePath`` could otherwise name arbitrary imports), drops ``$ref`` values that point
anywhere but into the schema itself (nothing is ever fetched or read from disk), drops references
that do not resolve and patterns that do not compile, and refuses schemas too large or deep to
process quickly. ``title`` is dropped too: it only adds ``Field(title=...)`` noise to the models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

__all__ = ("SchemaRejected", "clean_schema")

# Real tool schemas are a few KiB; these bounds keep a hostile one from stalling generation.
MAX_SCHEMA_NODES = 20_000
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_TEXT = 1_000_000

# Keywords whose value is one subschema.
_SCHEMA_KEYS = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
# Keywords whose value is a list of subschemas.
_SCHEMA_LIST_KEYS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
# Keywords whose value maps names to subschemas.
_SCHEMA_MAP_KEYS = frozenset({"$defs", "definitions", "dependentSchemas", "patternProperties", "properties"})
# Keywords whose value is plain data, copied as it is.
_VALUE_KEYS = frozenset(
    {
        "const",
        "contentEncoding",
        "contentMediaType",
        "default",
        "deprecated",
        "description",
        "enum",
        "examples",
        "exclusiveMaximum",
        "exclusiveMinimum",
        "format",
        "maxItems",
        "maxLength",
        "maxProperties",
        "maximum",
        "minItems",
        "minLength",
        "minProperties",
        "minimum",
        "multipleOf",
        "nullable",
        "pattern",
        "readOnly",
        "required",
        "type",
        "uniqueItems",
        "writeOnly",
    }
)


class SchemaRejected(Exception):
    """A schema is too large, too deep or not a JSON object; the tool falls back to a plain model."""


def _mapping(value: Any) -> Mapping[str, Any] | None:
    # JSON objects have string keys; anything else is not a schema object.
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):  # pyright: ignore[reportUnknownVariableType]
        return cast("Mapping[str, Any]", value)
    return None


def _sequence(value: Any) -> list[Any] | None:
    return cast("list[Any]", value) if isinstance(value, list) else None


@dataclass
class _Cleaner:
    root: Mapping[str, Any]
    notes: list[str] = field(default_factory=list[str])

    def schema(self, node: Any, where: str) -> Any:
        if isinstance(node, bool):
            return node
        obj = _mapping(node)
        if obj is None:
            self.notes.append(f"{where}: not a schema, treated as any value")
            return {}
        out: dict[str, Any] = {}
        for key, value in obj.items():
            here = f"{where}/{key}"
            items, entries = _sequence(value), _mapping(value)
            if key == "$ref":
                if self._resolves(value):
                    out[key] = value
                else:
                    self.notes.append(f"{where}: $ref {value!r} ignored (only refs into the schema are used)")
            elif key in _SCHEMA_KEYS:
                if key == "items" and items is not None:
                    out[key] = [self.schema(v, here) for v in items]
                else:
                    out[key] = self.schema(value, here)
            elif key in _SCHEMA_LIST_KEYS:
                if items is not None:
                    out[key] = [self.schema(v, here) for v in items]
            elif key == "patternProperties":
                if entries is not None:
                    out[key] = {k: self.schema(v, f"{here}/{k}") for k, v in entries.items() if self._regex(k, here)}
            elif key == "pattern":
                if self._regex(value, where):
                    out[key] = value
            elif key in _SCHEMA_MAP_KEYS:
                if entries is not None:
                    out[key] = {k: self.schema(v, f"{here}/{k}") for k, v in entries.items()}
            elif key == "dependencies":
                if entries is not None:
                    # Draft 7: each entry is a schema or a list of property names.
                    out[key] = {
                        k: v if isinstance(v, list) else self.schema(v, f"{here}/{k}") for k, v in entries.items()
                    }
            elif key in _VALUE_KEYS:
                out[key] = value
        required = _sequence(out.pop("required", None))
        if required is not None:
            out["required"] = [r for r in required if isinstance(r, str)]
        return out

    def _regex(self, pattern: Any, where: str) -> bool:
        # Generated models validate patterns with Python's re; one it cannot compile would make
        # every call of the tool fail, so drop it instead.
        try:
            re.compile(pattern)
        except (re.error, TypeError, OverflowError, RecursionError):
            self.notes.append(f"{where}: pattern {pattern!r} ignored (not a valid regular expression)")
            return False
        return True

    def _resolves(self, ref: Any) -> bool:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return False
        if ref == "#":
            return True
        if not ref.startswith("#/"):
            return False
        node: Any = self.root
        for raw in ref[2:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            obj, items = _mapping(node), _sequence(node)
            if obj is not None and part in obj:
                node = obj[part]
            elif items is not None and part.isdigit() and int(part) < len(items):
                node = items[int(part)]
            else:
                return False
        return isinstance(node, bool) or _mapping(node) is not None


def _check_size(schema: Any) -> None:
    nodes = 0
    text = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise SchemaRejected(f"more than {MAX_SCHEMA_NODES} nodes")
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaRejected(f"nested deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, Mapping):
            for key, value in cast("Mapping[Any, Any]", node).items():
                text += len(str(key))
                stack.append((value, depth + 1))
        elif isinstance(node, list | tuple):
            stack.extend((value, depth + 1) for value in cast("list[Any]", node))
        elif isinstance(node, str):
            text += len(node)
        if text > MAX_SCHEMA_TEXT:
            raise SchemaRejected(f"more than {MAX_SCHEMA_TEXT} characters of text")


def clean_schema(schema: Any) -> tuple[dict[str, Any], list[str]]:
    """Copy an untrusted tool schema, keeping only what is safe to generate models from.

    Returns:
        The cleaned schema, and notes on what was dropped (for the generation report).

    Raises:
        SchemaRejected: The schema is not a JSON object, or exceeds the size or depth bounds.
    """
    root = _mapping(schema)
    if root is None:
        raise SchemaRejected("the schema is not a JSON object")
    _check_size(root)
    first = _Cleaner(root)
    cleaned = first.schema(root, "#")
    # Refs may point into parts the first pass dropped; resolve them again against the result.
    second = _Cleaner(cleaned)
    return second.schema(cleaned, "#"), first.notes + second.notes
