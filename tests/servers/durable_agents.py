"""One worker process of the adapters' durable-approval tests: starts an agent run that pauses at
its approvals and stores the framework's state, or resumes a run from stored state.

    python durable_agents.py FRAMEWORK start  URL TOKEN TOOLS_DIR CALL_LOG STATE_DIR
    python durable_agents.py FRAMEWORK resume URL TOKEN TOOLS_DIR CALL_LOG STATE_DIR
    python durable_agents.py pydantic_ai continue URL TOKEN TOOLS_DIR CALL_LOG STATE_DIR
        -> prints one JSON line: what the run returned (``continue`` stores the state it ends with)

FRAMEWORK is ``pydantic_ai``, ``langgraph`` or ``openai_agents``. Each run is its own process, with
its own executor on the gateway, tool server and MCP session (as two workers behind a load balancer
would be); the only thing the two share is STATE_DIR, where the start stores the framework's own
state (message history, a SQLite checkpoint, a serialized RunState) and the resume reads it. The
model is each framework's own test model: one response with two ``execute_code`` calls, each
deleting one item on the test server (its call log counts the deletions), then a text answer.

The resume approves the call that deletes ``x1`` and rejects the one that deletes ``x2``. The
secret comes in ``IPYBOX_TEST_SECRET`` (hex); ``IPYBOX_TEST_SWAP=1`` swaps the two actions' locators
in the stored state before resuming (a tampered checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ipybox import ApprovalDecision, CodeExecutor, GatewayKernel
from servers.fixtures import stdio_server

# How long a suspended action is held on the gateway.
HOLD = 3600.0
REJECTION = "not x2, says a person"


def action(item: str) -> str:
    return (
        "from mcptools.test import delete_item\n"
        f"print('before {item}', flush=True)\n"
        "try:\n"
        f"    print(delete_item.run(delete_item.Params(item_id='{item}')))\n"
        "except Exception as exc:\n"
        "    print('caught', type(exc).__name__, getattr(exc, 'reason', None))\n"
        f"print('after {item}', flush=True)\n"
    )


# IPYBOX_TEST_PARALLEL=1: one code action whose two threads each delete one item (two calls pending at once).
PARALLEL = (
    "import threading\n"
    "from mcptools.test import delete_item\n"
    "done = {}\n"
    "def call(item):\n"
    "    try:\n"
    "        done[item] = delete_item.run(delete_item.Params(item_id=item)).result\n"
    "    except Exception as exc:\n"
    "        done[item] = type(exc).__name__\n"
    "threads = [threading.Thread(target=call, args=(item,)) for item in ('x1', 'x2')]\n"
    "for thread in threads: thread.start()\n"
    "for thread in threads: thread.join()\n"
    "print(sorted(done.items()))\n"
)
CODES = (
    {"call-1": PARALLEL}
    if os.environ.get("IPYBOX_TEST_PARALLEL") == "1"
    else {"call-1": action("x1"), "call-2": action("x2")}
)
DECISIONS = {"call-1": ApprovalDecision(approved=True), "call-2": ApprovalDecision(approved=False, reason=REJECTION)}


class Run:
    def __init__(self, executor: CodeExecutor, secret: bytes, state: Path) -> None:
        self.executor = executor
        self.secret = secret
        self.state = state
        self.swap = os.environ.get("IPYBOX_TEST_SWAP") == "1"


def swapped(first: str, second: str, text: str) -> str:
    """``text`` with the two strings exchanged."""
    marker = "\0swap\0"
    return text.replace(first, marker).replace(second, first).replace(marker, second)


# --- PydanticAI: message history (ModelMessagesTypeAdapter) and the deferred requests -------------


def pydantic_agent(run: Run) -> Any:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ipybox.integrations.pydantic_ai import IpyboxToolset

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(
                parts=[ToolCallPart("execute_code", {"code": code}, tool_call_id=id) for id, code in CODES.items()]
            )
        returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(json.dumps({p.tool_call_id: p.model_response_str() for p in returns}))])

    toolset = IpyboxToolset(run.executor, secret=run.secret, ttl=HOLD)
    return Agent(FunctionModel(respond), toolsets=[toolset], output_type=[str, DeferredToolRequests])


async def pydantic_start(run: Run) -> dict[str, Any]:
    from pydantic import TypeAdapter
    from pydantic_ai import DeferredToolRequests

    from ipybox.integrations.pydantic_ai import pending_mcp_calls

    result = await pydantic_agent(run).run("delete x1 and x2")
    assert isinstance(result.output, DeferredToolRequests), result.output
    (run.state / "messages.json").write_bytes(result.all_messages_json())
    (run.state / "requests.json").write_bytes(TypeAdapter(DeferredToolRequests).dump_json(result.output))
    pending = pending_mcp_calls(result.output)
    return {"pending": {id: [p.tool, dict(p.args), p.locator is not None] for id, p in pending.items()}}


async def pydantic_resume(run: Run) -> dict[str, Any]:
    from pydantic import TypeAdapter
    from pydantic_ai import DeferredToolRequests
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from ipybox.integrations.pydantic_ai import mcp_approval_results, pending_mcp_calls

    messages = ModelMessagesTypeAdapter.validate_json((run.state / "messages.json").read_bytes())
    text = (run.state / "requests.json").read_text()
    if run.swap:
        stored = pending_mcp_calls(TypeAdapter(DeferredToolRequests).validate_json(text))
        first, second = (stored[id].locator for id in ("call-1", "call-2"))
        assert first is not None and second is not None
        text = swapped(first, second, text)
    requests = TypeAdapter(DeferredToolRequests).validate_json(text)
    results = mcp_approval_results(requests, DECISIONS)
    result = await pydantic_agent(run).run(message_history=messages, deferred_tool_results=results)
    returns = pydantic_returns(result)
    return {"returns": returns, "output": result.output}


def pydantic_returns(result: Any) -> dict[str, str]:
    """What each tool call of the run's new messages returned, by tool call id."""
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    return {
        p.tool_call_id: p.model_response_str()
        for m in result.new_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }


