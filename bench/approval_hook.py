"""The host's approval path per tool call, in process (no kernel, no MCP server): the gate deciding one
call under a policy, without a tool-call hook, with a sync hook and with an async one; and with
OpenTelemetry spans: none, the API's no-op (no SDK configured: every executor's default), and the
SDK recording to a batch processor whose exporter drops the spans.

    uv run --frozen python bench/approval_hook.py [--calls N]

What it times is `ApprovalGate.tool` (the request, the policy, the decision), the call's trace context
made current around its MCP request, plus the `ToolServer`'s `finished` report: the part of a call's
host-side cost that policies, the hook and tracing add. Prints the median of 5 rounds in microseconds
per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import cast

import anyio
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ipybox import ApprovalChain, ApprovalRules, ToolCallEvent, Tracing
from ipybox._approval._policies import Approval
from ipybox._engine._execution import open_execution
from ipybox._engine._gate import ApprovalGate
from ipybox._engine._toolevents import ToolCallHook
from ipybox._engine._tracing import ActionTracer
from ipybox._kernel import KernelHandle
from ipybox._toolserver._channel import ToolRequest

__all__ = ("batch_provider", "main", "per_call", "recording")

ROUNDS = 5


async def per_call(
    policy: Approval,
    hook: ToolCallHook | None,
    calls: int,
    tracer: ActionTracer | None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Microseconds per call through the gate and its finished report, by ``clock`` (wall time, or the
    process's CPU time, which a busy machine bends less)."""
    gate = ApprovalGate(policy, None, hook, tracer=tracer)
    execution, driver = open_execution("pass", key=None, timeout=None)
    if tracer is not None:
        driver.span = tracer.start_action(execution_id=execution.id, key=None, code="pass", parent=None)
    msg_id = "bench-msg"
    request = ToolRequest(token="t" * 16, seq=1, execution=msg_id, server="bench", tool="add", arguments={"a": 1})
    async with gate.running(driver, msg_id, kernel=cast("KernelHandle", _Unobserved())):
        began = clock()
        for _ in range(calls):
            decision = await gate.tool(request, server="bench-server", annotations=None, input_schema=None)
            assert decision.approved
            # What the ToolServer does around the MCP request: the call's span current, for the mcp SDK.
            trace = gate.trace_context(request)
            if trace is not None:
                otel_context.detach(otel_context.attach(trace))
            await gate.finished(request, None)
        cost = (clock() - began) / calls * 1e6
    execution.cancel()
    if driver.span is not None:
        driver.span.end()
    return cost


class _Dropped(SpanExporter):
    """An exporter that drops what it gets: the cost measured is ipybox's and the SDK's, not a backend's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def batch_provider() -> TracerProvider:
    """The SDK recording every span to a batch processor whose exporter drops them."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    return provider


def recording() -> ActionTracer:
    return ActionTracer(Tracing(tracer_provider=batch_provider()))


class _Unobserved:
    """The gate's only use of the kernel on this path: its left-behind tasks, here not observable
    (as on a gateway), so the gate measures its own cost and none of reading /proc."""

    # The host sees no thread of this kernel, but no earlier action left one: nothing to state.
    unseen = False

    def live_tasks(self) -> None:
        return None


def _count(event: ToolCallEvent) -> None:
    _seen.append(event)


async def _count_async(event: ToolCallEvent) -> None:
    _seen.append(event)


_seen: list[ToolCallEvent] = []


async def run(calls: int) -> None:
    rules = ApprovalRules(allow=["bench.*"])
    chain = ApprovalChain(ApprovalRules(deny=["other.*"]), rules)
    off, on = ActionTracer(Tracing()), recording()
    rows: list[tuple[str, Approval, ToolCallHook | None, ActionTracer | None]] = [
        ('"auto", no hook, no spans', "auto", None, None),
        ('"auto", no hook, spans off (no SDK)', "auto", None, off),
        ('"auto", no hook, spans on (SDK, batch)', "auto", None, on),
        ("ApprovalRules, no hook, spans off", rules, None, off),
        ("ApprovalChain(rules, rules), spans off", chain, None, off),
        ('"auto", sync hook, spans off', "auto", _count, off),
        ('"auto", async hook, spans off', "auto", _count_async, off),
        ("ApprovalChain, sync hook, spans on", chain, _count, on),
    ]
    # Rounds take turns over the rows, so that a busy spell of the machine falls on all of them.
    costs: dict[str, list[float]] = {label: [] for label, _, _, _ in rows}
    for _ in range(ROUNDS):
        for label, policy, hook, tracer in rows:
            _seen.clear()
            costs[label].append(await per_call(policy, hook, calls, tracer))
    for label, values in costs.items():
        print(f"{label:42s} {statistics.median(values):7.2f} µs/call (min {min(values):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5_000)
    args = parser.parse_args()
    anyio.run(run, args.calls)


if __name__ == "__main__":
    main()
