"""OpenTelemetry spans of code actions and their tool calls, read back from the SDK's in-memory
exporter: a real sandboxed kernel and the in-process test kernel calling the project's test MCP
server over stdio, with approved, asked, rejected and failing calls."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_support import collect
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from tracing_support import provider_for

from ipybox import ApprovalRules, CodeExecutionError, CodeExecutor, Tracing
from ipybox._engine._tracing import ACTION_SPAN, MAX_ATTRIBUTE_CHARS
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

# add: allowed by the rules; greet: left to a person (accepted); delete_item: denied; fail: allowed, the tool errs.
CALLS = (
    "from ipybox_kernel import ToolCallError, call_tool\n"
    "outcome = {}\n"
    "for tool, args in [('add', {'a': 1, 'b': 2}), ('greet', {'name': 'trace'}), ('delete_item', {'item_id': 'i'}),"
    " ('fail', {'message': 'boom'})]:\n"
    "    try:\n        call_tool('test', tool, args)\n        outcome[tool] = 'ran'\n"
    "    except ToolCallError as e:\n        outcome[tool] = type(e).__name__\n"
    "import json; print(json.dumps(outcome))"
)
RULES = ApprovalRules(allow=["test.add", "test.fail"], deny=["test.delete_*"], otherwise="ask")
EXPECTED = {"add": "ran", "greet": "ran", "delete_item": "ToolCallRejected", "fail": "ToolExecutionError"}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture(params=["sandboxed", "in_process"])
def kernel_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def executor_for(
    kind: str, workspace: Path, tools_dir: Path, exporter: InMemorySpanExporter, *, values: bool = False
) -> CodeExecutor:
    tracing = Tracing(tracer_provider=provider_for(exporter), values=values)
    if kind == "in_process":
        return CodeExecutor(
            workspace=workspace,
            tools_dir=tools_dir,
            approval=RULES,
            kernel=InProcessKernel(),
            sandbox=None,
            tracing=tracing,
        )
    return CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=RULES, tracing=tracing)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def action_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == ACTION_SPAN]


def tool_spans(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {
        attributes(span)["gen_ai.tool.name"]: span
        for span in exporter.get_finished_spans()
        if span.name.startswith("execute_tool ")
    }


async def test_a_code_action_is_a_span_with_a_child_span_per_tool_call(
    kernel_kind: str, tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter
) -> None:
    async with executor_for(kernel_kind, workspace, tools_dir, exporter) as executor:
        [asked], result = await collect(executor, CALLS)
    assert json.loads(result.text) == EXPECTED
    execution_id = asked.id.split(":")[0]
    [action] = action_spans(exporter)
    assert action.parent is None  # nothing was current where execute() was called
    code = CALLS.encode()
    assert attributes(action) == {
        "ipybox.execution.id": execution_id,
        "ipybox.code.size": len(code),
        "ipybox.code.sha256": hashlib.sha256(code).hexdigest(),
        "ipybox.execution.outcome": "ok",
        "ipybox.output.chars": len(result.text),
        "ipybox.output.truncated_chars": 0,
        "ipybox.tool_calls": 4,
        "ipybox.tool_calls.approved": 3,
        "ipybox.tool_calls.rejected": 1,
        "ipybox.approval.wait_total": result.account.approval_wait,
        "ipybox.tool.time_total": result.account.tool_time,
        "ipybox.network.connections": 0,  # no network
        "ipybox.network.bytes_total": 0,
        "ipybox.output.bytes_total": len(result.text.encode()),  # its one print, all kept
    }
    calls = tool_spans(exporter)
    assert list(calls) == ["add", "greet", "delete_item", "fail"]
    assert [span.name for span in calls.values()] == [f"execute_tool {tool}" for tool in calls]
    assert action.context is not None
    for number, (tool, span) in enumerate(calls.items(), start=1):
        assert span.parent is not None and span.parent.span_id == action.context.span_id, tool
        assert span.context is not None and span.context.trace_id == action.context.trace_id
        assert span.start_time is not None and action.start_time is not None and span.start_time >= action.start_time
        assert span.end_time is not None and action.end_time is not None and span.end_time <= action.end_time
        attrs = attributes(span)
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.call.id"] == f"{execution_id}:{number}"
        assert attrs["ipybox.mcp.server"] == "test"
        assert attrs["ipybox.mcp.transport"] == "stdio"
        assert attrs["ipybox.approval.wait"] >= 0 and attrs["ipybox.tool.duration"] >= 0
        # Values only when the application opts in.
        assert "gen_ai.tool.call.arguments" not in attrs and "gen_ai.tool.call.result" not in attrs
    add, greet, delete, fail = (attributes(calls[tool]) for tool in ("add", "greet", "delete_item", "fail"))
    assert add["ipybox.approval.decision"] == "approved" and add["ipybox.approval.decided_by"] == "policy"
    assert add["ipybox.approval.policy"] == "ApprovalRules"
    assert calls["add"].status.status_code is StatusCode.UNSET and "error.type" not in add
    assert greet["ipybox.approval.decision"] == "approved" and greet["ipybox.approval.decided_by"] == "application"
    assert "ipybox.approval.policy" not in greet
    assert delete["ipybox.approval.decision"] == "rejected" and delete["ipybox.approval.decided_by"] == "policy"
    assert delete["error.type"] == "rejected" and calls["delete_item"].status.status_code is StatusCode.ERROR
    assert "ipybox.approval.reason" in delete
    assert fail["ipybox.approval.decision"] == "approved"
    assert fail["error.type"] == "tool_error" and calls["fail"].status.status_code is StatusCode.ERROR


async def test_values_are_recorded_only_when_the_application_opts_in(
    tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter
) -> None:
    code = "from ipybox_kernel import call_tool\ncall_tool('test', 'add', {'a': 20, 'b': 22})"
    async with executor_for("in_process", workspace, tools_dir, exporter, values=True) as executor:
        await collect(executor, code)
    add = attributes(tool_spans(exporter)["add"])
    assert json.loads(add["gen_ai.tool.call.arguments"]) == {"a": 20, "b": 22}
    assert "42" in add["gen_ai.tool.call.result"]


async def test_a_failed_code_action_says_so_and_bounds_the_kernels_error_name(
    tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter
) -> None:
    # The exception's class name is kernel code's choice: a long one is cut.
    name = "E" * (MAX_ATTRIBUTE_CHARS * 4)
    code = f"class {name}(Exception): pass\nprint('before')\nraise {name}('secret output')"
    async with executor_for("in_process", workspace, tools_dir, exporter) as executor:
        with pytest.raises(CodeExecutionError):
            await executor.execute(code)
    [action] = action_spans(exporter)
    attrs = attributes(action)
    assert attrs["ipybox.execution.outcome"] == "error"
    assert attrs["error.type"] == "CodeExecutionError"
    assert attrs["ipybox.code.error_name"].startswith("E" * MAX_ATTRIBUTE_CHARS)
    assert len(attrs["ipybox.code.error_name"]) < MAX_ATTRIBUTE_CHARS + 40
    assert action.status.status_code is StatusCode.ERROR
    assert "secret" not in (action.status.description or "")


async def test_a_code_action_nests_under_the_span_current_where_it_was_started(
    tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter
) -> None:
    provider = provider_for(exporter)
    tracing = Tracing(tracer_provider=provider)
    async with CodeExecutor(
        workspace=workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None, tracing=tracing
    ) as executor:
        with provider.get_tracer("agent").start_as_current_span("agent tool") as outer:
            execution = executor.execute("1 + 1", key="action-1")
        await execution
    [action] = action_spans(exporter)
    assert action.parent is not None and action.parent.span_id == outer.get_span_context().span_id
    assert attributes(action)["ipybox.execution.key"] == "action-1"


async def test_hostile_tool_names_are_bounded_on_spans(
    tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter
) -> None:
    # Kernel code names the server and the tool: unknown ones are refused, but still traced, cut.
    tool = "t\n" * 500  # 1,000 characters: within the request's bound, past the attribute's
    code = (
        "from ipybox_kernel import ToolCallError, call_tool\n"
        f"try:\n    call_tool('test', {tool!r})\nexcept ToolCallError as e:\n    print(type(e).__name__)"
    )
    async with executor_for("in_process", workspace, tools_dir, exporter) as executor:
        _, result = await collect(executor, code)
    assert result.text.strip()  # the call failed in the kernel, one way or another
    for span in exporter.get_finished_spans():
        for value in attributes(span).values():
            if isinstance(value, str):
                assert len(value) < MAX_ATTRIBUTE_CHARS + 40
        assert len(span.name) < 300


def test_without_an_sdk_the_global_tracer_is_a_no_op() -> None:
    # The default Tracing uses the global API, whose tracer records nothing until an SDK is set.
    from ipybox._engine._tracing import ActionTracer

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no test sets a global SDK
    span = ActionTracer(Tracing()).start_action(execution_id="x1", key=None, code="1", parent=None)
    assert not span.is_recording()
    span.end()


async def test_a_forged_execution_id_cannot_move_a_span_out_of_the_running_code_action(
    tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter
) -> None:
    # Kernel code sends a call that names another execution: it is refused as a stray call, and its
    # span stays under the code action that ran when it arrived, flagged as such.
    code = (
        "from ipybox_kernel import _client, _transport\n"
        "line = _transport.round_trip('test', 'add', {'a': 1, 'b': 2}, 'some-other-execution', None)\n"
        "try:\n    _client._parse_reply('test', 'add', line)\nexcept Exception as e:\n    print(type(e).__name__)"
    )
    async with executor_for("in_process", workspace, tools_dir, exporter) as executor:
        requests, result = await collect(executor, code)
    assert requests == [] and result.text.strip() == "ToolCallRejected"
    [action] = action_spans(exporter)
    [stray] = tool_spans(exporter).values()
    assert action.context is not None and stray.parent is not None
    assert stray.parent.span_id == action.context.span_id
    attrs = attributes(stray)
    assert attrs["ipybox.tool.call.stray"] is True and "gen_ai.tool.call.id" not in attrs
    assert attrs["ipybox.approval.decision"] == "rejected" and attrs["ipybox.approval.decided_by"] == "ipybox"
    assert attrs["error.type"] == "rejected"
