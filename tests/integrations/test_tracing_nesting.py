"""Each adapter's code action in its framework's own trace, read back with the framework's tooling:
PydanticAI's OpenTelemetry instrumentation (its tool span is the parent of the code action's span),
LangChain (the OpenTelemetry span current where the agent runs, LangChain itself has no OpenTelemetry
spans) and the OpenAI Agents SDK's own tracing (a custom span under the function span, recorded by a
`TracingProcessor`). The in-process kernel and the test MCP server; approvals by policy or by the run."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from agents import Agent as OpenAIAgent
from agents import Runner
from agents.testing import ScriptedModel as AgentsScriptedModel
from agents.testing import assistant_message, function_call
from agents.tracing import Span, Trace, TracingProcessor, get_trace_provider, set_trace_provider
from agents.tracing.provider import DefaultTraceProvider
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import DeferredToolRequests, DeferredToolResults, RunContext, ToolApproved
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.capabilities.instrumentation import Instrumentation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from tracing_support import provider_for

from ipybox import ApprovalRules, CodeExecutor, Tracing
from ipybox._engine._tracing import ACTION_SPAN
from ipybox.integrations.langchain import IpyboxTool
from ipybox.integrations.openai_agents import ipybox_tool
from ipybox.integrations.pydantic_ai import IpyboxToolset
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

CODE = "from mcptools.test import add\nprint(add.run({'a': 1, 'b': 2}).result)"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
async def executor(
    tools_dir: Path, workspace: Path, exporter: InMemorySpanExporter, request: pytest.FixtureRequest
) -> AsyncGenerator[CodeExecutor]:
    approval = cast("Any", getattr(request, "param", "auto"))
    tracing = Tracing(tracer_provider=provider_for(exporter))
    async with CodeExecutor(
        workspace=workspace,
        tools_dir=tools_dir,
        kernel=InProcessKernel(),
        sandbox=None,
        approval=approval,
        tracing=tracing,
    ) as executor:
        yield executor


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = [span for span in exporter.get_finished_spans() if span.name == name]
    return span


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and parent.context is not None and span.parent.span_id == parent.context.span_id


def assert_tool_call_under_action(exporter: InMemorySpanExporter) -> ReadableSpan:
    action = named(exporter, ACTION_SPAN)
    assert child_of(named(exporter, "execute_tool add"), action)
    return action


# -- PydanticAI ----------------------------------------------------------------------------------


def one_code_action(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(m, ModelResponse) and m.tool_calls for m in messages):
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("execute_code", {"code": CODE}, tool_call_id="call-1")])


async def test_pydantic_ai_a_code_action_is_a_child_of_the_agents_tool_span(
    executor: CodeExecutor, exporter: InMemorySpanExporter
) -> None:
    async def approve(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
        return DeferredToolResults(approvals={call.tool_call_id: ToolApproved() for call in requests.approvals})

    settings = InstrumentationSettings(tracer_provider=provider_for(exporter))
    agent = PydanticAgent(
        FunctionModel(one_code_action),
        toolsets=[IpyboxToolset(executor)],
        capabilities=[Instrumentation(settings), HandleDeferredToolCalls(handler=approve)],
    )
    with anyio.fail_after(60):
        result = await agent.run("go")
    assert result.output == "done"
    action = assert_tool_call_under_action(exporter)
    tool = named(exporter, "execute_tool execute_code")
    assert child_of(action, tool)
    assert dict(tool.attributes or {})["gen_ai.tool.call.id"] == "call-1"


async def test_pydantic_ai_a_run_that_resumes_a_paused_code_action_is_linked_from_the_actions_span(
    executor: CodeExecutor, exporter: InMemorySpanExporter
) -> None:
    # The MCP call ends the first run (DeferredToolRequests); the second run, with the approval, takes
    # the paused code action up again. A span's parent cannot change: the action stays under the first
    # run's tool span and says which span resumed it (a link and an event).
    settings = InstrumentationSettings(tracer_provider=provider_for(exporter))
    agent = PydanticAgent(
        FunctionModel(one_code_action),
        toolsets=[IpyboxToolset(executor)],
        capabilities=[Instrumentation(settings)],
        output_type=[str, DeferredToolRequests],
    )
    with anyio.fail_after(60):
        first = await agent.run("go")
        assert isinstance(first.output, DeferredToolRequests)
        results = DeferredToolResults(approvals={call.tool_call_id: ToolApproved() for call in first.output.approvals})
        second = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
    assert second.output == "done"
    action = assert_tool_call_under_action(exporter)
    code_tools = [span for span in exporter.get_finished_spans() if span.name == "execute_tool execute_code"]
    started, resumed = sorted(code_tools, key=lambda span: span.start_time or 0)
    assert child_of(action, started)
    assert resumed.context is not None
    assert [link.context.span_id for link in action.links] == [resumed.context.span_id]
    [event] = [event for event in action.events if event.name == "ipybox.resumed"]
    assert dict(event.attributes or {})["ipybox.resumed_by.span_id"] == f"{resumed.context.span_id:016x}"


# -- LangChain -----------------------------------------------------------------------------------


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's list-of-replies chat model, usable by `create_agent` (which binds tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


async def test_langchain_a_code_action_is_a_child_of_the_span_current_where_the_agent_runs(
    executor: CodeExecutor, exporter: InMemorySpanExporter
) -> None:
    # LangChain makes no OpenTelemetry spans; LangGraph's tasks carry the caller's context to the tool,
    # so whatever span is current there (the application's, an instrumentation's) is the parent.
    call = {"name": "execute_code", "args": {"code": CODE}, "id": "call-1", "type": "tool_call"}
    model = ScriptedModel(responses=[AIMessage("", tool_calls=[call]), AIMessage("done")])
    agent = cast("Any", create_agent(model, tools=[IpyboxTool(executor=executor, approval=None)]))
    with anyio.fail_after(60):
        with provider_for(exporter).get_tracer("app").start_as_current_span("agent turn"):
            await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]})
    action = assert_tool_call_under_action(exporter)
    assert child_of(action, named(exporter, "agent turn"))


# -- OpenAI Agents SDK ---------------------------------------------------------------------------


class Recorder(TracingProcessor):
    """Keeps every span the Agents SDK ends."""

    def __init__(self) -> None:
        self.spans: list[Span[Any]] = []

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def on_span_end(self, span: Span[Any]) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


def agents_model() -> AgentsScriptedModel:
    """The agent's model: one code action, then a final answer."""
    return AgentsScriptedModel(
        [[function_call("execute_code", {"code": CODE}, call_id="call_1")], [assistant_message("done")]]
    )


