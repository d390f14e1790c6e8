"""Kernel code that attacks the tool channel itself: the unix socket to the host's ToolServer.

Whatever arrives on the socket (nested JSON, garbage, floods of connections and bytes) must end in
an error reply for that connection and bounded host memory, and the executor must keep running
code and tool calls afterwards.
"""

# The tests measure and inject faults into the executor's ToolServer, which is private.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import contextlib
import errno
import json
import os
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from deadline_support import patient
from servers.fixtures import stdio_server

from ipybox import ApprovalRequest, ApprovalRules, CodeExecutionError, CodeExecutor
from ipybox._toolserver._channel import MAX_JSON_DEPTH, MAX_JSON_VALUES, MAX_LINE_BYTES, MAX_REPLY_BYTES
from ipybox._toolserver._lines import _RECEIVE_CHUNK
from ipybox._toolserver._server import MAX_BUFFERED_BYTES, MAX_CONNECTIONS, BuiltinTool

from .conftest import processes_mentioning, run, wait_until_gone

pytestmark = pytest.mark.anyio

# Kernel code: helpers that talk to the tool socket directly, the way an attacker would.
RAW_SOCKET = """
import json, os, socket
TOKEN = os.environ["IPYBOX_TOOL_TOKEN"]
SOCKET = os.environ["IPYBOX_TOOL_SOCKET"]

def exchange(*lines, timeout=60):
    '''Send raw lines on one new connection; the replies (fewer if the host hangs up).'''
    replies = []
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(SOCKET)
        reader = sock.makefile("rb")
        for line in lines:
            try:
                sock.sendall(line)
                reply = reader.readline()
            except OSError:
                break
            if not reply:
                break
            replies.append(json.loads(reply))
    return replies

def request(server, tool, arguments, **extra):
    # The running execution's id, as the kernel's own client sends it: calls naming none are denied.
    execution = os.environ.get("IPYBOX_EXECUTION")
    fields = {"token": TOKEN, "seq": 1, "execution": execution, "server": server, "tool": tool, "arguments": arguments}
    fields.update(extra)
    return json.dumps(fields).encode() + b"\\n"
"""


async def exchange(executor: CodeExecutor, lines: str) -> list[dict[str, Any]]:
    """The replies to raw lines (a Python expression evaluated in the kernel) sent on one connection."""
    await run(executor, RAW_SOCKET)
    result = await run(executor, f"print(json.dumps(exchange(*{lines})))", timeout=60)
    return json.loads(result.text)


async def still_works(executor: CodeExecutor) -> None:
    """Code runs and a tool call reaches the MCP server, on the same executor."""
    code = "from mcptools.test import add\nprint(add.run(add.Params(a=40, b=2)).result)"
    result = await run(executor, code)
    assert result.text == "42\n"


async def test_one_line_of_deeply_nested_json_gets_an_error_naming_the_depth_limit_and_the_executor_keeps_working(
    auto_executor: CodeExecutor,
) -> None:
    nested = "{'x': " + "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2) + "}"
    too_deep = "{'x': " + "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1) + "}"
    lines = (
        "[b'[' * 100_000 + b'\\n', b'{\"a\":' * 100_000 + b'\\n', "
        f"request('nowhere', 'tool', {too_deep}), request('nowhere', 'tool', {nested})]"
    )
    brackets, objects, one_too_deep, at_the_limit = await exchange(auto_executor, lines)
    for reply in (brackets, objects, one_too_deep):
        assert reply["error"] == "bad_request", reply
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in reply["message"], reply
    # A request nested exactly to the limit is read, and refused only for naming no server.
    assert at_the_limit["error"] == "unknown_server", at_the_limit
    await still_works(auto_executor)


async def test_a_request_of_a_million_small_values_is_refused_before_it_is_parsed(auto_executor: CodeExecutor) -> None:
    # 3 MB of "[]," parsed into ~64 MB of Python lists; the 16 MiB line limit allowed ~430 MB. Commas and
    # brackets inside strings do not count, so a long string of them is read.
    lines = (
        f"[request('nowhere', 'tool', {{'x': [[]] * {MAX_JSON_VALUES}}}), "
        f"request('nowhere', 'tool', {{'x': '[],' * {MAX_JSON_VALUES}}})]"
    )
    many, in_a_string = await exchange(auto_executor, lines)
    assert many["error"] == "bad_request" and f"{MAX_JSON_VALUES} or more JSON values" in many["message"], many
    assert in_a_string["error"] == "unknown_server", in_a_string
    await still_works(auto_executor)


