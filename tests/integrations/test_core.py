"""The adapters' shared core: instructions with stubs, payloads, decisions, re-attach and replay.

Real kernel in the real sandbox, the project's test MCP server; the "framework" here is a decide
function that ends a tool body the way an interrupt does, by raising.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

import anyio
import pytest

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutor,
    Execution,
    ExecutionError,
    ExecutionLost,
    UsageError,
)
from ipybox.integrations._core import (
    ActionOutcome,
    ApprovalPayload,
    Durable,
    check_answers,
    describe_tools,
    drive,
    parse_decision,
    search_stubs,
    start_or_attach,
    tool_instructions,
)

pytestmark = pytest.mark.anyio


class Paused(Exception):
    """Stands for a framework's interrupt: it ends the tool body and leaves the execution paused."""


def interrupting(answers: dict[str, ApprovalDecision]):
    """A decide function that answers from ``answers`` by request id, and 'interrupts' otherwise."""
    asked: list[ApprovalPayload] = []

    async def decide(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
        asked.append(payload)
        if request.id in answers:
            return answers[request.id]
        raise Paused(payload)

    return decide, asked


TWO_CALLS = (
    "from ipybox_kernel import ToolCallRejected\n"
    "from mcptools.test import greet, add\n"
    "with open('side_effect.txt', 'a') as f:\n    f.write('ran\\n')\n"
    "print('before', flush=True)\n"
    "print(greet.run({'name': 'a'}), flush=True)\n"
    "try:\n"
    "    print(add.run({'a': 1, 'b': 2}))\n"
    "except ToolCallRejected as e:\n"
    "    print('rejected:', e.reason)\n"
)


async def test_the_instructions_carry_the_stubs_of_the_generated_tools(tools_dir: Path, tmp_path: Path) -> None:
    text = tool_instructions(tools_dir)
    assert "stateful" in text and "ToolCallRejected" in text
    assert "class greet:" in text and "def run(params: Params)" in text
    # Without generated tools the text describes the kernel alone.
    alone = tool_instructions(tmp_path / "missing")
    assert "mcptools" not in alone and alone.startswith("Run Python code")
    assert tool_instructions(None) == alone


def large_catalogue(tools_dir: Path, root: Path, copies: int) -> Path:
    """``root/mcptools`` with the test server's package under ``copies`` package names."""
    large = root / "mcptools"
    for number in range(copies):
        shutil.copytree(tools_dir / "test", large / f"test_{number}")
    return large


async def test_a_catalogue_over_the_prompt_limit_shows_only_names_and_points_to_the_search(
    tools_dir: Path, tmp_path: Path
) -> None:
    # The test server's stubs are ~3,000 characters: twelve copies pass the 32,000 of "auto".
    large = large_catalogue(tools_dir, tmp_path, 12)
    text = describe_tools(large, search_tool="search_tools")
    assert text.catalogue == "summary" and text.needs_search
    assert "class greet:" not in text.text and "mcptools.test_11: add, compute_stats" in text.text
    assert "call the `search_tools` tool" in text.text
    # Without a search tool next to the code tool, the text sends the model to the kernel's search.
    alone = tool_instructions(large)
    assert "`search_tools` tool" not in alone and "from ipybox_kernel import search_tools" in alone
    assert describe_tools(large, catalogue="stubs").catalogue == "stubs"
    small = describe_tools(tools_dir, search_tool="search_tools")
    assert small.catalogue == "stubs" and "class greet:" in small.text and "search_tools" not in small.text
    summary = describe_tools(tools_dir, catalogue="summary", servers=["test"])
    assert summary.catalogue == "summary" and "mcptools.test: add" in summary.text
    assert describe_tools(tmp_path / "missing", catalogue="summary").catalogue is None
    with pytest.raises(UsageError, match="'auto', 'stubs' or 'summary'"):
        describe_tools(tools_dir, catalogue="all")  # pyright: ignore[reportArgumentType]


async def test_the_search_answers_with_the_stubs_of_the_best_matches_or_says_why_not(tools_dir: Path) -> None:
    found = await search_stubs(tools_dir, "add two numbers", 2)
    assert "class add:" in found and "def run(params: Params)" in found
    assert "class crash:" not in found
    assert "no words" in await search_stubs(tools_dir, "the of", 3)
    assert "No tool matches" in await search_stubs(tools_dir, "zebra xylophone", 3)
    assert "No tool matches" in await search_stubs(tools_dir, "add two numbers", 3, servers=["other"])


async def test_a_tool_body_run_once_per_approval_runs_the_code_once(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    (module_workspace / "side_effect.txt").unlink(missing_ok=True)
    answers: dict[str, ApprovalDecision] = {}
    shown: list[str] = []
    runs = 0

    async def show(chunk: CodeExecutionChunk) -> None:
        shown.append(chunk.text)

    executions: list[Execution] = []

    async def tool_body() -> ActionOutcome:
        nonlocal runs
        runs += 1
        execution = start_or_attach(executor, "core:thread-1:call-1", TWO_CALLS, approval="ask")
        executions.append(execution)
        decide, _ = interrupting(answers)
        return await drive(execution, decide, on_output=show)

    outcome: ActionOutcome | None = None
    with anyio.fail_after(60):
        while outcome is None:
            try:
                outcome = await tool_body()
            except Paused as paused:
                payload: ApprovalPayload = paused.args[0]
                answers[payload.request_id] = ApprovalDecision(
                    approved=payload.tool == "greet", reason=None if payload.tool == "greet" else "not now"
                )
    assert runs == 3
    assert outcome.error is None
    assert outcome.text == "before\nHello, a!\nrejected: not now\n"
    assert shown == ["before\n", "Hello, a!\n", "rejected: not now\n"]  # nothing shown twice
    assert (module_workspace / "side_effect.txt").read_text() == "ran\n"
    # The adapter's answers are marked as the adapter's, whatever the framework's shape was.
    assert executions[0] is executions[-1]
    decided = [event.decision for event in executions[0].log if isinstance(event, ApprovalRequest) and event.decision]
    assert [(d.approved, d.reason, d.by) for d in decided] == [(True, None, "adapter"), (False, "not now", "adapter")]


async def test_the_payload_is_plain_json_naming_what_the_host_will_run(executor: CodeExecutor) -> None:
    execution = start_or_attach(executor, "core:payload", "from mcptools.test import greet\ngreet.run({'name': 'p'})")
    decide, asked = interrupting({})
    with anyio.fail_after(30), pytest.raises(Paused):
        await drive(execution, decide)
    data = asked[0].to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["name"] == "test.greet" and data["args"] == {"name": "p"}
    assert data["request_id"] == f"{execution.id}:1"
    assert "test_server.py" in data["description"]
    assert data["description"] == asked[0].description and '\n  "name": "p"' in data["description"]
    assert data["undeclared_args"] == [] and isinstance(data["arguments_checked"], bool)
    assert data["call_site"] == {"line": 2, "text": "greet.run({'name': 'p'})", "module": None}
    assert asked[0].call_name == "test__greet"
    execution.cancel()


async def test_a_resume_whose_executor_was_replaced_reports_lost_and_runs_nothing(
    tools_dir: Path, workspace: Path
) -> None:
    code = (
        "with open('ran.txt', 'a') as f:\n    f.write('x')\n"
        "from mcptools.test import greet\ngreet.run({'name': 'gone'})"
    )
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as first:
        execution = start_or_attach(first, "core:replaced", code)
        decide, _ = interrupting({})
        with anyio.fail_after(30), pytest.raises(Paused):
            await drive(execution, decide)
    assert (workspace / "ran.txt").read_text() == "x"
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as second:
        with pytest.raises(ExecutionLost):
            start_or_attach(second, "core:replaced", code)
        assert (await second.execute("import os; os.path.getsize('ran.txt')")).text == "1\n"


async def test_a_decision_for_another_request_cancels_and_reports_lost(executor: CodeExecutor) -> None:
    execution = start_or_attach(executor, "core:mismatch", "from mcptools.test import greet\ngreet.run({'name': 'm'})")

    async def decide(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
        # An answer that names another request, checked at the adapter's edge.
        check_answers(execution, request, "x0:1")
        return ApprovalDecision(approved=True)

    with anyio.fail_after(30):
        outcome = await drive(execution, decide)
        assert isinstance(outcome.error, ExecutionLost)
        assert outcome.text.startswith("execution lost, nothing was re-run")
        # The paused code is stopped, and the kernel is free for the next action.
        with pytest.raises(ExecutionError):
            await execution


async def test_a_code_error_becomes_an_outcome_with_the_clean_traceback(executor: CodeExecutor) -> None:
    execution = start_or_attach(executor, "core:error", "print('partial')\n1 / 0")
    decide, _ = interrupting({})
    with anyio.fail_after(30):
        outcome = await drive(execution, decide)
    assert isinstance(outcome.error, CodeExecutionError)
    assert outcome.text.startswith("partial\n") and "ZeroDivisionError" in outcome.text
    assert "ipybox_kernel" not in outcome.text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"type": "approve"}, (ApprovalDecision(approved=True), None)),
        ({"type": "reject", "message": "no"}, (ApprovalDecision(approved=False, reason="no"), None)),
        ({"type": "reject", "request_id": "x1:2"}, (ApprovalDecision(approved=False), "x1:2")),
        (True, (ApprovalDecision(approved=True), None)),
        (ApprovalDecision(approved=False, reason="r"), (ApprovalDecision(approved=False, reason="r"), None)),
    ],
)
def test_decisions_are_read_from_the_shapes_people_resume_with(
    value: object, expected: tuple[ApprovalDecision, str | None]
) -> None:
    # The frameworks' "message" is the one vocabulary's reason.
    assert parse_decision(value) == expected


@pytest.mark.parametrize(
    "value", ["approve", {"type": "edit"}, {"type": "reject", "message": 3}, {"type": "approve", "extra": 1}, None]
)
def test_anything_else_is_a_usage_error_showing_the_accepted_shapes(value: object) -> None:
    with pytest.raises(UsageError, match=r"\{'type': 'approve'\}"):
        parse_decision(value)


def test_durable_approvals_need_a_secret_of_32_bytes_and_a_ttl() -> None:
    secret = secrets.token_bytes(32)
    assert Durable.of(None, 60) is None
    assert Durable.of(secret, 60) == Durable(secret=secret, hold=60.0)
    with pytest.raises(UsageError, match="32"):
        Durable.of(b"a password", 60)
    with pytest.raises(UsageError, match="need a ttl"):
        Durable.of(secret, None)
