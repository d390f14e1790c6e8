"""Kernels on Jupyter Kernel Gateway against local kernels (issue #18).

Starts its own ``jupyter kernelgateway`` on 127.0.0.1 (kernel listing on, IOPub rate limit off, as
docs/remote.md asks of operators), then measures:

1. ``1+1`` and one approved tool call (the test server's ``greet``), local vs gateway: medians and ratios;
2. 20 executors at once through the one gateway: wall time to start them all and run ``1+1`` in each;
3. ``upload`` and ``download`` of a 10 MB file, local vs gateway: medians in MB/s;
4. 1,000 executions through the gateway, and 100 executor start/stop cycles: the host's RSS and the
   gateway's kernel count before and after (no leak: the count returns to what it was);
5. a dropped websocket, through a TCP relay the benchmark cuts while a cell runs: the time from the
   cut until the link is reopened and the kernel checked (the path back at once), and from the
   path's return until output the kernel printed while it was down arrives (medians).

    uv run --frozen python bench/gateway.py            # the issue's sizes, ~10 minutes on 2 cores
    uv run --frozen python bench/gateway.py --quick    # smaller sizes, ~2 minutes
    uv run --frozen python bench/gateway.py --reconnect-only
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from load import rss_kib, test_server
from servers.gateway import Gateway, relay, run_gateway

from ipybox import ApprovalRequest, CodeExecutionChunk, CodeExecutionResult, CodeExecutor, GatewayKernel, Timeouts

TRANSFER_BYTES = 10 * 10**6
GREET = "from ipybox_kernel import call_tool\ncall_tool('test', 'greet', {'name': 'bench'})"


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(ex: CodeExecutor, code: str, n: int) -> list[float]:
    await ex.execute(code)  # warm: the first call also starts the MCP server
    samples: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        await ex.execute(code)
        samples.append(time.perf_counter() - start)
    return samples


def kernel(gw: Gateway) -> GatewayKernel:
    return GatewayKernel(gw.url, token=gw.token, allow_unisolated_kernel=True)


async def latency(gw: Gateway, workspace: Path, n: int) -> None:
    rows: dict[str, dict[str, float]] = {}
    for name, remote in (("local", None), ("gateway", kernel(gw))):
        async with CodeExecutor(workspace=workspace, tools_dir=None, approval="auto", kernel=remote) as ex:
            ex.register_mcp_server("test", test_server())
            start = time.perf_counter()
            plain = median_ms(await timed(ex, "1+1", n))
            rows[name] = {"1+1": plain, "tool call": median_ms(await timed(ex, GREET, n))}
            print(f"  {name}: measured in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(f"\n| median of {n} | local | gateway | gateway / local |\n| --- | --- | --- | --- |")
    for what in ("1+1", "tool call"):
        local, remote_ms = rows["local"][what], rows["gateway"][what]
        print(f"| `{what}` | {local:.1f} ms | {remote_ms:.1f} ms | {remote_ms / local:.1f}x |")


async def concurrent(gw: Gateway, workspace: Path, executors: int) -> None:
    ready: list[float] = []
    runs: list[float] = []
    start = time.perf_counter()

    async def one() -> None:
        # Twenty kernels starting at once on two cores take far longer than one.
        timeouts = Timeouts(start=600)
        async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=kernel(gw), timeouts=timeouts) as ex:
            ready.append(time.perf_counter() - start)
            began = time.perf_counter()
            assert (await ex.execute("print(1+1)")).text == "2\n"
            runs.append(time.perf_counter() - began)

    async with anyio.create_task_group() as tg:
        for _ in range(executors):
            tg.start_soon(one)
    wall = time.perf_counter() - start
    print(
        f"\n{executors} executors at once through one gateway: all started and ran `1+1` in {wall:.1f} s; "
        f"start median {statistics.median(ready):.2f} s (max {max(ready):.2f} s), "
        f"`1+1` median {median_ms(runs):.1f} ms (max {max(runs) * 1000:.1f} ms)"
    )


async def transfers(gw: Gateway, workspace: Path, runs: int) -> None:
    src, back = workspace / "transfer-src.bin", workspace / "transfer-back.bin"
    src.write_bytes(os.urandom(TRANSFER_BYTES))
    rows: dict[str, tuple[float, float]] = {}
    for name, remote in (("local", None), ("gateway", kernel(gw))):
        up: list[float] = []
        down: list[float] = []
        async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=remote) as ex:
            for _ in range(runs):
                start = time.perf_counter()
                await ex.upload(src, "transfer.bin")
                up.append(time.perf_counter() - start)
                start = time.perf_counter()
                await ex.download("transfer.bin", back)
                down.append(time.perf_counter() - start)
                assert back.read_bytes() == src.read_bytes()
        rows[name] = (TRANSFER_BYTES / 1e6 / statistics.median(up), TRANSFER_BYTES / 1e6 / statistics.median(down))
    print(f"\n| {TRANSFER_BYTES // 10**6} MB file, median of {runs} | local | gateway |\n| --- | --- | --- |")
    for i, what in enumerate(("upload", "download")):
        print(f"| `{what}` | {rows['local'][i]:.0f} MB/s | {rows['gateway'][i]:.0f} MB/s |")


async def soak(gw: Gateway, workspace: Path, executions: int, cycles: int) -> None:
    kernels_before, rss_before = len(gw.kernel_ids()), rss_kib(os.getpid())
    async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=kernel(gw)) as ex:
        await ex.execute("1+1")
        rss_warm = rss_kib(os.getpid())
        start = time.perf_counter()
        for i in range(executions):
            await ex.execute(f"x = {i}; x + 1")
        took = time.perf_counter() - start
        rss_after = rss_kib(os.getpid())
    print(
        f"\n{executions} executions through the gateway in {took:.1f} s ({took / executions * 1000:.1f} ms each): "
        f"host RSS {rss_warm / 1024:.1f} MiB after the first, {rss_after / 1024:.1f} MiB after the last"
    )
    rss_cycles = rss_kib(os.getpid())
    start = time.perf_counter()
    for _ in range(cycles):
        async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=kernel(gw)) as ex:
            await ex.execute("1+1")
    took = time.perf_counter() - start
    print(
        f"{cycles} start/run/stop cycles in {took:.1f} s ({took / cycles:.2f} s each): host RSS "
        f"{rss_cycles / 1024:.1f} -> {rss_kib(os.getpid()) / 1024:.1f} MiB; gateway kernels "
        f"{kernels_before} before, {len(gw.kernel_ids())} after (host RSS at the very start "
        f"{rss_before / 1024:.1f} MiB)"
    )


# The cell of the reconnection benchmark: prints one line for each byte it gets on a unix socket (the
# gateway's kernels run on this machine), and answers each once the line is flushed.
ECHO = """\
import socket, sys
link = socket.socket(socket.AF_UNIX)
link.connect({path!r})
while (byte := link.recv(1)) not in (b"", b"q"):
    print(byte.decode())
    sys.stdout.flush()
    link.sendall(b".")
