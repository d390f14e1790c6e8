"""A listed schema's check is prepared once (size, ``check_schema``, the validator) and kept by the
schema object, within bounds a server listing ever new or huge schemas cannot push past."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from schemacheck_support import record_preparations

from ipybox._mcp import _schemacheck
from ipybox._mcp._schemacheck import SchemaChecks, forget_schemas, schema_problem, value_problem


def strict_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"count": {"type": "integer", "maximum": 10}, "path": {"type": "string", "pattern": "^/"}},
        "required": ["count"],
    }


@pytest.fixture
def preparations(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[str, Any]]:
    return record_preparations(monkeypatch)


def test_a_second_check_against_the_same_schema_does_not_prepare_it_again(
    preparations: list[Mapping[str, Any]],
) -> None:
    schema = strict_schema()
    assert value_problem(schema, {"count": 1}) is None
    assert value_problem(schema, {"count": 11}) == '["count"]: 11 is greater than the maximum of 10'
    assert value_problem(schema, {"count": 1, "path": "relative"}) is not None
    assert preparations == [schema]


def test_an_equal_schema_of_a_new_listing_or_a_forgotten_one_is_prepared_anew(
    preparations: list[Mapping[str, Any]],
) -> None:
    listed, relisted = strict_schema(), strict_schema()
    value_problem(listed, {"count": 1})
    value_problem(relisted, {"count": 1})
    forget_schemas([listed, None])
    value_problem(listed, {"count": 1})
    value_problem(relisted, {"count": 1})
    assert [id(s) for s in preparations] == [id(listed), id(relisted), id(listed)]


def test_a_schema_made_for_one_check_is_not_kept(preparations: list[Mapping[str, Any]]) -> None:
    schema = strict_schema()
    for _ in range(2):
        assert schema_problem(schema, {"count": 11}, "input", "the answer", listed=False) is not None
    assert len(preparations) == 2


def test_verdicts_kept_for_hostile_schemas_stay_the_same() -> None:
    huge = {"type": "object", "description": "x" * (_schemacheck.MAX_SCHEMA_CHARS + 1)}
    invalid = {"type": "object", "properties": {"count": {"type": 12}}}
    # Every array level tried against two branches: 2**depth evaluations for a nested list.
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    node = {"anyOf": [branch, {**branch, "minItems": 1}, {"type": "integer"}]}
    explode = {"$defs": {"n": node}, "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}}
    value: object = ["s"]
    for _ in range(40):
        value = [value, "s"]
    for _ in range(2):
        assert "too large for ipybox to check" in str(value_problem(huge, {}))
        assert value_problem(invalid, {"count": "anything"}) is None  # no certain answer: the server checks
        # The step budget is per check, not per validator: the kept one is stopped again.
        assert "took more than ipybox allows" in str(value_problem(explode, {"x": value}))


def test_the_cache_is_bounded_by_count_and_by_size() -> None:
    checks = SchemaChecks(max_entries=8, max_chars=20_000)
    listings = [{**strict_schema(), "description": f"listing {i}"} for i in range(100)]
    for schema in listings:
        checks.get(schema)
    assert len(checks) == 8
    # The most recently used are kept.
    assert checks.get(listings[-1]) is checks.get(listings[-1])
    heavy = [{"type": "object", "description": "x" * 6_000, "title": str(i)} for i in range(10)]
    for schema in heavy:
        checks.get(schema)
    assert checks.chars <= 20_000 and len(checks) == 3
    # Heavier than the whole budget alone: prepared, never kept.
    too_heavy = {"type": "object", "description": "x" * 30_000}
    assert checks.get(too_heavy) is not checks.get(too_heavy)
    assert len(checks) == 3 and checks.chars <= 20_000


def test_many_listed_schemas_do_not_grow_the_shared_cache_past_its_bound() -> None:
    for i in range(600):
        value_problem({**strict_schema(), "title": f"tool {i}"}, {"count": 1})
    shared = _schemacheck._CHECKS
    assert len(shared) <= shared.max_entries and shared.chars <= shared.max_chars


# Schemas that say only types, keys and required keys: checked by their shape first.
SHAPED: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "title": "A"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "title": "addArguments",
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": ["string", "null"]}},
            "inner": {"type": "object", "properties": {"on": {"type": "boolean"}}, "additionalProperties": False},
            "any": {},
        },
    },
]
# Values of every JSON type and some Python ones a JSON parser never makes, in the places above.
VALUES: list[object] = [
    0,
    1,
    -3,
    1.0,
    1.5,
    float("nan"),
    True,
    False,
    None,
    "1",
    "",
    [],
    [1],
    ["x", None],
    {},
    {"on": True},
]


def _objects() -> list[object]:
    out: list[object] = [None, [], "x", {}, {"c": 1}, {1: 2}]
    for value in VALUES:
        for other in VALUES[:6]:
            out += [{"a": value, "b": other}, {"a": value}, {"a": other, "b": value, "c": 0}]
            out += [{"tags": value, "inner": other}, {"inner": value}, {"tags": [value, other]}, {"any": value}]
            out += [{"inner": {"on": value}}, {"inner": {"on": True, "off": value}}]
    return out


def test_a_shape_check_gives_the_validators_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value the shape lets through is one the validator lets through; every other one gets the
    validator's own verdict and message."""
    values = _objects()

    def verdict(schema: Mapping[str, Any], value: object) -> str | None:
        return schema_problem(schema, value, "output", "the structured result")

    verdicts = [[verdict(schema, value) for value in values] for schema in SHAPED]
    assert all(_schemacheck._CHECKS.get(schema).shape is not None for schema in SHAPED)

    def no_shape(schema: object) -> None:
        return None

    monkeypatch.setattr(_schemacheck, "_shape", no_shape)
    forget_schemas(SHAPED)
    assert all(_schemacheck._CHECKS.get(schema).shape is None for schema in SHAPED)
    assert verdicts == [[verdict(schema, value) for value in values] for schema in SHAPED]
    # Among them: JSON keeps booleans from numbers, and a closed object refuses other keys.
    assert verdict(SHAPED[0], {"a": True, "b": 0}) == "[\"a\"]: True is not of type 'integer'"
    assert verdict(SHAPED[1], {"a": 1, "b": 0, "c": 0}) is not None


def test_a_schema_that_says_more_than_a_shape_is_checked_by_the_validator_alone() -> None:
    draft3 = "http://json-schema.org/draft-03/schema#"
    draft4 = "http://json-schema.org/draft-04/schema#"
    schemas: list[dict[str, Any]] = [
        strict_schema(),  # maximum, pattern
        {"type": "object", "properties": {"x": {"enum": [1, 2]}}},
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "integer"}}},
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"type": "array", "items": [{"type": "integer"}]},  # a tuple of items, before 2020-12
        {"type": "object", "properties": {"x": False}},
        {"$schema": draft3, "type": "object", "properties": {"x": {"required": True}}},
        {"type": []},
        {"type": "object", "properties": {"x": {"type": "integer", "$schema": draft4}}},
    ]
    for schema in schemas:
        assert _schemacheck._CHECKS.get(schema).shape is None, schema


def test_a_value_too_large_for_a_shape_check_is_left_to_the_validators_budget() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}}
    assert value_problem(schema, {"xs": list(range(_schemacheck._SHAPE_NODES))}) is None
    assert "took more than ipybox allows" in str(value_problem(schema, {"xs": list(range(_schemacheck.MAX_STEPS))}))
    assert (
        value_problem(schema, {"xs": [*range(_schemacheck._SHAPE_NODES), True]})
        == "[\"xs\"][1000]: True is not of type 'integer'"
    )
