"""What the OpenAI Agents SDK adapter costs on top of `CodeExecutor.execute`, per code action.

    uv run --frozen python bench/adapter_openai_agents.py [--runs N]

Not part of ``run.py``. One executor (default sandbox, the bench MCP server's generated tools),
and in the same run, taking turns so that drift hits both sides alike:

- ``code action``: ``print(1)`` through ``executor.execute`` against the same code through the
  tool's ``on_invoke_tool`` as the SDK calls it, for the default tool (``approval="interrupt"``: a
  nested agent run whose model drives the kernel) and the waiting tool (an approval handler). The
  adapter's overhead is the difference of the medians; the target is at most 1 ms.
- ``approval round trip``: one ``add`` call approved. Direct: ``execute`` iterated, the request
  accepted as it arrives. ``handler run``: one ``Runner.run`` of an agent (the SDK's ScriptedModel:
  a tool call, then a message) whose waiting tool has the approval handler accept: the SDK's own
  floor. ``interruption``: the same agent with the default tool: ``Runner.run`` until the
  interruption, ``to_state``, ``state.approve``, ``Runner.run`` again until the end; both runs of
  the outer agent are included, because that is what an application pays per approval.

Prints one line per metric (medians in ms, ratio adapter/direct) and the JSON report last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from agents import Agent, FunctionTool, Runner, Usage, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources
from ipybox.integrations.openai_agents import ipybox_tool

HERE = Path(__file__).resolve().parent
ACTION = "print(1)"
APPROVED_ACTION = "from mcptools.benchsrv import add\nprint(add.run({'a': 1, 'b': 2}))"


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 4)


async def timed(step: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Wall time, and this process's CPU time (the kernel runs in another process, so this is the
    host side alone: the adapter's own work, undisturbed by the kernel's scheduling)."""
    wall, cpu = time.perf_counter(), time.process_time()
    await step()
    return time.perf_counter() - wall, time.process_time() - cpu


async def invoke(tool: FunctionTool, n: int) -> object:
    arguments = json.dumps({"code": ACTION})
    call_id = f"bench_{n}"
    # What the SDK passes: the model's call is there too (a resumed call is looked up by it).
    call = ResponseFunctionToolCall(
        id=call_id, call_id=call_id, type="function_call", name=tool.name, arguments=arguments
    )
    ctx = ToolContext[Any](
        context=None, usage=Usage(), tool_name=tool.name, tool_call_id=call_id, tool_arguments=arguments, tool_call=call
    )
    output = await tool.on_invoke_tool(ctx, arguments)
    if output != "1\n":
        raise RuntimeError(f"the tool returned {output!r}")
    return output


async def direct(executor: CodeExecutor, code: str, expected: str) -> CodeExecutionResult:
    result: CodeExecutionResult | None = None
    async for event in executor.execute(code):
        if isinstance(event, ApprovalRequest):
            await event.accept()
        elif isinstance(event, CodeExecutionResult):
            result = event
    if result is None or result.text != expected:
        raise RuntimeError(f"direct execution returned {result!r}")
    return result


def approving_agent(tool: FunctionTool, n: int) -> Agent[Any]:
    model = ScriptedModel(
        [[function_call("execute_code", {"code": APPROVED_ACTION}, call_id=f"bench_{n}")], [assistant_message("ok")]]
    )
    return Agent(name="bench", tools=[tool], model=model)


async def approval_round_trip(tool: FunctionTool, n: int) -> None:
    agent = approving_agent(tool, n)
    result = await Runner.run(agent, "go")
    state = result.to_state()
    [item] = state.get_interruptions()
    state.approve(item)
    result = await Runner.run(agent, state)
    if result.final_output != "ok" or result.interruptions:
        raise RuntimeError(f"the run ended with {result.final_output!r}")


async def handler_run(tool: FunctionTool, n: int) -> None:
    result = await Runner.run(approving_agent(tool, n), "go")
    if result.final_output != "ok" or result.interruptions:
        raise RuntimeError(f"the run ended with {result.final_output!r}")


async def rounds(
    steps: dict[str, Callable[[int], Awaitable[object]]], n: int, *, warmup: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU samples of each step, taking turns in a rotating order so that drift and the
    position in a round hit every step alike."""
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in steps}
    names = list(steps)
    for i in range(-warmup, n):
        turn = names[i % len(names) :] + names[: i % len(names)]
        for name in turn:
            wall, cpu = await timed(lambda: steps[name](i))  # noqa: B023 - awaited at once
            if i >= 0:
                samples[name][0].append(wall)
                samples[name][1].append(cpu)
    return samples


def compare(title: str, samples: dict[str, tuple[list[float], list[float]]], base: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    wall0, cpu0 = median_ms(samples[base][0]), median_ms(samples[base][1])
    print(f"{title}, {base}: wall {wall0:8.3f} ms, host CPU {cpu0:7.3f} ms")
    report[f"{title}/{base}"] = {"wall_ms": wall0, "host_cpu_ms": cpu0, "n": len(samples[base][0])}
    for name, (walls, cpus) in samples.items():
        if name == base:
            continue
        wall, cpu = median_ms(walls), median_ms(cpus)
        print(
            f"{title}, {name}: wall {wall:8.3f} ms ({wall - wall0:+.3f}, ratio {wall / wall0:.2f}), "
            f"host CPU {cpu:7.3f} ms ({cpu - cpu0:+.3f})"
        )
        report[f"{title}/{name}"] = {
            "wall_ms": wall,
            "host_cpu_ms": cpu,
            "wall_overhead_ms": round(wall - wall0, 4),
            "host_cpu_overhead_ms": round(cpu - cpu0, 4),
            "ratio": round(wall / wall0, 3),
            "n": len(walls),
        }
    return report


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="code actions per variant (default 200)")
    args = parser.parse_args()
    set_tracing_disabled(True)
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-agents-") as tmp:
        tools_dir = Path(tmp) / "mcptools"
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()
        server = {"command": sys.executable, "args": [str(HERE / "bench_mcp_server.py")]}
        await generate_mcp_sources("benchsrv", server, tools_dir)
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
            interrupting = ipybox_tool(executor)
            waiting = ipybox_tool(executor, approval=lambda ctx, request: True)
            steps: dict[str, Callable[[int], Awaitable[object]]] = {
                "direct": lambda n: direct(executor, ACTION, "1\n"),
                "interrupt": lambda n: invoke(interrupting, n),
                "waiting": lambda n: invoke(waiting, n),
            }
            samples = await rounds(steps, args.runs, warmup=20)
            approval_steps: dict[str, Callable[[int], Awaitable[object]]] = {
                "direct": lambda n: direct(executor, APPROVED_ACTION, "result=3\n"),
                "handler run": lambda n: handler_run(waiting, n),
                "interruption": lambda n: approval_round_trip(interrupting, n),
            }
            approvals = await rounds(approval_steps, args.runs // 4, warmup=5)

    report = compare("code action", samples, "direct") | compare("approval round trip", approvals, "direct")
    print(json.dumps(report))


if __name__ == "__main__":
    anyio.run(main)
