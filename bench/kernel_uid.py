"""What the kernel's own host uid costs at start, under host root: sandboxed starts with it against
starts as host uid 0 (the same code, with the uid step turned off), taking turns.

    uv run --frozen python bench/kernel_uid.py        # n=20 of each; run as root
    uv run --frozen python bench/kernel_uid.py -n 40

Rounds alternate in ABBA order (own uid first in even rounds, second in odd ones) so that a machine
whose load drifts affects both alike. Each start times ``__aenter__`` of a fresh ``CodeExecutor``
until ready, then checks ``execute("1+1")`` untimed and that the kernel's host uid is what the
variant says. Prints one JSON object: each variant's summary and the median of the per-round
differences (own uid minus root).
"""

# Turning the uid step off, and reading the kernel's host pid, reach into the kernel's module.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from benchlib import summarize

import ipybox._kernel._zmqkernel as zmqkernel
from ipybox import CodeExecutor
from ipybox._kernel import Kernel


def _host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def _no_kernel_uid(writable: list[Path]) -> None:
    return None


async def _start(workspace: Path, *, own_uid: bool) -> float:
    real = zmqkernel.kernel_uid
    if not own_uid:
        zmqkernel.kernel_uid = _no_kernel_uid
    try:
        started = time.perf_counter()
        async with CodeExecutor(workspace=workspace) as executor:
            ready = time.perf_counter() - started
            result = await executor.execute("1+1")
            assert result.text.strip() == "2", result.text
            kernel = executor._kernels.kernel
            assert isinstance(kernel, Kernel) and kernel._sandbox_pid is not None
            assert (_host_uid(kernel._sandbox_pid) != 0) == own_uid
            return ready
    finally:
        zmqkernel.kernel_uid = real


async def main(n: int) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the kernel gets a uid of its own only then")
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        # One untimed start of each: the uid probe runs once per process, imports warm up.
        await _start(workspace, own_uid=True)
        await _start(workspace, own_uid=False)
        own: list[float] = []
        root: list[float] = []
        for i in range(n):
            order = (True, False) if i % 2 == 0 else (False, True)
            for variant in order:
                (own if variant else root).append(await _start(workspace, own_uid=variant))
    differences = [a - b for a, b in zip(own, root, strict=True)]
    return {
        "own_uid": summarize(own),
        "root_uid": summarize(root),
        "own_minus_root_median_ms": round(statistics.median(differences) * 1000, 1),
        "load_average": os.getloadavg(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Kernel start with its own host uid against host uid 0.")
    parser.add_argument("-n", type=int, default=20, help="rounds (one start of each variant per round)")
    print(json.dumps(anyio.run(main, parser.parse_args().n)))
