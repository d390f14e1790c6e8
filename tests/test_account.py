"""The account of each code action (its tool calls counted and timed by the host) on its result and its
span, and the budgets of `Limits` (tool calls per code action, total approval wait) past which calls
fail in the kernel with `ToolCallBudgetExceeded`: on a real sandboxed kernel and the in-process one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approval_support import collect
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ipybox import ActionAccount, ApprovalRules, CodeExecutor, Limits, Tracing
from ipybox._engine._tracing import ACTION_SPAN
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

CALLS = (
    "from ipybox_kernel import ToolCallError, call_tool\n"
    "outcome = []\n"
    "for tool, args in {calls}:\n"
    "    try:\n        call_tool('test', tool, args)\n        outcome.append('ran')\n"
    "    except ToolCallError as e:\n        outcome.append(type(e).__name__)\n"
    "import json; print(json.dumps(outcome))"
)
MIXED = CALLS.format(
    calls="[('add', {'a': 1, 'b': 2}), ('greet', {'name': 'x'}), ('delete_item', {'item_id': 'i'}), "
    "('fail', {'message': 'boom'})]"
)
RULES = ApprovalRules(allow=["test.add", "test.fail"], deny=["test.delete_*"], otherwise="ask")


@pytest.fixture(params=["sandboxed", "in_process"])
def kernel_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def executor_for(kind: str, workspace: Path, tools_dir: Path, **options: object) -> CodeExecutor:
    if kind == "in_process":
        options = {"kernel": InProcessKernel(), "sandbox": None, **options}
    return CodeExecutor(workspace=workspace, tools_dir=tools_dir, **options)  # pyright: ignore[reportArgumentType]


async def test_the_result_and_the_span_account_for_the_calls(
    kernel_kind: str, tools_dir: Path, workspace: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider)
    async with executor_for(kernel_kind, workspace, tools_dir, approval=RULES, tracing=tracing) as executor:
        [asked], result = await collect(executor, MIXED)
        nothing = await executor.execute("1 + 1")
    assert asked.tool_name == "greet"
    assert json.loads(result.text) == ["ran", "ran", "ToolCallRejected", "ToolExecutionError"]
    account = result.account
    assert (account.tool_calls, account.approved, account.rejected) == (4, 3, 1)
    assert account.approval_wait > 0 and account.tool_time > 0
    assert nothing.account == ActionAccount(output_bytes=1)  # each code action counts its own: '2'
    action = next(span for span in exporter.get_finished_spans() if span.name == ACTION_SPAN)
    attributes = dict(action.attributes or {})
    assert attributes["ipybox.tool_calls"] == 4
    assert attributes["ipybox.tool_calls.approved"] == 3
    assert attributes["ipybox.tool_calls.rejected"] == 1
    assert attributes["ipybox.approval.wait_total"] == account.approval_wait
    assert attributes["ipybox.tool.time_total"] == account.tool_time


async def test_the_account_counts_the_bytes_of_output_the_host_received(
    kernel_kind: str, tools_dir: Path, workspace: Path
) -> None:
    code = (
        "import sys\nfrom IPython.display import display\n"
        "print('\u00e9' * 10)\n"  # 10 two-byte characters and a newline: 21 bytes
        "sys.stderr.write('warn!')\nsys.stderr.flush()\n"  # 5 bytes
        "display({'text/plain': 'ab', 'application/json': {'k': 1}}, raw=True)\n"  # 'ab' and '{"k": 1}': 10
        "'\u20ac'"  # the result '€', shown as its repr: "'€'", 5 bytes
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with executor_for(kernel_kind, workspace, tools_dir, tracing=Tracing(tracer_provider=provider)) as executor:
        result = await executor.execute(code)
    assert result.text.count("\u00e9") == 10 and "warn!" in result.text
    assert result.account.output_bytes == 21 + 5 + 10 + 5
    action = next(span for span in exporter.get_finished_spans() if span.name == ACTION_SPAN)
    assert dict(action.attributes or {})["ipybox.output.bytes_total"] == 41


async def test_calls_past_the_tool_call_budget_fail_in_the_kernel_and_the_next_action_starts_afresh(
    kernel_kind: str, tools_dir: Path, workspace: Path
) -> None:
    code = CALLS.format(calls="[('add', {'a': 1, 'b': 2})] * 4")
    limits = Limits(tool_calls=2)
    async with executor_for(kernel_kind, workspace, tools_dir, approval="auto", limits=limits) as executor:
        first = await executor.execute(code)
        second = await executor.execute(code)
        message = await executor.execute(
            "from ipybox_kernel import call_tool, ToolCallBudgetExceeded\n"
            "for _ in range(3):\n"
            "    try:\n        call_tool('test', 'add', {'a': 1, 'b': 1})\n"
            "    except ToolCallBudgetExceeded as e:\n        print(e.message)"
        )
    expected = ["ran", "ran", "ToolCallBudgetExceeded", "ToolCallBudgetExceeded"]
    assert json.loads(first.text) == json.loads(second.text) == expected
    assert (first.account.tool_calls, first.account.approved, first.account.rejected) == (4, 2, 2)
    assert "Limits.tool_calls=2" in message.text and "was not made" in message.text


async def test_the_approval_wait_budget_bounds_the_wait_and_then_refuses_calls(
    tools_dir: Path, workspace: Path
) -> None:
    # Nobody answers: the first asked call waits what the budget allows, the next is refused unasked.
    code = CALLS.format(calls="[('greet', {'name': 'x'}), ('greet', {'name': 'y'}), ('add', {'a': 1, 'b': 2})]")
    limits = Limits(approval_wait=1)
    async with executor_for("in_process", workspace, tools_dir, approval=RULES, limits=limits) as executor:
        execution = executor.execute(code)
        events = [event async for event in execution]  # seen, never answered
        result = await execution
    assert json.loads(result.text) == ["ToolCallRejected", "ToolCallBudgetExceeded", "ToolCallBudgetExceeded"]
    assert [type(event).__name__ for event in events].count("ApprovalRequest") == 1
    assert result.account.approval_wait >= 1
    assert (result.account.tool_calls, result.account.approved, result.account.rejected) == (3, 0, 3)


def test_budgets_must_be_positive_whole_numbers() -> None:
    from ipybox import UsageError

    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match=r"Limits\.tool_calls"):
            Limits(tool_calls=bad)  # pyright: ignore[reportArgumentType]
        with pytest.raises(UsageError, match=r"Limits\.approval_wait"):
            Limits(approval_wait=bad)  # pyright: ignore[reportArgumentType]
