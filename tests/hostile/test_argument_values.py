"""Argument values are checked against the tool's input schema before anyone is asked, and a schema
built to hang or crash the host (catastrophic regexes, exponential ``anyOf``, self references, huge or
deep schemas) costs the host a bounded moment and refuses the call with a reason the code sees.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from schemacheck_support import record_preparations

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, StdioServer
from ipybox._mcp import _schemacheck

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).with_name("schema_server.py")
# A text or key of "a"s ending in a mismatch: Python's backtracking re takes 2**n steps on it.
LONG = "a" * 5_000 + "!"


def nested(depth: int) -> object:
    value: object = ["s"]
    for _ in range(depth):
        value = [value, "s"]
    return value


# (tool, arguments, whether the host asks; else a phrase of the refusal the kernel code sees)
CALLS: list[tuple[str, dict[str, object], str | None]] = [
    ("strict", {"count": 11}, "11 is greater than the maximum of 10"),
    ("strict", {"count": "3"}, "'3' is not of type 'integer'"),
    ("strict", {"count": 3, "mode": "delete"}, "is not one of ['read', 'write']"),
    ("strict", {"count": 3, "tags": ["a", "a"]}, "repeated items"),
    ("strict", {"count": 3, "mode": "read", "tags": ["a", "b"]}, None),
    ("redos", {"s": LONG}, "does not match the pattern"),
    ("redos", {"s": "aaaa"}, None),
    ("redos_keys", {LONG: 1}, "keys the schema does not allow"),
    ("redos_loose", {LONG: 1}, None),
    ("explode", {"x": nested(40)}, "took more than ipybox allows"),
    ("self_ref", {}, "took more than ipybox allows"),
    ("deep", {}, "nested deeper than ipybox's limit"),
    ("huge", {}, "over ipybox's limit"),
    ("remote_ref", {"x": 1}, None),  # a $ref ipybox does not fetch: left to the server
    ("redos_output", {"s": "aaaa"}, None),
]

CODE = """
import json
from ipybox_kernel import ToolCallError, call_tool
for tool, arguments in json.loads({calls!r}):
    try:
        print(json.dumps(['ran', json.loads(call_tool('schemas', tool, arguments).text)['tool']]))
    except ToolCallError as e:
        print(json.dumps([type(e).__name__, str(e)]))
"""


@pytest.fixture
async def ex(tmp_path: Path) -> AsyncGenerator[CodeExecutor]:
    (tmp_path / "work").mkdir()
    async with CodeExecutor(workspace=tmp_path / "work", approval="ask") as executor:
        executor.register_mcp_server("schemas", StdioServer(command=sys.executable, args=(str(SERVER),)))
        yield executor


async def accept_all(executor: CodeExecutor, code: str) -> tuple[list[ApprovalRequest], CodeExecutionResult]:
    requests: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    with anyio.fail_after(180):  # Python's re would take longer than the universe on LONG
        async for event in executor.execute(code):
            if isinstance(event, ApprovalRequest):
                requests.append(event)
                await event.accept()
            elif isinstance(event, CodeExecutionResult):
                result = event
    assert result is not None
    return requests, result


async def test_values_that_do_not_fit_the_schema_and_hostile_schemas_are_refused_before_anyone_is_asked(
    ex: CodeExecutor,
) -> None:
    # The first call to a server is asked about before it was ever listed (ipybox starts servers
    # for approved calls only); from then on its schemas are known.
    requests, warm = await accept_all(ex, CODE.format(calls=json.dumps([["strict", {"count": 1}]])))
    assert [r.tool_name for r in requests] == ["strict"] and json.loads(warm.text) == ["ran", "strict"]

    calls = [[tool, arguments] for tool, arguments, _ in CALLS]
    requests, result = await accept_all(ex, CODE.format(calls=json.dumps(calls)))
    outcomes = [json.loads(line) for line in result.text.splitlines()]
    assert len(outcomes) == len(CALLS), result.text
    for (tool, _, refusal), (kind, text) in zip(CALLS, outcomes, strict=True):
        if refusal is None:
            assert (kind, text) == ("ran", tool)
        else:
            assert kind == "ToolCallError" and refusal in text and "The call was not made" in text, (tool, text)
    # Only what fits was asked about; a key only a catastrophic pattern could declare is flagged,
    # worked out in linear time.
    assert [r.tool_name for r in requests] == [tool for tool, _, refusal in CALLS if refusal is None]
    loose = next(r for r in requests if r.tool_name == "redos_loose")
    assert loose.undeclared_args == (LONG,)
    assert "[UNDECLARED" in loose.description


async def test_a_structured_result_built_for_a_catastrophic_output_pattern_is_refused_without_hanging_the_host(
    ex: CodeExecutor,
) -> None:
    # The server lists an output schema with a backtracking pattern and returns a text built for it;
    # the MCP SDK's own check (Python's re, in the host's event loop) would never finish.
    code = CODE.format(calls=json.dumps([["redos_output", {"s": LONG}], ["redos_output", {"s": "aa"}]]))
    requests, result = await accept_all(ex, code)
    refused, fine = (json.loads(line) for line in result.text.splitlines())
    assert refused[0] == "ToolExecutionError" and "does not match the pattern" in refused[1], refused
    assert fine == ["ran", "redos_output"]
    assert [r.tool_name for r in requests] == ["redos_output", "redos_output"]


async def test_calls_to_a_listed_tool_check_against_a_validator_made_once(
    ex: CodeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, warm = await accept_all(ex, CODE.format(calls=json.dumps([["strict", {"count": 1}]])))
    assert json.loads(warm.text) == ["ran", "strict"]
    prepared = record_preparations(monkeypatch)
    calls = [["strict", {"count": n}] for n in range(5)] + [["strict", {"count": 11}]]
    requests, result = await accept_all(ex, CODE.format(calls=json.dumps(calls)))
    lines = [json.loads(line) for line in result.text.splitlines()]
    assert lines[:5] == [["ran", "strict"]] * 5 and "greater than the maximum" in lines[5][1]
    assert len(requests) == 5
    # Six checks before approval, against the schema the warm-up call listed: none made a validator.
    assert prepared == []


async def test_a_new_listing_replaces_the_kept_checks_of_the_old_one(
    ex: CodeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = record_preparations(monkeypatch)
    _, warm = await accept_all(ex, CODE.format(calls=json.dumps([["strict", {"count": 1}]])))
    assert json.loads(warm.text) == ["ran", "strict"] and len(prepared) == 1
    # A tool the listing lacks makes the tool server list the server's tools again.
    calls: list[list[object]] = [["no_such_tool", {}], ["strict", {"count": 2}], ["strict", {"count": 3}]]
    _, result = await accept_all(ex, CODE.format(calls=json.dumps(calls)))
    lines = [json.loads(line) for line in result.text.splitlines()]
    assert "has no tool named 'no_such_tool'" in lines[0][1] and lines[1:] == [["ran", "strict"]] * 2
    # The new listing's schema is a new object, prepared once; the old one's entry is dropped.
    old, new = prepared
    assert old == new and old is not new
    held = [entry.schema for entry in _schemacheck._CHECKS._entries.values()]
    assert any(schema is new for schema in held) and not any(schema is old for schema in held)