async def test_garbage_on_the_tool_socket_gets_error_replies_and_the_tool_server_keeps_serving(
    auto_executor: CodeExecutor,
) -> None:
    lines = (
        "[b'\\x00\\xff\\xfe garbage\\n', b'\\n', b'\"' * 1000 + b'\\n', b'[' + b'\"[\",' * 10_000 + b'1]\\n', "
        "b'9' * 100_000 + b'\\n', b'[1e999999, -1e999999, 1e-999999]\\n', "
        # Arguments the host parses but no MCP client can encode (a lone surrogate).
        "request('test', 'greet', {'name': '\\ud800'}), "
        "request('test', 'greet', {'name': 'Ada'})]"
    )
    replies = await exchange(auto_executor, lines)
    assert len(replies) == 8, replies
    *garbage, surrogate, greeting = replies
    # The many brackets inside strings do not count as nesting: that line is refused for being an array.
    assert garbage[3]["message"] == "a tool-call request must be a JSON object", garbage
    assert all(reply["ok"] is False for reply in garbage), garbage
    assert surrogate["error"] == "bad_request" and "Invalid JSON" in surrogate["message"], surrogate
    assert greeting["ok"] is True and greeting["text"] == "Hello, Ada!", greeting
    await still_works(auto_executor)


# -- host memory and connections -----------------------------------------------------------------

# Each partial line stays just under the per-line limit, so only the shared budget can stop them.
PARTIAL_LINE = MAX_LINE_BYTES - 1024 * 1024
# What the host may hold beyond the budget: one read per connection over it, and the spare room of
# the growing line buffers (a bytearray over-allocates by an eighth).
BUFFER_SLACK = MAX_CONNECTIONS * _RECEIVE_CHUNK + MAX_BUFFERED_BYTES // 8

HOLD_PARTIAL_LINES = f"""
import threading
DATA = b"x" * {PARTIAL_LINE}
held, refused = [], []

def hold():
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(60)
    sock.connect(SOCKET)
    try:
        sock.sendall(DATA)  # no newline: a request line that never ends
    except OSError:
        refused.append(json.loads(sock.makefile("rb").readline()))
        sock.close()
    else:
        held.append(sock)

threads = [threading.Thread(target=hold) for _ in range({MAX_CONNECTIONS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps([len(held), [reply["error"] for reply in refused]]))
"""


END_HELD_LINES = """
verdicts = []
for sock in held:
    try:
        sock.sendall(b"\\n")
    except OSError:
        pass  # the host refused this one and closed it; its reply is still there to read
    verdicts.append(json.loads(sock.makefile("rb").readline())["error"])
    sock.close()
print(json.dumps(verdicts))
"""


async def test_many_connections_each_holding_a_large_partial_line_stay_within_the_shared_buffer_budget(
    auto_executor: CodeExecutor,
) -> None:
    await run(auto_executor, RAW_SOCKET)
    # Python's own count of the bytes this process (and its ToolServer) allocates, at its peak: RSS
    # would also count what the C allocator keeps from earlier tests, which varies with their history.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = await run(auto_executor, HOLD_PARTIAL_LINES, timeout=120)
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    sent, refused = json.loads(result.text)
    # A client's sendall returns once its last bytes are in the socket, before the host has read
    # them: the host may still refuse that connection on its last chunk. Ending each line tells them
    # apart: the host answers a line it held (not JSON: bad_request), or had refused it (too_large).
    verdicts = json.loads((await run(auto_executor, END_HELD_LINES, timeout=120)).text)
    held = verdicts.count("bad_request")
    print(f"host memory peaked {grown / 2**20:.1f} MiB higher while {held} connections held {PARTIAL_LINE} bytes each")
    # Without the budget every connection would hold its line: MAX_CONNECTIONS * 15 MiB.
    assert held * PARTIAL_LINE <= MAX_BUFFERED_BYTES, (result.text, verdicts)
    assert set(verdicts) <= {"bad_request", "too_large"} and len(verdicts) == sent, verdicts
    assert set(refused) == {"too_large"} and sent + len(refused) == MAX_CONNECTIONS, result.text
    assert grown < MAX_BUFFERED_BYTES + BUFFER_SLACK, f"host memory peaked {grown} bytes higher"
    await still_works(auto_executor)


