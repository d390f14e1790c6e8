"""A code action in LangSmith: child runs of the LangChain tool run that ran it, read back through
LangSmith's own OpenTelemetry export (``tracing_mode="otel"``) into the SDK's in-memory exporter.

LangChain's own agent (`create_agent`) driven by LangChain's scripted chat model, LangSmith's
`LangChainTracer` as the run's callback with a real `langsmith.Client` that exports to OpenTelemetry
only (no network, no API key); the in-process kernel and the test MCP server. The three paths of the
tool: no checkpointer (the executor's policy decides), interrupt-and-resume in the same process
(keyed), and durable approvals (a suspended action resumed from its locator).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from deadline_support import patient
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tracers.langchain import LangChainTracer
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from langsmith import Client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from servers.gateway import Gateway

from ipybox import ApprovalRules, CodeExecutor, GatewayKernel, Tracing
from ipybox._engine._tracing import ACTION_SPAN
from ipybox.integrations.langchain import IpyboxTool
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

META = "langsmith.metadata."
CODE = "from mcptools.test import add\nprint(add.run({'a': 1, 'b': 2}).result)"
CALLS = (
    "from ipybox_kernel import ToolCallError, call_tool\n"
    "for tool, args in [('add', {'a': 1, 'b': 2}), ('delete_item', {'item_id': 'secret-id'}),"
    " ('fail', {'message': 'boom'})]:\n"
    "    try:\n"
    "        call_tool('test', tool, args)\n"
    "    except ToolCallError as e:\n"
    "        print(type(e).__name__)"
)
CALLS_LINE = 4  # the line of CALLS that makes each call


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's list-of-replies chat model, usable by `create_agent` (which binds tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


@dataclass
class LangSmith:
    """LangSmith's tracer of an agent run, exporting its runs as OpenTelemetry spans to ``exporter``."""

    tracer: LangChainTracer
    client: Client
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        """Every span exported so far, once LangSmith has sent what it queued."""
        self.tracer.wait_for_futures()
        self.client.flush()
        self.provider.force_flush()
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def langsmith() -> Iterator[LangSmith]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # LangSmith types the provider with a stand-in class of its own.
    client = Client(api_key="unused", tracing_mode="otel", otel_tracer_provider=cast("Any", provider))
    yield LangSmith(LangChainTracer(client=client), client, provider, exporter)
    client.cleanup()
    provider.shutdown()


@pytest.fixture
async def executor(tools_dir: Path, workspace: Path, request: pytest.FixtureRequest) -> AsyncGenerator[CodeExecutor]:
    approval, values = cast("tuple[Any, bool]", getattr(request, "param", ("auto", False)))
    async with CodeExecutor(
        workspace=workspace,
        tools_dir=tools_dir,
        kernel=InProcessKernel(),
        sandbox=None,
        approval=approval,
        tracing=Tracing(values=values),
    ) as executor:
        yield executor


START: Any = {"messages": [{"role": "user", "content": "go"}]}


def agent_for(tool: IpyboxTool, code: str | None, *, checkpointer: InMemorySaver | None = None) -> Any:
    """An agent whose model asks for one code action (none: the graph resumes past it), then says "done"."""
    replies: list[BaseMessage] = [AIMessage("done")]
    if code is not None:
        call = {"name": "execute_code", "args": {"code": code}, "id": "call-1", "type": "tool_call"}
        replies.insert(0, AIMessage("", tool_calls=[call]))
    return cast("Any", create_agent(ScriptedModel(responses=replies), tools=[tool], checkpointer=checkpointer))


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((span for span in spans if span.name == name), key=lambda span: span.start_time or 0)


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    found = [span for span in spans if span.parent is not None and span.parent.span_id == parent.context.span_id]
    return sorted(found, key=lambda span: span.start_time or 0)


def action_under(spans: list[ReadableSpan], tool_run: ReadableSpan) -> ReadableSpan:
    """The code action's span, the one child of the tool run's span."""
    [action] = children(spans, tool_run)
    assert action.name == ACTION_SPAN
    assert action.context is not None and tool_run.context is not None
    assert action.context.trace_id == tool_run.context.trace_id
    return action


RULES = ApprovalRules(allow=["test.add", "test.fail"], deny=["test.delete_*"])