@pytest.fixture
def agents_spans() -> Iterator[Recorder]:
    """The Agents SDK's tracing on, into a recorder only (never to OpenAI), for one test."""
    earlier = get_trace_provider()
    provider = DefaultTraceProvider()
    recorder = Recorder()
    provider.set_processors([recorder])
    provider.set_disabled(False)
    set_trace_provider(provider)
    yield recorder
    set_trace_provider(earlier)


def exported(span: Span[Any]) -> dict[str, Any]:
    return span.export() or {}


def agents_actions(recorder: Recorder) -> list[dict[str, Any]]:
    return [exported(s) for s in recorder.spans if exported(s)["span_data"].get("name") == ACTION_SPAN]


async def run_one_code_action(executor: CodeExecutor, code: str) -> None:
    """An agent run whose model asks for one code action, decided by the executor's policy."""
    model = AgentsScriptedModel(
        [[function_call("execute_code", {"code": code}, call_id="call_1")], [assistant_message("done")]]
    )
    agent = OpenAIAgent(name="coder", tools=[ipybox_tool(executor, approval=None)], model=model)
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go")
    assert result.final_output == "done"


def function_spans(recorder: Recorder) -> list[dict[str, Any]]:
    return [exported(s) for s in recorder.spans if exported(s)["span_data"]["type"] == "function"]


async def test_openai_agents_a_code_action_is_a_span_under_the_function_span_joined_by_its_execution_id(
    executor: CodeExecutor, exporter: InMemorySpanExporter, agents_spans: Recorder
) -> None:
    await run_one_code_action(executor, CODE)
    [function] = function_spans(agents_spans)
    [action] = agents_actions(agents_spans)
    assert action["parent_id"] == function["id"] and action["trace_id"] == function["trace_id"]
    data = action["span_data"]["data"]
    otel_action = assert_tool_call_under_action(exporter)
    assert data["ipybox.execution.id"] == dict(otel_action.attributes or {})["ipybox.execution.id"]
    assert data["ipybox.resumed"] is False and data["ipybox.execution.outcome"] == "ok"
    assert data["ipybox.tool_calls"] == data["ipybox.tool_calls.approved"] == 1
    assert CODE not in str(action) and "add" not in str(data)  # no code, no tool names


