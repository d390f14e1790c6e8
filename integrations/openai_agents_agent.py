"""An OpenAI Agents SDK agent with ipybox as its code-action tool, on the weather example.

The agent writes Python that calls the weather MCP server through generated modules; each MCP call
stops the run as an interruption that you approve or reject here at the terminal, and the run goes on
from its `RunState` while the code waits in the sandboxed kernel.

    python integrations/openai_agents_agent.py          # offline: a scripted model plays the agent
    OPENAI_API_KEY=... python integrations/openai_agents_agent.py "Is it warmer in Oslo or Lisbon?"

Needs ``pip install "ipybox[openai-agents]"`` and bubblewrap (``bash scripts/setup.sh`` installs both).
Set OPENAI_MODEL to choose the model (default gpt-4.1).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from agents import Agent, Model, Runner, RunResult, RunState, ToolApprovalItem, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from ipybox import CodeExecutionChunk, CodeExecutor, generate_mcp_sources
from ipybox.integrations.openai_agents import ipybox_tool

QUESTION = "Compare today's weather in Oslo and Lisbon and mail a short report to team@example.com."

# What the offline model "writes": two forecasts (the same tool twice) and one e-mail.
SCRIPTED_CODE = """\
from ipybox_kernel import ToolCallRejected
from mcptools.weather import get_forecast, send_report

lines = []
for city in ["oslo", "lisbon"]:
    forecast = get_forecast.run({"city": city})
    lines.append(f"{forecast.city}: {forecast.temperature} °C, {forecast.conditions}")
    print(lines[-1], flush=True)
try:
    print(send_report.run({"recipient": "team@example.com", "subject": "Weather", "body": "\\n".join(lines)}))
except ToolCallRejected as rejected:
    print("report not sent:", rejected.reason)
"""


def choose_model() -> Model | str:
    if os.environ.get("OPENAI_API_KEY"):
        return os.environ.get("OPENAI_MODEL", "gpt-4.1")
    set_tracing_disabled(True)  # offline: there is nowhere to send traces
    return ScriptedModel(
        [
            [function_call("execute_code", {"code": SCRIPTED_CODE}, call_id="call_weather")],
            [assistant_message("Both forecasts are above; the report was not sent.")],
        ]
    )


def show_progress(ctx: ToolContext[Any], chunk: CodeExecutionChunk) -> None:
    print(f"  | {chunk.text}", end="" if chunk.text.endswith("\n") else "\n", flush=True)


def ask(item: ToolApprovalItem, state: RunState[Any]) -> None:
    """Approve or reject one MCP call at the terminal."""
    raw: Any = item.raw_item
    print(f"\nThe code wants to call {item.tool_name}({raw.arguments})")
    answer = input("  approve? [y]es / [a]lways for this tool / [n]o: ").strip().lower()
    if answer in ("y", "yes"):
        state.approve(item)
    elif answer in ("a", "always"):
        state.approve(item, always_approve=True)
    else:
        reason = input("  why not? ").strip() or "the user said no"
        state.reject(item, rejection_message=reason)


async def main() -> None:
    question = " ".join(sys.argv[1:]) or QUESTION
    with tempfile.TemporaryDirectory(prefix="ipybox-agents-") as tmp:
        tools_dir = Path(tmp) / "mcptools"
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()
        await generate_mcp_sources(
            "weather", {"command": sys.executable, "args": ["-m", "ipybox.examples.weather"]}, tools_dir
        )
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
            agent = Agent(
                name="weather analyst",
                instructions="Answer with the execute_code tool; print only what you need to read.",
                tools=[ipybox_tool(executor, on_output=show_progress)],
                model=choose_model(),
            )
            print(f"> {question}")
            result: RunResult = await Runner.run(agent, question)
            while result.interruptions:
                state = result.to_state()
                for item in state.get_interruptions():
                    ask(item, state)
                result = await Runner.run(agent, state)
            print(f"\n{result.final_output}")


if __name__ == "__main__":
    anyio.run(main)
