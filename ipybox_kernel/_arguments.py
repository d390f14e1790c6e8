"""Tool arguments from a generated ``Params`` model: what the generated modules' ``_arguments`` calls.

The contract (DESIGN.md §5): what the tool accepts is never rejected, and it is sent as given.

- Only what the caller set is sent; the server keeps its own defaults.
- ``None`` for an optional property means "not given" and is left out, unless the property's schema
  admits ``null`` (code generation marks those fields with `NULLABLE_KEY`); then it is sent as null.
- Numbers as JSON Schema counts them: an ``integer`` field takes ``1.0`` and sends ``1`` (`JsonInt`);
  an ``enum``/``const`` of numbers or booleans takes the values JSON counts equal to a member
  (``0.0`` for ``0``, never ``false`` for ``0``) and sends the value as given (`JsonEqual`).
- What JSON Schema says about an object's keys beyond its fields (``min/maxProperties``, required
  names without a property, ``dependentRequired``, a ``false`` property or pattern, ``propertyNames:
  false``, ``additionalProperties: false`` next to ``patternProperties``): checked on the keys that
  are sent, by `JsonObject` from the rules code generation writes under `KEYS_KEY`.
- Keys the schema does not declare: refused with the closest declared key named when the schema
  forbids them (``additionalProperties: false``); otherwise sent as given, with a warning naming the
  closest declared key, since an undeclared key is most often a typo that the server would ignore.

Imported only by generated modules, which import pydantic anyway; ``import ipybox_kernel`` alone stays
standard library only.
"""

from __future__ import annotations

import difflib
import json
import operator
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Annotated, Any, Self, cast, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    RootModel,
    StrictFloat,
    StrictInt,
    ValidationError,
    WrapValidator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

__all__ = (
    "KEYS_KEY",
    "NULLABLE_KEY",
    "JsonEqual",
    "JsonInt",
    "JsonObject",
    "UndeclaredArgumentWarning",
    "tool_arguments",
)

NULLABLE_KEY = "x-ipybox-nullable"
"""``json_schema_extra`` key of fields whose schema admits null, though they are optional."""

KEYS_KEY = "x-ipybox-keys"
"""``json_schema_extra`` key (in a `JsonObject`'s ``model_config``) of the rules on its keys."""

_EXTRA_FIELD = "__pydantic_extra__"


def _integral(value: int | float) -> int | float:
    # JSON Schema counts 1.0 an integer; it is sent as given (1.0), like every other value.
    if isinstance(value, float) and not value.is_integer():
        raise PydanticCustomError("int_from_float", "Input should be an integer (no fractional part)")
    return value


JsonInt = Annotated[StrictInt | StrictFloat, AfterValidator(_integral)]
"""JSON Schema's ``integer``: an int, or a float without a fraction, sent as given; never "5" or True."""


