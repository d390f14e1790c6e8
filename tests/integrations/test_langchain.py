"""IpyboxTool in LangChain's own agent (`create_agent`) driven by LangChain's scripted chat model.

Real kernel in the real sandbox, the project's test MCP server over stdio, LangGraph's in-memory
checkpointer; each MCP call of the code is an interrupt answered the way a HITL UI answers it.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias, cast

import anyio
import pytest
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, GraphOutput, Interrupt
from pydantic import BaseModel, ValidationError
from server_asks_support import TRICKY, asking_code

from ipybox import ApprovalRules, CodeExecutor, ExecutionCancelled, UsageError
from ipybox.integrations import _core
from ipybox.integrations.langchain import IpyboxSearchTool, IpyboxTool, ipybox_tools

pytestmark = pytest.mark.anyio


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's list-of-replies chat model, usable by `create_agent` (which binds tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


def code_call(code: str, call_id: str) -> dict[str, Any]:
    return {"name": "execute_code", "args": {"code": code}, "id": call_id, "type": "tool_call"}


# The compiled agent's generic parameters are partly unknown to a type checker; tests use it as Any.
Agent: TypeAlias = Any


def agent_with(tool: IpyboxTool, *calls: dict[str, Any], checkpointer: InMemorySaver | None) -> Agent:
    """An agent whose model makes ``calls`` in one turn, then says "done"."""
    model = ScriptedModel(responses=[AIMessage("", tool_calls=list(calls)), AIMessage("done")])
    return cast("Agent", create_agent(model, tools=[tool], checkpointer=checkpointer))


def agent_running(executor: CodeExecutor, *calls: dict[str, Any], checkpointer: bool = True) -> Agent:
    return agent_with(IpyboxTool(executor=executor), *calls, checkpointer=InMemorySaver() if checkpointer else None)


def config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


async def run_answering(
    agent: Agent,
    thread: str,
    answer: Callable[[dict[str, Any]], dict[str, Any]],
) -> tuple[GraphOutput[Any], list[list[Interrupt]]]:
    """Run the agent to the end, answering each round of interrupts by id; returns every round."""
    rounds: list[list[Interrupt]] = []
    out = await agent.ainvoke(START, config(thread), version="v2")
    while out.interrupts:
        rounds.append(list(out.interrupts))
        resume = {it.id: answer(it.value) for it in out.interrupts}
        out = await agent.ainvoke(Command(resume=resume), config(thread), version="v2")
    return out, rounds


def tool_messages(out: GraphOutput[Any]) -> dict[str, ToolMessage]:
    messages: list[BaseMessage] = out.value["messages"]
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


START: Any = {"messages": [{"role": "user", "content": "go"}]}
GREET = "from mcptools.test import greet"


def approve(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "approve"}


TWO_CALLS = (
    "from ipybox_kernel import ToolCallRejected\n"
    "from mcptools.test import greet, add\n"
    "with open('{marker}', 'a') as f:\n    f.write('ran\\n')\n"
    "print('hello:', greet.run({{'name': 'a'}}), flush=True)\n"
    "try:\n"
    "    print('sum:', add.run({{'a': 1, 'b': 2}}).result)\n"
    "except ToolCallRejected as e:\n"
    "    print('rejected:', e.reason)\n"
)


async def test_one_code_action_with_two_mcp_calls_pauses_twice_and_runs_the_code_once(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    agent = agent_running(executor, code_call(TWO_CALLS.format(marker="once.txt"), "call-1"))
    with anyio.fail_after(90):
        out, rounds = await run_answering(agent, "t-once", approve)
    assert [[it.value["name"] for it in r] for r in rounds] == [["test.greet"], ["test.add"]]
    first = rounds[0][0].value
    assert json.loads(json.dumps(first)) == first
    assert set(first) == {"type", "tool_call_id", "name", "args", "description", "request_id", "server", "tool"} | {
        "undeclared_args",
        "arguments_checked",
        "call_site",
    }
    assert first["type"] == "tool_approval" and first["tool_call_id"] == "call-1"
    assert first["args"] == {"name": "a"} and "test_server.py" in first["description"]
    assert first["request_id"].endswith(":1")
    # The line of the code action that made the call, its text from the host's copy of the code.
    assert first["call_site"]["line"] == 5 and first["call_site"]["text"].startswith("print('hello:', greet.run(")
    assert rounds[0][0].response_schema is not None
    message = tool_messages(out)["call-1"]
    assert message.status == "success"
    assert message.content == "hello: Hello, a!\nsum: 3\n"
    assert (module_workspace / "once.txt").read_text() == "ran\n"


async def test_parallel_code_actions_each_pause_and_resume_by_interrupt_id(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    agent = agent_running(
        executor,
        code_call(TWO_CALLS.format(marker="par-a.txt"), "call-a"),
        code_call(TWO_CALLS.format(marker="par-b.txt"), "call-b"),
    )
    with anyio.fail_after(90):
        out, rounds = await run_answering(agent, "t-par", approve)
    # One kernel runs one code action at a time: the second one's calls come after the first's.
    asked = [[(it.value["tool_call_id"], it.value["name"]) for it in r] for r in rounds]
    assert asked == [
        [("call-a", "test.greet")],
        [("call-a", "test.add")],
        [("call-b", "test.greet")],
        [("call-b", "test.add")],
    ]
    messages = tool_messages(out)
    assert messages["call-a"].content == "hello: Hello, a!\nsum: 3\n"
    assert messages["call-b"].content == "hello: Hello, a!\nsum: 3\n"
    assert (module_workspace / "par-a.txt").read_text() == "ran\n"
    assert (module_workspace / "par-b.txt").read_text() == "ran\n"


async def test_a_code_action_without_mcp_calls_finishes_beside_one_that_pauses(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    agent = agent_running(
        executor,
        code_call("print('quiet')", "call-q"),
        code_call(TWO_CALLS.format(marker="par-q.txt"), "call-r"),
    )
    with anyio.fail_after(60):
        out, rounds = await run_answering(agent, "t-quiet", approve)
    assert len(rounds) == 2
    assert tool_messages(out)["call-q"].content == "quiet\n"


async def test_a_rejected_call_raises_tool_call_rejected_that_the_code_catches(
    executor: CodeExecutor, module_workspace: Path
) -> None:
    def refuse_add(value: dict[str, Any]) -> dict[str, Any]:
        return {"type": "reject", "message": "not now"} if value["tool"] == "add" else {"type": "approve"}

    agent = agent_running(executor, code_call(TWO_CALLS.format(marker="reject.txt"), "call-r1"))
    with anyio.fail_after(60):
        out, rounds = await run_answering(agent, "t-reject", refuse_add)
    assert len(rounds) == 2
    assert tool_messages(out)["call-r1"].content == "hello: Hello, a!\nrejected: not now\n"
    assert (module_workspace / "reject.txt").read_text() == "ran\n"


@pytest.mark.parametrize(
    ("answer", "complaint"),
    [
        ({"type": "edit"}, "'approve', 'reject' or 'answer'"),
        ({"type": "answer"}, "needs 'content'"),
        ({"type": "approve", "message": "fine"}, "takes no 'message'"),
        ({"type": "reject", "reason": "no"}, "Extra inputs are not permitted"),
    ],
)
async def test_an_answer_that_is_no_decision_is_refused_and_the_interrupt_can_be_answered_again(
    executor: CodeExecutor, answer: dict[str, Any], complaint: str
) -> None:
    thread = f"t-invalid-{complaint}"
    agent = agent_running(executor, code_call(f"{GREET}\nprint(greet.run({{'name': 'v'}}))", "c-v"))
    with anyio.fail_after(60):
        out = await agent.ainvoke(START, config(thread), version="v2")
        (pending,) = out.interrupts
        with pytest.raises(ValidationError, match=complaint):
            await agent.ainvoke(Command(resume={pending.id: answer}), config(thread), version="v2")
        out = await agent.ainvoke(Command(resume={pending.id: {"type": "approve"}}), config(thread), version="v2")
    assert not out.interrupts
    assert tool_messages(out)["c-v"].content == "Hello, v!\n"


@pytest.mark.parametrize("fresh_process", [False, True], ids=["same process", "fresh process"])
async def test_a_resume_after_the_executor_was_replaced_reports_lost_and_runs_nothing(
    tools_dir: Path, workspace: Path, fresh_process: bool
) -> None:
    checkpointer = InMemorySaver()
    code = TWO_CALLS.format(marker="lost.txt")
    thread = f"t-lost-{fresh_process}"  # the process record of started keys outlives a test

    def agent_on(executor: CodeExecutor, *replies: AIMessage) -> Agent:
        model = ScriptedModel(responses=list(replies))
        return cast("Agent", create_agent(model, tools=[IpyboxTool(executor=executor)], checkpointer=checkpointer))

    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as first:
        with anyio.fail_after(60):
            asks = AIMessage("", tool_calls=[code_call(code, "call-l")])
            out = await agent_on(first, asks).ainvoke(START, config(thread), version="v2")
        (pending,) = out.interrupts
    if fresh_process:
        # What a new process knows of the keys started before: nothing but the checkpoint.
        _core._started.clear()
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as second:
        with anyio.fail_after(60):
            out = await agent_on(second, AIMessage("done")).ainvoke(
                Command(resume={pending.id: {"type": "approve"}}), config(thread), version="v2"
            )
        assert not out.interrupts
        message = tool_messages(out)["call-l"]
        assert message.status == "error"
        assert isinstance(message.content, str) and message.content.startswith("execution lost, nothing was re-run")
        assert out.value["messages"][-1].content == "done"  # the graph went on
    assert (workspace / "lost.txt").read_text() == "ran\n"


async def test_an_execution_past_its_ttl_is_reported_lost_on_resume(executor: CodeExecutor) -> None:
    tool = IpyboxTool(executor=executor, ttl=0.5)
    agent = agent_with(tool, code_call(f"{GREET}\ngreet.run({{'name': 't'}})", "c-ttl"), checkpointer=InMemorySaver())
    with anyio.fail_after(60):
        out = await agent.ainvoke(START, config("t-ttl"), version="v2")
        (pending,) = out.interrupts
        execution = executor.attach("langchain:t-ttl:c-ttl")
        with pytest.raises(ExecutionCancelled):
            # Iterated, not awaited: awaiting alone would reject the request nobody iterates for.
            async for _ in execution.events():
                pass
        assert execution.expired
        out = await agent.ainvoke(Command(resume={pending.id: {"type": "approve"}}), config("t-ttl"), version="v2")
    message = tool_messages(out)["c-ttl"]
    assert message.status == "error" and "execution lost, nothing was re-run" in str(message.content)


async def test_without_a_checkpointer_the_executors_policy_decides_and_nothing_is_silently_accepted(
    tools_dir: Path, workspace: Path
) -> None:
    code = (
        "from ipybox_kernel import ToolCallRejected\n"
        "from mcptools.test import greet, delete_item\n"
        "print(greet.run({'name': 'p'}))\n"
        "try:\n"
        "    delete_item.run({'item_id': 'x'})\n"
        "except ToolCallRejected as e:\n"
        "    print('rejected:', e.reason)\n"
    )
    rules = ApprovalRules(allow=["test.greet"])
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=rules) as executor:
        agent = agent_running(executor, code_call(code, "c-p"), checkpointer=False)
        with anyio.fail_after(60):
            out = await agent.ainvoke(START, version="v2")
    assert not out.interrupts
    text = tool_messages(out)["c-p"].content
    assert isinstance(text, str) and text.startswith("Hello, p!\nrejected: nobody can approve test.delete_item")


async def test_a_displayed_image_reaches_the_tool_message_as_an_image_block(executor: CodeExecutor) -> None:
    code = (
        "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('plotted')"
    )
    agent = agent_running(executor, code_call(code, "c-img"))
    with anyio.fail_after(60):
        out, _ = await run_answering(agent, "t-img", approve)
    content = tool_messages(out)["c-img"].content
    assert isinstance(content, list)
    text, image = cast("list[dict[str, Any]]", content)
    assert text["type"] == "text" and "plotted" in text["text"]
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert base64.b64decode(image["base64"]).startswith(b"\x89PNG")


async def test_a_code_error_is_an_error_tool_message_with_the_traceback_and_the_graph_goes_on(
    executor: CodeExecutor,
) -> None:
    agent = agent_running(executor, code_call("print('partial')\n{}['missing']", "c-err"))
    with anyio.fail_after(60):
        out, _ = await run_answering(agent, "t-err", approve)
    message = tool_messages(out)["c-err"]
    assert message.status == "error"
    assert isinstance(message.content, str)
    assert message.content.startswith("partial\n") and "KeyError: 'missing'" in message.content
    assert "ipybox_kernel" not in message.content
    assert out.value["messages"][-1].content == "done"


async def test_kernel_output_reaches_the_custom_stream_once_across_resumes(executor: CodeExecutor) -> None:
    code = (
        "from mcptools.test import greet\nprint('one', flush=True)\n"
        "print(greet.run({'name': 's'}), flush=True)\nprint('two')"
    )
    agent = agent_running(executor, code_call(code, "c-s"))
    streamed: list[str] = []
    payload: Any = START
    with anyio.fail_after(60):
        while payload is not None:
            pending: list[Interrupt] = []
            async for part in agent.astream(
                payload, config("t-stream"), stream_mode=["custom", "updates"], version="v2"
            ):
                if part["type"] == "custom":
                    event = part["data"]
                    assert event["type"] == "ipybox.output" and event["tool_call_id"] == "c-s"
                    streamed.append(event["text"])
                elif part["type"] == "updates" and "__interrupt__" in part["data"]:
                    pending += part["data"]["__interrupt__"]
            payload = Command(resume={it.id: {"type": "approve"} for it in pending}) if pending else None
    assert streamed == ["one\n", "Hello, s!\n", "two\n"]


def test_the_description_carries_the_stubs_and_the_model_sees_only_the_code(executor: CodeExecutor) -> None:
    tool = IpyboxTool(executor=executor)
    assert tool.name == "execute_code"
    assert "class greet:" in tool.description and tool.description == tool.instructions
    assert list(cast("type[BaseModel]", tool.tool_call_schema).model_json_schema()["properties"]) == ["code"]
    short = IpyboxTool(executor=executor, name="python", description="Run Python; see the system prompt.")
    assert short.name == "python" and "class greet:" in short.instructions


async def test_a_summary_catalogue_comes_with_a_search_tool_whose_stubs_the_model_then_calls(
    executor: CodeExecutor,
) -> None:
    assert [t.name for t in ipybox_tools(executor)] == ["execute_code"]  # small: the stubs are in the prompt
    code, search = ipybox_tools(executor, catalogue="summary")
    assert isinstance(code, IpyboxTool) and isinstance(search, IpyboxSearchTool)
    assert code.catalogue_mode == "summary" and "class add:" not in code.description
    assert "mcptools.test: add," in code.description and "call the `search_tools` tool" in code.description
    search_call = {
        "name": "search_tools",
        "args": {"query": "add two numbers", "k": 2},
        "id": "s1",
        "type": "tool_call",
    }
    run_add = code_call("from mcptools.test import add\nprint(add.run(add.Params(a=2, b=3)).result)", "c1")
    model = ScriptedModel(
        responses=[AIMessage("", tool_calls=[search_call]), AIMessage("", tool_calls=[run_add]), AIMessage("done")]
    )
    agent = cast("Agent", create_agent(model, tools=[code, search], checkpointer=InMemorySaver()))
    with anyio.fail_after(60):
        out, rounds = await run_answering(agent, "summary", approve)
    messages = tool_messages(out)
    assert "class add:" in str(messages["s1"].content) and "class Params" in str(messages["s1"].content)
    assert [it.value["name"] for r in rounds for it in r] == ["test.add"]
    assert messages["c1"].content == "5\n"


async def test_the_example_agent_runs_offline_and_asks_at_the_terminal() -> None:
    example = Path(__file__).resolve().parents[2] / "integrations" / "langchain_agent.py"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    with anyio.fail_after(90):
        run = await anyio.run_process([sys.executable, str(example)], input=b"y\nno mail today\n", env=env, check=False)
    out = run.stdout.decode()
    assert run.returncode == 0, run.stderr.decode()
    assert out.count("[approval] MCP tool call weather.") == 2
    assert "kernel> Lisbon: " in out and "kernel> report not sent: no mail today" in out
    assert "model: Done" in out


async def test_the_sync_invoke_says_to_use_ainvoke(executor: CodeExecutor) -> None:
    tool = IpyboxTool(executor=executor)
    with pytest.raises(UsageError, match="ainvoke"):
        tool.invoke(code_call("1", "call-sync"))


# -- a server's question during a call (elicitation) ---------------------------------------------


async def test_a_servers_question_is_an_interrupt_whose_answer_reaches_the_server_and_its_text_is_escaped(
    asking_executor: CodeExecutor,
) -> None:
    agent = agent_running(asking_executor, code_call(asking_code(TRICKY), "call-q"))

    def answer(value: dict[str, Any]) -> dict[str, Any]:
        if "question" in value:
            return {"type": "answer", "content": {"name": "Ada", "age": 36}, "request_id": value["request_id"]}
        return {"type": "approve"}

    with anyio.fail_after(90):
        out, rounds = await run_answering(agent, "t-question", answer)
    assert [[it.value["name"] for it in r] for r in rounds] == [["asking.ask"], ["asking.elicitation/create"]]
    question = rounds[1][0].value
    assert json.loads(json.dumps(question)) == question
    assert question["question"]["mode"] == "form" and question["question"]["during_tool"] == "ask"
    assert set(question["question"]["requested_schema"]["properties"]) == {"name", "age"}
    # The server's text as sent in args; escaped in the description a person reads.
    assert question["args"]["message"] == TRICKY
    shown = question["description"]
    assert "\x1b" not in shown and "\u202e" not in shown and "\nFields:\n  - 'admin'" not in shown
    assert "\\x1b" in shown or "\\u001b" in shown
    assert json.loads(tool_messages(out)["call-q"].content) == [  # pyright: ignore[reportArgumentType]
        {"action": "accept", "content": {"name": "Ada", "age": 36}}
    ]


async def test_an_approval_declines_a_question_an_unfitting_answer_declines_it_and_an_answer_refuses_a_tool_call(
    asking_executor: CodeExecutor,
) -> None:
    def approve_everything(value: dict[str, Any]) -> dict[str, Any]:
        return {"type": "approve"}

    def misfit(value: dict[str, Any]) -> dict[str, Any]:
        if "question" in value:
            return {"type": "answer", "content": {"name": 7, "admin": True}}
        return {"type": "approve"}

    def answer_everything(value: dict[str, Any]) -> dict[str, Any]:
        return {"type": "answer", "content": {"name": "Ada"}}

    seen: dict[str, str] = {}
    for thread, answer in [("t-a", approve_everything), ("t-m", misfit), ("t-t", answer_everything)]:
        agent = agent_running(asking_executor, code_call(asking_code("Your name?"), f"call-{thread}"))
        with anyio.fail_after(90):
            out, _ = await run_answering(agent, thread, answer)
        seen[thread] = str(tool_messages(out)[f"call-{thread}"].content)
    assert json.loads(seen["t-a"]) == [{"action": "decline", "content": None}]
    assert json.loads(seen["t-m"]) == [{"action": "decline", "content": None}]
    assert seen["t-t"].startswith("rejected:") and "for a server's question, not for 'ask'" in seen["t-t"]
