"""Durable approvals (issue #31): an execution paused at an approval on a real Kernel Gateway is
suspended by one process (A), which exits, and resumed by another (B) from its signed locator.

A and B are separate Python processes (tests/servers/durable_worker.py), each with its own executor,
tool server and MCP session of the test server over stdio, whose ``delete_item`` tool writes a line
to a call log on every call: the side effect counted here.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from deadline_support import patient
from servers.durable_agents import PARALLEL
from servers.fixtures import stdio_server
from servers.gateway import Gateway, run_gateway

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutor,
    ExecutionLost,
    GatewayKernel,
    InvalidLocator,
    UsageError,
)
from ipybox._engine._suspension import _tag

# The backstop for a hang: each test runs one or two worker processes, each starting a kernel.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

WORKER = Path(__file__).parent / "servers" / "durable_worker.py"
# One worker process: start, a kernel on the gateway (or re-attach), the MCP server, the code.
WORKER_DEADLINE = 120.0
BEFORE_AND_AFTER = "before the call\nresult='deleted x1'\nafter the call\n"


@pytest.fixture
def secret() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


def calls(call_log: Path) -> list[str]:
    return call_log.read_text().splitlines() if call_log.exists() else []


async def worker(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, mode: str, arg: str, stdin: str = ""
) -> dict[str, object]:
    """Run one worker process to its end and return what it printed (JSON)."""
    command = [sys.executable, str(WORKER), mode, gateway.url, gateway.token, str(tools_dir), str(call_log), arg]
    env = {**os.environ, "IPYBOX_TEST_SECRET": secret.hex()}
    with anyio.fail_after(patient(WORKER_DEADLINE)):
        done = await anyio.run_process(command, input=stdin.encode(), env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


async def suspended(gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, ttl: float = 3600) -> str:
    """Process A: run the action to its approval request, suspend it, exit; its locator."""
    printed = await worker(gateway, tools_dir, call_log, secret, "suspend", str(ttl))
    assert printed["args"] == {"item_id": "x1"}
    assert printed["ended"] == "ExecutionSuspended"
    assert calls(call_log) == []
    locator = printed["locator"]
    assert isinstance(locator, str)
    return locator


async def resumed(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, locator: str, decision: str
) -> dict[str, object]:
    """Process B: resume from the locator with ``decision`` ("ask": accept what is asked again)."""
    return await worker(gateway, tools_dir, call_log, secret, "resume", decision, stdin=locator)


def executor(gateway: Gateway, workspace: Path, tools_dir: Path) -> CodeExecutor:
    kernel = GatewayKernel(gateway.url, token=gateway.token, allow_unisolated_kernel=True)
    return CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=kernel)


@contextlib.asynccontextmanager
async def two_hosts(
    gateway: Gateway, tmp_path: Path, tools_dir: Path, call_log: Path
) -> AsyncGenerator[tuple[CodeExecutor, CodeExecutor]]:
    """Two executors of this process on the same gateway, each with the counting test server."""
    async with contextlib.AsyncExitStack() as stack:
        hosts: list[CodeExecutor] = []
        for name in ("b1", "b2"):
            (tmp_path / name).mkdir(exist_ok=True)
            host = await stack.enter_async_context(executor(gateway, tmp_path / name, tools_dir))
            host.register_mcp_server("test", stdio_server(call_log=call_log))
            hosts.append(host)
        yield hosts[0], hosts[1]


def payload_of(locator: str) -> dict[str, object]:
    encoded = locator.split(".")[2]
    return json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))


def with_payload(locator: str, payload: dict[str, object], *, secret: bytes | None = None) -> str:
    """The locator with another payload: under its old tag (a tampering), or signed with ``secret``."""
    prefix, version, _, tag = locator.split(".")
    encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    body = f"{prefix}.{version}.{encoded}"
    if secret is not None:
        tag = base64.urlsafe_b64encode(_tag(secret, body)).rstrip(b"=").decode()
    return f"{body}.{tag}"


async def test_resumed_in_another_process_with_approval_the_call_runs_once_and_b_gets_all_the_output(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, workspace: Path
) -> None:
    locator = await suspended(gateway, tools_dir, call_log, secret)
    # A has exited; the kernel it left blocked in the call is still on the gateway.
    assert payload_of(locator)["kernel"] in gateway.kernel_ids()
    report = await resumed(gateway, tools_dir, call_log, secret, locator, "ask")
    assert report["error"] is None
    # The pending call is asked again in B, with the arguments A received.
    assert report["asked"] == [{"item_id": "x1"}]
    assert report["text"] == BEFORE_AND_AFTER
    assert "".join(report["chunks"]) == BEFORE_AND_AFTER  # pyright: ignore[reportCallIssue, reportArgumentType]
    assert calls(call_log) == ["delete_item x1"]
    # A replay of the same locator finds nothing to resume (B ended it and deleted its kernel).
    async with executor(gateway, workspace, tools_dir) as ex:
        ex.register_mcp_server("test", stdio_server(call_log=call_log))
        with anyio.fail_after(patient(WORKER_DEADLINE)), pytest.raises(ExecutionLost, match="nothing was re-run"):
            await ex.resume(locator, secret=secret, decision=ApprovalDecision(approved=True))
    assert calls(call_log) == ["delete_item x1"]


async def test_resumed_with_a_rejection_the_code_sees_tool_call_rejected(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes
) -> None:
    locator = await suspended(gateway, tools_dir, call_log, secret)
    report = await resumed(gateway, tools_dir, call_log, secret, locator, "reject")
    assert report["error"] is None
    assert report["text"] == "before the call\ncaught ToolCallRejected\nafter the call\n"
    assert calls(call_log) == []


async def test_a_locator_resumed_by_two_hosts_at_once_runs_in_one_of_them_only(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, tmp_path: Path
) -> None:
    locator = await suspended(gateway, tools_dir, call_log, secret)
    async with two_hosts(gateway, tmp_path, tools_dir, call_log) as (b1, b2):
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            first = b1.resume(locator, secret=secret)
            events = first.events()
            request = None
            async for event in events:
                if isinstance(event, ApprovalRequest):
                    request = event
                    break
            assert request is not None and request.tool_args == {"item_id": "x1"}
            # While b1 holds it, a second host is refused: the kernel releases its hold once.
            # (The gateway hands the session's websocket to b2 meanwhile; b1 reopens it and goes on.)
            with pytest.raises(ExecutionLost, match="nothing was re-run"):
                await b2.resume(locator, secret=secret, decision=ApprovalDecision(approved=True))
            await request.accept()
            assert (await first).text == BEFORE_AND_AFTER
    assert calls(call_log) == ["delete_item x1"]


async def test_a_changed_or_foreign_locator_is_refused_and_nothing_runs(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, workspace: Path
) -> None:
    locator = await suspended(gateway, tools_dir, call_log, secret)
    payload = payload_of(locator)
    swapped_args = json.loads(json.dumps(payload))
    [call] = swapped_args["calls"]
    call["line"] = call["line"].replace('"item_id":"x1"', '"item_id":"everything"')
    assert call["line"] != payload["calls"][0]["line"]  # pyright: ignore[reportIndexIssue]
    forged = {
        "swapped arguments": with_payload(locator, swapped_args),
        "another kernel": with_payload(locator, {**payload, "kernel": "0" * 36}),
        "a later expiry": with_payload(locator, {**payload, "expires": time.time() + 10**6}),
        "another secret": with_payload(locator, payload, secret=secrets.token_bytes(32)),
        "a cut tag": locator[:-4],
        "another version": locator.replace("ipybox-suspended.1.", "ipybox-suspended.2.", 1),
    }
    async with executor(gateway, workspace, tools_dir) as ex:
        ex.register_mcp_server("test", stdio_server(call_log=call_log))
        for what, bad in forged.items():
            with pytest.raises(InvalidLocator):
                ex.resume(bad, secret=secret, decision=ApprovalDecision(approved=True))
            assert calls(call_log) == [], what
        with pytest.raises(InvalidLocator):
            ex.resume(locator, secret=secrets.token_bytes(32), decision=ApprovalDecision(approved=True))
        with pytest.raises(UsageError, match="32"):
            ex.resume(locator, secret=b"short")
        # The genuine locator still resumes (nothing above consumed it), once.
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            result = await ex.resume(locator, secret=secret, decision=ApprovalDecision(approved=True))
    assert result.text == BEFORE_AND_AFTER
    assert calls(call_log) == ["delete_item x1"]


async def test_past_its_ttl_a_suspended_execution_is_lost_and_its_kernel_released(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, workspace: Path
) -> None:
    ttl = 3.0
    locator = await suspended(gateway, tools_dir, call_log, secret, ttl=ttl)
    payload = payload_of(locator)
    expires = payload["expires"]
    assert isinstance(expires, float)
    # The ttl itself is what is waited for here.
    await anyio.sleep(max(0.0, expires - time.time()) + 0.1)
    async with executor(gateway, workspace, tools_dir) as ex:
        ex.register_mcp_server("test", stdio_server(call_log=call_log))
        with pytest.raises(ExecutionLost, match="expired"):
            ex.resume(locator, secret=secret, decision=ApprovalDecision(approved=True))
        # Signed again with a later expiry (as a worker with a clock behind would see it): the kernel
        # itself ended the held process at its ttl, so there is nothing to resume either.
        later = with_payload(locator, {**payload, "expires": time.time() + 3600}, secret=secret)
        with anyio.fail_after(patient(WORKER_DEADLINE)), pytest.raises(ExecutionLost, match="nothing was re-run"):
            await ex.resume(later, secret=secret, decision=ApprovalDecision(approved=True))
    assert calls(call_log) == []


async def test_a_gateway_restart_loses_a_suspended_execution_and_resume_says_so(
    tools_dir: Path, call_log: Path, secret: bytes, workspace: Path
) -> None:
    with run_gateway() as first:
        locator = await suspended(first, tools_dir, call_log, secret)
    port = int(first.url.rsplit(":", 1)[1])
    with run_gateway(port=port, token=first.token) as again:
        async with executor(again, workspace, tools_dir) as ex:
            ex.register_mcp_server("test", stdio_server(call_log=call_log))
            with anyio.fail_after(patient(WORKER_DEADLINE)), pytest.raises(ExecutionLost, match="HTTP 404"):
                await ex.resume(locator, secret=secret, decision=ApprovalDecision(approved=True))
    assert calls(call_log) == []


async def suspended_in_two_calls(
    gateway: Gateway, workspace: Path, tools_dir: Path, call_log: Path, secret: bytes, *, show: str
) -> tuple[str, dict[str, str]]:
    """Process A's part, in an executor of its own: run `PARALLEL` until both calls wait, suspend it
    showing the call for ``show``; the locator and each item's request id."""
    async with executor(gateway, workspace, tools_dir) as a:
        a.register_mcp_server("test", stdio_server(call_log=call_log))
        execution = a.execute(PARALLEL, key="action-2")
        requests: dict[str, str] = {}
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    requests[event.tool_args["item_id"]] = event.id
                    if len(requests) == 2:
                        break
            locator = await a.suspend(execution, secret=secret, ttl=3600, shown=requests[show])
    assert {call["request"] for call in payload_of(locator)["calls"]} == set(requests.values())  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]
    assert calls(call_log) == []
    return locator, requests