async def pydantic_continue(run: Run) -> dict[str, Any]:
    """Answer what the stored state shows (approve x1, reject x2) and store the state again: the run
    pauses once more (``pending``) or ends (``returns``)."""
    from pydantic import TypeAdapter
    from pydantic_ai import DeferredToolRequests
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from ipybox.integrations.pydantic_ai import mcp_approval_results, pending_mcp_calls

    messages = ModelMessagesTypeAdapter.validate_json((run.state / "messages.json").read_bytes())
    requests = TypeAdapter(DeferredToolRequests).validate_json((run.state / "requests.json").read_bytes())
    decisions = {
        id: DECISIONS["call-1" if payload.args["item_id"] == "x1" else "call-2"]
        for id, payload in pending_mcp_calls(requests).items()
    }
    result = await pydantic_agent(run).run(
        message_history=messages, deferred_tool_results=mcp_approval_results(requests, decisions)
    )
    if isinstance(result.output, DeferredToolRequests):
        (run.state / "messages.json").write_bytes(result.all_messages_json())
        (run.state / "requests.json").write_bytes(TypeAdapter(DeferredToolRequests).dump_json(result.output))
        pending = pending_mcp_calls(result.output)
        return {"pending": {id: [p.tool, dict(p.args), p.locator is not None] for id, p in pending.items()}}
    returns = pydantic_returns(result)
    return {"returns": returns}


# --- LangGraph: create_agent with a SQLite checkpointer ------------------------------------------


THREAD: Any = {"configurable": {"thread_id": "thread-1"}}


