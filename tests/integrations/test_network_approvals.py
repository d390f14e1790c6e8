"""An asked network connection through a framework adapter: PydanticAI's deferred tool calls.

The connection shows up as a call of ipybox's own ``connect`` tool (``ipybox__connect``) with the
destination as its arguments, and the framework's decision lets it through or refuses it.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import Agent as OpenAIAgent
from network_support import WebServer, serving
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext, ToolApproved, ToolDenied
from pydantic_ai.capabilities import HandleDeferredToolCalls

from ipybox import CodeExecutor, Network
from ipybox.integrations.pydantic_ai import IpyboxToolset

from .test_pydantic_ai import scripted

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def web() -> Generator[WebServer]:
    with serving() as server:
        yield server


async def test_an_asked_connection_is_a_deferred_tool_call_that_the_framework_approves_or_denies(
    web: WebServer, workspace: Path
) -> None:
    network = Network(
        allow=[f"127.0.0.1:{web.port}"],
        unlisted="ask",
        hosts={"yes.test": "127.0.0.1", "no.test": "127.0.0.1"},
    )
    seen: list[tuple[str, dict[str, Any]]] = []
    payloads: list[dict[str, Any]] = []

    async def handler(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
        seen.extend((call.tool_name, call.args_as_dict()) for call in requests.approvals)
        payloads.extend(requests.metadata.values())
        return DeferredToolResults(
            approvals={
                c.tool_call_id: ToolApproved() if c.args_as_dict()["host"] == "yes.test" else ToolDenied("not there")
                for c in requests.approvals
            }
        )

    code = (
        "import urllib.request, urllib.error\n"
        "for name in ('yes.test', 'no.test'):\n"
        "    try:\n"
        f"        print(urllib.request.urlopen(f'http://{{name}}:{web.port}/agent').read().decode())\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(e.code, e.reason)\n"
    )
    async with CodeExecutor(workspace=workspace, network=network) as executor:
        agent = Agent(
            scripted(code), toolsets=[IpyboxToolset(executor)], capabilities=[HandleDeferredToolCalls(handler=handler)]
        )
        with anyio.fail_after(60):
            result = await agent.run("go")
    assert seen == [
        ("ipybox__connect", {"host": "yes.test", "port": web.port}),
        ("ipybox__connect", {"host": "no.test", "port": web.port}),
    ]
    # The line that opened each connection, as the host shows it, in the payload and its description.
    line = f"print(urllib.request.urlopen(f'http://{{name}}:{web.port}/agent').read().decode())"
    for payload in payloads:
        assert payload["call_site"] == {"line": 4, "text": line, "module": None}
        assert f"Made at: line 4 of the code action: {line}" in payload["description"]
    assert len(payloads) == 2
    assert result.output.splitlines() == [
        f"hello /agent for yes.test:{web.port}",
        f"403 ipybox: the application rejected the connection to no.test:{web.port}: not there",
    ]


async def test_an_asked_connection_is_an_interruption_of_an_openai_agents_run_approved_or_rejected_on_its_state(
    web: WebServer, workspace: Path
) -> None:
    from agents import Runner, set_tracing_disabled

    from ipybox.integrations.openai_agents import ipybox_tool

    from .test_openai_agents import answer_all
    from .test_openai_agents import scripted as scripted_openai

    set_tracing_disabled(True)
    network = Network(allow=[f"127.0.0.1:{web.port}"], unlisted="ask", hosts={"yes.test": "127.0.0.1"})
    code = (
        "import urllib.request, urllib.error\n"
        "for name in ('yes.test', 'yes.test'):\n"
        "    try:\n"
        f"        print(urllib.request.urlopen(f'http://{{name}}:{web.port}/openai').read().decode())\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(e.code, e.reason)\n"
    )
    async with CodeExecutor(workspace=workspace, network=network) as executor:
        agent = OpenAIAgent(name="coder", tools=[ipybox_tool(executor)], model=scripted_openai(code))
        answers = iter([True, False])

        def decide(item: Any, state: Any) -> None:
            if next(answers):
                state.approve(item)
            else:
                state.reject(item, rejection_message="not twice")

        with anyio.fail_after(60):
            result, seen = await answer_all(agent, await Runner.run(agent, "go"), decide)
    assert seen == [("ipybox__connect", {"host": "yes.test", "port": web.port})] * 2
    [output] = [item.output for item in result.new_items if getattr(item, "type", "") == "tool_call_output_item"]
    lines = output.splitlines()
    assert lines[0] == f"hello /openai for yes.test:{web.port}", output
    assert lines[1] == f"403 ipybox: the application rejected the connection to yes.test:{web.port}: not twice", output
