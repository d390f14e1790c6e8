"""Floors under the numbers, measured with plain clients in the host process.

`kernel_floor`: a plain ipykernel driven by jupyter_client's own client (no sandbox, no ipybox):
start until ready, and `execute_interactive("1+1")` until idle. The issue's kernel targets were set
against this floor on a faster machine; it moves with the machine, so it is measured in every run.

`direct_call`: `add` on the bench server over stdio, with no kernel, sandbox, tool channel or
approval in between. No executor can make a tool call cheaper than this.

`connect_and_list`: starting a server, initializing and listing its tools. Every
`generate_mcp_sources` pays this before it writes anything, so generation time minus this is the
cost of the generator itself.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import benchlib
from jupyter_client.manager import AsyncKernelManager
from mcp import ClientSession, StdioServerParameters, stdio_client

__all__ = ("connect_and_list", "direct_call", "kernel_floor")

# Bounds the whole measurement; a direct call takes ~1-3 ms, so this only trips on a hang.
BASELINE_TIMEOUT = 120.0


def _ignore(_: dict[str, Any]) -> None:
    pass


async def kernel_floor(*, starts: int = 5, executes: int = 200, warmup: int = 20) -> dict[str, Any]:
    """Start-to-ready and 1+1 round trip of a plain ipykernel through jupyter_client, over ipc."""
    start_times: list[float] = []
    rtts: list[float] = []
    with anyio.fail_after(BASELINE_TIMEOUT):
        for n in range(starts):
            manager = AsyncKernelManager(transport="ipc")
            t0 = time.perf_counter()
            await manager.start_kernel()  # pyright: ignore[reportUnknownMemberType]
            client = manager.client()
            client.start_channels()
            try:
                await client.wait_for_ready(timeout=BASELINE_TIMEOUT)
                start_times.append(time.perf_counter() - t0)
                if n == starts - 1:
                    for i in range(warmup + executes):
                        t0 = time.perf_counter()
                        reply = await client.execute_interactive("1+1", output_hook=_ignore)  # pyright: ignore[reportUnknownMemberType]
                        if i >= warmup:
                            rtts.append(time.perf_counter() - t0)
                        if reply["content"]["status"] != "ok":
                            raise RuntimeError(f"plain kernel answered {reply['content']!r} to 1+1")
            finally:
                client.stop_channels()
                await manager.shutdown_kernel(now=True)  # pyright: ignore[reportUnknownMemberType]
    return {"start_ready": benchlib.summarize(start_times), "execute_1plus1": benchlib.summarize(rtts)}


async def direct_call(*, calls: int = 200, warmup: int = 20) -> dict[str, Any]:
    """Median time of one `add` call on the bench server over stdio, straight from the host."""
    server = StdioServerParameters(command=sys.executable, args=[str(Path(__file__).with_name("bench_mcp_server.py"))])
    times: list[float] = []
    with anyio.fail_after(BASELINE_TIMEOUT):
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for i in range(warmup + calls):
                t0 = time.perf_counter()
                result = await session.call_tool("add", {"a": i, "b": 1})
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
                if result.structured_content != {"result": i + 1}:
                    raise RuntimeError(f"bench server answered {result.structured_content!r} to add({i}, 1)")
    return benchlib.summarize(times)


async def connect_and_list(command: str, args: list[str], *, reps: int = 3) -> dict[str, Any]:
    """Time from spawning a stdio server to having its tool list, over reps fresh sessions."""
    server = StdioServerParameters(command=command, args=args)
    times: list[float] = []
    tools = 0
    with anyio.fail_after(BASELINE_TIMEOUT):
        for _ in range(reps):
            t0 = time.perf_counter()
            async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                tools = len((await session.list_tools()).tools)
                times.append(time.perf_counter() - t0)
    return benchlib.summarize(times, tools=tools)
