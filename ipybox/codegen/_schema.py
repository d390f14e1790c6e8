"""Cleaning untrusted JSON Schemas before models are generated from them.

A tool's ``inputSchema`` and ``outputSchema`` come from the MCP server and are treated as hostile.
`clean_schema` returns a copy that keeps only standard JSON Schema keywords (generator extensions
such as ``customTypePath`` could otherwise name arbitrary imports), drops ``$ref`` values that point
anywhere but into the schema itself (nothing is ever fetched or read from disk), drops references
that do not resolve and patterns that do not compile, and refuses schemas too large or deep to
process quickly. ``title`` is dropped too: it only adds ``Field(title=...)`` noise to the models.

It also rewrites what the generator would turn into a stricter check than the schema's, so that a
model never rejects or alters what the tool accepts (DESIGN.md §5):

- ``format`` is an annotation (JSON Schema's default): it moves into the description, so no field
  becomes a ``datetime``, ``UUID`` or pattern-checked hostname that rejects or rewrites strings.
- ``unevaluatedProperties``/``unevaluatedItems`` become ``additional*`` only where nothing else
  evaluates (no applicators next to them); otherwise they are dropped.
- draft-7 tuples (``items: [...]``) become ``prefixItems``, with ``additionalItems`` as ``items``.
- a typeless ``allOf`` of typeless branches becomes one ``anyOf`` by type, each type's keywords from
  every branch merged (the generator made an object model of it, refusing arrays and scalars).
- ``patternProperties`` become a loose ``additionalProperties``: a key that matches no declared name
  must satisfy one of the pattern schemas or the ``additionalProperties`` schema (keys are not checked).
- What the root says about its keys that no field can (``min/maxProperties``, required names without a
  property, ``dependentRequired``, ``false`` properties and patterns, ``propertyNames: false``,
  ``additionalProperties: false`` next to ``patternProperties``) is returned as `KEYS_KEY` rules,
  which the kernel's ``JsonObject`` checks on the keys sent.
- A property that is not required and whose schema admits ``null`` is marked ``NULLABLE_KEY``, which
  the generator copies into the field; at call time ``None`` is sent as ``null`` only for those.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

# The marker of an optional property whose schema admits null; the kernel's runtime reads it.
from ipybox_kernel._arguments import KEYS_KEY, NULLABLE_KEY

__all__ = ("KEYS_KEY", "NULLABLE_KEY", "CleanSchema", "SchemaRejected", "clean_schema")


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
        "$schema",
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
    keys: dict[str, Any] = field(default_factory=dict[str, Any])

    @property
    def draft7(self) -> bool:
        dialect = self.root.get("$schema")
        return isinstance(dialect, str) and any(f"draft-0{n}/" in dialect for n in (4, 6, 7))

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
                    # Draft 7 tuple: the same as 2020-12's prefixItems.
                    out["prefixItems"] = [self.schema(v, here) for v in items]
                else:
                    out[key] = self.schema(value, here)
            elif key == "format":
                if isinstance(value, str):
                    out[key] = value
            elif key in _SCHEMA_LIST_KEYS:
                if items is not None:
                    out[key] = [self.schema(v, here) for v in items]
                if key != "prefixItems" and False in out.get(key, ()):
                    # The generator cannot take a `false` branch: without it anyOf/oneOf mean the
                    # same, and allOf checks less (never more).
                    out[key] = [v for v in out[key] if v is not False]
                    if not out[key]:
                        del out[key]
            elif key == "patternProperties":
                if entries is not None:
                    out[key] = {k: self.schema(v, f"{here}/{k}") for k, v in entries.items()}
            elif key == "pattern":
                value = _python_pattern(value)
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
        if self.draft7 and "$ref" in out:
            # Up to draft 7, keywords next to $ref are ignored.
            out = {k: v for k, v in out.items() if k in _REF_SIBLINGS}
        elif where == "#":
            out, self.keys = _key_rules(obj, out, draft7=self.draft7)
        return _loosen(out, obj, root=where == "#")

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
        return isinstance(ref, str) and _pointer(self.root, ref) is not None


# Keywords next to which ``unevaluated*`` means more than ``additional*``: they evaluate too.
_APPLICATORS = frozenset(
    {
        "$dynamicRef",
        "$ref",
        "allOf",
        "anyOf",
        "contains",
        "dependencies",
        "dependentSchemas",
        "else",
        "if",
        "not",
        "oneOf",
        "then",
    }
)


# What stays next to a draft-7 $ref: the ref, annotations, and definitions other refs may point into.
_REF_SIBLINGS = frozenset({"$ref", "description", "$defs", "definitions", "$schema"})
# Keywords that only constrain values of one JSON type; the generator takes them as that type.
_OBJECT_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "maxProperties",
        "minProperties",
        "properties",
        "propertyNames",
        "required",
    }
)
_ARRAY_KEYWORDS = frozenset(
    {"contains", "items", "maxContains", "maxItems", "minContains", "minItems", "prefixItems", "uniqueItems"}
)
_ANY_OTHER = ["string", "number", "boolean", "null"]


def _typeless(out: dict[str, Any]) -> dict[str, Any]:
    """A schema without ``type`` whose keywords are for objects or arrays also admits every other type.

    The generator would type it from its keywords (``{"items": ...}`` as a list), rejecting the
    rest; so each family becomes one typed branch of an ``anyOf``, next to the other types.
    """
    if "type" in out or "enum" in out or "const" in out:
        return out
    merged = _merged_all_of(out)
    if merged is not None:
        return merged
    objects = {k: out[k] for k in _OBJECT_KEYWORDS if k in out}
    arrays = {k: out[k] for k in _ARRAY_KEYWORDS if k in out}
    if (not objects and not arrays) or any(k in out for k in ("allOf", "anyOf", "oneOf", "$ref")):
        # With composition the generator's own inference stays: an extra union would only be merged
        # into its branches in ways that are hard to predict.
        return out
    rest = {k: v for k, v in out.items() if k not in objects and k not in arrays}
    branches: list[Any] = []
    branches.append({"type": "object", **objects} if objects else {"type": "object"})
    branches.append({"type": "array", **arrays} if arrays else {"type": "array"})
    branches.append({"type": _ANY_OTHER})
    if "anyOf" in rest:
        # Keep the schema's own anyOf: both must hold.
        return {
            **{k: v for k, v in rest.items() if k != "anyOf"},
            "allOf": [{"anyOf": rest["anyOf"]}, {"anyOf": branches}],
        }
    return {**rest, "anyOf": branches}


def _families(branch: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The object and array keywords of a cleaned typeless ``allOf`` branch, or None if it is not one.

    A typeless branch is ``true``, annotations only, or what `_typeless` made of it: an ``anyOf`` of
    an object branch, an array branch and every other type.
    """
    if branch is True:
        return {}, {}
    node = _mapping(branch)
    if node is None or set(node) - _ANNOTATIONS - {"anyOf"}:
        return None
    if "anyOf" not in node:
        return {}, {}
    match _sequence(node["anyOf"]):
        case [{"type": "object", **objects}, {"type": "array", **arrays}, {"type": other}] if other == _ANY_OTHER:
            return dict(objects), dict(arrays)
        case _:
            return None


