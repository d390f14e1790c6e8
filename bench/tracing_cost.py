"""What OpenTelemetry tracing costs per tool call, side by side with the untraced path in one run.

    uv run --frozen python bench/tracing_cost.py [--quick]

Two measurements, each taking turns between its variants so that a busy spell of the machine falls
on all of them:

- host path, in process (no kernel, no server; `approval_hook.per_call`): the gate's decision, the
  trace context made current around the MCP request and the finished report, with no tracer at all
  (the untraced path), with spans off (the API without an SDK: every executor's default) and with
  spans on (the SDK, a `BatchSpanProcessor` whose exporter drops the spans); timed by the wall clock
  and by the process's CPU time, which other processes on a busy machine bend far less. Target:
  spans off add at most 20 µs of CPU per call.
- end to end: two executors on the default sandbox calling the bench server's ``add`` from one
  cell in a loop, timed in the kernel; one with tracing off (the default), one with the SDK and a
  batch processor. The difference is what recording a tool call's span costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from approval_hook import batch_provider, per_call

from ipybox import CodeExecutor, StdioServer, Tracing
from ipybox._engine._tracing import ActionTracer

__all__ = ("OFF_TARGET_US", "measure", "print_costs")

BENCH = Path(__file__).resolve().parent
# What tracing that is off may add to one tool call (issue #30).
OFF_TARGET_US = 20.0


def _loop(n: int) -> str:
    return (
        "import time as _t\nfrom ipybox_kernel import call_tool as _call\n"
        f"_t0 = _t.perf_counter()\nfor _i in range({n}):\n    _call('bench', 'add', {{'a': _i, 'b': 1}})\n"
        f"print((_t.perf_counter() - _t0) / {n} * 1e6)"
    )


async def _host_path(rounds: int, calls: int, clock: Callable[[], float]) -> dict[str, list[float]]:
    provider = batch_provider()
    tracers: dict[str, ActionTracer | None] = {
        "none": None,
        "off": ActionTracer(Tracing()),
        "on": ActionTracer(Tracing(tracer_provider=provider)),
    }
    costs: dict[str, list[float]] = {name: [] for name in tracers}
    names = list(tracers)
    for turn in range(rounds):
        # Each round in another order, and each run after a collection and with the batch processor's
        # queue emptied: what one variant leaves behind (garbage, spans still to export on the
        # processor's thread) must not fall on the next one's time.
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            gc.collect()
            costs[name].append(await per_call("auto", None, calls, tracers[name], clock))
            if name == "on":
                provider.force_flush()
    provider.shutdown()
    return costs


async def _end_to_end(rounds: int, calls: int) -> dict[str, list[float]]:
    server = StdioServer(command=sys.executable, args=(str(BENCH / "bench_mcp_server.py"),))
    tracings = {"off": Tracing(), "on": Tracing(tracer_provider=batch_provider())}
    costs: dict[str, list[float]] = {name: [] for name in tracings}
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-tracing-") as tmp:
        async with AsyncExitStack() as stack:
            executors: dict[str, CodeExecutor] = {}
            for name, tracing in tracings.items():
                workspace = Path(tmp) / name
                workspace.mkdir()
                executor = CodeExecutor(workspace=workspace, tools_dir=None, approval="auto", tracing=tracing)
                executors[name] = await stack.enter_async_context(executor)
                executors[name].register_mcp_server("bench", server)
                await executors[name].execute(_loop(20))  # starts the server, warms the path
            for _ in range(rounds):
                for name, executor in executors.items():
                    result = await executor.execute(_loop(calls))
                    costs[name].append(float(result.text))
    return costs


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median_us": round(statistics.median(values), 2), "min_us": round(min(values), 2), "n": len(values)}


async def measure(quick: bool) -> dict[str, Any]:
    """Both measurements: µs per call for each variant, and the differences against the untraced path."""
    rounds, calls = (3, 2_000) if quick else (9, 5_000)
    host = await _host_path(rounds, calls, time.perf_counter)
    # The process's CPU time: what the work costs, without the time other processes of a busy
    # machine take from it (the host path does no I/O, so nothing is left out).
    host_cpu = await _host_path(rounds, calls, time.process_time)
    e2e = await _end_to_end(3 if quick else 7, 100 if quick else 200)
    added_off = statistics.median(host_cpu["off"]) - statistics.median(host_cpu["none"])
    return {
        "host_path": {name: _summary(values) for name, values in host.items()},
        "host_path_cpu": {name: _summary(values) for name, values in host_cpu.items()},
        "spans_off_added_us_wall": round(statistics.median(host["off"]) - statistics.median(host["none"]), 2),
        "end_to_end": {name: _summary(values) for name, values in e2e.items()},
        "spans_off_added_us": {
            "value": round(added_off, 2),
            "target": f"≤ {OFF_TARGET_US:g} µs",
            "target_met": added_off <= OFF_TARGET_US,
        },
        "spans_on_added_us_host": round(statistics.median(host_cpu["on"]) - statistics.median(host_cpu["none"]), 2),
        "spans_on_added_us_end_to_end": round(statistics.median(e2e["on"]) - statistics.median(e2e["off"]), 2),
    }


def print_costs(costs: dict[str, Any]) -> None:
    host, cpu, e2e = costs["host_path"], costs["host_path_cpu"], costs["end_to_end"]
    off = costs["spans_off_added_us"]
    met = "ok" if off["target_met"] else "MISSED"
    print("tracing, per tool call (the variants taking turns in this run; medians, µs):")
    for label, times in (("wall", host), ("CPU", cpu)):
        print(
            f"  host path in process, {label}: untraced {times['none']['median_us']}, spans off "
            f"{times['off']['median_us']}, spans on (SDK, batch) {times['on']['median_us']}"
        )
    print(
        f"  spans off add {off['value']:+.2f} µs of CPU (target {off['target']}: {met}); "
        f"{costs['spans_off_added_us_wall']:+.2f} µs of wall time"
    )
    print(f"  spans on add {costs['spans_on_added_us_host']:+.2f} µs of CPU on the host path")
    print(
        f"  end to end, timed in the kernel: spans off {e2e['off']['median_us']}, spans on {e2e['on']['median_us']} "
        f"({costs['spans_on_added_us_end_to_end']:+.2f} µs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON too")
    args = parser.parse_args()
    costs = anyio.run(measure, args.quick)
    print_costs(costs)
    if args.json:
        print(json.dumps(costs))


if __name__ == "__main__":
    main()
