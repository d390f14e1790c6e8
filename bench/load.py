"""Load and soak benchmarks for ipybox (not tests: they report figures, they do not time out a CI run).

    python bench/load.py            # full: concurrency ramp, 10,000 executions, 200 start/stop cycles
    python bench/load.py --quick    # small version of each, about a minute

1. Concurrency: N executors at once, each running cells that make MCP tool calls (test server over
   stdio, approval "auto"). N grows until a round fails or its p95 cell latency passes the budget.
2. Soak: sequential executions on one executor; host RSS, host open fds, kernel RSS sampled.
3. Churn: start and stop executors; processes left over and ipybox-* run dirs left in /tmp counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import anyio

from ipybox import CodeExecutor, IpyboxError, StdioServer
from ipybox._kernel import Kernel

__all__ = ("main",)

TEST_SERVER = Path(__file__).resolve().parent.parent / "tests" / "servers" / "test_server.py"
# A round "holds" while the slowest 5% of its cells finish within this many seconds.
P95_BUDGET = 5.0
# Executors per concurrency round in the full run; the ramp stops at the first round that fails.
FULL_RAMP = (1, 4, 8, 16, 24, 32, 48, 64)
QUICK_RAMP = (1, 4, 8)
# Executors starting at the same time: a kernel start takes about 1 s of CPU, and on 2 cores 16
# simultaneous starts miss the kernel's 30 s start timeout. Starts are staggered; the load is not.
STARTS_AT_ONCE = 4
# Cells per executor per round, and tool calls per cell.
CELLS_PER_EXECUTOR = 5
CALLS_PER_CELL = 10
# No single cell may take longer than this; past it the round counts as failed.
CELL_TIMEOUT = 60.0
CELL = (
    "from ipybox_kernel import call_tool\n"
    f"total = sum(int(call_tool('test', 'add', {{'a': i, 'b': 1}}).text) for i in range({CALLS_PER_CELL}))\n"
    "data = [x * x for x in range(20_000)]\n"
    "print(total, len(data))\n"
)
EXPECTED = f"{sum(range(CALLS_PER_CELL)) + CALLS_PER_CELL} 20000\n"


def test_server() -> StdioServer:
    return StdioServer(command=sys.executable, args=(str(TEST_SERVER), "--transport", "stdio"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tree_rss_kib(pid: int) -> int:
    return sum(rss_kib(p) for p in {pid, *descendants(pid)} if Path(f"/proc/{p}").exists())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Round:
    executors: int
    latencies: list[float] = field(default_factory=list[float])
    failures: list[str] = field(default_factory=list[str])
    wall: float = 0.0

    @property
    def holds(self) -> bool:
        return not self.failures and percentile(self.latencies, 0.95) <= P95_BUDGET


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = cast("BaseExceptionGroup[BaseException]", exc).exceptions[0]
    return exc


class Countdown:
    """Set once ``count`` parties have arrived: every executor is warm (or has failed)."""

    def __init__(self, count: int) -> None:
        self._left = count
        self.done = anyio.Event()
        if count == 0:
            self.done.set()

    def arrive(self) -> None:
        self._left -= 1
        if self._left == 0:
            self.done.set()


async def one_executor(
    root: Path, index: int, result: Round, starts: anyio.CapacityLimiter, ready: Countdown, go: anyio.Event
) -> None:
    """Start an executor and warm its MCP server up, then, once every executor is ready, run timed cells."""
    workspace = root / f"ws{index}"
    workspace.mkdir()
    arrived = False
    try:
        async with AsyncExitStack() as stack:
            async with starts:
                ex = await stack.enter_async_context(CodeExecutor(workspace=workspace, tools_dir=None, approval="auto"))
                ex.register_mcp_server("test", test_server())
                with anyio.fail_after(CELL_TIMEOUT * 2):
                    await ex.execute("from ipybox_kernel import call_tool\ncall_tool('test', 'add', {'a': 0, 'b': 0})")
            arrived = True
            ready.arrive()
            await go.wait()
            for _ in range(CELLS_PER_EXECUTOR):
                begin = time.monotonic()
                with anyio.fail_after(CELL_TIMEOUT):
                    out = await ex.execute(CELL)
                result.latencies.append(time.monotonic() - begin)
                if out.text != EXPECTED:
                    result.failures.append(f"executor {index}: unexpected output {out.text!r}")
    # Reported in the round's summary, not raised. A failed kernel start arrives as an ExceptionGroup.
    except (IpyboxError, TimeoutError, OSError, ExceptionGroup) as exc:
        result.failures.append(f"executor {index}: {type(exc).__name__}: {_leaf(exc)}")
        if not arrived:
            ready.arrive()


async def concurrency(ramp: tuple[int, ...]) -> None:
    print(f"\n== concurrency: N executors at once, each {CELLS_PER_EXECUTOR} cells x {CALLS_PER_CELL} tool calls ==")
    print(
        f"(start = until all have a kernel and a warm MCP server, {STARTS_AT_ONCE} starting at a time; "
        "latencies are per cell while all run)"
    )
    header = ("N", "start s", "cells", "p50 s", "p95 s", "max s", "wall s", "cells/s")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (4, 8, 6, 7, 7, 7, 7, 8), strict=True)) + "  holds")
    best = 0
    for n in ramp:
        result = Round(executors=n)
        ready = Countdown(n)
        go = anyio.Event()
        begin = started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            async with anyio.create_task_group() as tg:
                starts = anyio.CapacityLimiter(STARTS_AT_ONCE)
                for i in range(n):
                    tg.start_soon(one_executor, Path(tmp), i, result, starts, ready, go)
                await ready.done.wait()
                started = time.monotonic()
                go.set()
            result.wall = time.monotonic() - started
        lat = result.latencies or [float("nan")]
        print(
            f"{n:>4} {started - begin:>8.1f} {len(result.latencies):>6} {statistics.median(lat):>7.2f} "
            f"{percentile(lat, 0.95):>7.2f} {max(lat):>7.2f} {result.wall:>7.1f} "
            f"{len(result.latencies) / result.wall:>8.1f}  {'yes' if result.holds else 'NO'}"
        )
        for failure in result.failures[:3]:
            print(f"      {failure}")
        if not result.holds:
            break
        best = n
    print(f"largest N that holds (p95 <= {P95_BUDGET:g} s, no failures) on {os.cpu_count()} cores: {best}")


async def soak(executions: int) -> None:
    print(f"\n== soak: {executions} sequential executions on one executor ==")
    samples = 10
    every = max(executions // samples, 1)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        async with CodeExecutor(workspace=tmp, tools_dir=None, approval="auto") as ex:
            ex.register_mcp_server("test", test_server())
            kernel = ex._kernels.kernel  # sampled for its RSS
            assert isinstance(kernel, Kernel)
            assert kernel is not None
            print(f"{'done':>7} {'host RSS MiB':>13} {'host fds':>9} {'kernel RSS MiB':>15} {'exec/s':>7}")
            first: tuple[int, int, int] | None = None
            sample = (0, 0, 0)
            begin = last = time.monotonic()
            for i in range(1, executions + 1):
                # Every tenth execution makes a tool call, so the tool channel is soaked as well.
                code = (
                    "from ipybox_kernel import call_tool\nprint(call_tool('test', 'add', {'a': 1, 'b': 2}).text)"
                    if i % 10 == 0
                    else f"x = {i}\nprint(x)"
                )
                out = await ex.execute(code)
                if out.text not in ("3\n", f"{i}\n"):
                    print(f"  execution {i}: unexpected output {out.text!r}")
                if i % every == 0 or i == executions:
                    now = time.monotonic()
                    sample = (rss_kib(os.getpid()), open_fds(), tree_rss_kib(kernel.pid))
                    first = first or sample
                    rate = every / (now - last)
                    last = now
                    print(f"{i:>7} {sample[0] / 1024:>13.1f} {sample[1]:>9} {sample[2] / 1024:>15.1f} {rate:>7.0f}")
            assert first is not None
            total = time.monotonic() - begin
            print(
                f"growth from the first sample: host RSS {(sample[0] - first[0]) / 1024:+.1f} MiB, "
                f"host fds {sample[1] - first[1]:+d}, kernel RSS {(sample[2] - first[2]) / 1024:+.1f} MiB; "
                f"{executions / total:.0f} executions/s overall"
            )


async def churn(cycles: int) -> None:
    print(f"\n== churn: start and stop {cycles} executors ==")
    leaked: set[int] = set()
    dirs: list[Path] = []
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for i in range(cycles):
            async with CodeExecutor(workspace=tmp, tools_dir=None, approval="auto") as ex:
                ex.register_mcp_server("test", test_server())
                # The executor's own dir and its kernel's run dir; both must be gone after the stop.
                home, kernel = ex._side.home, ex._kernels.kernel
                assert kernel is None or isinstance(kernel, Kernel)
                dirs += [p for p in (home, kernel.run_dir if kernel else None) if p is not None]
                # Every fourth executor also starts its MCP server, so server processes are counted too.
                if i % 4 == 0:
                    await ex.execute("from ipybox_kernel import call_tool\ncall_tool('test', 'add', {'a': 1, 'b': 2})")
            leaked |= descendants(os.getpid())
    wall = time.monotonic() - begin
    left = [p for p in dirs if p.exists()]
    print(f"{cycles} start/stop cycles in {wall:.1f} s ({wall / cycles * 1000:.0f} ms per cycle)")
    print(f"processes left behind: {len(leaked)}; run dirs left behind: {len(left)} of {len(dirs)}")
    if leaked or left:
        print(f"  leaked pids: {sorted(leaked)[:10]}, dirs: {[str(p) for p in left[:10]]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small version of each benchmark")
    parser.add_argument("--only", choices=("concurrency", "soak", "churn"), help="run one benchmark")
    args = parser.parse_args()
    ramp, executions, cycles = (QUICK_RAMP, 500, 20) if args.quick else (FULL_RAMP, 10_000, 200)

    async def run_all() -> None:
        if args.only in (None, "concurrency"):
            await concurrency(ramp)
        if args.only in (None, "soak"):
            await soak(executions)
        if args.only in (None, "churn"):
            await churn(cycles)

    mode = "quick" if args.quick else "full"
    print(f"ipybox load benchmark ({mode}), {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    anyio.run(run_all)


if __name__ == "__main__":
    main()
