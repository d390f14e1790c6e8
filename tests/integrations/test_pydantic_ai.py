"""The PydanticAI toolset: MCP approvals through HandleDeferredToolCalls and DeferredToolRequests.

Real kernel in the real sandbox, the project's test MCP server, agents driven by PydanticAI's own
FunctionModel, which calls ``execute_code`` with scripted code and then answers with the tool's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from pydantic_ai import (
    Agent,
    AgentRunResult,
    BinaryContent,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.messages import (
    AgentStreamEvent,
    InstructionDeltaPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from server_asks_support import TRICKY, asking_code
from servers.fixtures import stdio_server
from servers.test_server import png_bytes

from ipybox import ApprovalDecision, ApprovalRules, CodeExecutor, UsageError, generate_mcp_sources
from ipybox.integrations.pydantic_ai import (
    ApprovalPayload,
    Decision,
    IpyboxToolset,
    KernelOutputEvent,
    mcp_approval_results,
    pending_mcp_calls,
)

pytestmark = pytest.mark.anyio

Output = str | DeferredToolRequests


Seen = list[tuple[list[ModelMessage], AgentInfo]]


def scripted(*codes: str, seen: Seen | None = None) -> FunctionModel:
    """A model that calls ``execute_code`` with each of ``codes`` in turn (one per response), then
    answers with the last tool result. ``seen`` collects what each request showed the model."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append((list(messages), info))
        made = sum(isinstance(m, ModelResponse) and bool(m.tool_calls) for m in messages)
        if made < len(codes):
            call = ToolCallPart("execute_code", {"code": codes[made]}, tool_call_id=f"call-{made + 1}")
            return ModelResponse(parts=[call])
        returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(returns[-1].model_response_str() if returns else "nothing ran")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        for part in respond(messages, info).parts:
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                delta = DeltaToolCall(
                    name=part.tool_name, json_args=json.dumps(part.args), tool_call_id=part.tool_call_id
                )
                yield {0: delta}

    return FunctionModel(respond, stream_function=stream)