"""


Event = CodeExecutionChunk | ApprovalRequest | CodeExecutionResult


class Reopened(logging.Handler):
    """Sets an event when ipybox logs a reopened websocket (on the event loop's thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.event = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("reopened"):
            self.event.set()


async def next_line(events: AsyncIterator[Event]) -> str:
    """The next line of output (ipykernel may send a line in more than one chunk)."""
    text = ""
    async for event in events:
        if isinstance(event, CodeExecutionChunk):
            text += event.text
            if text.endswith("\n"):
                return text
    raise RuntimeError("the echo cell ended")


async def echo(link: anyio.abc.SocketStream, events: AsyncIterator[Event], byte: bytes) -> None:
    await link.send(byte)
    assert await link.receive(1) == b"."
    assert await next_line(events) == f"{byte.decode()}\n"


async def reconnection(gw: Gateway, workspace: Path, runs: int) -> None:
    reopened = Reopened()
    link_logger = logging.getLogger("ipybox._gateway._link")
    link_logger.addHandler(reopened)
    link_logger.setLevel(logging.INFO)
    blips: list[float] = []
    outages: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ipybox-") as directory:
        path = os.path.join(directory, "echo")
        before = set(gw.kernel_ids())
        async with await anyio.create_unix_listener(path) as listener, relay(gw.url) as hop:
            remote = GatewayKernel(hop.url, token=gw.token, allow_unisolated_kernel=True)
            async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=remote) as ex:
                execution = ex.execute(ECHO.format(path=path))
                events = aiter(execution)
                [kernel_id] = set(gw.kernel_ids()) - before
                with anyio.fail_after(600):
                    async with await listener.accept() as link:
                        await echo(link, events, b"a")
                        for _ in range(runs):
                            reopened.event = anyio.Event()
                            start = time.perf_counter()
                            await hop.cut()
                            await reopened.event.wait()
                            blips.append(time.perf_counter() - start)
                            await echo(link, events, b"b")
                        for _ in range(runs):
                            # Down until the gateway buffers and the kernel has printed into the buffer.
                            hop.down()
                            await hop.cut()
                            await gw.wait_disconnected(kernel_id)
                            await link.send(b"c")
                            assert await link.receive(1) == b"."
                            start = time.perf_counter()
                            hop.up()
                            assert await next_line(events) == "c\n"
                            outages.append(time.perf_counter() - start)
                        await link.send(b"q")
                    await execution
    link_logger.removeHandler(reopened)
    print(
        f"\nreconnection, median of {runs}: cut with the path back at once -> websocket reopened and the kernel "
        f"checked in {median_ms(blips):.0f} ms (max {max(blips) * 1000:.0f} ms); path down until the kernel "
        f"printed -> that output arrived {median_ms(outages):.0f} ms after the path came back "
        f"(max {max(outages) * 1000:.0f} ms)"
    )


async def main(quick: bool, reconnect_only: bool) -> None:
    n, executors, runs, executions, cycles = (20, 5, 3, 100, 10) if quick else (50, 20, 7, 1000, 100)
    with run_gateway() as gw, tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        if not reconnect_only:
            await latency(gw, workspace, n)
            await concurrent(gw, workspace, executors)
            await transfers(gw, workspace, runs)
            await soak(gw, workspace, executions, cycles)
        await reconnection(gw, workspace, 5 if quick else 15)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Kernels on Jupyter Kernel Gateway against local kernels")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--reconnect-only", action="store_true", help="only the dropped-websocket measurement")
    args = parser.parse_args()
    anyio.run(main, args.quick, args.reconnect_only)
