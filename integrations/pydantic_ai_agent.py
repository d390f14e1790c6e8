"""A PydanticAI agent whose code actions run in ipybox, with each MCP call approved at the terminal.

The agent gets one tool, ``execute_code``, and the typed stubs of the weather example's MCP server
(``python -m ipybox.examples.weather``) in its instructions. When the running code calls an MCP tool, the
run ends with PydanticAI's ``DeferredToolRequests``; this script asks you about each call and resumes
the run, and the paused code goes on from where it stopped (it never runs twice). A refused call
raises ``ToolCallRejected`` in the code with your reason.

Offline by default: a scripted ``FunctionModel`` writes the code action. With ``ANTHROPIC_API_KEY``
or ``OPENAI_API_KEY`` set, a real model writes it (install the provider's extra too, e.g.
``pip install "pydantic-ai-slim[anthropic]"``); ``IPYBOX_MODEL`` names another model.

Run: ``.venv/bin/python integrations/pydantic_ai_agent.py``
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import AgentStreamEvent, ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from ipybox import CodeExecutor, generate_mcp_sources
from ipybox.integrations.pydantic_ai import (
    Decision,
    IpyboxToolset,
    KernelOutputEvent,
    mcp_approval_results,
    pending_mcp_calls,
)

WEATHER = {"command": sys.executable, "args": ["-m", "ipybox.examples.weather"]}
TASK = "What is the weather in Oslo? Send the team (team@example.com) a one-line report."

SCRIPTED_ACTION = """\
from ipybox_kernel import ToolCallRejected
from mcptools.weather import get_forecast, send_report
forecast = get_forecast.run({"city": "oslo"})
line = f"Oslo: {forecast.temperature} °C, {forecast.conditions}"
print(line)
try:
    print(send_report.run({"recipient": "team@example.com", "subject": "Weather", "body": line}))
except ToolCallRejected as e:
    print("report not sent:", e.reason)
"""


def scripted_model() -> FunctionModel:
    """Writes one code action, then answers with what it printed."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) and m.tool_calls for m in messages):
            return ModelResponse(
                parts=[ToolCallPart("execute_code", {"code": SCRIPTED_ACTION}, tool_call_id="action-1")]
            )
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(f"Done. The code printed:\n{returns[-1].model_response_str()}")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        # Streamed requests (this script shows kernel output live through an event stream handler).
        for part in respond(messages, info).parts:
            if isinstance(part, ToolCallPart):
                yield {0: DeltaToolCall(part.tool_name, json.dumps(part.args), tool_call_id=part.tool_call_id)}
            elif isinstance(part, TextPart):
                yield part.content

    return FunctionModel(respond, stream_function=stream)


def choose_model() -> Model | str:
    if name := os.environ.get("IPYBOX_MODEL"):
        return name
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-sonnet-4-5"
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4.1"
    return scripted_model()


async def show_kernel_output(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    async for event in events:
        if isinstance(event, KernelOutputEvent):
            print(f"  kernel | {event.text}", end="" if event.text.endswith("\n") else "\n", flush=True)


async def ask(question: str) -> str:
    try:
        return await anyio.to_thread.run_sync(input, question)
    except EOFError:
        return ""


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ipybox-pydantic-ai-") as tmp:
        tools_dir, workspace = Path(tmp) / "mcptools", Path(tmp) / "workspace"
        workspace.mkdir()
        await generate_mcp_sources("weather", WEATHER, tools_dir)
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
            agent = Agent(
                choose_model(),
                instructions="Answer by running Python code; call the MCP tools from the code.",
                toolsets=[IpyboxToolset(executor)],
                output_type=[str, DeferredToolRequests],
            )
            print(f"task: {TASK}")
            result = await agent.run(TASK, event_stream_handler=show_kernel_output)
            while isinstance(result.output, DeferredToolRequests):
                decisions: dict[str, Decision] = {}
                for tool_call_id, payload in pending_mcp_calls(result.output).items():
                    print(f"\nthe code calls {payload.name}({payload.args})\n  {payload.description}")
                    answer = (await ask("approve? [y/N] ")).strip().lower()
                    reason = None if answer == "y" else (await ask("why not? ")).strip() or "refused at the terminal"
                    decisions[tool_call_id] = Decision.approve() if reason is None else Decision.reject(reason)
                result = await agent.run(
                    message_history=result.all_messages(),
                    deferred_tool_results=mcp_approval_results(result.output, decisions),
                    event_stream_handler=show_kernel_output,
                )
            print(f"\nagent: {result.output}")


if __name__ == "__main__":
    anyio.run(main)
