"""A LangChain agent whose one tool is ipybox: it writes Python that calls the weather MCP server, and
you approve each MCP call at the terminal when LangGraph pauses on it.

    .venv/bin/python integrations/langchain_agent.py                # offline: a scripted chat model
    OPENAI_API_KEY=... .venv/bin/python integrations/langchain_agent.py "Is it warmer in Oslo or Lisbon?"

With a provider key set (and that provider's LangChain package installed, e.g. langchain-openai), the
model named by IPYBOX_MODEL (default ``openai:gpt-4.1-mini``, any ``init_chat_model`` name) writes the
code. Answer each approval with ``y`` (approve), or anything else as the reason to reject it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import anyio
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain.chat_models import init_chat_model
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, Interrupt

from ipybox import CodeExecutor, generate_mcp_sources
from ipybox.integrations.langchain import IpyboxTool

SERVER = {"command": sys.executable, "args": ["-m", "ipybox.examples.weather"]}
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GOOGLE_API_KEY", "MISTRAL_API_KEY")
QUESTION = "What's the weather in Lisbon? Send the team a short report."

# What the scripted model "writes": one code action with two MCP calls, the second one refusable.
SCRIPTED_CODE = """\
from ipybox_kernel import ToolCallRejected
from mcptools.weather import get_forecast, send_report

forecast = get_forecast.run(get_forecast.Params(city="lisbon"))
print(f"Lisbon: {forecast.temperature} °C, {forecast.conditions}", flush=True)
try:
    body = f"Lisbon today: {forecast.temperature} °C and {forecast.conditions}."
    print(send_report.run(send_report.Params(recipient="team@example.com", subject="Lisbon", body=body)))
except ToolCallRejected as e:
    print("report not sent:", e.reason)
"""


class ScriptedModel(FakeMessagesListChatModel):
    """Replies from a list; `create_agent` binds tools, which a scripted model ignores."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def chat_model() -> BaseChatModel:
    if any(os.environ.get(key) for key in PROVIDER_KEYS):
        return init_chat_model(os.environ.get("IPYBOX_MODEL", "openai:gpt-4.1-mini"))
    call = {"name": "execute_code", "args": {"code": SCRIPTED_CODE}, "id": "call-1", "type": "tool_call"}
    return ScriptedModel(
        responses=[AIMessage("", tool_calls=[call]), AIMessage("Done: the forecast is above (scripted model).")]
    )


def ask(pending: Interrupt) -> dict[str, str]:
    """One approval at the terminal, answered as HumanInTheLoopMiddleware decisions are."""
    value: dict[str, Any] = pending.value
    # The description shows the arguments too, every string in them quoted and escaped.
    print(f"\n[approval] {value['description']}")
    answer = input("approve? [y / reason to reject] ").strip()
    if answer.lower() in ("y", "yes"):
        return {"type": "approve"}
    return {"type": "reject", "message": answer or "rejected at the terminal"}


async def main() -> None:
    question = " ".join(sys.argv[1:]) or QUESTION
    with tempfile.TemporaryDirectory(prefix="ipybox-langchain-") as tmp:
        tools_dir, workspace = Path(tmp) / "mcptools", Path(tmp) / "workspace"
        workspace.mkdir()
        await generate_mcp_sources("weather", SERVER, tools_dir)
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
            # Typed as Any: the compiled graph's generic parameters are partly unknown to type checkers.
            tool = IpyboxTool(executor=executor)
            agent = cast("Any", create_agent(chat_model(), tools=[tool], checkpointer=InMemorySaver()))
            config: Any = {"configurable": {"thread_id": "weather"}}
            payload: Any = {"messages": [{"role": "user", "content": question}]}
            print(f"you: {question}")
            while payload is not None:
                pending: list[Interrupt] = []
                async for part in agent.astream(payload, config, stream_mode=["custom", "updates"], version="v2"):
                    if part["type"] == "custom":  # kernel output, as it is printed
                        for line in part["data"]["text"].splitlines():
                            print(f"  kernel> {line}")
                    elif "__interrupt__" in part["data"]:
                        pending += part["data"]["__interrupt__"]
                    elif "model" in part["data"]:
                        for message in part["data"]["model"]["messages"]:
                            for call in message.tool_calls:
                                print(f"\nmodel runs code:\n{call['args'].get('code', '')}")
                            if message.content:
                                print(f"\nmodel: {message.content}")
                payload = Command(resume={p.id: ask(p) for p in pending}) if pending else None


if __name__ == "__main__":
    anyio.run(main)