def _json_equal(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    matched = handler(value)
    # pydantic's Literal matches by Python equality, where True == 1 and 0 == False; JSON's does not.
    if isinstance(value, bool) is not isinstance(matched, bool):
        raise PydanticCustomError(
            "literal_error",
            "{given} is none of the allowed values (JSON keeps booleans and numbers apart)",
            {"given": json.dumps(value)},
        )
    # The value as given: 0.0 stays 0.0 where the schema says 0 (JSON Schema counts them equal).
    return value


JsonEqual = WrapValidator(_json_equal)
"""Metadata for a ``Literal`` of numbers or booleans: JSON's equality, and the value sent as given."""


class JsonObject(BaseModel):
    """A generated model with rules on its keys that its fields cannot say, checked on the keys sent.

    The rules (``model_config["json_schema_extra"][KEYS_KEY]``, written by code generation) are JSON
    Schema's own, so a check agrees with the server's: ``minProperties``/``maxProperties`` (int),
    ``required`` (names without a property), ``anyOf``/``oneOf`` (lists of names: all of one list,
    or of exactly one, must be given), ``dependentRequired`` (name -> names), ``absent``
    (names whose schema is ``false``), ``propertyNames`` (``false``: no key at all), ``forbidden``
    (patterns whose schema is ``false``) and ``closed`` (``{"names": [...], "patterns": [...]}``:
    ``additionalProperties: false`` next to ``patternProperties``; every other key must match one).
    Patterns are searched (unanchored) as JSON Schema does.
    """

    @model_validator(mode="after")
    def _ipybox_check_keys(self) -> Self:
        extra: Any = type(self).model_config.get("json_schema_extra")
        rules: Any = cast("dict[str, Any]", extra).get(KEYS_KEY) if isinstance(extra, dict) else None
        if isinstance(rules, dict):
            keys = _sent_keys(self)
            values: dict[str, Any] = {}
            if "values" in rules or "additional" in rules:
                dumped = self.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
                values = {key: dumped[key] for key in keys if key in dumped}
            problem = _key_problem(keys, cast("dict[str, Any]", rules), values)
            if problem is not None:
                raise PydanticCustomError("object_keys", "{problem}", {"problem": problem})
        return self


def _sent_keys(value: BaseModel) -> list[str]:
    """The keys `tool_arguments` sends for ``value``: what the caller set, by alias, and extra keys."""
    cls = type(value)
    keys = [
        cls.model_fields[name].alias or name
        for name in value.model_fields_set
        if name in cls.model_fields and (getattr(value, name) is not None or _nullable(cls, name))
    ]
    return [*keys, *(value.__pydantic_extra__ or {})]


@cache
def _pattern(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError):
        return None


def _matches(key: str, patterns: Sequence[Any]) -> bool | None:
    """Whether ``key`` matches one of ``patterns``; None when one cannot be used (no certain answer)."""
    compiled = [_pattern(p) if isinstance(p, str) else None for p in patterns]
    if any(c is None for c in compiled):
        return None
    return any(c.search(key) for c in compiled if c is not None)


def _sets(groups: list[list[str]]) -> str:
    return "; ".join(", ".join(map(repr, names)) or "(none)" for names in groups)


def _key_problem(keys: list[str], rules: dict[str, Any], values: Mapping[str, Any]) -> str | None:
    """What about ``keys`` (sent with ``values``, as JSON data) breaks ``rules`` (see `JsonObject`), or None."""
    present = set(keys)
    low, high = rules.get("minProperties"), rules.get("maxProperties")
    if isinstance(low, int) and len(present) < low:
        return f"at least {low} argument(s) must be given; {len(present)} given"
    if isinstance(high, int) and len(present) > high:
        return f"at most {high} argument(s) may be given; {len(present)} given"
    missing = [name for name in rules.get("required", ()) if name not in present]
    if missing:
        return f"required argument(s) missing: {', '.join(map(repr, missing))}"
    groups: list[list[str]] = rules.get("anyOf", [])
    if groups and not any(all(n in present for n in names) for names in groups):
        return f"one of these sets of arguments must be given: {_sets(groups)}"
    groups = rules.get("oneOf", [])
    if groups and sum(all(n in present for n in names) for names in groups) != 1:
        return f"exactly one of these sets of arguments must be given: {_sets(groups)}"
    for name, needed in cast("dict[str, Any]", rules.get("dependentRequired", {})).items():
        lacking = [n for n in needed if n not in present] if name in present else []
        if lacking:
            return f"with {name!r} given, {', '.join(map(repr, lacking))} must be given too"
    refused = [name for name in rules.get("absent", ()) if name in present]
    if refused:
        return f"argument(s) {', '.join(map(repr, refused))} may not be given (the schema allows no value)"
    if rules.get("propertyNames") is False and present:
        return "the tool takes no arguments"
    for key in keys:
        if _matches(key, rules.get("forbidden", ())):
            return f"argument {key!r} may not be given (the schema allows no value for its name)"
    closed = rules.get("closed")
    if isinstance(closed, dict):
        names, patterns = (
            cast("dict[str, Any]", closed).get("names", ()),
            cast("dict[str, Any]", closed).get("patterns", ()),
        )
        for key in keys:
            if key not in names and _matches(key, patterns) is False:
                return (
                    f"{key!r} is not an argument the tool declares, nor matches one of its name patterns "
                    f"({_closest(key, list(names))})"
                )
    for pattern, schema in cast("dict[str, Any]", rules.get("values", {})).items():
        for key, value in values.items():
            if _matches(key, [pattern]) and not _fits(value, schema):
                return f"argument {key!r} (its name matches {pattern!r}) does not fit {json.dumps(schema)}"
    additional = rules.get("additional")
    if isinstance(additional, dict):
        spec = cast("dict[str, Any]", additional)
        for key, value in values.items():
            other = key not in spec.get("names", ()) and _matches(key, spec.get("patterns", ())) is False
            if other and not _fits(value, spec.get("schema", {})):
                return (
                    f"argument {key!r}, which the tool does not declare, does not fit {json.dumps(spec.get('schema'))}"
                )
    return None


def _json_type(value: Any, kind: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    match kind:
        case "integer":
            return number and (isinstance(value, int) or float(value).is_integer())
        case "number":
            return number
        case "string":
            return isinstance(value, str)
        case "boolean":
            return isinstance(value, bool)
        case "null":
            return value is None
        case "array":
            return isinstance(value, list)
        case "object":
            return isinstance(value, dict)
        case _:
            return False


def _same_json(a: Any, b: Any) -> bool:
    """JSON's equality: 1 is 1.0, but true is not 1; arrays and objects member by member."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        left, right = cast("list[Any]", a), cast("list[Any]", b)
        return len(left) == len(right) and all(map(_same_json, left, right))
    if isinstance(a, dict) and isinstance(b, dict):
        left_map, right_map = cast("dict[str, Any]", a), cast("dict[str, Any]", b)
        return left_map.keys() == right_map.keys() and all(_same_json(v, right_map[k]) for k, v in left_map.items())
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return False
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    return (type(a) is type(b) or numbers) and a == b


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether JSON ``value`` fits ``schema``, whose keywords code generation chose so that this reads
    each exactly (``type``, ``enum``, ``const``, numeric bounds, lengths, item counts, ``pattern``)."""
    kinds = schema.get("type")
    if kinds is not None and not any(_json_type(value, k) for k in ([kinds] if isinstance(kinds, str) else kinds)):
        return False
    if "enum" in schema and not any(_same_json(value, member) for member in schema["enum"]):
        return False
    if "const" in schema and not _same_json(value, schema["const"]):
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        bounds: list[tuple[str, Callable[[Any, Any], bool]]] = [
            ("minimum", operator.ge),
            ("maximum", operator.le),
            ("exclusiveMinimum", operator.gt),
            ("exclusiveMaximum", operator.lt),
        ]
        if not all(check(value, schema[name]) for name, check in bounds if name in schema):
            return False
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            return False
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not _matches(value, [pattern]):
            return False
    if isinstance(value, list):
        items = cast("list[Any]", value)
        if len(items) < schema.get("minItems", 0) or len(items) > schema.get("maxItems", len(items)):
            return False
    return True


class UndeclaredArgumentWarning(UserWarning):
    """An argument the tool's schema does not declare (but allows) is sent; often a misspelled name."""


def tool_arguments(
    model: type[BaseModel], params: BaseModel | Mapping[str, Any] | None, *, tool: str
) -> dict[str, Any]:
    """Validate ``params`` with ``model`` and return the arguments to send, as JSON data.

    A ``Params`` instance is validated again from the fields its caller set: values assigned or
    changed in place after it was made are checked as construction checks them.

    Args:
        model: The tool module's ``Params``.
        params: A ``Params`` instance, a dict of arguments, or None for no arguments.
        tool: The tool's name, for warnings.

    Raises:
        pydantic.ValidationError: ``params`` does not fit the tool's schema; an undeclared key in an
            object that forbids them names the closest declared key.
    """
    if isinstance(params, model):
        # pydantic checks values when a model is made, not when a field is assigned or a list or
        # dict in it is changed in place, nor in model_construct: what the caller set is checked
        # again, as a dict of arguments would be, so what is sent is what the schema accepts.
        params = params.model_dump(by_alias=True, exclude_unset=True, warnings=False)
    try:
        validated = model.model_validate({} if params is None else params)
    except ValidationError as exc:
        raise _suggesting(exc, model) from None
    if _flat(validated):
        # Nothing for the walks below to find: no undeclared key, no None, nothing nested.
        return validated.model_dump(mode="json", by_alias=True, exclude_unset=True)
    undeclared: list[str] = []
    _find_undeclared(validated, (), undeclared)
    for where in undeclared:
        # Points at the caller of the module's run(), i.e. the line of code with the typo.
        warnings.warn(
            f"tool {tool!r}: {where}; it is sent to the server as given", UndeclaredArgumentWarning, stacklevel=4
        )
    exclude = _unset_nones(validated)
    return validated.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude=exclude or None)


# Values that hold no model, no key and no None: a model whose set fields are only these needs no walk.
_SCALARS = frozenset({str, int, float, bool})


def _flat(model: BaseModel) -> bool:
    """Whether ``model`` has no extra keys and every field the caller set is a plain scalar."""
    if model.__pydantic_extra__ or isinstance(model, RootModel):
        return False
    values = model.__dict__
    return all(type(values.get(name)) in _SCALARS for name in model.__pydantic_fields_set__)


def _nullable(model: type[BaseModel], name: str) -> bool:
    info = model.model_fields[name]
    extra = info.json_schema_extra
    marks = cast("dict[str, Any]", extra) if isinstance(extra, dict) else {}
    return info.is_required() or marks.get(NULLABLE_KEY) is True


def _unset_nones(value: Any) -> dict[Any, Any]:
    """The ``exclude`` tree for model_dump: every None the caller set where it means "not given"."""
    if isinstance(value, RootModel):
        return _unset_nones(value.root)  # pyright: ignore[reportUnknownMemberType]
    if isinstance(value, BaseModel):
        cls = type(value)
        out: dict[Any, Any] = {}
        for name in value.model_fields_set:
            if name not in cls.model_fields:
                continue
            item = getattr(value, name)
            if item is None and not _nullable(cls, name):
                out[name] = True
            elif inner := _unset_nones(item):
                out[name] = inner
        for key, item in (value.__pydantic_extra__ or {}).items():
            if inner := _unset_nones(item):
                out[key] = inner
        return out
    if isinstance(value, list | tuple):
        items: list[Any] | tuple[Any, ...] = value  # pyright: ignore[reportUnknownVariableType]
        return {i: inner for i, item in enumerate(items) if (inner := _unset_nones(item))}
    if isinstance(value, dict):
        entries: dict[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
        return {k: inner for k, item in entries.items() if (inner := _unset_nones(item))}
    return {}


def _declared(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _closest(key: str, declared: list[str]) -> str:
    close = difflib.get_close_matches(key, declared, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"declared: {', '.join(map(repr, declared))}" if declared else "it declares no keys"


def _where(path: tuple[Any, ...]) -> str:
    return f" in {'.'.join(map(str, path))}" if path else ""


def _find_undeclared(value: Any, path: tuple[Any, ...], into: list[str]) -> None:
    if isinstance(value, RootModel):
        _find_undeclared(value.root, path, into)  # pyright: ignore[reportUnknownMemberType]
    elif isinstance(value, BaseModel):
        cls = type(value)
        extra = value.__pydantic_extra__ or {}
        # A schema that types its extra keys (additionalProperties: {...}) expects them: no warning.
        typed = _EXTRA_FIELD in getattr(cls, "__annotations__", {})
        into.extend(
            f"{key!r}{_where(path)} is not an argument the tool declares ({_closest(key, _declared(cls))})"
            for key in (extra if not typed else ())
        )
        for name in value.model_fields_set:
            if name in cls.model_fields:
                _find_undeclared(getattr(value, name), (*path, cls.model_fields[name].alias or name), into)
    elif isinstance(value, list | tuple):
        items: list[Any] | tuple[Any, ...] = value  # pyright: ignore[reportUnknownVariableType]
        for i, item in enumerate(items):
            _find_undeclared(item, (*path, i), into)
    elif isinstance(value, dict):
        entries: dict[Any, Any] = value  # pyright: ignore[reportUnknownVariableType]
        for k, item in entries.items():
            _find_undeclared(item, (*path, k), into)


def _models_in(annotation: Any, into: list[type[BaseModel]], depth: int = 0) -> None:
    if depth > 8:
        return
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if issubclass(annotation, RootModel):
            _models_in(annotation.model_fields["root"].annotation, into, depth + 1)
        elif annotation not in into:
            into.append(annotation)
        return
    for arg in get_args(annotation):
        _models_in(arg, into, depth + 1)


def _models_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The model classes an error location may point into (best effort: unions give several)."""
    current: list[type[BaseModel]] = [model]
    for part in path:
        found: list[type[BaseModel]] = []
        for cls in current:
            for name, info in cls.model_fields.items():
                if part in (name, info.alias):
                    _models_in(info.annotation, found)
        if found:
            current = found
        # Otherwise the part is a list index, a dict key or a union member's tag: stay.
    return current


def _suggesting(exc: ValidationError, model: type[BaseModel]) -> ValidationError:
    """``exc`` with each undeclared key's error naming the closest declared key."""
    errors = exc.errors()
    if not any(e["type"] == "extra_forbidden" for e in errors):
        return exc
    details: list[InitErrorDetails] = []
    notes: list[str] = []
    for error in errors:
        loc = error["loc"]
        if error["type"] == "extra_forbidden" and loc:
            declared = sorted({k for cls in _models_at(model, loc[:-1]) for k in _declared(cls)})
            message = (
                f"not an argument the tool declares, and it accepts no others ({_closest(str(loc[-1]), declared)})"
            )
            notes.append(f"{'.'.join(map(str, loc))}: {message}")
            kind = PydanticCustomError("extra_forbidden", "{message}", {"message": message})
            details.append({"type": kind, "loc": loc, "input": error["input"]})
        else:
            details.append({"type": error["type"], "loc": loc, "input": error["input"], "ctx": error.get("ctx", {})})
    try:
        return ValidationError.from_exception_data(exc.title, details)
    except (KeyError, TypeError, ValueError):
        # An error type that cannot be rebuilt: keep the original, with the suggestions as notes.
        for note in notes:
            exc.add_note(note)
        return exc