def tool_returns(result: AgentRunResult[Any]) -> list[ToolReturnPart]:
    return [
        p
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


GREET_THEN_ADD = (
    "from ipybox_kernel import ToolCallRejected\n"
    "from mcptools.test import greet, add\n"
    "with open('{marker}', 'a') as f:\n    f.write('ran\\n')\n"
    "print(greet.run({{'name': 'a'}}), flush=True)\n"
    "try:\n"
    "    print('sum', add.run({{'a': 1, 'b': 2}}).result)\n"
    "except ToolCallRejected as e:\n"
    "    print('rejected:', e.reason)\n"
)


async def test_each_mcp_call_reaches_the_inline_handler_as_its_own_tool_call(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def handler(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
        seen.extend((call.tool_name, call.args_as_dict()) for call in requests.approvals)
        return DeferredToolResults(
            approvals={
                c.tool_call_id: ToolApproved() if c.tool_name == "test__greet" else ToolDenied("no adding today")
                for c in requests.approvals
            }
        )

    agent = Agent(
        scripted(GREET_THEN_ADD.format(marker="inline.txt")),
        toolsets=[IpyboxToolset(executor)],
        capabilities=[HandleDeferredToolCalls(handler=handler)],
    )
    with anyio.fail_after(60):
        result = await agent.run("go")
    assert seen == [("test__greet", {"name": "a"}), ("test__add", {"a": 1, "b": 2})]
    assert result.output == "Hello, a!\nrejected: no adding today\n"
    assert (module_workspace / "inline.txt").read_text() == "ran\n"


Answer = Callable[[DeferredToolRequests], DeferredToolResults]


async def run_to_the_end(
    executor: CodeExecutor, code: str, answer: Answer, shown: list[str] | None = None
) -> AgentRunResult[Output]:
    """Run an agent whose MCP approvals end the run, resuming with ``answer``'s results until it is
    done; ``shown`` collects the kernel output the runs streamed."""

    async def collect(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            if isinstance(event, KernelOutputEvent) and shown is not None:
                shown.append(event.text)

    agent = Agent(scripted(code), toolsets=[IpyboxToolset(executor)], output_type=[str, DeferredToolRequests])
    with anyio.fail_after(60):
        result = await agent.run("go", event_stream_handler=collect)
        while isinstance(result.output, DeferredToolRequests):
            results = answer(result.output)
            result = await agent.run(
                message_history=result.all_messages(), deferred_tool_results=results, event_stream_handler=collect
            )
    return result


async def test_approvals_across_runs_resume_the_paused_code_which_runs_once(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    asked: list[str] = []

    def approve(requests: DeferredToolRequests) -> DeferredToolResults:
        pending = pending_mcp_calls(requests)
        asked.extend(payload.name for payload in pending.values())
        return requests.build_results(approvals={tool_call_id: ToolApproved() for tool_call_id in pending})

    shown: list[str] = []
    result = await run_to_the_end(executor, GREET_THEN_ADD.format(marker="deferred.txt"), approve, shown)
    assert asked == ["test.greet", "test.add"]
    assert result.output == "Hello, a!\nsum 3\n"
    assert shown == ["Hello, a!\n", "sum 3\n"]  # each line streamed once, though the log was walked thrice
    assert (module_workspace / "deferred.txt").read_text() == "ran\n"  # three tool body runs, one execution


async def test_a_rejection_built_by_the_helper_reaches_the_code_which_goes_on(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    def decide(requests: DeferredToolRequests) -> DeferredToolResults:
        decisions = {
            tool_call_id: True if payload.tool == "greet" else ApprovalDecision(approved=False, reason="adding is off")
            for tool_call_id, payload in pending_mcp_calls(requests).items()
        }
        return mcp_approval_results(requests, decisions)

    result = await run_to_the_end(executor, GREET_THEN_ADD.format(marker="helper.txt"), decide)
    assert result.output == "Hello, a!\nrejected: adding is off\n"
    assert (module_workspace / "helper.txt").read_text() == "ran\n"


def test_the_deprecated_decision_still_builds_the_same_results() -> None:
    call = ToolCallPart("test__add", {"a": 1}, tool_call_id="c1")
    payload = {"request_id": "x9:1", "server": "test", "tool": "add", "args": {"a": 1}, "description": "d"}
    requests = DeferredToolRequests(approvals=[call], metadata={"c1": payload})
    with pytest.warns(DeprecationWarning, match="use ipybox.ApprovalDecision"):
        old = Decision.reject("no")
    new = ApprovalDecision(approved=False, reason="no")
    assert mcp_approval_results(requests, {"c1": old}).metadata == mcp_approval_results(requests, {"c1": new}).metadata
    assert mcp_approval_results(requests, {"c1": new}).metadata["c1"] == {
        "type": "reject",
        "request_id": "x9:1",
        "message": "no",
    }


async def test_a_policy_of_its_own_lets_the_toolset_run_without_pydantic_ai_approvals(executor: CodeExecutor) -> None:
    code = (
        "from mcptools.test import lookup, delete_item\n"
        "print(lookup.run({'key': 'k'}).result)\n"
        "delete_item.run({'item_id': 'i'})\n"
    )
    rules = ApprovalRules(allow=["test.lookup"], deny=["test.delete_item"])
    # A fresh kernel before and after: code that ran under another policy in the same kernel would
    # get its calls refused (SECURITY.md, "Attribution of requests").
    await executor.reset()
    agent = Agent(scripted(code), toolsets=[IpyboxToolset(executor, approval=rules)])  # no handler, no deferral
    try:
        with anyio.fail_after(60):
            result = await agent.run("go")
    finally:
        await executor.reset()
    (part,) = tool_returns(result)
    assert part.outcome == "failed"
    assert str(part.content).startswith("value of k\n") and "ToolCallRejected" in str(part.content)


def test_the_helper_refuses_a_decision_for_a_call_that_is_not_pending() -> None:
    requests = DeferredToolRequests()
    with pytest.raises(UsageError, match=r"no MCP call waits for approval under tool call id\(s\) \['call-9'\]"):
        mcp_approval_results(requests, {"call-9": True})


async def test_a_bare_tool_denied_aborts_the_action_and_frees_the_kernel_for_the_next(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    paused = "from mcptools.test import delete_item\ndelete_item.run({'item_id': 'x'})\nopen('after.txt', 'w').close()"
    agent = Agent(
        scripted(paused, "print('next action')"),
        toolsets=[IpyboxToolset(executor)],
        output_type=[str, DeferredToolRequests],
    )
    with anyio.fail_after(60):
        result = await agent.run("go")
        assert isinstance(result.output, DeferredToolRequests)
        denied = DeferredToolResults(approvals={"call-1": ToolDenied("not this action")})
        # The second action can only run once the first, paused at its MCP call, was cancelled.
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=denied)
    first, _ = tool_returns(result)
    assert (first.outcome, first.content) == ("denied", "not this action")
    assert result.output == "next action\n"
    assert not (module_workspace / "after.txt").exists()


async def test_a_resume_whose_execution_is_gone_reports_it_lost_and_runs_nothing(
    tools_dir: Path, workspace: Path
) -> None:
    code = (
        "with open('lost.txt', 'a') as f:\n    f.write('x')\n"
        "from mcptools.test import greet\ngreet.run({'name': 'gone'})"
    )
    with anyio.fail_after(90):
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as first:
            agent = Agent(scripted(code), toolsets=[IpyboxToolset(first)], output_type=[str, DeferredToolRequests])
            result = await agent.run("go")
            assert isinstance(result.output, DeferredToolRequests)
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as second:
            agent = Agent(scripted(code), toolsets=[IpyboxToolset(second)], output_type=[str, DeferredToolRequests])
            resumed = await agent.run(
                message_history=result.all_messages(),
                deferred_tool_results=DeferredToolResults(approvals={"call-1": ToolApproved()}),
            )
    (part,) = tool_returns(resumed)
    assert part.outcome == "failed"
    assert str(part.content).startswith("execution lost, nothing was re-run")
    assert (workspace / "lost.txt").read_text() == "x"


async def test_a_decision_for_an_execution_this_process_never_started_runs_nothing(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    code = (
        "with open('elsewhere.txt', 'a') as f:\n    f.write('x')\n"
        "from mcptools.test import greet\ngreet.run({'name': 'far'})"
    )
    paused = Agent(scripted(code), toolsets=[IpyboxToolset(executor)], output_type=[str, DeferredToolRequests])
    # The same conversation resumed by a toolset whose executions are keyed apart (another id), as a
    # process that never started the action would see it: no execution, no record of its key.
    elsewhere = Agent(
        scripted(code), toolsets=[IpyboxToolset(executor, id="elsewhere")], output_type=[str, DeferredToolRequests]
    )
    with anyio.fail_after(60):
        result = await paused.run("go")
        assert isinstance(result.output, DeferredToolRequests)
        results = mcp_approval_results(result.output, {"call-1": True})
        resumed = await elsewhere.run(message_history=result.all_messages(), deferred_tool_results=results)
        # The paused action is still there for the process that owns it.
        finished = await paused.run(message_history=result.all_messages(), deferred_tool_results=results)
    (part,) = tool_returns(resumed)
    assert part.outcome == "failed" and str(part.content).startswith("execution lost, nothing was re-run")
    assert finished.output == "'Hello, far!'\n"
    assert (module_workspace / "elsewhere.txt").read_text() == "x"


async def test_the_instructions_carry_the_stubs_and_a_new_server_is_appended_not_rewritten(
    workspace: Path, tmp_path: Path
) -> None:
    tools = tmp_path / "mcptools"
    await generate_mcp_sources("test", stdio_server(), tools)
    seen: Seen = []
    with anyio.fail_after(90):
        async with CodeExecutor(workspace=workspace, tools_dir=tools) as executor:
            agent = Agent(scripted("print(1)", "print(2)", seen=seen), toolsets=[IpyboxToolset(executor)])
            first = await agent.run("go")
            await generate_mcp_sources("more", stdio_server(), tools)
            second = await agent.run("again", message_history=first.all_messages())
    before, after = seen[0][1].instructions, seen[-1][1].instructions
    assert before is not None and "class greet:" in before and "mcptools.test" in before
    assert "mcptools.more" not in before
    # The cached prefix stays as it was; the new catalogue joins the conversation as a change.
    assert after == before
    (change,) = [p for m in second.new_messages() for p in m.parts if isinstance(p, InstructionDeltaPart)]
    assert change.content is not None and "mcptools.more" in change.content and "mcptools.test" in change.content
    last_request = seen[-1][0][-1]
    assert isinstance(last_request, ModelRequest) and "mcptools.more" in str(last_request.parts)


async def test_a_summary_catalogue_offers_a_search_tool_whose_stubs_the_model_then_calls(
    executor: CodeExecutor,
) -> None:
    seen: Seen = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append((list(messages), info))
        calls = [
            ToolCallPart("search_tools", {"query": "add two numbers", "k": 2}, tool_call_id="s1"),
            ToolCallPart(
                "execute_code",
                {"code": "from mcptools.test import add\nprint(add.run(add.Params(a=2, b=3)).result)"},
                tool_call_id="c1",
            ),
        ]
        made = sum(isinstance(m, ModelResponse) and bool(m.tool_calls) for m in messages)
        return ModelResponse(parts=[calls[made]] if made < len(calls) else [TextPart("done")])

    await executor.reset()  # "auto" after code that ran under "ask" would be refused
    toolset = IpyboxToolset(executor, approval="auto", catalogue="summary")
    with anyio.fail_after(60):
        result = await Agent(FunctionModel(respond), toolsets=[toolset]).run("go")
    info = seen[0][1]
    assert sorted(t.name for t in info.function_tools) == ["execute_code", "search_tools"]
    assert info.instructions is not None and "class add:" not in info.instructions
    assert "call the `search_tools` tool" in info.instructions
    returns = {p.tool_call_id: p.model_response_str() for p in tool_returns(result)}
    assert "class add:" in returns["s1"] and returns["c1"] == "5\n"
    # With the stubs in the prompt (a small catalogue), there is nothing to search for.
    small: Seen = []
    await Agent(scripted("print(1)", seen=small), toolsets=[IpyboxToolset(executor)]).run("go")
    assert [t.name for t in small[0][1].function_tools] == ["execute_code"]


async def test_the_kernel_output_streams_live_as_custom_events(executor: CodeExecutor) -> None:
    code = (
        "from mcptools.test import lookup\n"
        "print('first', flush=True)\n"
        "print(lookup.run({'key': 'one'}).result, flush=True)\n"
        "print(lookup.run({'key': 'two'}).result)\n"
    )
    events: list[KernelOutputEvent] = []
    first_seen = anyio.Event()

    async def handler(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
        if any(call.args_as_dict() == {"key": "two"} for call in requests.approvals):
            # The code is paused at its second MCP call, a round trip after it printed 'first':
            # the stream's consumer has seen that line while the code still runs.
            await first_seen.wait()
        return requests.build_results(approve_all=True)

    agent = Agent(
        scripted(code), toolsets=[IpyboxToolset(executor)], capabilities=[HandleDeferredToolCalls(handler=handler)]
    )
    with anyio.fail_after(60):
        async with agent.run_stream_events("go") as stream:
            async for event in stream:
                if isinstance(event, KernelOutputEvent):
                    events.append(event)
                    first_seen.set()
    assert [(e.text, e.stream, e.tool_call_id, e.tool_name) for e in events] == [
        ("first\n", "stdout", "call-1", "execute_code"),
        ("value of one\n", "stdout", "call-1", "execute_code"),
        ("value of two\n", "stdout", "call-1", "execute_code"),
    ]


async def test_a_displayed_image_reaches_the_model_as_binary_content(executor: CodeExecutor) -> None:
    png = png_bytes(2, 2, (0, 128, 255))
    code = f"from IPython.display import Image, display\nprint('plot')\ndisplay(Image(data={png!r}))"
    seen: Seen = []
    agent = Agent(scripted(code, seen=seen), toolsets=[IpyboxToolset(executor)])
    with anyio.fail_after(60):
        await agent.run("go")
    (part,) = [p for m in seen[-1][0] if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    content: object = part.content
    assert isinstance(content, list)
    text, image = cast("list[object]", content)
    assert isinstance(text, str) and text.startswith("plot\n")
    assert isinstance(image, BinaryContent) and image.media_type == "image/png" and image.data == png


async def test_a_code_error_is_a_failed_tool_result_with_the_clean_traceback(executor: CodeExecutor) -> None:
    agent = Agent(scripted("print('partial')\n1 / 0"), toolsets=[IpyboxToolset(executor)])
    with anyio.fail_after(60):
        result = await agent.run("go")
    (part,) = tool_returns(result)
    assert part.outcome == "failed"
    assert str(part.content).startswith("partial\n") and "ZeroDivisionError" in str(part.content)
    assert "ipybox_kernel" not in str(part.content)


def test_importing_ipybox_integrations_imports_no_framework() -> None:
    probe = "import sys, ipybox, ipybox.integrations; print(*sorted(sys.modules))"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert not {"pydantic_ai", "pydantic_graph"} & {name.partition(".")[0] for name in run.stdout.split()}


def test_the_example_agent_runs_offline_asking_at_the_terminal() -> None:
    script = Path(__file__).resolve().parents[2] / "integrations" / "pydantic_ai_agent.py"
    env = {k: v for k, v in os.environ.items() if k not in {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "IPYBOX_MODEL"}}
    run = subprocess.run(
        [sys.executable, str(script)],
        input="y\nn\nno e-mail today\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("approve? [y/N]") == 2
    assert "the code calls weather.send_report(" in run.stdout
    assert "agent: Done. The code printed:\nOslo: " in run.stdout
    assert run.stdout.rstrip().endswith("report not sent: no e-mail today")


async def test_a_servers_question_is_deferred_with_its_form_and_only_an_answer_accepts_it(
    asking_executor: CodeExecutor,
) -> None:
    questions: list[ApprovalPayload] = []

    def answer(requests: DeferredToolRequests) -> DeferredToolResults:
        decisions: dict[str, ApprovalDecision | bool] = {}
        for tool_call_id, payload in pending_mcp_calls(requests).items():
            if payload.question is None:
                decisions[tool_call_id] = True
            else:
                questions.append(payload)
                decisions[tool_call_id] = ApprovalDecision(approved=True, content={"name": "Ada"})
        return mcp_approval_results(requests, decisions)

    result = await run_to_the_end(asking_executor, asking_code(TRICKY), answer)
    assert json.loads(str(result.output)) == [{"action": "accept", "content": {"name": "Ada"}}]
    [question] = questions
    assert question.tool == "elicitation/create" and question.question is not None
    assert question.question["mode"] == "form" and question.question["during_tool"] == "ask"
    assert question.args["message"] == TRICKY
    assert "\x1b" not in question.description and "\u202e" not in question.description

    def approve_only(requests: DeferredToolRequests) -> DeferredToolResults:
        return mcp_approval_results(requests, dict.fromkeys(pending_mcp_calls(requests), True))

    declined = await run_to_the_end(asking_executor, asking_code("Your name?"), approve_only)
    assert json.loads(str(declined.output)) == [{"action": "decline", "content": None}]
