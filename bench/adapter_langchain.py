"""What the LangChain adapter adds to a code action, and to an approval round trip.

    uv run --frozen python bench/adapter_langchain.py [--runs N]

One sandboxed executor, the bench MCP server (`greet`). Every variant runs in the same process on
that executor, interleaved run by run so drift on a shared machine hits them alike:

- code action: ``await executor.execute(code)`` against ``await tool.ainvoke(tool_call)`` for the
  same code, the tool's checkpointer path (keyed execution, replay walk, ToolMessage) and its
  policy path; LangChain's own cost of calling a tool is measured with a tool that does nothing.
  The adapter's own overhead is ipybox tool − executor − bare tool.
- approval round trip: one MCP call from the code, approved: iterating the execution and accepting
  the request, against a `create_agent` graph with an in-memory checkpointer that interrupts and is
  resumed; LangGraph's own cost of an interrupt and resume is measured with a tool that only calls
  ``interrupt()``. The adapter's share is the graph with ipybox − the plain round trip − that one.

Prints a table of medians (ms) and writes nothing. A benchmark, not a test. ``--sizes`` prints only
how long the tool's description is for the weather example and for server-everything.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import anyio
from benchlib import BENCH_SERVER, summarize
from langchain.agents import create_agent  # pyright: ignore[reportUnknownVariableType]
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.types import Command, interrupt

from ipybox import ApprovalRequest, CodeExecutor, generate_mcp_sources
from ipybox.integrations.langchain import IpyboxTool

BENCH = Path(__file__).resolve().parent
SERVER = {"command": sys.executable, "args": [str(BENCH / "bench_mcp_server.py")]}
DESCRIBED = {
    "weather example": {"command": sys.executable, "args": ["-m", "ipybox.examples.weather"]},
    "server-everything": {"command": str(BENCH.parent / "node_modules" / ".bin" / "mcp-server-everything")},
}
CODE = "x = 1"
APPROVED = f"from mcptools.{BENCH_SERVER} import greet\ngreet.run({{'name': 'b'}})"
# Runs discarded before measuring: the first calls pay imports and pydantic schema builds.
WARMUP = 20
# A hung round must end the run, not stall it.
ROUND_TIMEOUT = 60.0


class ScriptedModel(FakeMessagesListChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


class NothingTool(BaseTool):
    """LangChain's cost of running a tool: validation, callbacks, the ToolMessage."""

    name: str = "execute_code"
    description: str = "does nothing"

    def _run(self, code: str) -> str:
        return ""

    async def _arun(self, code: str) -> str:
        return ""


class InterruptTool(BaseTool):
    """LangGraph's cost of an interrupt and its resume, with no kernel behind it."""

    name: str = "execute_code"
    description: str = "asks once"

    def _run(self, code: str) -> str:
        raise NotImplementedError

    async def _arun(self, code: str) -> str:
        interrupt({"type": "tool_approval"})
        return ""


def tool_call(call_id: str, code: str = CODE) -> dict[str, Any]:
    return {"name": "execute_code", "args": {"code": code}, "id": call_id, "type": "tool_call"}


