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
