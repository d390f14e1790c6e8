"""One worker process of the adapters' durable-approval tests: starts an agent run that pauses at
its approvals and stores the framework's state, or resumes a run from stored state.

    python durable_agents.py FRAMEWORK start  URL TOKEN TOOLS_DIR CALL_LOG STATE_DIR
    python durable_agents.py FRAMEWORK resume URL TOKEN TOOLS_DIR CALL_LOG STATE_DIR
        -> prints one JSON line: what the run returned

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


CODES = {"call-1": action("x1"), "call-2": action("x2")}
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
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart

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
    returns = {
        p.tool_call_id: p.model_response_str()
        for m in result.new_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }
    return {"returns": returns, "output": result.output}


WORKERS: dict[tuple[str, str], Callable[[Run], Awaitable[dict[str, Any]]]] = {
    ("pydantic_ai", "start"): pydantic_start,
    ("pydantic_ai", "resume"): pydantic_resume,
}


async def main(framework: str, mode: str, url: str, token: str, tools: str, call_log: str, state: str) -> None:
    secret = bytes.fromhex(os.environ["IPYBOX_TEST_SECRET"])
    with tempfile.TemporaryDirectory() as workspace:
        kernel = GatewayKernel(url, token=token, allow_unisolated_kernel=True)
        async with CodeExecutor(workspace=workspace, tools_dir=tools, kernel=kernel) as executor:
            executor.register_mcp_server("test", stdio_server(call_log=Path(call_log)))
            report = await WORKERS[framework, mode](Run(executor, secret, Path(state)))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    framework, mode, url, token, tools, call_log, state = sys.argv[1:]
    anyio.run(main, framework, mode, url, token, tools, call_log, state)