async def timed(action: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Wall time, and this process's CPU time (the host side: steadier than wall time under load)."""
    with anyio.fail_after(ROUND_TIMEOUT):
        start, cpu = time.perf_counter(), time.process_time()
        await action()
        return time.perf_counter() - start, time.process_time() - cpu


async def approved_directly(executor: CodeExecutor) -> None:
    async for event in executor.execute(APPROVED):
        if isinstance(event, ApprovalRequest):
            await event.accept()


async def approved_in_graph(tool: BaseTool, thread: str) -> None:
    model = ScriptedModel(responses=[AIMessage("", tool_calls=[tool_call("c", APPROVED)]), AIMessage("done")])
    agent = cast("Any", create_agent(model, tools=[tool], checkpointer=InMemorySaver()))
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    out = await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config, version="v2")
    (pending,) = out.interrupts
    out = await agent.ainvoke(Command(resume={pending.id: {"type": "approve"}}), config, version="v2")
    assert not out.interrupts


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-lc-") as tmp:
        tools_dir, workspace = Path(tmp) / "mcptools", Path(tmp) / "workspace"
        workspace.mkdir()
        await generate_mcp_sources(BENCH_SERVER, SERVER, tools_dir)
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
            tool, nothing = IpyboxTool(executor=executor), NothingTool()
            # The tool's checkpointer path outside a graph: a config that names a checkpointer.
            keyed: RunnableConfig = {"configurable": {"thread_id": "bench", CONFIG_KEY_CHECKPOINTER: InMemorySaver()}}
            counter = iter(range(10**9))
            action_variants: dict[str, Callable[[], Awaitable[object]]] = {
                "executor.execute": lambda: executor.execute(CODE).result(),
                "bare BaseTool.ainvoke": lambda: nothing.ainvoke(tool_call("n")),
                "IpyboxTool, checkpointer path": lambda: tool.ainvoke(tool_call(f"k{next(counter)}"), keyed),
                "IpyboxTool, policy path": lambda: tool.ainvoke(tool_call("p")),
            }
            approval_variants: dict[str, Callable[[], Awaitable[object]]] = {
                "approve by iterating the execution": lambda: approved_directly(executor),
                "graph, tool that only interrupts": lambda: approved_in_graph(InterruptTool(), "i"),
                "graph, IpyboxTool (interrupt + resume)": lambda: approved_in_graph(tool, f"t{next(counter)}"),
            }
            actions = await measure(action_variants, runs)
            approvals = await measure(approval_variants, max(runs // 5, 10))
    report(actions, approvals)


Samples = dict[str, tuple[list[float], list[float]]]
"""Per variant: wall times and CPU times of its runs, in seconds."""


async def measure(variants: dict[str, Callable[[], Awaitable[object]]], runs: int) -> Samples:
    samples: Samples = {name: ([], []) for name in variants}
    for i in range(WARMUP + runs):
        for name, action in variants.items():
            wall, cpu = await timed(action)
            if i >= WARMUP:
                samples[name][0].append(wall)
                samples[name][1].append(cpu)
    return samples


def report(actions: Samples, approvals: Samples) -> None:
    def median(name: str, which: int) -> float:
        both = {**actions, **approvals}
        return statistics.median(both[name][which]) * 1000

    header = f"{'median ms':>10} {'p95 ms':>8} {'cpu ms':>8} {'n':>5}"
    print(f"{'code action (x = 1)':<42} {header}")
    for name, (wall, cpu) in {**actions, **approvals}.items():
        if name == next(iter(approvals)):
            print(f"\n{'approval round trip (one MCP call)':<42} {header}")
        metric, cpu_metric = summarize(wall), summarize(cpu)
        print(
            f"{name:<42} {metric['median']:>10.3f} {metric['p95']:>8.3f} {cpu_metric['median']:>8.3f} {metric['n']:>5}"
        )
    print("\nadapter's own overhead per code action (tool − executor − bare tool), medians, wall / cpu ms:")
    for name in ("IpyboxTool, checkpointer path", "IpyboxTool, policy path"):
        wall, cpu = (
            median(name, i) - median("executor.execute", i) - median("bare BaseTool.ainvoke", i) for i in (0, 1)
        )
        ratio = median(name, 0) / median("executor.execute", 0)
        print(f"  {name:<40} {wall:>7.3f} / {cpu:.3f}   (tool / executor, wall: {ratio:.2f}x)")
    plain, graph_only, graph = (
        "approve by iterating the execution",
        "graph, tool that only interrupts",
        "graph, IpyboxTool (interrupt + resume)",
    )
    wall, cpu = (median(graph, i) - median(plain, i) - median(graph_only, i) for i in (0, 1))
    print(
        "adapter's share of an approval round trip (graph with ipybox − plain round trip − graph alone), "
        f"medians, wall / cpu ms: {wall:.3f} / {cpu:.3f}   (graph with ipybox / plain, wall: "
        f"{median(graph, 0) / median(plain, 0):.2f}x)"
    )


async def sizes() -> None:
    """The description's length: what every model call carries when the tool is bound."""
    for label, params in DESCRIBED.items():
        with tempfile.TemporaryDirectory(prefix="ipybox-bench-lc-") as tmp:
            tools_dir, workspace = Path(tmp) / "mcptools", Path(tmp) / "workspace"
            workspace.mkdir()
            written = await generate_mcp_sources(label.split()[0], params, tools_dir)
            async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
                text = IpyboxTool(executor=executor).description
            # No tokenizer works offline here; ~4 characters a token is the usual rule for English and code.
            size = f"{len(text)} characters, {len(text.split())} words, ~{len(text) // 4} tokens"
            print(f"{label}: {len(written)} tools, {size}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="measured runs per code-action variant")
    parser.add_argument("--sizes", action="store_true", help="only print the description's size")
    args = parser.parse_args()
    if args.sizes:
        anyio.run(sizes)
    else:
        anyio.run(main, args.runs)
