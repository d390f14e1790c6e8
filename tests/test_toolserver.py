"""The host ToolServer with real MCP servers over stdio, streamable HTTP and SSE, and a real client."""

from __future__ import annotations

import base64
import datetime
import errno
import json
import os
import select
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from servers.fixtures import SERVER_SCRIPT, Channel, RecordingGate, stdio_server, tool_channel, wait_for_exit
from servers.test_server import png_bytes

from ipybox._approval._decisions import ApprovalDecision
from ipybox._exceptions import UsageError
from ipybox._mcp._servers import HttpServer, StdioServer
from ipybox._toolserver._boundary import ToolCallFailed, tool_errors
from ipybox._toolserver._channel import MAX_LINE_BYTES, ToolRequest
from ipybox._toolserver._server import ToolServer

pytestmark = pytest.mark.anyio

ORDER = {
    "customer": {
        "name": "Ada",
        "email": "ada@example.org",
        "address": {"street": "1 Main St", "city": "Zurich", "country": "CH"},
    },
    "items": [
        {"sku": "ABC-123", "quantity": 2, "unit_price": 2.5},
        {"sku": "XYZ-999", "quantity": 1, "unit_price": 10},
    ],
    "priority": "urgent",
}


async def test_calls_over_each_transport_return_text_structured_and_image_results(
    server_params: StdioServer | HttpServer,
) -> None:
    gate = RecordingGate()
    async with tool_channel({"test": server_params}, gate) as channel:
        greet, order, stats, add, time_, image = await channel.calls(
            ("test", "greet", {"name": "Ada"}),
            ("test", "create_order", ORDER),
            ("test", "compute_stats", {"values": [1, 2, 6]}),
            ("test", "add", {"a": 2, "b": 40}),
            ("test", "get-time", None),
            ("test", "make_image", {"color": "blue"}),
        )
    assert greet == {
        "structured": None,
        "text": "Hello, Ada!",
        "content": [{"type": "text", "text": "Hello, Ada!"}],
    }
    assert order["text"] == "order for Ada to Zurich, CH: 2 items, total 15.00, priority urgent"
    assert stats["structured"] == {"count": 3, "mean": 3.0, "range": {"min": 1.0, "max": 6.0}}
    assert add["structured"] == {"result": 42}
    assert add["text"] == "42"
    assert datetime.datetime.fromisoformat(time_["text"]).tzinfo is not None
    assert image["content"] == [
        {
            "type": "image",
            "mimeType": "image/png",
            "data": base64.b64encode(png_bytes(4, 4, (0, 0, 255))).decode(),
        }
    ]
    assert gate.tools == ["greet", "create_order", "compute_stats", "add", "get-time", "make_image"]


async def test_tool_errors_and_unknown_names_raise_readable_errors_and_skip_the_gate(
    server_params: StdioServer | HttpServer,
) -> None:
    gate = RecordingGate()
    async with tool_channel({"test": server_params}, gate) as channel:
        failed, invalid, no_tool, no_server, after = await channel.calls(
            ("test", "fail", {"message": "the disk is full"}),
            ("test", "create_order", {**ORDER, "priority": "whenever"}),
            ("test", "no_such_tool", {}),
            ("nowhere", "greet", {"name": "Ada"}),
            ("test", "add", {"a": 1, "b": 1}),
        )
    assert failed["error"] == "ToolExecutionError"
    assert "the disk is full" in failed["message"]
    assert (failed["server_name"], failed["tool_name"]) == ("test", "fail")
    # A value the input schema refuses is refused by the host, before the gate (the server is listed by then).
    assert invalid["error"] == "ToolCallError"
    assert "priority" in invalid["message"] and "The call was not made" in invalid["message"]
    assert no_tool["error"] == "ToolNotFound"
    assert "'no_such_tool'" in no_tool["message"] and "'greet'" in no_tool["message"]
    assert no_server["error"] == "ToolNotFound"
    assert "'nowhere'" in no_server["message"] and "'test'" in no_server["message"]
    assert after["structured"] == {"result": 2}
    assert gate.tools == ["fail", "add"]