# Array keywords whose meaning depends on each other's presence (``maxContains`` without
# ``contains`` is ignored): taken together from one branch or not at all.
_CONTAINS = frozenset({"contains", "maxContains", "minContains"})


def _merged_keyword(key: str, first: Any, other: Any) -> Any:
    """``key``'s value for an object or array that both values constrain, or ``first`` (looser)."""
    match key, first, other:
        case "properties" | "dependentRequired", dict(), dict():
            return {**cast("dict[str, Any]", other), **cast("dict[str, Any]", first)}
        case "required", list(), list():
            return [*cast("list[Any]", first), *(k for k in cast("list[Any]", other) if k not in first)]
        case "minItems" | "minProperties", int(), int():
            return max(first, other)
        case "maxItems" | "maxProperties", int(), int():
            return min(first, other)
        case "uniqueItems", bool(), bool():
            return first or other
        case _:
            return first


def _merged_family(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One type's keywords from every branch of an ``allOf``, checked no more strictly than all of them.

    Properties and required names add up and bounds take the tighter value (exactly the
    intersection); any other keyword two branches give differently keeps the first branch's value,
    which the intersection implies. ``items``/``additionalProperties`` next to another branch's
    ``prefixItems``/``properties`` then apply to fewer members, which only admits more.
    """
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            merged[key] = _merged_keyword(key, merged[key], value) if key in merged else value
    if sum(1 for part in parts if set(part) & _CONTAINS) > 1:
        merged = {k: v for k, v in merged.items() if k not in _CONTAINS}
    return merged


def _merged_all_of(out: dict[str, Any]) -> dict[str, Any] | None:
    """A typeless ``allOf`` of typeless branches as one ``anyOf`` by type, or None if it is not one.

    The generator turns ``allOf`` of such branches into an object model that refuses every array and
    scalar the schema admits; by type, ``allOf`` is each type's keywords together.
    """
    branches = _sequence(out.get("allOf"))
    if branches is None or set(out) - _ANNOTATIONS - _OBJECT_KEYWORDS - _ARRAY_KEYWORDS - {"allOf"}:
        return None
    own = ({k: out[k] for k in _OBJECT_KEYWORDS if k in out}, {k: out[k] for k in _ARRAY_KEYWORDS if k in out})
    families = [own, *map(_families, branches)]
    if any(f is None for f in families):
        return None
    typed = [f for f in families if f is not None]
    rest = {k: v for k, v in out.items() if k in _ANNOTATIONS}
    objects, arrays = _merged_family([f[0] for f in typed]), _merged_family([f[1] for f in typed])
    return {
        **rest,
        "anyOf": [{"type": "object", **objects}, {"type": "array", **arrays}, {"type": list(_ANY_OTHER)}],
    }


def _loosen(out: dict[str, Any], original: Mapping[str, Any], *, root: bool) -> dict[str, Any]:
    """Rewrite keywords the generator would check more strictly than JSON Schema (module docstring)."""
    form = out.pop("format", None)
    if form is not None:
        description = out.get("description")
        note = f"Format: {form}."
        out["description"] = f"{description} ({note})" if isinstance(description, str) and description else note
    items = out.pop("additionalItems", None)
    if "prefixItems" in out and isinstance(original.get("items"), list) and items is not None:
        out["items"] = items
    applied = any(key in out for key in _APPLICATORS)
    unevaluated = out.pop("unevaluatedItems", None)
    if unevaluated is not None and not applied and "items" not in out:
        out["items"] = unevaluated
    unevaluated = out.pop("unevaluatedProperties", None)
    if unevaluated is not None and not applied and "additionalProperties" not in out:
        out["additionalProperties"] = unevaluated
    patterns = _mapping(out.pop("patternProperties", None))
    if patterns and out.get("additionalProperties") is False and "properties" not in out:
        # Every key must match a pattern: that much is checked exactly (the keys' type).
        names = [_python_pattern(p) for p in patterns]
        if "propertyNames" not in out and all(_compiles(p) for p in names):
            out["propertyNames"] = (
                {"pattern": names[0]} if len(names) == 1 else {"anyOf": [{"pattern": p} for p in names]}
            )
    if patterns:
        options = [o for o in [*patterns.values(), out.get("additionalProperties", True)] if o is not False]
        if any(o is True or o == {} for o in options):
            # {} rather than true: keys the patterns declare are expected, not typos to warn about.
            out["additionalProperties"] = {}
        else:
            out["additionalProperties"] = {"anyOf": options} if options else False
    out = _single_all_of(out)
    # The root is an object whatever it says (tool arguments); elsewhere keep every type it admits.
    return out if root else _typeless(out)


# Keywords that only annotate: next to them, ``allOf: [S]`` means S.
_ANNOTATIONS = frozenset({"$defs", "$schema", "default", "definitions", "deprecated", "description", "examples"})


def _single_all_of(out: dict[str, Any]) -> dict[str, Any]:
    """``{"allOf": [S]}`` with only annotations beside it is S itself.

    The generator merges a lone ``allOf`` branch in ways of its own (a typeless branch that admits
    arrays became an object model); S in its place is what the schema says.
    """
    branches = _sequence(out.get("allOf"))
    if branches is None or len(branches) != 1 or set(out) - _ANNOTATIONS - {"allOf"}:
        return out
    branch = _mapping(branches[0])
    if branch is None or set(branch) & (set(out) - {"allOf"}):
        return out
    return {**{k: v for k, v in out.items() if k != "allOf"}, **branch}


def _names(value: Any) -> list[str] | None:
    items = _sequence(value)
    if items is None or not all(isinstance(item, str) for item in items):
        return None
    return list(dict.fromkeys(cast("list[str]", items)))


def _count(value: Any) -> int | None:
    # JSON Schema's non-negative integer; 2.0 counts as 2.
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != int(value):
        return None
    return int(value)


def _required_only(branches: Any) -> list[list[str]] | None:
    """The names of each branch of a composition whose branches say only ``required``, or None."""
    items = _sequence(branches)
    if not items:
        return None
    out: list[list[str]] = []
    for branch in items:
        node = _mapping(branch)
        names = _names(node.get("required")) if node is not None else None
        if node is None or names is None or set(node) - {"required", "description", "title", "$comment"}:
            return None
        out.append(names)
    return out


def _key_rules(
    original: Mapping[str, Any], out: dict[str, Any], *, draft7: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The root's rules on its keys that generated fields cannot say (`KEYS_KEY`; the kernel's ``JsonObject``).

    Each rule is exactly the keyword's meaning on the keys sent, so a call it refuses the server's
    check refuses too. ``original`` is the raw root (for ``dependentRequired``, which the cleaned
    schema does not keep), ``out`` its cleaned keywords before loosening. Returns ``out`` without
    what became a rule and the generator would misread (an ``anyOf``/``oneOf``/``allOf`` of branches
    of required names only: it made a model per branch and kept one), and the rules.
    """
    rules: dict[str, Any] = {}
    out = dict(out)
    for key in ("allOf", "anyOf", "oneOf"):
        branches = _required_only(original.get(key)) if key in out else None
        if branches is None:
            continue
        del out[key]
        if key == "allOf":
            out["required"] = list(
                dict.fromkeys([*(_names(out.get("required")) or []), *(n for b in branches for n in b)])
            )
        else:
            rules[key] = branches
    for bound in ("minProperties", "maxProperties"):
        count = _count(out.get(bound))
        if count is not None:
            rules[bound] = count
    properties = _mapping(out.get("properties")) or {}
    required = [name for name in _names(out.get("required")) or [] if name not in properties]
    if required:
        rules["required"] = required
    dependent: dict[str, list[str]] = {}
    for key in ("dependencies", "dependentRequired") if draft7 else ("dependentRequired",):
        for name, needed in (_mapping(original.get(key)) or {}).items():
            names = _names(needed)
            if names:
                dependent[name] = [*dependent.get(name, []), *(n for n in names if n not in dependent.get(name, []))]
    if dependent:
        rules["dependentRequired"] = dependent
    absent = [name for name, sub in properties.items() if sub is False]
    if absent:
        rules["absent"] = absent
    if out.get("propertyNames") is False:
        rules["propertyNames"] = False
    patterns = _mapping(out.get("patternProperties")) or {}
    translated = {_python_pattern(p): sub for p, sub in patterns.items()}
    if all(_compiles(p) for p in translated):
        forbidden = [p for p, sub in translated.items() if sub is False]
        if forbidden:
            rules["forbidden"] = forbidden
        if translated and out.get("additionalProperties") is False:
            rules["closed"] = {"names": list(properties), "patterns": list(translated)}
        raw = _mapping(original.get("patternProperties")) or {}
        values = {_python_pattern(p): _value_check(sub) for p, sub in raw.items()}
        checked = {p: sub for p, sub in values.items() if isinstance(sub, dict) and sub}
        if checked:
            rules["values"] = checked
        extra = _value_check(original.get("additionalProperties"))
        if translated and isinstance(extra, dict) and extra:
            rules["additional"] = {"names": list(properties), "patterns": list(translated), "schema": extra}
    return out, rules


# Keywords the kernel's value check (``ipybox_kernel._arguments._fits``) reads exactly, and those it may
# pass over because they only annotate (format included: an annotation here).
_VALUE_CHECKS = frozenset(
    {
        "const",
        "enum",
        "exclusiveMaximum",
        "exclusiveMinimum",
        "maxItems",
        "maxLength",
        "maximum",
        "minItems",
        "minLength",
        "minimum",
        "pattern",
        "type",
    }
)
_VALUE_ANNOTATIONS = frozenset(
    {"$comment", "default", "deprecated", "description", "examples", "format", "readOnly", "title", "writeOnly"}
)
_JSON_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})


