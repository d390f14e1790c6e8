"""Python calls per tool call, ours against the same call made straight from the host.

    uv run --frozen python bench/callcount.py [--calls N] [--top N]

Counts rather than times: cProfile's call counts do not depend on the machine's load, so two trees
can be compared on a busy machine (run this script from each, at any time). For a loop of
``--calls`` calls of the bench server's ``add`` it reports, per call:

- ``direct``: the host calling the server through the MCP SDK (`ClientSession.call_tool`);
- ``host``: the host process while a cell of the same calls runs in a `CodeExecutor`'s kernel
  (default sandbox, ``approval="auto"``), less what an empty cell costs it;
- ``kernel``: the kernel's own calls for the loop (profiled in the kernel, less the empty loop);
- the host's calls by package, and the functions whose counts differ most from the direct call's.

A coroutine counts once per resumption, so the figures weigh passes through the event loop too.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from ipybox import CodeExecutor, generate_mcp_sources

__all__ = ("main",)

_SERVER = Path(__file__).with_name("bench_mcp_server.py")
_PACKAGES = ("ipybox", "mcp", "anyio", "asyncio", "pydantic", "opentelemetry", "jsonschema")

# Profiled in the kernel: the calls' loop, and the same loop without the calls, to subtract.
_KERNEL_CELL = """\
import cProfile as _cp
def _count(body):
    _p = _cp.Profile(); _p.enable(); body(); _p.disable()
    return sum(s.callcount for s in _p.getstats())
def _calls():
    for _i in range({n}):
        _a.run(_a.Params(a=_i, b=1))
def _empty():
    for _i in range({n}):
        pass
print(_count(_calls) - _count(_empty))
"""


def _counts(profile: cProfile.Profile) -> Counter[str]:
    counts: Counter[str] = Counter()
    for stat in profile.getstats():
        code = stat.code
        if isinstance(code, str):
            key = code
        else:
            where = code.co_filename.split("site-packages/")[-1]
            key = f"{where}:{code.co_firstlineno}:{code.co_name}"
        counts[key] += stat.callcount
    return counts


def _package(key: str) -> str:
    return next((p for p in _PACKAGES if f"{p}/" in key or key.startswith(p)), "other")


async def _direct(n: int) -> Counter[str]:
    server = StdioServerParameters(command=sys.executable, args=[str(_SERVER)])
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for i in range(20):
            await session.call_tool("add", {"a": i, "b": 1})
        profile = cProfile.Profile()
        profile.enable()
        for i in range(n):
            await session.call_tool("add", {"a": i, "b": 1})
        profile.disable()
    return _counts(profile)


async def _ours(n: int) -> tuple[Counter[str], int]:
    params = {"command": sys.executable, "args": [str(_SERVER)]}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        await generate_mcp_sources("benchsrv", params, work / "mcptools")
        async with CodeExecutor(workspace=work, tools_dir=work / "mcptools", approval="auto") as executor:
            await executor.execute("from mcptools.benchsrv import add as _a")
            cell = f"for _i in range({n}):\n    _a.run(_a.Params(a=_i, b=1))"
            await executor.execute(cell)  # warm-up: the server started, the first reply said "unmarked"
            profile = cProfile.Profile()
            profile.enable()
            await executor.execute("pass")
            profile.disable()
            empty = _counts(profile)
            profile = cProfile.Profile()
            profile.enable()
            await executor.execute(cell)
            profile.disable()
            host = _counts(profile)
            host.subtract(empty)
            kernel = await executor.execute(_KERNEL_CELL.format(n=n))
    return host, int((kernel.text or "0").strip())


async def _main(n: int, top: int) -> None:
    direct = await _direct(n)
    host, kernel = await _ours(n)
    by_package: Counter[str] = Counter()
    for key, count in host.items():
        by_package[_package(key)] += count
    extra = Counter(host)
    extra.subtract(direct)
    differences = [(key, round(count / n, 1)) for key, count in sorted(extra.items(), key=lambda kv: -abs(kv[1]))[:top]]
    report = {
        "calls": n,
        "direct": round(sum(direct.values()) / n, 1),
        "host": round(sum(host.values()) / n, 1),
        "kernel": round(kernel / n, 1),
        "host_by_package": {k: round(v / n, 1) for k, v in by_package.most_common()},
        "host_over_direct": differences,
    }
    print(f"Python calls per tool call: direct {report['direct']}, host {report['host']}, kernel {report['kernel']}")
    print("host by package:", report["host_by_package"])
    print("host against direct, largest differences per call:")
    for key, count in differences:
        print(f"  {count:+7.1f}  {key}")
    print(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    anyio.run(_main, args.calls, args.top)


if __name__ == "__main__":
    main()