async def test_the_gate_sees_the_real_command_line_or_url_and_once_the_server_ran_the_tool_annotations(
    server_params: StdioServer | HttpServer,
) -> None:
    gate = RecordingGate()
    async with tool_channel({"test": server_params}, gate) as channel:
        await channel.calls(
            ("test", "lookup", {"key": "k"}),
            ("test", "lookup", {"key": "k"}),
            ("test", "delete_item", {"item_id": "7"}),
        )
    first, lookup, delete = gate.calls
    if isinstance(server_params, StdioServer):
        expected = shlex.join([sys.executable, str(SERVER_SCRIPT), "--transport", "stdio"])
    else:
        expected = f"{server_params.type} {server_params.url}"
    assert first.server == lookup.server == delete.server == expected
    # The first call is approved before the server runs, so nothing is known of its tools yet.
    assert first.annotations is None
    assert lookup.annotations == {"readOnlyHint": True}
    assert delete.annotations == {"readOnlyHint": False, "destructiveHint": True}
    assert (delete.server_name, delete.tool_name, delete.request.arguments) == (
        "test",
        "delete_item",
        {"item_id": "7"},
    )
    assert delete.seq > lookup.seq
    assert delete.request.execution is None  # the stand-in kernel is not IPython


async def test_the_gate_sees_one_read_only_schema_and_annotations_per_listing_of_a_tool() -> None:
    # Made read-only once per listing and shared by the tool's calls, not copied for each call.
    gate = RecordingGate()
    async with tool_channel({"test": stdio_server()}, gate) as channel:
        await channel.calls(*[("test", "lookup", {"key": "k"})] * 3)
        await channel.tool_server.reset()
        await channel.calls(*[("test", "lookup", {"key": "k"})] * 2)
    first, second, third, relisted_first, relisted = gate.calls
    assert first.annotations is None and first.input_schema is None  # not listed yet
    assert second.annotations == third.annotations == relisted.annotations == {"readOnlyHint": True}
    assert second.annotations is third.annotations and second.input_schema is third.input_schema
    # After the reset the server is listed again when the call runs: the gate saw the last listing
    # (the same objects), and the call after it the new one.
    assert relisted_first.input_schema is third.input_schema
    assert relisted.input_schema is not third.input_schema and relisted.input_schema == third.input_schema
    for shared in (third.annotations, third.input_schema):
        assert shared is not None
        with pytest.raises(TypeError, match="read-only"):
            shared["readOnlyHint"] = False  # pyright: ignore[reportIndexIssue]
    assert third.input_schema is not None
    properties = third.input_schema["properties"]
    with pytest.raises(TypeError, match="read-only"):
        properties["injected"] = {"type": "string"}


async def test_after_a_reset_the_gate_still_sees_the_annotations_of_the_last_listing_and_no_server_runs() -> None:
    gate = RecordingGate(deny={"lookup": "not now"})
    async with tool_channel({"test": stdio_server()}, gate) as channel:
        pid = (await channel.call("test", "pid"))["structured"]["result"]
        await channel.tool_server.reset()
        await wait_for_exit(pid)
        rejected = await channel.call("test", "lookup", {"key": "k"})
        assert channel.tool_server._sessions._entries["test"].live is None
    assert rejected["error"] == "ToolCallRejected"
    assert gate.calls[-1].annotations == {"readOnlyHint": True}


async def test_an_unknown_tool_is_refused_once_its_server_runs_and_from_then_on_without_asking(tmp_path: Path) -> None:
    started = tmp_path / "started"
    gate = RecordingGate()
    async with tool_channel({"test": stdio_server(started_file=started)}, gate) as channel:
        first, again = await channel.calls(("test", "no_such_tool", {}), ("test", "no_such_tool", {}))
    assert first["error"] == again["error"] == "ToolNotFound"
    assert "'no_such_tool'" in first["message"] and "'greet'" in first["message"]
    # Asked once: whether a tool exists is known only from a running server, started for an approved call.
    assert gate.tools == ["no_such_tool"]
    assert len(started.read_text().split()) == 1