def _plain_json(value: Any, depth: int = 0) -> bool:
    """JSON data the generated module can hold as a literal (finite numbers, string keys)."""
    if depth > MAX_SCHEMA_DEPTH:
        return False
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    items, entries = _sequence(value), _mapping(value)
    if items is not None:
        return all(_plain_json(v, depth + 1) for v in items)
    return entries is not None and all(_plain_json(v, depth + 1) for v in entries.values())


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _value_check(schema: Any) -> dict[str, Any] | None:
    """``schema``'s keywords for the kernel's value check, if it reads every one of them exactly, else None.

    ``{}`` means any value; ``false`` is not a value check (`_key_rules` says it as ``forbidden``).
    """
    if schema is True:
        return {}
    node = _mapping(schema)
    if node is None or set(node) - _VALUE_CHECKS - _VALUE_ANNOTATIONS:
        return None
    out = {k: v for k, v in node.items() if k in _VALUE_CHECKS}
    if not _plain_json(out):
        return None
    kinds = out.get("type")
    kind_list = [kinds] if isinstance(kinds, str) else _sequence(kinds)
    if kinds is not None and (kind_list is None or not all(k in _JSON_TYPES for k in kind_list)):
        return None
    if "enum" in out and _sequence(out["enum"]) is None:
        return None
    bounds = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    if any(k in out and not _number(out[k]) for k in bounds):
        return None
    if any(k in out and _count(out[k]) is None for k in ("minLength", "maxLength", "minItems", "maxItems")):
        return None
    if "pattern" in out:
        pattern = _python_pattern(out["pattern"])
        if not isinstance(pattern, str) or not _compiles(pattern):
            return None
        out["pattern"] = pattern
    return out


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError):
        return False
    return True


