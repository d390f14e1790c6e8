"""The host's approval path per tool call, in process (no kernel, no MCP server): the gate deciding one
call under a policy, without a tool-call hook, with a sync hook and with an async one.

    uv run --frozen python bench/approval_hook.py [--calls N]

What it times is `ApprovalGate.tool` (the request, the policy, the decision) plus, with a hook, the
`ToolServer`'s `finished` report: the part of a call's host-side cost that policies and the hook
add. Prints the median of 5 rounds in microseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import cast

import anyio

from ipybox import ApprovalChain, ApprovalRules, ToolCallEvent
from ipybox._execution import open_execution
from ipybox._gate import ApprovalGate
from ipybox._kernel import KernelHandle
from ipybox._policies import Approval
from ipybox._toolevents import ToolCallHook
from ipybox._toolserver._channel import ToolRequest

__all__ = ("main",)

ROUNDS = 5


async def per_call(policy: Approval, hook: ToolCallHook | None, calls: int) -> float:
    """Microseconds per call through the gate (and its finished report when there is a hook)."""
    gate = ApprovalGate(policy, None, hook)
    execution, driver = open_execution("pass", key=None, timeout=None)
    msg_id = "bench-msg"
    request = ToolRequest(token="t" * 16, seq=1, execution=msg_id, server="bench", tool="add", arguments={"a": 1})
    async with gate.running(driver, msg_id, kernel=cast("KernelHandle", _Unobserved())):
        began = time.perf_counter()
        for _ in range(calls):
            decision = await gate.tool(request, server="bench-server", annotations=None, input_schema=None)
            assert decision.approved
            if hook is not None:
                await gate.finished(request, None)
        cost = (time.perf_counter() - began) / calls * 1e6
    execution.cancel()
    return cost


class _Unobserved:
    """The gate's only use of the kernel on this path: its left-behind tasks, here not observable
    (as on a gateway), so the gate measures its own cost and none of reading /proc."""

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
    rows: list[tuple[str, Approval, ToolCallHook | None]] = [
        ('"auto", no hook', "auto", None),
        ("ApprovalRules, no hook", rules, None),
        ("ApprovalChain(rules, rules), no hook", chain, None),
        ('"auto", sync hook', "auto", _count),
        ('"auto", async hook', "auto", _count_async),
        ("ApprovalChain, sync hook", chain, _count),
    ]
    # Rounds take turns over the rows, so that a busy spell of the machine falls on all of them.
    costs: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _ in range(ROUNDS):
        for label, policy, hook in rows:
            _seen.clear()
            costs[label].append(await per_call(policy, hook, calls))
    for label, values in costs.items():
        print(f"{label:40s} {statistics.median(values):7.2f} µs/call (min {min(values):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5_000)
    args = parser.parse_args()
    anyio.run(run, args.calls)


if __name__ == "__main__":
    main()
