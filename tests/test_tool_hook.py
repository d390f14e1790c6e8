"""Chained policies and the tool-call hook in a real sandboxed kernel, calling the project's test MCP
server: what the hook sees of approved, asked, denied and failing calls, and that it can neither
change a decision nor break a call."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from ipybox import (
    ApprovalChain,
    ApprovalRequest,
    ApprovalRules,
    CodeExecutionResult,
    CodeExecutor,
    ToolCallDecided,
    ToolCallEvent,
    ToolCallFinished,
    ToolCallRequested,
)

pytestmark = pytest.mark.anyio

# add: allowed by the rules; greet: left to a person; delete_item: denied; fail: allowed, the tool errs.
CALLS = (
    "from ipybox_kernel import ToolCallError, call_tool\n"
    "outcome = {}\n"
    "for tool, args in [('add', {'a': 1, 'b': 2}), ('greet', {'name': 'hook'}), ('delete_item', {'item_id': 'i'}),"
    " ('fail', {'message': 'boom'})]:\n"
    "    try:\n        call_tool('test', tool, args)\n        outcome[tool] = 'ran'\n"
    "    except ToolCallError as e:\n        outcome[tool] = type(e).__name__\n"
    "import json; print(json.dumps(outcome))"
)
RULES = ApprovalRules(allow=["test.add", "test.fail"], deny=["test.delete_*"])


async def run_answering(executor: CodeExecutor, code: str, *, key: str | None = None) -> CodeExecutionResult:
    """Run code, accepting every request that reaches the application as an event."""
    async for event in executor.execute(code, key=key):
        if isinstance(event, ApprovalRequest):
            await event.accept()
        elif isinstance(event, CodeExecutionResult):
            return event
    raise AssertionError("no result")


def by_call(events: list[ToolCallEvent]) -> dict[str, list[ToolCallEvent]]:
    calls: dict[str, list[ToolCallEvent]] = {}
    for event in events:
        calls.setdefault(event.tool, []).append(event)
    return calls


async def test_the_hook_sees_each_call_requested_decided_and_finished_under_a_chain(
    tools_dir: Path, workspace: Path
) -> None:
    events: list[ToolCallEvent] = []
    chain = ApprovalChain(RULES, "ask")
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=chain, on_tool_call=events.append) as ex:
        result = await run_answering(ex, CALLS, key="action-1")
    assert json.loads(result.text) == {
        "add": "ran",
        "greet": "ran",
        "delete_item": "ToolCallRejected",
        "fail": "ToolExecutionError",
    }
    calls = by_call(events)
    assert list(calls) == ["add", "greet", "delete_item", "fail"]
    for tool, (requested, decided, finished) in calls.items():
        assert isinstance(requested, ToolCallRequested)
        assert isinstance(decided, ToolCallDecided)
        assert isinstance(finished, ToolCallFinished)
        assert requested.server == "test" and requested.execution_key == "action-1"
        assert requested.call_id == decided.call_id == finished.call_id
        assert requested.call_id is not None and requested.call_id.startswith(f"{requested.execution_id}:"), tool
        assert decided.waited >= 0 and finished.duration >= 0
    add, greet, delete, fail = (calls[tool] for tool in ("add", "greet", "delete_item", "fail"))
    assert isinstance(add[0], ToolCallRequested) and dict(add[0].arguments) == {"a": 1, "b": 2}
    assert isinstance(add[1], ToolCallDecided) and (add[1].decision.by, add[1].policy) == ("policy", "ApprovalRules")
    assert isinstance(greet[1], ToolCallDecided)
    assert (greet[1].decision.approved, greet[1].decision.by, greet[1].policy) == (True, "application", None)
    assert isinstance(delete[1], ToolCallDecided) and not delete[1].decision.approved
    assert delete[1].decision.reason == "test.delete_item is denied by the approval rules"
    assert [e.error for e in (add[2], greet[2], delete[2], fail[2]) if isinstance(e, ToolCallFinished)] == [
        None,
        None,
        "rejected",
        "tool_error",
    ]


async def test_rules_then_a_callback_decide_without_asking_and_an_async_hook_is_awaited(
    tools_dir: Path, workspace: Path
) -> None:
    events: list[ToolCallEvent] = []
    asked: list[str] = []

    def person(request: ApprovalRequest) -> bool:
        asked.append(request.rule_name)
        return True

    async def hook(event: ToolCallEvent) -> None:
        await anyio.lowlevel.checkpoint()
        events.append(event)

    chain = ApprovalChain(RULES, person)
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=chain, on_tool_call=hook) as ex:
        result = await ex.execute(CALLS)  # awaited, not iterated: nothing may be left to ask
    assert json.loads(result.text)["greet"] == "ran"
    assert asked == ["test.greet"]
    decided = {e.tool: e for e in events if isinstance(e, ToolCallDecided)}
    assert (decided["greet"].decision.by, decided["greet"].policy) == ("callback", person.__qualname__)
    assert decided["add"].policy == "ApprovalRules"


async def test_a_hook_that_raises_changes_no_decision_and_breaks_no_call(tools_dir: Path, workspace: Path) -> None:
    seen: list[str] = []

    def broken(event: ToolCallEvent) -> None:
        seen.append(type(event).__name__)
        raise RuntimeError("the metrics backend is down")

    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=RULES, on_tool_call=broken) as ex:
        result = await ex.execute(CALLS.replace("('greet', {'name': 'hook'}), ", ""))
    assert json.loads(result.text) == {"add": "ran", "delete_item": "ToolCallRejected", "fail": "ToolExecutionError"}
    assert seen == ["ToolCallRequested", "ToolCallDecided", "ToolCallFinished"] * 3


async def test_an_executions_own_observer_sees_its_calls_only_until_it_stops(tools_dir: Path, workspace: Path) -> None:
    # Next to the executor's hook: an observer of one execution (what adapters put in their traces).
    hooked: list[ToolCallEvent] = []
    one = "from mcptools.test import add\nprint(add.run({'a': 1, 'b': 2}).result)"
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=RULES, on_tool_call=hooked.append) as ex:
        first = ex.execute(CALLS)
        seen: list[ToolCallEvent] = []
        first.on_tool_call(seen.append)
        await first
        second = ex.execute(one)
        stopped: list[ToolCallEvent] = []
        stop = second.on_tool_call(stopped.append)
        stop()
        stop()  # twice: harmless
        await second
    assert [(e.tool, type(e).__name__) for e in seen] == [
        (e.tool, type(e).__name__) for e in hooked if e.execution_id == first.id
    ]
    assert {e.tool for e in seen} == {"add", "greet", "delete_item", "fail"}
    assert any(e.execution_id == second.id for e in hooked) and stopped == []