def _admits_null(node: Any, root: Mapping[str, Any], seen: frozenset[str] = frozenset()) -> bool:
    """Whether `node` (a cleaned subschema) may be ``null``; a reference cycle counts as not."""
    if isinstance(node, bool):
        return node
    obj = _mapping(node)
    if obj is None:
        return True
    ref = obj.get("$ref")
    if isinstance(ref, str):
        if ref in seen:
            return False
        target = _pointer(root, ref)
        if target is not None and not _admits_null(target, root, seen | {ref}):
            return False
    if obj.get("nullable") is True:
        return True
    kind = obj.get("type")
    if isinstance(kind, str) and kind != "null":
        return False
    if isinstance(kind, list) and "null" not in kind:
        return False
    enum = _sequence(obj.get("enum"))
    if enum is not None and None not in enum:
        return False
    if "const" in obj and obj["const"] is not None:
        return False
    for key in ("allOf",):
        if any(not _admits_null(sub, root, seen) for sub in _sequence(obj.get(key)) or []):
            return False
    for key in ("anyOf", "oneOf"):
        options = _sequence(obj.get(key))
        if options is not None and not any(_admits_null(sub, root, seen) for sub in options):
            return False
    return True


def _pointer(root: Mapping[str, Any], ref: str) -> Any | None:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        obj, items = _mapping(node), _sequence(node)
        if obj is not None and part in obj:
            node = obj[part]
        elif items is not None and part.isdigit() and int(part) < len(items):
            node = items[int(part)]
        else:
            return None
    return node if isinstance(node, bool) or _mapping(node) is not None else None


