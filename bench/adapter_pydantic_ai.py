"""What the PydanticAI adapter adds to a code action and to an approval round trip.

    uv run --frozen python bench/adapter_pydantic_ai.py [--actions N] [--approvals N] [--json PATH]

One sandboxed `CodeExecutor` with the bench MCP server's generated tools serves every measurement,
and the variants alternate sample by sample, so drift on a busy machine hits all of them alike:

- code action: ``await executor.execute(code)`` against ``IpyboxToolset.call_tool`` (start or attach
  by key, walk the events, build the tool result) on the same code, with a real `RunContext`. The
  difference is the adapter's own overhead per action (target: median ≤ 1 ms). For context, the
  same action as a whole agent run (`Agent.run` with a `FunctionModel`), which adds PydanticAI's own
  work.
- approval round trip, code that makes one MCP call: iterating the execution and accepting the
  `ApprovalRequest` directly, against an agent run whose `HandleDeferredToolCalls` handler approves
  the call inline, and against the across-runs path (run ends with `DeferredToolRequests`, resumed
  with `DeferredToolResults`).

Medians in ms with n, min and p95; the ratios are adapter / direct. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from benchlib import Metric, summarize
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext, ToolApproved
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RunUsage

from ipybox import ApprovalRequest, CodeExecutor, generate_mcp_sources
from ipybox.integrations.pydantic_ai import IpyboxToolset

BENCH = Path(__file__).resolve().parent
SERVER = {"command": sys.executable, "args": [str(BENCH / "bench_mcp_server.py")]}
ACTION = "x = 1"
CALL = "from mcptools.bench import add\nr = add.run({'a': 1, 'b': 2})"
TARGET_MS = 1.0

Sample = Callable[[], Awaitable[None]]


def one_call_model(code: str) -> FunctionModel:
    """Calls ``execute_code`` once with ``code``, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) and m.tool_calls for m in messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("execute_code", {"code": code}, tool_call_id="call-1")])

    return FunctionModel(respond)


async def interleaved(
    variants: dict[str, Sample], n: int, warmup: int = 3
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall times and this process's CPU times of each variant, sampled in turn."""
    for sample in variants.values():
        for _ in range(warmup):
            await sample()
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(n):
        for name, sample in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            await sample()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu


async def measure(actions: int, approvals: int) -> dict[str, Metric]:
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-pydantic-ai-") as tmp:
        tools, workspace = Path(tmp) / "mcptools", Path(tmp) / "workspace"
        workspace.mkdir()
        await generate_mcp_sources("bench", SERVER, tools)
        async with CodeExecutor(workspace=workspace, tools_dir=tools) as executor:
            toolset = IpyboxToolset(executor)
            model = one_call_model(ACTION)
            calls = iter(range(1_000_000))

            async def direct_action() -> None:
                await executor.execute(ACTION)

            async def adapter_action() -> None:
                ctx = RunContext[object](
                    deps=None, model=model, usage=RunUsage(), tool_call_id=f"a{next(calls)}", conversation_id="bench"
                )
                tool = (await toolset.get_tools(ctx))["execute_code"]
                await toolset.call_tool("execute_code", {"code": ACTION}, ctx, tool)

            action_agent = Agent(model, toolsets=[toolset])

            async def agent_action() -> None:
                await action_agent.run("go")

            action_times, action_cpu = await interleaved(
                {"direct": direct_action, "adapter": adapter_action, "agent": agent_action}, actions
            )

            async def direct_approval() -> None:
                async for event in executor.execute(CALL):
                    if isinstance(event, ApprovalRequest):
                        await event.accept()

            async def approve_all(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
                return requests.build_results(approve_all=True)

            inline_agent = Agent(
                one_call_model(CALL), toolsets=[toolset], capabilities=[HandleDeferredToolCalls(handler=approve_all)]
            )
            deferred_agent = Agent(one_call_model(CALL), toolsets=[toolset], output_type=[str, DeferredToolRequests])

            async def inline_approval() -> None:
                await inline_agent.run("go")

            async def deferred_approval() -> None:
                result = await deferred_agent.run("go")
                assert isinstance(result.output, DeferredToolRequests)
                results = DeferredToolResults(
                    approvals={c.tool_call_id: ToolApproved() for c in result.output.approvals}
                )
                await deferred_agent.run(message_history=result.all_messages(), deferred_tool_results=results)

            approval_times, _ = await interleaved(
                {"direct": direct_approval, "inline": inline_approval, "deferred": deferred_approval}, approvals
            )

    paired = [a - d for a, d in zip(action_times["adapter"], action_times["direct"], strict=True)]
    return {
        "action_direct": summarize(action_times["direct"]),
        "action_adapter": summarize(action_times["adapter"]),
        "action_overhead_paired": summarize(paired),
        "action_direct_host_cpu": summarize(action_cpu["direct"]),
        "action_adapter_host_cpu": summarize(action_cpu["adapter"]),
        "action_agent_run": summarize(action_times["agent"]),
        "approval_direct": summarize(approval_times["direct"]),
        "approval_inline_agent_run": summarize(approval_times["inline"]),
        "approval_deferred_two_runs": summarize(approval_times["deferred"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=200, help="samples per code-action variant")
    parser.add_argument("--approvals", type=int, default=30, help="samples per approval variant")
    parser.add_argument("--json", type=Path, help="also write the metrics here")
    args = parser.parse_args()
    metrics = anyio.run(measure, args.actions, args.approvals)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{'metric':<28} {'median ms':>10} {'n':>5} {'min':>9} {'p95':>9}   (load average {load})")
    for name, m in metrics.items():
        print(f"{name:<28} {m['median']:>10.3f} {m['n']:>5} {m['min']:>9.3f} {m['p95']:>9.3f}")
    overhead = metrics["action_adapter"]["median"] - metrics["action_direct"]["median"]
    cpu = metrics["action_adapter_host_cpu"]["median"] - metrics["action_direct_host_cpu"]["median"]
    print(
        f"\nadapter overhead per code action: {overhead:.3f} ms wall (difference of medians), "
        f"{cpu:.3f} ms of this process's CPU (difference of medians), "
        f"{metrics['action_overhead_paired']['median']:.3f} ms wall (median of paired differences); "
        f"target <= {TARGET_MS} ms: {'met' if max(overhead, cpu) <= TARGET_MS else 'NOT met'}"
    )
    for name, base in (
        ("action_adapter", "action_direct"),
        ("action_agent_run", "action_direct"),
        ("approval_inline_agent_run", "approval_direct"),
        ("approval_deferred_two_runs", "approval_direct"),
    ):
        print(f"ratio {name} / {base}: {metrics[name]['median'] / metrics[base]['median']:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    main()
