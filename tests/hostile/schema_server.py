"""An MCP server (stdio) whose input schemas are built to hang or crash a host that checks arguments
against them, next to one honest strict tool. Every tool answers with its arguments as JSON, so a
test sees what reached the server.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from approval_text_server import serve  # run as a script: its directory is on sys.path

# Backtracking regexes: exponential in the length of a text of "a"s that ends in a mismatch.
REDOS = "^(a+)+$"
REDOS_KEY = "^(a|a)*$"


def _nested_any_of() -> dict[str, Any]:
    # Every array level tried against two branches: 2**depth evaluations for a nested list.
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    node = {"anyOf": [branch, {**branch, "minItems": 1}, {"type": "integer"}]}
    return {"$defs": {"n": node}, "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}}


def _deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"x": node}}
    return node


def tools() -> list[types.Tool]:
    strict = {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": 0, "maximum": 10},
            "mode": {"enum": ["read", "write"]},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        "required": ["count"],
    }
    schemas: dict[str, dict[str, Any]] = {
        "strict": strict,
        "redos": {"type": "object", "properties": {"s": {"type": "string", "pattern": REDOS}}},
        "redos_keys": {"type": "object", "patternProperties": {REDOS_KEY: {}}, "additionalProperties": False},
        "redos_loose": {"type": "object", "patternProperties": {REDOS_KEY: {"type": "integer"}}},
        "explode": _nested_any_of(),
        "deep": _deep(70),
        "huge": {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": i} for i in range(60_000)}},
        "self_ref": {"$ref": "#", "type": "object"},
        "remote_ref": {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/schema.json"}}},
    }
    redos_output = {"type": "object", "properties": {"s": {"type": "string", "pattern": REDOS}}}
    return [
        *(types.Tool.model_validate({"name": name, "inputSchema": schema}) for name, schema in schemas.items()),
        # Echoes its arguments as its structured result, which the host checks against this schema.
        types.Tool.model_validate(
            {"name": "redos_output", "inputSchema": {"type": "object"}, "outputSchema": redos_output}
        ),
    ]


if __name__ == "__main__":
    anyio.run(serve, "hostile-schemas", tools)