def _mark_nullable(node: Any, root: Mapping[str, Any], depth: int = 0) -> None:
    """Mark every optional property whose schema admits null with `NULLABLE_KEY` (in place)."""
    if depth > MAX_SCHEMA_DEPTH or not isinstance(node, dict):
        return
    obj = cast("dict[str, Any]", node)
    properties = obj.get("properties")
    if isinstance(properties, dict):
        required = set(_sequence(obj.get("required")) or [])
        for name, sub in list(cast("dict[str, Any]", properties).items()):
            if name not in required and _admits_null(sub, root):
                properties[name] = {NULLABLE_KEY: True} if isinstance(sub, bool) else {**sub, NULLABLE_KEY: True}
    for key, value in obj.items():
        if key in _SCHEMA_KEYS:
            _mark_nullable(value, root, depth + 1)
        elif key in _SCHEMA_LIST_KEYS and isinstance(value, list):
            for sub in cast("list[Any]", value):
                _mark_nullable(sub, root, depth + 1)
        elif (key in _SCHEMA_MAP_KEYS or key == "dependencies") and isinstance(value, dict):
            for sub in cast("dict[str, Any]", value).values():
                _mark_nullable(sub, root, depth + 1)


# ECMAScript's named groups and backreferences, which Python spells (?P<name>...) and (?P=name).
_NAMED_GROUP = re.compile(r"(?<!\\)\(\?<(?=[A-Za-z_])")
_NAMED_BACKREF = re.compile(r"\\k<([A-Za-z_][A-Za-z0-9_]*)>")


def _python_pattern(pattern: Any) -> Any:
    """An ECMAScript pattern in Python's syntax where the two differ only in spelling."""
    if not isinstance(pattern, str):
        return pattern
    return _NAMED_BACKREF.sub(r"(?P=\1)", _NAMED_GROUP.sub("(?P<", pattern))


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


@dataclass(frozen=True)
class CleanSchema:
    """What `clean_schema` makes of a tool schema.

    Attributes:
        schema: The cleaned schema, for the generator.
        keys: The root's rules on its keys (`KEYS_KEY`), empty when it has none.
        notes: What was dropped (for the generation report).
    """

    schema: dict[str, Any]
    keys: dict[str, Any]
    notes: list[str]


def clean_schema(schema: Any) -> CleanSchema:
    """Copy an untrusted tool schema, keeping only what is safe to generate models from.

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
    result = second.schema(cleaned, "#")
    _mark_nullable(result, result)
    return CleanSchema(result, first.keys, first.notes + second.notes)
