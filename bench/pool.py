"""A warm KernelPool against cold starts: how long until ``async with CodeExecutor(...)`` is ready.

    uv run --frozen python bench/pool.py                       # n=20 of each kind; about 3 minutes on 2 cores
    uv run --frozen python bench/pool.py -n 40 --kind skills   # one kind only

Three kinds of executor, each against a pool made for it: ``plain`` (no skills, no network),
``skills`` (``skills_dir``, the pool's ``skills_dir`` the same) and ``network`` (a `Network`, the
pool's ``network=True``). Rounds alternate: one cold start (the executor starting its own sandboxed
kernel), then one start from a pool of two that was refilled before the round. Each round times
``__aenter__`` ("ready"), then ``execute("1+1")`` untimed as a check, then the first result counted
from before ``__aenter__`` ("ready + 1+1"). The pooled rounds also check, by the kernel's pid, that
the executor ran a kernel that was waiting in the pool: a pooled round that did not is reported as
a miss. Prints one JSON object.
"""

# Which kernel an executor runs is internal; its pid is what tells a pooled kernel from its own.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from benchlib import summarize

from ipybox import CodeExecutor, KernelPool, Network
from ipybox._kernel import Kernel

# Refilling the pool between rounds: two sandboxed starts on a loaded 2-core machine.
FILL_TIMEOUT = 60.0
KINDS = ("plain", "skills", "network")


async def _round(executor: CodeExecutor) -> tuple[float, float, int]:
    """Seconds until ready and until the first result; the pid of the kernel it ran."""
    started = time.perf_counter()
    async with executor:
        ready = time.perf_counter() - started
        result = await executor.execute("1+1")
        first = time.perf_counter() - started
        assert result.text.strip() == "2", result.text
        kernel = executor._kernels.kernel
        assert isinstance(kernel, Kernel)
        return ready, first, kernel.pid


def _settings(kind: str, workspace: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pool's extra settings and the executor's for ``kind``."""
    if kind == "skills":
        return {"skills_dir": workspace / "skills"}, {"skills_dir": workspace / "skills"}
    if kind == "network":
        return {"network": True}, {"network": Network(allow=["example.org"])}
    return {}, {}


async def _kind(kind: str, n: int) -> dict[str, Any]:
    cold_ready: list[float] = []
    cold_first: list[float] = []
    warm_ready: list[float] = []
    warm_first: list[float] = []
    misses = 0
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-pool-") as work:
        workspace = Path(work)
        pooled, own = _settings(kind, workspace)
        async with KernelPool(size=2, workspace=workspace, tools_dir=None, **pooled) as pool:
            for i in range(n):
                ready, first, _ = await _round(CodeExecutor(workspace=workspace, tools_dir=None, **own))
                cold_ready.append(ready)
                cold_first.append(first)
                with anyio.fail_after(FILL_TIMEOUT):
                    await pool.wait_until_full()
                waiting = {lease.kernel.pid for lease in pool._ready if lease.kernel is not None}
                ready, first, pid = await _round(CodeExecutor(workspace=workspace, tools_dir=None, pool=pool, **own))
                warm_ready.append(ready)
                warm_first.append(first)
                misses += pid not in waiting
                print(
                    f"{kind} round {i + 1}/{n}: cold {cold_ready[-1] * 1000:.0f} ms, pooled {ready * 1000:.1f} ms",
                    file=sys.stderr,
                )
    return {
        f"{kind} cold: ready": summarize(cold_ready),
        f"{kind} pooled: ready": summarize(warm_ready),
        f"{kind} cold: ready + 1+1": summarize(cold_first),
        f"{kind} pooled: ready + 1+1": summarize(warm_first),
        f"{kind} pooled rounds that did not get a pooled kernel": misses,
    }


async def main(n: int, kinds: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for kind in kinds:
        report |= await _kind(kind, n)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A warm KernelPool against cold starts.")
    parser.add_argument("-n", type=int, default=20, help="rounds per kind (one cold and one pooled start each)")
    parser.add_argument(
        "--kind", action="append", default=[], choices=KINDS, help="measure only this kind (repeatable)"
    )
    args = parser.parse_args()
    kinds: list[str] = args.kind or list(KINDS)
    report = anyio.run(main, args.n, kinds)
    for row in report.values():
        if isinstance(row, dict):
            row.pop("samples", None)  # type: ignore[union-attr]
    print(json.dumps(report, indent=2))
