"""Where the time of one MCP tool call from kernel code goes, hop by hop.

    uv run --frozen python bench/hops.py [--calls N]

Needs ``node_modules/.bin/mcp-server-everything`` (``npm ci``). Not part of ``run.py``: that one
times whole calls from a real kernel; this one takes the path apart, with no kernel in between:

- ``mcp raw``: ``ClientSession.call_tool("get-sum")`` on server-everything over stdio, back to back
  in this process. The floor under everything else: the MCP SDK plus the Node server.
- host stages: each step the ToolServer takes for one request, timed alone in a loop (parse and
  token, request validation, the arguments' check against the input schema, also with its
  validator made for each call as before it was kept per schema, the tool's annotations, the
  approval gate as ``CodeExecutor`` runs it with ``approval="auto"``, result conversion, reply
  encoding).
- ``channel``: a client process calling a host built-in tool that returns at once through the
  kernel stub (``ipybox_kernel.call_tool``): socket, ToolServer, gate, stub, no MCP server.
- ``chain``: the same client calling server-everything's ``get-sum``, through the stub, then
  through the generated module (``get_sum.run(get_sum.Params(...))``) as kernel code does.
- ``kernel``: the same calls timed inside a `CodeExecutor`'s kernel (default sandbox,
  ``approval="auto"``): an unknown server (answered before the gate), the ``ipybox`` built-in
  refusing empty arguments (after the gate), the same after a ``print()``, the stub and the
  generated module. Under ``"auto"`` nobody is shown a call, so after the first reply says
  ``"unmarked"`` the kernel no longer flushes and marks its output before each call; the last row
  is the ``print()`` again under ``ApprovalRules`` that approve the built-in, where each call's output
  is flushed and marked before its request (ipybox_kernel._marks).

Everything is reported as medians in ms over ``--calls`` calls after a warm-up.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from mcp import types as mcp_types

from ipybox import ApprovalRules, CodeExecutor, generate_mcp_sources
from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest
from ipybox._approval._policies import decide_by_policy
from ipybox._mcp._schemacheck import schema_problem
from ipybox._mcp._servers import StdioServer, open_session
from ipybox._toolserver._channel import ToolRequest, ToolResultReply
from ipybox._toolserver._parse import parse_request
from ipybox._toolserver._registry import check_arguments
from ipybox._toolserver._server import ToolServer

__all__ = ("main",)

REPO = Path(__file__).resolve().parent.parent
EVERYTHING_BIN = REPO / "node_modules" / ".bin" / "mcp-server-everything"
# Calls before timing starts: imports, first-use caches, the server's JIT.
WARMUP = 50
# Bounds each section; a call takes milliseconds, so this only trips on a hang.
SECTION_TIMEOUT = 120.0

# Run in a separate interpreter (as the kernel is): times calls through the stub and prints the
# per-call times in ns as one JSON list. argv: mode, calls, warmup.
_CLIENT = r"""
import json, sys, time
mode, calls, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import ipybox_kernel
if mode == "builtin":
    def one(i): return ipybox_kernel.call_tool("bench", "noop", {"a": i, "b": 1})
elif mode == "stub":
    def one(i): return ipybox_kernel.call_tool("everything", "get-sum", {"a": i, "b": 1})
else:
    from mcptools.everything import get_sum
    def one(i): return get_sum.run(get_sum.Params(a=i, b=1))
times = []
for i in range(warmup + calls):
    t0 = time.perf_counter_ns()
    one(i)
    if i >= warmup:
        times.append(time.perf_counter_ns() - t0)