@pytest.mark.parametrize("executor", [(RULES, False)], indirect=True)
async def test_each_tool_call_is_a_run_under_the_code_action_under_the_tool_run(
    executor: CodeExecutor, langsmith: LangSmith
) -> None:
    agent = agent_for(IpyboxTool(executor=executor), CALLS)
    with anyio.fail_after(patient(60)):
        await agent.ainvoke(START, {"callbacks": [langsmith.tracer]})
    spans = langsmith.spans()
    [tool_run] = named(spans, "execute_code")
    action = action_under(spans, tool_run)
    calls = children(spans, action)
    assert [span.name for span in calls] == ["test.add", "test.delete_item", "test.fail"]
    add, delete, fail = (attributes(span) for span in calls)
    for call in (add, delete, fail):
        assert call["gen_ai.operation.name"] == "execute_tool"  # LangSmith's own mark of a tool run
        assert call[META + "ipybox.mcp.server"] == "test"
        assert call[META + "ipybox.approval.decided_by"] == "policy"
        assert call[META + "ipybox.approval.policy"] == "ApprovalRules"
        assert call[META + "ipybox.approval.wait"] >= 0
        assert call[META + "code.line.number"] == CALLS_LINE
        assert str(call[META + "gen_ai.tool.call.id"]).startswith(
            f"{attributes(action)[META + 'ipybox.execution.id']}:"
        )
    assert add[META + "ipybox.approval.decision"] == "approved" and META + "error.type" not in add
    assert add[META + "ipybox.tool.duration"] >= 0
    assert delete[META + "ipybox.approval.decision"] == "rejected" and delete[META + "error.type"] == "rejected"
    assert fail[META + "ipybox.approval.decision"] == "approved" and fail[META + "error.type"] == "tool_error"
    assert [span.status.status_code for span in calls] == [StatusCode.OK, StatusCode.ERROR, StatusCode.ERROR]
    data = attributes(action)
    assert data[META + "ipybox.execution.outcome"] == "ok" and data[META + "ipybox.resumed"] is False
    assert data[META + "ipybox.tool_calls"] == 3
    assert data[META + "ipybox.tool_calls.approved"] == 2 and data[META + "ipybox.tool_calls.rejected"] == 1
    # Never argument values or the line's text unless the application opts in.
    ours = str([attributes(span) for span in (action, *calls)])
    assert "secret-id" not in ours and "boom" not in ours and "call_tool(" not in ours


@pytest.mark.parametrize("executor", [("auto", True)], indirect=True)
async def test_argument_values_and_the_calls_line_go_to_langsmith_when_the_application_opts_in(
    executor: CodeExecutor, langsmith: LangSmith
) -> None:
    agent = agent_for(IpyboxTool(executor=executor), CODE)
    with anyio.fail_after(patient(60)):
        await agent.ainvoke(START, {"callbacks": [langsmith.tracer]})
    spans = langsmith.spans()
    [call] = children(spans, action_under(spans, named(spans, "execute_code")[0]))
    assert call.name == "test.add"
    inputs = json.loads(str(attributes(call)["gen_ai.prompt"]))
    assert json.loads(inputs["arguments"]) == {"a": 1, "b": 2}
    assert inputs["call_site"] == "print(add.run({'a': 1, 'b': 2}).result)"