def langgraph_agent(run: Run, saver: Any) -> Any:
    from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    from ipybox.integrations.langchain import IpyboxTool

    class Scripted(BaseChatModel):
        """Two code actions in one turn, then "done" once their results are in."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
            if any(isinstance(m, ToolMessage) for m in messages):
                message = AIMessage("done")
            else:
                calls = [
                    {"name": "execute_code", "args": {"code": code}, "id": id, "type": "tool_call"}
                    for id, code in CODES.items()
                ]
                message = AIMessage("", tool_calls=calls)
            return ChatResult(generations=[ChatGeneration(message=message)])

    tool = IpyboxTool(executor=run.executor, secret=run.secret, ttl=HOLD)
    return create_agent(Scripted(), tools=[tool], checkpointer=saver)  # pyright: ignore[reportUnknownVariableType]


async def langgraph_start(run: Run) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(run.state / "checkpoints.sqlite")) as saver:
        agent = langgraph_agent(run, saver)
        out = await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, THREAD, version="v2")
    values = [it.value for it in out.interrupts]
    return {"pending": {v["tool_call_id"]: [v["tool"], v["args"], "locator" in v] for v in values}}


async def langgraph_resume(run: Run) -> dict[str, Any]:
    from langchain_core.messages import ToolMessage
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.types import Command

    async with AsyncSqliteSaver.from_conn_string(str(run.state / "checkpoints.sqlite")) as saver:
        agent = langgraph_agent(run, saver)
        state = await agent.aget_state(THREAD)
        if run.swap:
            await langgraph_swap(saver, state)
            state = await agent.aget_state(THREAD)
        answers: dict[str, dict[str, Any]] = {}
        for it in state.interrupts:
            decision = DECISIONS[it.value["tool_call_id"]]
            answers[it.id] = (
                {"type": "approve"} if decision.approved else {"type": "reject", "message": decision.reason}
            )
        out = await agent.ainvoke(Command(resume=answers), THREAD, version="v2")
    messages = out.value["messages"]
    return {"returns": {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}}


async def langgraph_swap(saver: Any, state: Any) -> None:
    """Exchange the two actions' locators in the checkpoint's saved interrupts, as an attacker who
    can write the checkpoint database could."""
    from langgraph.types import Interrupt

    saved = await saver.aget_tuple(state.config)
    interrupts = [(task, value) for task, channel, value in saved.pending_writes if channel == "__interrupt__"]
    assert len(interrupts) == 2, interrupts
    (task_a, [first]), (task_b, [second]) = interrupts
    for task, mine, theirs in ((task_a, first, second), (task_b, second, first)):
        changed = Interrupt(value={**mine.value, "locator": theirs.value["locator"]}, id=mine.id)
        await saver.aput_writes(saved.config, [("__interrupt__", [changed])], task)


# --- OpenAI Agents: RunState.to_string() -----------------------------------------------------------


def openai_agent(run: Run, turns: list[Any]) -> Any:
    from agents import Agent, set_tracing_disabled
    from agents.testing import ScriptedModel

    from ipybox.integrations.openai_agents import ipybox_tool

    set_tracing_disabled(True)
    tool = ipybox_tool(run.executor, secret=run.secret, ttl=HOLD)
    return Agent(name="agent", model=ScriptedModel(turns), tools=[tool])


def openai_item(item: Any) -> tuple[str, dict[str, Any], str]:
    """(the code action's call id, the MCP call's arguments, the nested call id) of an interruption."""
    args = json.loads(item.raw_item.arguments)
    return f"call-{args['item_id'][1:]}", args, str(item.raw_item.call_id)


async def openai_start(run: Run) -> dict[str, Any]:
    from agents import Runner
    from agents.testing import assistant_message, function_call

    calls = [function_call("execute_code", {"code": code}, call_id=id) for id, code in CODES.items()]
    agent = openai_agent(run, [calls, [assistant_message("done")]])
    result = await Runner.run(agent, "go")
    (run.state / "run_state.json").write_text(result.to_state().to_string())
    pending: dict[str, Any] = {}
    for item in result.interruptions:
        action, args, call_id = openai_item(item)
        pending[action] = [str(item.tool_name).removeprefix("test__"), args, call_id.count("|") == 2]
    return {"pending": pending}


async def openai_resume(run: Run) -> dict[str, Any]:
    from agents import Runner, RunState, ToolCallOutputItem
    from agents.testing import assistant_message

    # This model is only asked for the final answer: the two code calls are in the stored state.
    agent = openai_agent(run, [[assistant_message("done")]])
    text = (run.state / "run_state.json").read_text()
    if run.swap:
        state = await RunState.from_string(agent, text)
        first, second = (openai_item(item)[2].split("|")[2] for item in state.get_interruptions())
        text = swapped(first, second, text)
    state = await RunState.from_string(agent, text)
    for item in state.get_interruptions():
        action = openai_item(item)[0]
        if DECISIONS[action].approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=DECISIONS[action].reason)
    result = await Runner.run(agent, state)
    returns: dict[str, Any] = {}
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            raw: Any = item.raw_item
            returns[str(raw["call_id"])] = item.output
    return {"returns": returns}


WORKERS: dict[tuple[str, str], Callable[[Run], Awaitable[dict[str, Any]]]] = {
    ("openai_agents", "start"): openai_start,
    ("openai_agents", "resume"): openai_resume,
    ("pydantic_ai", "start"): pydantic_start,
    ("pydantic_ai", "resume"): pydantic_resume,
    ("pydantic_ai", "continue"): pydantic_continue,
    ("langgraph", "start"): langgraph_start,
    ("langgraph", "resume"): langgraph_resume,
}


async def main(framework: str, mode: str, url: str, token: str, tools: str, call_log: str, state: str) -> None:
    secret = bytes.fromhex(os.environ["IPYBOX_TEST_SECRET"])
    with tempfile.TemporaryDirectory() as workspace, tempfile.TemporaryDirectory() as snapshot:
        if mode == "resume":
            # A resume reads a copy of the stored state: what it writes back (a finished thread)
            # leaves the stored state as A left it, for the tests' replays.
            shutil.copytree(state, snapshot, dirs_exist_ok=True)
            state = snapshot
        kernel = GatewayKernel(url, token=token, allow_unisolated_kernel=True)
        async with CodeExecutor(workspace=workspace, tools_dir=tools, kernel=kernel) as executor:
            executor.register_mcp_server("test", stdio_server(call_log=Path(call_log)))
            report = await WORKERS[framework, mode](Run(executor, secret, Path(state)))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    framework, mode, url, token, tools, call_log, state = sys.argv[1:]
    anyio.run(main, framework, mode, url, token, tools, call_log, state)
