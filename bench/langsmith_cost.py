"""What the LangChain tool's LangSmith runs cost: per code action when LangSmith tracing is off, and
per tool call when it is on, side by side in one run.

    uv run --frozen python bench/langsmith_cost.py [--quick]

- off: `action_runs` entered and left where no LangSmith run is current (a LangChain tool run with no
  LangSmith tracer), timed by the process's CPU time; what every code action of `IpyboxTool` pays.
- host, on: the runs of tool calls (their requested, decided and finished events handed to the
  observer `action_runs` registers) under a LangSmith run whose client exports to OpenTelemetry
  through a batch processor that drops the spans, timed by the process's CPU time (LangSmith's
  background thread included: the client is flushed inside the timing).
- end to end: one in-process executor calling the bench server's ``add`` from one cell in a loop,
  timed in the kernel, once with no run current and once under a LangSmith run whose client exports
  to OpenTelemetry (``tracing_mode="otel"``) through a batch processor that drops the spans: the
  difference is what a tool call's run costs (created, posted, ended and patched on the host).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import anyio
from approval_hook import batch_provider
from langsmith import Client, RunTree
from langsmith.run_helpers import tracing_context  # pyright: ignore[reportUnknownVariableType]

from ipybox import (
    ApprovalDecision,
    CodeExecutor,
    Execution,
    ExecutionLost,
    StdioServer,
    ToolCallDecided,
    ToolCallFinished,
    ToolCallRequested,
)
from ipybox.integrations._langsmith import action_runs
from ipybox.testing import InProcessKernel

BENCH = Path(__file__).resolve().parent


def off_per_action(actions: int) -> float:
    """CPU µs per code action of `action_runs` with no LangSmith run current."""
    unread = cast("Execution", object())  # with no run current the execution is not read
    start = time.process_time()
    for _ in range(actions):
        with action_runs(unread, resumed=False, values=False):
            pass
    return (time.process_time() - start) / actions * 1e6


class _Unrecorded:
    """What the observer reads of an execution, for events made up here: a running one whose requests
    it does not know (so no call site is looked up)."""

    id = "x0"
    key = None
    done = False

    def approval(self, request_id: str) -> None:
        raise ExecutionLost(request_id)

    def on_tool_call(self, hook: Any) -> Any:
        self.hook = hook
        return lambda: None


def on_per_call(client: Client, calls: int) -> float:
    """CPU µs per tool call of its LangSmith run, from its three events to the client's queue sent."""
    execution = _Unrecorded()
    root: Any = RunTree(name="execute_code", run_type="tool", ls_client=client)
    root.post()
    approved = ApprovalDecision(approved=True, by="policy")
    start = time.process_time()
    with tracing_context(parent=root), action_runs(cast("Execution", execution), resumed=False, values=False):
        for n in range(calls):
            fields: dict[str, Any] = {"call_id": f"x0:{n}", "server": "bench", "tool": "add", "execution_id": "x0"}
            execution.hook(ToolCallRequested(**fields, arguments={"a": n, "b": 1}))
            execution.hook(ToolCallDecided(**fields, decision=approved, policy="auto", waited=0.0))
            execution.hook(ToolCallFinished(**fields, error=None, duration=0.0))
    root.end()
    root.patch()
    client.flush()
    return (time.process_time() - start) / calls * 1e6


def _loop(n: int) -> str:
    return (
        "import time as _t\nfrom ipybox_kernel import call_tool as _call\n"
        f"_t0 = _t.perf_counter()\nfor _i in range({n}):\n    _call('bench', 'add', {{'a': _i, 'b': 1}})\n"
        f"print((_t.perf_counter() - _t0) / {n} * 1e6)"
    )


async def end_to_end(rounds: int, calls: int) -> dict[str, list[float]]:
    provider = batch_provider()
    client = Client(api_key="unused", tracing_mode="otel", otel_tracer_provider=cast("Any", provider))
    costs: dict[str, list[float]] = {"off": [], "on": []}
    server = StdioServer(command=sys.executable, args=(str(BENCH / "bench_mcp_server.py"),))
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-langsmith-") as tmp:
        async with CodeExecutor(
            workspace=tmp, tools_dir=None, kernel=InProcessKernel(), sandbox=None, approval="auto"
        ) as executor:
            executor.register_mcp_server("bench", server)
            await executor.execute(_loop(20))  # starts the server, warms the path
            for turn in range(rounds):
                for name in ("off", "on") if turn % 2 == 0 else ("on", "off"):
                    root: Any = (
                        RunTree(name="execute_code", run_type="tool", ls_client=client) if name == "on" else None
                    )
                    if root is not None:
                        root.post()
                    with tracing_context(parent=root):
                        execution = executor.execute(_loop(calls))
                        with action_runs(execution, resumed=False, values=False):
                            result = await execution
                    if root is not None:
                        root.end()
                        root.patch()
                        client.flush()
                    costs[name].append(float(result.text))
    client.cleanup()
    provider.shutdown()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    off = [off_per_action(20_000 if args.quick else 100_000) for _ in range(3 if args.quick else 7)]
    provider = batch_provider()
    client = Client(api_key="unused", tracing_mode="otel", otel_tracer_provider=cast("Any", provider))
    on = [on_per_call(client, 500 if args.quick else 2_000) for _ in range(3 if args.quick else 7)]
    client.cleanup()
    provider.shutdown()
    e2e = anyio.run(end_to_end, 4 if args.quick else 8, 100 if args.quick else 200)
    on_added = statistics.median(e2e["on"]) - statistics.median(e2e["off"])
    print("LangSmith runs of the LangChain tool (medians):")
    print(f"  off: {statistics.median(off):.2f} µs of CPU per code action (one context-variable read)")
    print(f"  on, host: {statistics.median(on):.1f} µs of CPU per tool call (its run created, posted, ended, patched)")
    print(
        f"  end to end, timed in the kernel, µs per tool call: no run {statistics.median(e2e['off']):.1f}, "
        f"LangSmith run per call {statistics.median(e2e['on']):.1f} ({on_added:+.1f})"
    )


if __name__ == "__main__":
    main()