def paused_then_resumed(out: Any, spans: list[ReadableSpan], thread: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check the two runs of the tool: the first part of the action paused at the call (left pending),
    the second, marked resumed, under the run that resumed it, where the graph's answer approved the
    call. Returns the attributes of the two runs of the call (asked, decided)."""
    [message] = [m for m in out.value["messages"] if isinstance(m, ToolMessage)]
    assert message.content == "3\n"
    paused_run, resuming_run = named(spans, "execute_code")
    assert resuming_run.context is not None and paused_run.context is not None
    assert resuming_run.context.trace_id != paused_run.context.trace_id  # each graph run is a trace of its own
    paused, resumed = action_under(spans, paused_run), action_under(spans, resuming_run)
    first_part, last_part = attributes(paused), attributes(resumed)
    assert first_part[META + "ipybox.execution.outcome"] == "paused" and first_part[META + "ipybox.resumed"] is False
    assert last_part[META + "ipybox.execution.outcome"] == "ok" and last_part[META + "ipybox.resumed"] is True
    assert last_part[META + "ipybox.tool_calls"] == 1
    # The parts are joined by the action's key.
    key = first_part[META + "ipybox.execution.key"]
    assert key == last_part[META + "ipybox.execution.key"] == f"langchain:{thread}:call-1"
    [asked] = children(spans, paused)
    [decided] = children(spans, resumed)
    assert asked.name == decided.name == "test.add"
    asked_data, decided_data = attributes(asked), attributes(decided)
    assert asked_data[META + "ipybox.approval.decision"] == "pending"
    assert decided_data[META + "ipybox.approval.decision"] == "approved"
    assert decided_data[META + "ipybox.approval.decided_by"] == "adapter"
    assert decided_data[META + "ipybox.tool.duration"] >= 0
    assert asked_data[META + "code.line.number"] == decided_data[META + "code.line.number"] == 2
    return asked_data, decided_data


@pytest.mark.parametrize("executor", [("ask", False)], indirect=True)
async def test_a_resumed_code_action_continues_under_the_tool_run_that_resumed_it(
    executor: CodeExecutor, langsmith: LangSmith
) -> None:
    agent = agent_for(IpyboxTool(executor=executor), CODE, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-keyed"}, "callbacks": [langsmith.tracer]}
    with anyio.fail_after(patient(60)):
        first = await agent.ainvoke(START, config, version="v2")
        [pending] = first.interrupts
        out = await agent.ainvoke(Command(resume={pending.id: {"type": "approve"}}), config, version="v2")
    asked, decided = paused_then_resumed(out, langsmith.spans(), "t-keyed")
    # The same request of the same execution, paused in one run and decided in the next.
    assert asked[META + "gen_ai.tool.call.id"] == decided[META + "gen_ai.tool.call.id"]


def gateway_executor(gateway: Gateway, workspace: Path, tools_dir: Path) -> CodeExecutor:
    workspace.mkdir()
    kernel = GatewayKernel(gateway.url, token=gateway.token, allow_unisolated_kernel=True)
    return CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=kernel)


@pytest.mark.timeout(600)
async def test_a_durable_code_action_resumed_by_another_executor_continues_under_the_resuming_tool_run(
    gateway: Gateway, tools_dir: Path, tmp_path: Path, langsmith: LangSmith
) -> None:
    # Executor A suspends the action at its call and is closed; B, another host's executor with the
    # same secret and checkpointer, resumes the graph and with it the action from its locator.
    secret, checkpointer = secrets.token_bytes(32), InMemorySaver()
    config: Any = {"configurable": {"thread_id": "t-durable"}, "callbacks": [langsmith.tracer]}
    with anyio.fail_after(patient(180)):
        async with gateway_executor(gateway, tmp_path / "a", tools_dir) as a:
            agent = agent_for(IpyboxTool(executor=a, secret=secret), CODE, checkpointer=checkpointer)
            [pending] = (await agent.ainvoke(START, config, version="v2")).interrupts
        async with gateway_executor(gateway, tmp_path / "b", tools_dir) as b:
            agent = agent_for(IpyboxTool(executor=b, secret=secret), None, checkpointer=checkpointer)
            out = await agent.ainvoke(Command(resume={pending.id: {"type": "approve"}}), config, version="v2")
    # B asks the call again (with A's arguments, a request of its own) and the graph's answer decides it.
    paused_then_resumed(out, langsmith.spans(), "t-durable")


FORGED = (
    "from ipybox_kernel import _client, _transport\n"
    "from ipybox_kernel._client import _calling_execution\n"
    "site = _transport.CallSite(line=10**30, module='m' * 5000 + '\\nforged')\n"
    "execution = _calling_execution('test', 'add')\n"
    "reply = _transport.round_trip('test', 'add', {'a': 1, 'b': 2}, execution, None, site)\n"
    "print(_client._parse_reply('test', 'add', reply))\n"
    "print(_transport.round_trip('test', 'add', {'a': 1, 'b': 2}, 'x-another', None, None))\n"
)


async def test_kernel_code_cannot_put_a_run_elsewhere_or_send_unbounded_text(
    executor: CodeExecutor, langsmith: LangSmith
) -> None:
    # Kernel code that sends its own call site (a huge module name, a line the code does not have) and
    # a call that names another execution: the first is recorded bounded, the second not at all.
    agent = agent_for(IpyboxTool(executor=executor), FORGED)
    with anyio.fail_after(patient(60)):
        out = await agent.ainvoke(START, {"callbacks": [langsmith.tracer]})
    [message] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert message.status == "success", message.content
    spans = langsmith.spans()
    [call] = children(spans, action_under(spans, named(spans, "execute_code")[0]))
    data = attributes(call)
    assert call.name == "test.add"
    module = str(data[META + "ipybox.call_site.module"])
    assert module == "m" * 256  # what the channel takes of it (at most 256 characters), no more
    assert META + "code.line.number" not in data  # a line the code does not have is unknown
    assert len(children(spans, call)) == 0