print(json.dumps(times))
"""


def _ms(samples_ns: list[int] | list[float]) -> float:
    return statistics.median(samples_ns) / 1e6


def _loop(fn: Callable[[], object], n: int) -> float:
    """Median ms of ``fn()`` over n runs, after a warm-up."""
    for _ in range(min(n, WARMUP)):
        fn()
    times: list[int] = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return _ms(times)


async def _aloop(fn: Callable[[], Awaitable[object]], n: int) -> float:
    for _ in range(min(n, WARMUP)):
        await fn()
    times: list[int] = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await fn()
        times.append(time.perf_counter_ns() - t0)
    return _ms(times)


def _everything() -> StdioServer:
    return StdioServer(command=str(EVERYTHING_BIN), args=("stdio",))


async def mcp_raw(calls: int) -> tuple[float, mcp_types.CallToolResult, mcp_types.Tool]:
    """Back-to-back ``call_tool`` on one session, plus a result and the tool spec for the stages."""
    with tempfile.TemporaryFile("w+") as errlog:
        async with open_session("everything", _everything(), errlog=errlog) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            counter = iter(range(10**9))

            async def one() -> mcp_types.CallToolResult:
                return await session.call_tool("get-sum", {"a": next(counter), "b": 1})

            median = await _aloop(one, calls)
            return median, await one(), tools["get-sum"]


async def host_stages(calls: int, result: mcp_types.CallToolResult, spec: mcp_types.Tool) -> dict[str, float]:
    """Each step of the ToolServer's handling of one request, timed alone."""
    token = secrets.token_urlsafe(32)
    request = {
        "token": token,
        "seq": 7,
        "execution": "0c4a6b2e-6f1d4a7e9b3c-1_123_4",
        "server": "everything",
        "tool": "get-sum",
        "arguments": {"a": 3, "b": 1},
    }
    line = json.dumps(request, separators=(",", ":")).encode()
    expected = token.encode()
    fields: dict[str, Any] = json.loads(line)
    parsed = ToolRequest.model_validate(fields)
    stages: dict[str, float] = {}
    stages["json.loads(request)"] = _loop(lambda: json.loads(line), calls)
    stages["token check"] = _loop(lambda: hmac.compare_digest(str(fields["token"]).encode(), expected), calls)
    stages["ToolRequest.model_validate"] = _loop(lambda: ToolRequest.model_validate(fields), calls)

    stages["parse_request (all of the above)"] = _loop(lambda: parse_request(line, expected), calls)
    # The check of the arguments against the listed input schema, with the validator kept per schema
    # (what the tool server does), and made for each call (what it did before the cache).
    stages["check_arguments"] = _loop(lambda: check_arguments(spec.input_schema, parsed), calls)
    stages["  same, validator made each call"] = _loop(
        lambda: schema_problem(spec.input_schema, parsed.arguments, "input", "the arguments", listed=False), calls
    )

    def dump_annotations() -> dict[str, Any] | None:
        return spec.annotations.model_dump(by_alias=True, mode="json", exclude_none=True) if spec.annotations else None

    stages["annotations dump"] = _loop(dump_annotations, calls)
    annotations = dump_annotations()
    stages["ApprovalRequest()"] = _loop(lambda: _approval_request(parsed, annotations), calls)
    stages["gate (request + auto policy)"] = await _aloop(lambda: _auto_gate(parsed, annotations), calls)

    def convert() -> ToolResultReply:
        text = "\n".join(item.text for item in result.content if isinstance(item, mcp_types.TextContent))
        return ToolResultReply(
            seq=7,
            structured=result.structured_content,
            text=text,
            content=[item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in result.content],
        )

    stages["result -> ToolResultReply"] = _loop(convert, calls)
    reply = convert()
    stages["reply.model_dump_json"] = _loop(lambda: reply.model_dump_json().encode() + b"\n", calls)
    return stages


_approvals = iter(range(10**9))
_EVERYTHING = "node_modules/.bin/mcp-server-everything stdio"


def _approval_request(
    call: ToolRequest,
    annotations: Mapping[str, Any] | None,
    server: str = _EVERYTHING,
    input_schema: Mapping[str, Any] | None = None,
) -> ApprovalRequest:
    return ApprovalRequest(
        id=f"exec:{next(_approvals)}",
        server_name=call.server,
        tool_name=call.tool,
        tool_args=call.arguments,
        server=server,
        annotations=annotations,
        input_schema=input_schema,
    )


async def _auto_gate(
    call: ToolRequest,
    /,
    annotations: Mapping[str, Any] | None,
    *,
    server: str = _EVERYTHING,
    input_schema: Mapping[str, Any] | None = None,
) -> ApprovalDecision:
    """What CodeExecutor._gate does with approval="auto"."""
    request = _approval_request(call, annotations, server, input_schema)
    decision, _ = await decide_by_policy("auto", request)
    assert decision is not None
    request.decide(decision)
    return decision


async def _through_stub(mode: str, calls: int, env: Mapping[str, str], cwd: Path) -> float:
    argv = [sys.executable, "-c", _CLIENT, mode, str(calls), str(WARMUP)]
    process = await anyio.run_process(argv, env={**os.environ, **env}, cwd=cwd, check=True)
    times: list[int] = json.loads(process.stdout)
    return _ms(times)