async def test_two_pending_calls_of_one_action_the_answer_goes_to_the_call_shown_and_the_other_is_asked(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # The person saw the second call's request (x2), not the first one the kernel made.
    locator, requests = await suspended_in_two_calls(gateway, tmp_path / "a", tools_dir, call_log, secret, show="x2")
    async with executor(gateway, tmp_path / "b", tools_dir) as b:
        b.register_mcp_server("test", stdio_server(call_log=call_log))
        # The answer stored for x2, presented as x1's (a state edited to move it): refused, nothing runs.
        with pytest.raises(InvalidLocator, match="suspended showing"):
            b.resume(locator, secret=secret, decision=ApprovalDecision(approved=True), request_id=requests["x1"])
        assert calls(call_log) == []
        asked: list[object] = []
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            execution = b.resume(
                locator, secret=secret, decision=ApprovalDecision(approved=True), request_id=requests["x2"]
            )
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    # Only the call nobody answered is asked again; refused here.
                    asked.append(event.tool_args["item_id"])
                    await event.reject("not x1")
            result = await execution
    assert asked == ["x1"]
    assert result.text == "[('x1', 'ToolCallRejected'), ('x2', 'deleted x2')]\n"
    assert calls(call_log) == ["delete_item x2"]


async def test_a_pending_call_nobody_answered_is_suspended_again_and_resumed_with_its_own_answer(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    locator, requests = await suspended_in_two_calls(gateway, tmp_path / "a", tools_dir, call_log, secret, show="x1")
    # B applies the answer to x1, then suspends again at x2, which nobody answered yet.
    async with executor(gateway, tmp_path / "b", tools_dir) as b:
        b.register_mcp_server("test", stdio_server(call_log=call_log))
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            execution = b.resume(
                locator, secret=secret, decision=ApprovalDecision(approved=True), request_id=requests["x1"]
            )
            again: ApprovalRequest | None = None
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    again = event
                    break
            assert again is not None and again.tool_args == {"item_id": "x2"}
            second = await b.suspend(execution, secret=secret, ttl=3600, shown=again.id)
    assert calls(call_log) == ["delete_item x1"]
    assert [call["request"] for call in payload_of(second)["calls"]] == [again.id]  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]
    # C answers x2 (rejects it) from the second locator; x1 does not run again.
    async with executor(gateway, tmp_path / "c", tools_dir) as c:
        c.register_mcp_server("test", stdio_server(call_log=call_log))
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            result = await c.resume(
                second, secret=secret, decision=ApprovalDecision(approved=False, reason="no"), request_id=again.id
            )
    assert result.text == "[('x1', 'deleted x1'), ('x2', 'ToolCallRejected')]\n"
    assert calls(call_log) == ["delete_item x1"]


# Kernel code that makes the kernel grant every resumer its hold (an honest kernel grants one): a
# thread keeps the hold in place and untaken.
GRANTS_EVERY_RELEASE = (
    "import threading, time\n"
    "import ipybox_kernel._remote as remote\n"
    "def keep_granting():\n"
    "    while True:\n"
    "        remote._hold_taken = False\n"
    "        if remote._hold is None:\n"
    "            remote._hold = threading.Timer(10**6, lambda: None)\n"
    "        time.sleep(0.01)\n"
    "threading.Thread(target=keep_granting, daemon=True).start()\n"
)


async def test_a_stored_decision_is_applied_once_even_when_the_kernel_releases_twice(
    gateway: Gateway, tools_dir: Path, call_log: Path, secret: bytes, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    code = (
        GRANTS_EVERY_RELEASE
        + "from mcptools.test import delete_item\n"
        + ("print(delete_item.run(delete_item.Params(item_id='x1')))\n")
    )
    async with executor(gateway, tmp_path / "a", tools_dir) as a:
        a.register_mcp_server("test", stdio_server(call_log=call_log))
        execution = a.execute(code, key="action-3")
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    break
            locator = await a.suspend(execution, secret=secret, ttl=3600)
    approve = ApprovalDecision(approved=True)
    async with two_hosts(gateway, tmp_path, tools_dir, call_log) as (b1, b2):
        with anyio.fail_after(patient(WORKER_DEADLINE)):
            assert (await b1.resume(locator, secret=secret, decision=approve)).text == "result='deleted x1'\n"
        assert calls(call_log) == ["delete_item x1"]
        # The same locator and stored decision again, in another executor of this process: the
        # kernel would grant it, the host does not apply the decision a second time.
        with pytest.raises(ExecutionLost, match="applied already"):
            b2.resume(locator, secret=secret, decision=approve)
    assert calls(call_log) == ["delete_item x1"]