def host_sockets() -> int:
    """How many sockets this process (and its ToolServer) has open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the descriptor listdir itself used
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


async def test_the_host_serves_at_most_max_connections_however_many_the_kernel_opens(workspace: Path) -> None:
    active = peak = 0
    full, release = anyio.Event(), anyio.Event()

    async def hold(arguments: Mapping[str, Any]) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == MAX_CONNECTIONS:
            full.set()
        try:
            await release.wait()
        finally:
            active -= 1
        return "held"

    calls = 6 * MAX_CONNECTIONS
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from ipybox_kernel import call_tool\n"
        f"with ThreadPoolExecutor({calls}) as pool:\n"
        f"    texts = list(pool.map(lambda i: call_tool('probe', 'hold').text, range({calls})))\n"
        "print(texts.count('held'))\n"
    )
    async with CodeExecutor(workspace=workspace, tools_dir=None, approval="auto") as ex:
        assert ex._tools is not None
        ex._tools.register_builtin("probe", "hold", hold)
        before = host_sockets()
        execution = ex.execute(code, timeout=120)
        with anyio.fail_after(60):
            await full.wait()
        accepted = host_sockets() - before
        release.set()
        result = await execution
    assert result.text == f"{calls}\n"
    assert peak == MAX_CONNECTIONS
    assert accepted <= MAX_CONNECTIONS


# -- faults in one call --------------------------------------------------------------------------

CATCH = (
    "from ipybox_kernel import call_tool, ToolCallError\n"
    "try:\n    call_tool({server!r}, {tool!r}, {args!r}); print('returned')\n"
    "except ToolCallError as e:\n    print(type(e).__name__, '|', e)\n"
)


async def raise_timeout(arguments: Mapping[str, Any]) -> str:
    with anyio.fail_after(0.01):
        await anyio.sleep_forever()
    return "unreachable"


async def raise_os_error(arguments: Mapping[str, Any]) -> str:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/host/secret/path")


async def raise_unexpected(arguments: Mapping[str, Any]) -> str:
    raise KeyError("host secret")


async def raise_group(arguments: Mapping[str, Any]) -> str:
    async with anyio.create_task_group():
        raise ValueError("host secret")
    return "unreachable"


async def return_no_text(arguments: Mapping[str, Any]) -> str:
    return cast("str", 42)


# Each fault, and the start of the error the kernel code gets for it.
FAULTS: dict[str, tuple[BuiltinTool, str]] = {
    "timeout": (raise_timeout, "ToolCallTimeout | faults.timeout timed out on the host"),
    "os_error": (raise_os_error, "ToolExecutionError | faults.os_error failed on the host: No space left"),
    "unexpected": (raise_unexpected, "ToolCallError | faults.unexpected failed on the host ("),
    "group": (raise_group, "ToolCallError | faults.group failed on the host ("),
    "no_text": (return_no_text, "ToolCallError | faults.no_text failed on the host ("),
}


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_fault_in_a_built_in_tool_is_that_calls_error_and_the_executor_keeps_working(
    auto_executor: CodeExecutor, fault: str
) -> None:
    handler, expected = FAULTS[fault]
    assert auto_executor._tools is not None
    auto_executor._tools.register_builtin("faults", fault, handler)
    result = await run(auto_executor, CATCH.format(server="faults", tool=fault, args={}))
    assert result.text.startswith(expected), result.text
    assert "secret" not in result.text
    await still_works(auto_executor)


async def test_an_approval_callback_that_raises_rejects_that_call_and_the_executor_keeps_working(
    auto_executor: CodeExecutor,
) -> None:
    def broken(request: ApprovalRequest) -> bool:
        raise OSError(errno.EIO, "approval store on /host/secret unreadable")

    code = CATCH.format(server="test", tool="greet", args={"name": "x"})
    result = await auto_executor.execute(code, approval=broken)
    assert result.text.startswith("ToolCallRejected | "), result.text
    assert "the approval callback failed (OSError)" in result.text and "secret" not in result.text
    # Back under the executor's "auto" after code ran under another policy, the kernel must be fresh
    # (SECURITY.md, "Attribution of requests").
    await auto_executor.reset()
    await still_works(auto_executor)


async def test_a_server_that_exits_mid_call_is_that_calls_crash_and_the_next_call_starts_it_again(
    auto_executor: CodeExecutor,
) -> None:
    code = CATCH.format(server="test", tool="crash", args={})
    result = await run(auto_executor, code)
    assert result.text.startswith("MCPServerCrashed | "), result.text
    await still_works(auto_executor)


async def test_a_reply_over_the_limit_is_that_calls_error_and_the_executor_keeps_working(
    auto_executor: CodeExecutor,
) -> None:
    tools = auto_executor._tools
    assert tools is not None
    limit = 1024 * 1024

    async def huge(arguments: Mapping[str, Any]) -> str:
        return "x" * (2 * limit)

    tools.register_builtin("faults", "huge", huge)
    tools._max_reply_bytes = limit
    try:
        builtin = await run(auto_executor, CATCH.format(server="faults", tool="huge", args={}))
        mcp = await run(auto_executor, CATCH.format(server="test", tool="greet", args={"name": "x" * limit}))
    finally:
        tools._max_reply_bytes = MAX_REPLY_BYTES
    for result, name in ((builtin, "faults.huge"), (mcp, "test.greet")):
        assert result.text.startswith(f"ToolCallError | the result of {name} is "), result.text
        assert f"the limit is {limit} bytes" in result.text
    await still_works(auto_executor)


@pytest.mark.timeout(600)  # the backstop for a hang; the deadline below grows with the load
async def test_a_kernel_that_drops_its_connection_mid_call_cancels_only_that_call(
    auto_executor: CodeExecutor,
) -> None:
    entered, cancelled = anyio.Event(), anyio.Event()

    async def hang(arguments: Mapping[str, Any]) -> str:
        entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return "unreachable"

    assert auto_executor._tools is not None
    auto_executor._tools.register_builtin("faults", "hang", hang)
    await run(auto_executor, RAW_SOCKET)
    code = (
        "sock = socket.socket(socket.AF_UNIX)\nsock.connect(SOCKET)\n"
        "sock.sendall(request('faults', 'hang', {}))\n"
        "try:\n    sock.recv(1)\nfinally:\n    sock.close()\n"
    )
    execution = auto_executor.execute(code)
    with anyio.fail_after(patient(30)):
        await entered.wait()
        auto_executor.interrupt()  # the cell ends, and closes the connection as it goes
        with pytest.raises(CodeExecutionError, match="KeyboardInterrupt"):
            await execution
        await cancelled.wait()
    await still_works(auto_executor)


# -- servers start only for approved calls -------------------------------------------------------

MARKED_CALL = (
    "from ipybox_kernel import call_tool, ToolCallError\n"
    "try:\n    print(call_tool('marked', {tool!r}, {args!r}).text)\n"
    "except ToolCallError as e:\n    print(type(e).__name__)\n"
)


async def test_an_mcp_server_is_started_only_after_the_first_call_to_it_is_approved(
    workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    async with CodeExecutor(workspace=workspace, tools_dir=None, approval="ask") as ex:
        ex.register_mcp_server("marked", stdio_server(started_file=marker))
        rejected = await run(ex, MARKED_CALL.format(tool="greet", args={"name": "Ada"}), accept=False)
        assert rejected.text == "ToolCallRejected\n"
        assert not marker.exists()
        assert processes_mentioning(str(marker)) == []
        approved = await run(ex, MARKED_CALL.format(tool="greet", args={"name": "Ada"}))
        assert approved.text == "Hello, Ada!\n"
        (pid,) = map(int, marker.read_text().split())
        assert processes_mentioning(str(marker)) == [pid]
    await wait_until_gone(str(marker))


async def test_a_read_only_tool_of_a_server_that_never_ran_is_not_approved_by_the_read_only_rule(
    workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    rules = ApprovalRules(allow=["marked.add"], allow_read_only=True, otherwise="reject")
    lookup = MARKED_CALL.format(tool="lookup", args={"key": "k"})
    async with CodeExecutor(workspace=workspace, tools_dir=None, approval=rules) as ex:
        ex.register_mcp_server("marked", stdio_server(started_file=marker))
        # Its annotations are unknown until the server runs, and unknown is not read-only.
        assert (await run(ex, lookup)).text == "ToolCallRejected\n"
        assert not marker.exists()
        assert (await run(ex, MARKED_CALL.format(tool="add", args={"a": 1, "b": 2}))).text == "3\n"
        # Now the server has listed its tools, and says lookup only reads.
        assert (await run(ex, lookup)).text == "value of k\n"
    await wait_until_gone(str(marker))