@pytest.mark.parametrize("executor", ["ask"], indirect=True)
async def test_openai_agents_a_run_that_resumes_a_paused_code_action_has_a_span_of_its_own_marked_resumed(
    executor: CodeExecutor, exporter: InMemorySpanExporter, agents_spans: Recorder
) -> None:
    model = AgentsScriptedModel(
        [[function_call("execute_code", {"code": CODE}, call_id="call_1")], [assistant_message("done")]]
    )
    agent = OpenAIAgent(name="coder", tools=[ipybox_tool(executor)], model=model)
    with anyio.fail_after(60):
        first = await Runner.run(agent, "go")
        state = first.to_state()
        [item] = state.get_interruptions()
        state.approve(item)
        result = await Runner.run(agent, state)
    assert result.final_output == "done"
    steps = agents_actions(agents_spans)
    first, last = steps[0]["span_data"]["data"], steps[-1]["span_data"]["data"]
    assert not first["ipybox.resumed"] and first["ipybox.execution.outcome"] == "paused"
    assert last["ipybox.resumed"] and last["ipybox.execution.outcome"] == "ok"
    execution_id = str(dict(named(exporter, ACTION_SPAN).attributes or {})["ipybox.execution.id"])
    assert {str(step["span_data"]["data"]["ipybox.execution.id"]) for step in steps} == {execution_id}
    # The end of the action is in the trace of the run that resumed it, under that run's function span.
    [resuming] = [span for span in function_spans(agents_spans) if span["span_data"]["output"] == "3\n"]
    assert steps[-1]["trace_id"] == resuming["trace_id"]
    # The call the run was asked about: pending in the part that paused, decided in the part that resumed.
    paused, decided = agents_tool_calls(agents_spans)
    assert (
        paused["parent_id"] == steps[0]["id"] and paused["span_data"]["data"]["ipybox.approval.decision"] == "pending"
    )
    assert decided["parent_id"] == steps[-1]["id"] and decided["trace_id"] == resuming["trace_id"]
    assert decided["span_data"]["data"]["ipybox.approval.decision"] == "approved"
    assert decided["span_data"]["data"]["gen_ai.tool.call.id"] == paused["span_data"]["data"]["gen_ai.tool.call.id"]


def agents_tool_calls(recorder: Recorder) -> list[dict[str, Any]]:
    return [
        exported(s) for s in recorder.spans if str(exported(s)["span_data"].get("name", "")).startswith("execute_tool ")
    ]


CALLS = (
    "from ipybox_kernel import ToolCallError, call_tool\n"
    "for tool, args in [('add', {'a': 1, 'b': 2}), ('delete_item', {'item_id': 'secret-id'}),"
    " ('fail', {'message': 'boom'})]:\n"
    "    try:\n        call_tool('test', tool, args)\n    except ToolCallError as e:\n        print(type(e).__name__)"
)


@pytest.mark.parametrize(
    "executor", [ApprovalRules(allow=["test.add", "test.fail"], deny=["test.delete_*"])], indirect=True
)
async def test_openai_agents_each_tool_call_is_a_span_under_the_code_actions_span(
    executor: CodeExecutor, exporter: InMemorySpanExporter, agents_spans: Recorder
) -> None:
    await run_one_code_action(executor, CALLS)
    [action] = agents_actions(agents_spans)
    calls = agents_tool_calls(agents_spans)
    assert [call["span_data"]["name"] for call in calls] == [
        "execute_tool add",
        "execute_tool delete_item",
        "execute_tool fail",
    ]
    otel = {
        dict(s.attributes or {})["gen_ai.tool.name"]: dict(s.attributes or {})
        for s in exporter.get_finished_spans()
        if s.name.startswith("execute_tool ")
    }
    for call in calls:
        assert call["parent_id"] == action["id"] and call["trace_id"] == action["trace_id"]
        data = call["span_data"]["data"]
        # Joined to the OpenTelemetry span of the same call by its id.
        assert data["gen_ai.tool.call.id"] == otel[data["gen_ai.tool.name"]]["gen_ai.tool.call.id"]
        assert data["ipybox.mcp.server"] == "test" and data["ipybox.approval.decided_by"] == "policy"
        assert data["ipybox.approval.wait"] >= 0
    add, delete, fail = (call["span_data"]["data"] for call in calls)
    assert (
        add["ipybox.approval.decision"] == "approved" and "error.type" not in add and add["ipybox.tool.duration"] >= 0
    )
    assert delete["ipybox.approval.decision"] == "rejected" and delete["error.type"] == "rejected"
    assert fail["ipybox.approval.decision"] == "approved" and fail["error.type"] == "tool_error"
    assert "secret-id" not in str(calls) and "boom" not in str(calls)  # never arguments or results
    assert action["span_data"]["data"]["ipybox.tool_calls"] == 3