async def test_a_rejected_call_raises_tool_call_rejected_with_the_reason_and_never_runs(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.log"
    gate = RecordingGate(deny={"delete_item": "deleting needs a human", "lookup": None})
    async with tool_channel({"test": stdio_server(call_log=log)}, gate) as channel:
        denied, denied_silently = await channel.calls(
            ("test", "delete_item", {"item_id": "7"}), ("test", "lookup", {"key": "k"})
        )
    assert denied["error"] == "ToolCallRejected"
    assert denied["reason"] == "deleting needs a human"
    assert "deleting needs a human" in denied["message"] and "'delete_item'" in denied["message"]
    assert denied_silently["error"] == "ToolCallRejected"
    assert denied_silently["reason"] is None
    assert not log.exists()


async def test_a_gate_that_fails_rejects_the_call_without_running_it(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"

    async def broken_gate(request: ToolRequest, **_: Any) -> ApprovalDecision:
        raise KeyError("policy table missing")

    async with tool_channel({"test": stdio_server(call_log=log)}, broken_gate) as channel:
        outcome = await channel.call("test", "delete_item", {"item_id": "7"})
    assert outcome["error"] == "ToolCallError"
    assert "failed on the host (KeyError)" in outcome["message"]
    assert "policy table" not in outcome["message"]
    assert not log.exists()


async def test_an_approved_destructive_call_runs_once(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with tool_channel({"test": stdio_server(call_log=log)}) as channel:
        outcome = await channel.call("test", "delete_item", {"item_id": "7"})
    assert outcome["text"] == "deleted 7"
    assert log.read_text() == "delete_item 7\n"


async def test_a_server_crash_mid_call_is_reported_and_the_next_call_restarts_it(tmp_path: Path) -> None:
    started = tmp_path / "started"
    async with tool_channel({"test": stdio_server(started_file=started)}) as channel:
        before, crashed, after = await channel.calls(
            ("test", "pid", None), ("test", "crash", None), ("test", "pid", None)
        )
    assert crashed["error"] == "MCPServerCrashed"
    assert "'test'" in crashed["message"] and "'crash'" in crashed["message"]
    assert "crashing on request" in crashed["output"]
    assert before["structured"]["result"] != after["structured"]["result"]
    assert started.read_text().split() == [
        str(before["structured"]["result"]),
        str(after["structured"]["result"]),
    ]


async def test_a_crash_over_http_is_reported_as_a_crash() -> None:
    from servers.fixtures import http_server

    with http_server("streamable-http") as params:
        async with tool_channel({"test": params}) as channel:
            outcome = await channel.call("test", "crash")
    assert outcome["error"] == "MCPServerCrashed"
    assert "'crash'" in outcome["message"]


async def test_a_call_past_the_call_timeout_raises_a_timeout_naming_server_and_tool(
    streamable_http_server: HttpServer,
) -> None:
    async with tool_channel({"test": streamable_http_server}, call_timeout=0.5) as channel:
        started = time.monotonic()
        slow, after = await channel.calls(("test", "slow", {"seconds": 30}), ("test", "add", {"a": 1, "b": 2}))
        elapsed = time.monotonic() - started
    assert slow["error"] == "ToolCallTimeout"
    assert slow["timeout"] == 0.5
    assert "'slow'" in slow["message"] and "'test'" in slow["message"] and "0.5 s" in slow["message"]
    assert after["structured"] == {"result": 3}
    assert elapsed < 20


async def test_a_server_that_fails_to_start_reports_its_stderr_and_other_servers_keep_working(
    streamable_http_server: HttpServer,
) -> None:
    failing = StdioServer(
        command=sys.executable,
        args=("-c", "import sys; sys.stderr.write('fatal: no API key configured\\n'); sys.exit(3)"),
    )
    missing = StdioServer(command="/nonexistent/mcp-server")
    servers = {"failing": failing, "missing": missing, "test": streamable_http_server}
    async with tool_channel(servers) as channel:
        fail_start, fail_missing, ok, fail_again = await channel.calls(
            ("failing", "anything", {}),
            ("missing", "anything", {}),
            ("test", "add", {"a": 1, "b": 2}),
            ("failing", "anything", {}),
        )
    assert fail_start["error"] == "MCPServerStartError"
    assert "fatal: no API key configured" in fail_start["output"]
    assert "'failing'" in fail_start["message"] and "fatal: no API key configured" in fail_start["message"]
    assert fail_missing["error"] == "MCPServerStartError"
    assert "/nonexistent/mcp-server" in fail_missing["message"]
    assert ok["structured"] == {"result": 3}
    assert fail_again["error"] == "MCPServerStartError"


async def test_a_server_that_died_while_idle_is_restarted_on_the_next_call() -> None:
    async with tool_channel({"test": stdio_server()}) as channel:
        channel.tool_server._sessions.idle_probe_after = 0.0
        first = (await channel.call("test", "pid"))["structured"]["result"]
        os.kill(first, signal.SIGKILL)
        await wait_for_exit(first)
        second = await channel.call("test", "pid")
    assert second["structured"]["result"] != first


async def test_reset_closes_the_sessions_and_the_next_call_starts_the_server_again() -> None:
    async with tool_channel({"test": stdio_server()}) as channel:
        first = (await channel.call("test", "pid"))["structured"]["result"]
        await channel.tool_server.reset()
        await wait_for_exit(first)
        second = (await channel.call("test", "pid"))["structured"]["result"]
    assert second != first
    await wait_for_exit(second)


async def test_registering_a_server_again_replaces_its_session() -> None:
    async with tool_channel({"test": stdio_server()}) as channel:
        first = (await channel.call("test", "pid"))["structured"]["result"]
        channel.tool_server.register("test", stdio_server(env={"MARKER": "second"}))
        await wait_for_exit(first)
        marker = await channel.call("test", "get_env", {"name": "MARKER"})
    assert marker["text"] == "second"


async def test_leaving_run_closes_the_servers_and_removes_the_socket() -> None:
    async with tool_channel({"test": stdio_server()}) as channel:
        pid = (await channel.call("test", "pid"))["structured"]["result"]
        socket_path = channel.tool_server.socket_path
        assert socket_path.stat().st_mode & 0o777 == 0o600
    assert not socket_path.exists()
    await wait_for_exit(pid)


async def test_placeholders_are_resolved_on_the_host_and_not_shown_to_the_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IPYBOX_TEST_SECRET", "s3cr3t-value")
    gate = RecordingGate()
    params = stdio_server(env={"API_KEY": "${IPYBOX_TEST_SECRET}"})
    async with tool_channel({"test": params}, gate) as channel:
        outcome = await channel.call("test", "get_env", {"name": "API_KEY"})
    assert outcome["text"] == "s3cr3t-value"
    assert "s3cr3t-value" not in gate.calls[0].server
    assert "env: API_KEY" in gate.calls[0].server


async def test_the_everything_server_answers_through_the_tool_server() -> None:
    binary = Path(__file__).parents[1] / "node_modules" / ".bin" / "mcp-server-everything"
    if not binary.exists():
        pytest.skip("node_modules is absent; run `npm ci` in the repository root")
    gate = RecordingGate()
    async with tool_channel({"everything": StdioServer(command=str(binary), args=("stdio",))}, gate) as channel:
        first, second = await channel.calls(
            ("everything", "get-sum", {"a": 2, "b": 40}), ("everything", "get-sum", {"a": 1, "b": 1})
        )
    assert "42" in first["text"] and "2" in second["text"]
    assert gate.calls[0].annotations is None  # approved before the server was started
    assert gate.calls[1].annotations is not None and gate.calls[1].annotations["readOnlyHint"] is True


# -- security ------------------------------------------------------------------------------------


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


def _exchange(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    """Send raw lines on one connection, reading one reply after each (fewer if the server hangs up)."""
    replies: list[dict[str, Any]] = []
    with _connect(path) as sock, sock.makefile("rb") as reader:
        for line in lines:
            try:
                sock.sendall(line)
                reply = reader.readline()
            except (BrokenPipeError, ConnectionResetError):
                break
            if not reply:
                break
            replies.append(json.loads(reply))
    return replies


async def _raw_exchange(channel: Channel, *lines: bytes) -> list[dict[str, Any]]:
    # Blocking sockets in a worker thread: the ToolServer runs on this test's event loop.
    return await anyio.to_thread.run_sync(_exchange, channel.tool_server.socket_path, *lines)


def _request(channel: Channel, **fields: Any) -> bytes:
    """A request line for greet(name="Ada"); a field given as ``...`` is left out."""
    request: dict[str, Any] = {
        "token": channel.env["IPYBOX_TOOL_TOKEN"],
        "seq": 1,
        "server": "test",
        "tool": "greet",
        "arguments": {"name": "Ada"},
    }
    request.update(fields)
    return json.dumps({k: v for k, v in request.items() if v is not ...}).encode() + b"\n"


async def test_requests_without_the_token_or_with_a_wrong_one_run_nothing(tmp_path: Path) -> None:
    started = tmp_path / "started"
    gate = RecordingGate()
    async with tool_channel({"test": stdio_server(started_file=started)}, gate) as channel:
        (missing,) = await _raw_exchange(channel, _request(channel, token=...), _request(channel))
        (wrong,) = await _raw_exchange(channel, _request(channel, token="x" * 32), _request(channel))
        (not_a_string,) = await _raw_exchange(channel, _request(channel, token=123))
        wrong_env = {**channel.env, "IPYBOX_TOOL_TOKEN": "guessed-token-guessed-token"}
        (from_kernel,) = await channel.calls(("test", "greet", {"name": "Ada"}), env=wrong_env)
    for reply in (missing, wrong, not_a_string):
        assert reply["ok"] is False and reply["error"] == "unauthorized"
    assert from_kernel["error"] == "ToolServerUnavailable"
    assert "token" in from_kernel["message"]
    assert gate.calls == []
    assert not started.exists()


async def test_requests_that_carry_a_command_url_or_env_are_refused(tmp_path: Path) -> None:
    started = tmp_path / "started"
    gate = RecordingGate()
    async with tool_channel({"test": stdio_server(started_file=started)}, gate) as channel:
        replies = await _raw_exchange(
            channel,
            _request(channel, command="/bin/sh", args=["-c", "touch /tmp/pwned"]),
            _request(channel, url="http://attacker.example/mcp"),
            _request(channel, env={"LD_PRELOAD": "/tmp/evil.so"}),
            _request(channel, arguments=["not", "an", "object"]),
            _request(channel, seq="1"),
        )
    assert [reply["error"] for reply in replies] == ["bad_request"] * 5
    assert "command" in replies[0]["message"] and "url" in replies[1]["message"] and "env" in replies[2]["message"]
    assert gate.calls == []
    assert not started.exists()


async def test_malformed_json_gets_an_error_and_the_connection_keeps_serving(
    streamable_http_server: HttpServer,
) -> None:
    async with tool_channel({"test": streamable_http_server}) as channel:
        garbage, not_object, invalid_utf8, good = await _raw_exchange(
            channel, b"{not json\n", b"[1, 2]\n", b"\xff\xfe\n", _request(channel)
        )
    assert garbage["error"] == not_object["error"] == invalid_utf8["error"] == "bad_request"
    assert good["ok"] is True and good["text"] == "Hello, Ada!"


def _send_huge_line(path: Path) -> dict[str, Any]:
    with _connect(path) as sock, sock.makefile("rb") as reader:
        chunk = b"x" * (1 << 20)
        try:
            for _ in range(MAX_LINE_BYTES // len(chunk) + 2):
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server hangs up once the line is over the limit
        return json.loads(reader.readline())


async def test_a_huge_request_line_is_refused_and_the_server_keeps_serving(
    streamable_http_server: HttpServer,
) -> None:
    async with tool_channel({"test": streamable_http_server}) as channel:
        reply = await anyio.to_thread.run_sync(_send_huge_line, channel.tool_server.socket_path)
        (good,) = await _raw_exchange(channel, _request(channel))
    assert reply["error"] == "too_large"
    assert good["ok"] is True


def _wait_for_a_slot(path: Path, request: bytes) -> dict[str, Any]:
    idle = [_connect(path) for _ in range(2)]
    with _connect(path) as third, third.makefile("rb") as reader:
        third.sendall(request)
        # Both slots are taken: the third connection is not served...
        readable, _, _ = select.select([third], [], [], 0.5)
        assert not readable
        # ...until one of the others closes.
        idle.pop().close()
        third.settimeout(20)
        reply = json.loads(reader.readline())
    for sock in idle:
        sock.close()
    return reply


async def test_connections_beyond_the_limit_wait_until_one_closes(streamable_http_server: HttpServer) -> None:
    async with tool_channel({"test": streamable_http_server}, max_connections=2) as channel:
        reply = await anyio.to_thread.run_sync(_wait_for_a_slot, channel.tool_server.socket_path, _request(channel))
    assert reply["ok"] is True


async def test_a_flood_of_connections_and_bad_requests_leaves_the_server_serving(
    streamable_http_server: HttpServer,
) -> None:
    gate = RecordingGate()
    async with tool_channel({"test": streamable_http_server}, gate, max_connections=8) as channel:

        async def pest(n: int) -> None:
            replies = await _raw_exchange(channel, b"nonsense\n", _request(channel, token="wrong-token-" + str(n)))
            assert [reply["error"] for reply in replies] == ["bad_request", "unauthorized"]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(100):
                    tg.start_soon(pest, n)
        outcome = await channel.call("test", "add", {"a": 1, "b": 1})
    assert outcome["structured"] == {"result": 2}
    assert gate.tools == ["add"]


# -- concurrency ---------------------------------------------------------------------------------

_THREADS = """
import time
from concurrent.futures import ThreadPoolExecutor
from ipybox_kernel import call_tool

with ThreadPoolExecutor(8) as pool:
    outputs = list(pool.map(lambda i: call_tool("test", "add", {"a": i, "b": 1}), range(64)))
sums = [output.structured["result"] for output in outputs]
assert sums == [i + 1 for i in range(64)], sums
started = time.monotonic()
with ThreadPoolExecutor(3) as pool:
    texts = list(pool.map(lambda _: call_tool("test", "slow", {"seconds": 0.5}).text, range(3)))
print(time.monotonic() - started)
"""

_GATHER = """
import asyncio, time
from ipybox_kernel import acall_tool

async def main():
    started = time.monotonic()
    outputs = await asyncio.gather(*(acall_tool("test", "slow", {"seconds": 0.5}) for _ in range(3)))
    assert [o.text for o in outputs] == ["slept 0.5 s"] * 3
    return time.monotonic() - started

print(asyncio.run(main()))
"""


async def test_calls_from_several_threads_of_one_kernel_run_in_parallel(
    streamable_http_server: HttpServer,
) -> None:
    async with tool_channel({"test": streamable_http_server}) as channel:
        await channel.call("test", "add", {"a": 1, "b": 1})  # start the server first
        elapsed = float(await channel.run_python(_THREADS))
    assert elapsed < 1.2  # three 0.5 s calls one after another would take 1.5 s


async def test_gathered_acall_tool_calls_run_concurrently(streamable_http_server: HttpServer) -> None:
    async with tool_channel({"test": streamable_http_server}) as channel:
        await channel.call("test", "add", {"a": 1, "b": 1})  # start the server first
        elapsed = float(await channel.run_python(_GATHER))
    assert elapsed < 1.2  # three 0.5 s calls one after another would take 1.5 s


async def test_approvals_of_parallel_calls_are_pending_at_the_same_time(
    streamable_http_server: HttpServer,
) -> None:
    pending: list[ToolRequest] = []
    all_pending = anyio.Event()

    async def gate(request: ToolRequest, **_: Any) -> ApprovalDecision:
        pending.append(request)
        if len(pending) == 3:
            all_pending.set()
        await all_pending.wait()
        return ApprovalDecision(approved=True)

    code = _GATHER.replace('"slow", {"seconds": 0.5}', '"slow", {"seconds": 0}').replace("0.5 s", "0 s")
    async with tool_channel({"test": streamable_http_server}, gate) as channel:
        await channel.run_python(code)
    assert len({call.seq for call in pending}) == 3


async def _killed_while_asked(code: str, log: Path) -> list[str]:
    """Run ``code`` as the kernel; the gate approves ``add`` and keeps any other call pending until
    the kernel is killed, which must cancel it. Returns the tools of the approved calls."""
    asked, cancelled = anyio.Event(), anyio.Event()
    approved: list[str] = []

    async def gate(request: ToolRequest, **_: Any) -> ApprovalDecision:
        if request.tool == "add":
            approved.append(request.tool)
            return ApprovalDecision(approved=True)
        asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("this gate only ends by being cancelled")

    async with tool_channel({"test": stdio_server(call_log=log)}, gate) as channel:
        kernel = await anyio.open_process([sys.executable, "-c", code], env=channel.env)
        async with kernel:
            with anyio.fail_after(60):
                await asked.wait()
            kernel.kill()
            with anyio.fail_after(10):
                await cancelled.wait()
    return approved


async def test_a_kernel_that_hangs_up_cancels_its_pending_approval_and_the_call(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    code = "from ipybox_kernel import call_tool; call_tool('test', 'delete_item', {'item_id': '7'})"
    assert await _killed_while_asked(code, log) == []
    assert not log.exists()


async def test_a_hang_up_after_a_run_of_quick_calls_still_cancels_the_pending_approval(tmp_path: Path) -> None:
    # The connection's reader stays registered from call to call; the slow call after a run of
    # quick ones must still be watched.
    log = tmp_path / "calls.log"
    code = (
        "from ipybox_kernel import call_tool\n"
        "for i in range(50): call_tool('test', 'add', {'a': i, 'b': 1})\n"
        "call_tool('test', 'delete_item', {'item_id': '7'})"
    )
    assert await _killed_while_asked(code, log) == ["add"] * 50
    assert not log.exists()  # only delete_item writes to it


async def test_a_connection_keeps_serving_after_slow_calls_and_a_request_sent_early() -> None:
    # While a call runs, the reader watches the socket for a hang-up; it must stop watching with the
    # call, and a request that arrives before the answer (the reader stops watching, it is not a
    # hang-up) must be answered next, on the same connection.
    async with tool_channel({"test": stdio_server()}) as channel:
        slow, slower, quick = await channel.calls(
            ("test", "slow", {"seconds": 0.2}),
            ("test", "slow", {"seconds": 0.2}),
            ("test", "add", {"a": 1, "b": 2}),
        )
        assert slow["text"] == slower["text"] == "slept 0.2 s"
        assert quick["structured"] == {"result": 3}
        calls = json.dumps([["slow", {"seconds": 0.2}], ["add", {"a": 2, "b": 2}]])
        early = json.loads(await channel.run_python(_REQUESTS_IN_ONE_WRITE, calls, "2"))
    assert [reply["seq"] for reply in early] == [1, 2]
    assert early[0]["text"] == "slept 0.2 s"
    assert early[1]["structured"] == {"result": 4}


async def test_a_request_read_before_the_kernel_hung_up_is_neither_asked_about_nor_made(tmp_path: Path) -> None:
    # Two requests in one write; the kernel reads the first reply and hangs up while the host still
    # reports the first call's end. The second request, read with the first, has nobody waiting for it.
    log = tmp_path / "calls.log"
    gone = anyio.Event()

    async def on_finished(request: ToolRequest, error: str | None, result: Any) -> None:
        if request.tool == "add" and request.seq == 1:
            with anyio.fail_after(60):
                await gone.wait()

    gate = RecordingGate()
    async with tool_channel({"test": stdio_server(call_log=log)}, gate, on_finished=on_finished) as channel:
        calls = json.dumps([["add", {"a": 1, "b": 2}], ["delete_item", {"item_id": "7"}]])
        (first,) = json.loads(await channel.run_python(_REQUESTS_IN_ONE_WRITE, calls, "1"))
        gone.set()  # the kernel process has exited: its end of the connection is closed
        assert (await channel.call("test", "add", {"a": 1, "b": 1}))["structured"] == {"result": 2}
    assert first["structured"] == {"result": 3}
    assert gate.tools == ["add", "add"]
    assert not log.exists()  # delete_item writes to it


# Request lines for the calls in argv[1] (``[[tool, arguments], ...]``), all in one write; then the
# first argv[2] replies, printed as one JSON list, and the connection closed.
_REQUESTS_IN_ONE_WRITE = """
import json, os, socket, sys
token = os.environ["IPYBOX_TOOL_TOKEN"]
calls, replies = json.loads(sys.argv[1]), int(sys.argv[2])
lines = b"".join(
    json.dumps({"token": token, "seq": seq, "server": "test", "tool": tool, "arguments": arguments}).encode() + b"\\n"
    for seq, (tool, arguments) in enumerate(calls, 1)
)
with socket.socket(socket.AF_UNIX) as sock:
    sock.connect(os.environ["IPYBOX_TOOL_SOCKET"])
    sock.sendall(lines)
    reader = sock.makefile("rb")
    print(json.dumps([json.loads(reader.readline()) for _ in range(replies)]))
"""


# -- usage -----------------------------------------------------------------------------------------


async def test_the_registry_is_filled_by_the_host_only(tmp_path: Path) -> None:
    tool_server = ToolServer(socket_path=tmp_path / "s", token="t" * 32, gate=RecordingGate())
    tool_server.register("a", {"command": "server-a", "args": ["--flag"]})
    tool_server.register("b", {"url": "http://127.0.0.1:9/mcp", "type": "sse"})
    assert dict(tool_server.servers) == {
        "a": StdioServer(command="server-a", args=("--flag",)),
        "b": HttpServer(type="sse", url="http://127.0.0.1:9/mcp"),
    }
    with pytest.raises(TypeError):
        tool_server.servers["c"] = StdioServer(command="x")  # type: ignore[index]
    with pytest.raises(UsageError, match="'command'"):
        tool_server.register("c", {"cmd": "x"})
    with pytest.raises(UsageError, match="non-empty name"):
        tool_server.register("", {"command": "x"})


async def test_a_short_token_and_a_busy_socket_path_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="token"):
        ToolServer(socket_path=Path("/tmp/x.sock"), token="short", gate=RecordingGate())
    async with tool_channel({}) as channel:
        second = ToolServer(socket_path=channel.tool_server.socket_path, token="t" * 32, gate=RecordingGate())
        with pytest.raises(UsageError, match="another process serves"):
            await second.run()
        assert channel.tool_server.socket_path.exists()


async def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    tool_server = ToolServer(socket_path=path, token="t" * 32, gate=RecordingGate())
    async with anyio.create_task_group() as tg:
        await tg.start(tool_server.run)
        assert path.stat().st_mode & 0o777 == 0o600
        tg.cancel_scope.cancel()
    assert not path.exists()


def _broken_stream() -> BaseException:
    return anyio.BrokenResourceError()


def _grouped_timeout() -> BaseException:
    return ExceptionGroup("transport", [TimeoutError()])


@pytest.mark.parametrize(
    ("make", "kind", "text"),
    [
        (_broken_stream, "server_crashed", "the connection to the server ended"),
        (_grouped_timeout, "timeout", "timed out on the host"),
        (lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/host/secret"), "tool_error", "No space left"),
        (lambda: UsageError("needs a 'package' string"), "tool_error", "needs a 'package' string"),
        (lambda: KeyError("host secret"), "internal", "failed on the host (KeyError)"),
    ],
)
def test_every_foreign_error_leaves_the_boundary_as_one_tool_call_failure(
    make: Callable[[], BaseException], kind: str, text: str
) -> None:
    with pytest.raises(ToolCallFailed) as caught, tool_errors("srv.tool"):
        raise make()
    assert caught.value.kind == kind
    assert caught.value.message.startswith("srv.tool") and text in caught.value.message
    assert "secret" not in caught.value.message