async def channel_and_chain(calls: int, work: Path) -> dict[str, float]:
    """Calls from a separate interpreter through the stub: a host built-in, then server-everything."""
    await generate_mcp_sources("everything", _everything(), work / "mcptools")
    token = secrets.token_urlsafe(32)

    async def noop(arguments: Mapping[str, Any]) -> str:
        return "ok"

    server = ToolServer(socket_path=work / "tools.sock", token=token, gate=_auto_gate)
    server.register_builtin("bench", "noop", noop)
    server.register("everything", _everything())
    env = {"IPYBOX_TOOL_SOCKET": str(work / "tools.sock"), "IPYBOX_TOOL_TOKEN": token, "PYTHONPATH": str(work)}
    results: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(server.run)
        results["channel: stub -> host built-in"] = await _through_stub("builtin", calls, env, work)
        results["chain: stub -> server-everything"] = await _through_stub("stub", calls, env, work)
        results["chain: generated get_sum.run()"] = await _through_stub("generated", calls, env, work)
        tg.cancel_scope.cancel()
    return results


_KERNEL_CELL = """
import json as _json, time as _time, ipybox_kernel as _k
from mcptools.everything import get_sum as _get_sum

def _median_ms(fn, n):
    for i in range({warmup}):
        fn(i)
    times = []
    for i in range(n):
        t0 = _time.perf_counter_ns()
        fn(i)
        times.append(_time.perf_counter_ns() - t0)
    return sorted(times)[n // 2] / 1e6

def _unknown(i):
    try:
        _k.call_tool("no-such-server", "x", {{}})
    except _k.ToolNotFound:
        pass

def _builtin(i):
    try:
        _k.call_tool("ipybox", "install_package", {{}})
    except _k.ToolExecutionError:
        pass

def _printed_builtin(i):
    print(i)
    _builtin(i)

print(_json.dumps({{
    "kernel: stub -> unknown server (no gate)": _median_ms(_unknown, {calls}),
    "kernel: stub -> host built-in (gate)": _median_ms(_builtin, {calls}),
    "kernel: print(), stub -> host built-in": _median_ms(_printed_builtin, {calls}),
    "kernel: stub -> server-everything": _median_ms(
        lambda i: _k.call_tool("everything", "get-sum", {{"a": i, "b": 1}}), {calls}),
    "kernel: generated get_sum.run()": _median_ms(lambda i: _get_sum.run(_get_sum.Params(a=i, b=1)), {calls}),
}}))
"""

# The print() row again under rules that may ask: each call's output is flushed and marked first.
_MARKED_CELL = """
print(_json.dumps({{"kernel: print(), built-in, marked": _median_ms(_printed_builtin, {calls})}}))
"""


async def in_kernel(calls: int, work: Path) -> dict[str, float]:
    """The same calls from kernel code, in a CodeExecutor's sandboxed kernel."""
    tools = work / "mcptools"
    if not await anyio.Path(tools).is_dir():
        await generate_mcp_sources("everything", _everything(), tools)
    async with CodeExecutor(workspace=work, tools_dir=tools, approval="auto") as executor:
        result = await executor.execute(_KERNEL_CELL.format(calls=calls, warmup=WARMUP))
        rows: dict[str, float] = json.loads(result.text.strip().splitlines()[-1])
        # Last: code run under "auto" before may run under any later policy, not the other way round.
        rules = ApprovalRules(allow=["ipybox.install_package"])
        marked = await executor.execute(_MARKED_CELL.format(calls=calls), approval=rules)
        rows.update(json.loads(marked.text.strip().splitlines()[-1]))
    return rows


async def run(calls: int) -> dict[str, float]:
    if not EVERYTHING_BIN.exists():
        raise SystemExit(f"{EVERYTHING_BIN} is missing; run `npm ci` in {REPO}")
    rows: dict[str, float] = {}
    with anyio.fail_after(SECTION_TIMEOUT):
        raw, result, spec = await mcp_raw(calls)
    rows["mcp raw: ClientSession.call_tool"] = raw
    rows.update(await host_stages(calls, result, spec))
    with tempfile.TemporaryDirectory(prefix="ipybox-hops-") as tmp, anyio.fail_after(SECTION_TIMEOUT):
        rows.update(await channel_and_chain(calls, Path(tmp)))
        rows.update(await in_kernel(calls, Path(tmp)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    rows = anyio.run(run, args.calls)
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"{'hop':<40} {'median ms':>10}   (n={args.calls}, load average {load})")
    for name, value in rows.items():
        print(f"{name:<40} {value:>10.4f}")


if __name__ == "__main__":
    main()
