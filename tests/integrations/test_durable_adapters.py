"""Durable approvals through the adapters (issue #31): an agent run pauses at its MCP approvals in
one process (A), which stores the framework's own state and exits; another process (B) resumes the
run from that state and the framework's answers.

Real parts throughout: the session's Kernel Gateway, A and B as separate Python processes
(tests/servers/durable_agents.py) with their own executors and MCP sessions of the test server,
whose ``delete_item`` writes a line to a call log on every call (the side effect counted here), and
each framework's own test model and state store. The model makes two code actions in one turn, so
each test also shows that two paused actions resume independently: B approves one and rejects the
other, whose code sees ``ToolCallRejected``. A state whose locators were swapped between the two
actions is refused, and a replay of the state after B finished runs nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from deadline_support import patient
from servers.gateway import Gateway

# The backstop for a hang: each test runs four worker processes, each starting a kernel.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(900)]

WORKER = Path(__file__).parent.parent / "servers" / "durable_agents.py"
# One worker process: start, a kernel on the gateway (or two re-attached), the MCP server, the code.
WORKER_DEADLINE = 180.0
APPROVED = "before x1\nresult='deleted x1'\nafter x1\n"
REJECTED = "before x2\ncaught ToolCallRejected not x2, says a person\nafter x2\n"


@pytest.fixture
def secret() -> bytes:
    return secrets.token_bytes(32)


def calls(call_log: Path) -> list[str]:
    return call_log.read_text().splitlines() if call_log.exists() else []


async def worker(
    framework: str, mode: str, gateway: Gateway, tools_dir: Path, tmp_path: Path, secret: bytes, *, swap: bool = False
) -> dict[str, Any]:
    """Run one worker process to its end and return what it printed (JSON)."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    command = [
        sys.executable,
        str(WORKER),
        framework,
        mode,
        gateway.url,
        gateway.token,
        str(tools_dir),
        str(tmp_path / "calls.log"),
        str(state),
    ]
    env = {**os.environ, "IPYBOX_TEST_SECRET": secret.hex(), "IPYBOX_TEST_SWAP": "1" if swap else "0"}
    with anyio.fail_after(patient(WORKER_DEADLINE)):
        done = await anyio.run_process(command, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-6000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


async def paused_resumed_and_replayed(
    framework: str, gateway: Gateway, tools_dir: Path, tmp_path: Path, secret: bytes
) -> None:
    """The whole story for one framework: A pauses and exits, a tampered B is refused, B resumes,
    a replay runs nothing."""
    call_log = tmp_path / "calls.log"
    started = await worker(framework, "start", gateway, tools_dir, tmp_path, secret)
    assert started["pending"] == {
        "call-1": ["delete_item", {"item_id": "x1"}, True],
        "call-2": ["delete_item", {"item_id": "x2"}, True],
    }
    assert calls(call_log) == []

    # The two actions' locators swapped in the stored state: each is another action's, refused.
    tampered = await worker(framework, "resume", gateway, tools_dir, tmp_path, secret, swap=True)
    for text in tampered["returns"].values():
        assert "refused to resume the code action, nothing was run" in text
    assert calls(call_log) == []

    resumed = await worker(framework, "resume", gateway, tools_dir, tmp_path, secret)
    # B's results hold the output from before the pause (carried in the locator) and after it.
    assert resumed["returns"] == {"call-1": APPROVED, "call-2": REJECTED}
    assert calls(call_log) == ["delete_item x1"]

    # The same stored state again: both actions ended, nothing runs twice.
    replayed = await worker(framework, "resume", gateway, tools_dir, tmp_path, secret)
    for text in replayed["returns"].values():
        assert "execution lost, nothing was re-run" in text
    assert calls(call_log) == ["delete_item x1"]


async def test_pydantic_ai_run_resumed_from_stored_message_history_in_another_process(
    gateway: Gateway, tools_dir: Path, tmp_path: Path, secret: bytes
) -> None:
    await paused_resumed_and_replayed("pydantic_ai", gateway, tools_dir, tmp_path, secret)


async def test_langgraph_run_resumed_from_a_sqlite_checkpoint_in_another_process(
    gateway: Gateway, tools_dir: Path, tmp_path: Path, secret: bytes
) -> None:
    await paused_resumed_and_replayed("langgraph", gateway, tools_dir, tmp_path, secret)


async def test_openai_agents_run_resumed_from_a_serialized_run_state_in_another_process(
    gateway: Gateway, tools_dir: Path, tmp_path: Path, secret: bytes
) -> None:
    await paused_resumed_and_replayed("openai_agents", gateway, tools_dir, tmp_path, secret)


async def test_pydantic_ai_action_with_two_parallel_calls_each_answer_goes_to_its_call_across_processes(
    gateway: Gateway, tools_dir: Path, tmp_path: Path, secret: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One code action whose two threads each call the tool: both wait when A suspends it.
    monkeypatch.setenv("IPYBOX_TEST_PARALLEL", "1")
    call_log = tmp_path / "calls.log"
    started = await worker("pydantic_ai", "start", gateway, tools_dir, tmp_path, secret)
    [(first_tool, first_args, has_locator)] = started["pending"].values()
    assert first_tool == "delete_item" and has_locator
    # B answers the call its state shows (x1 approved, x2 rejected); the other one is shown next.
    second = await worker("pydantic_ai", "continue", gateway, tools_dir, tmp_path, secret)
    [(_, second_args, _)] = second["pending"].values()
    assert {first_args["item_id"], second_args["item_id"]} == {"x1", "x2"}
    assert calls(call_log) == (["delete_item x1"] if first_args["item_id"] == "x1" else [])
    # C answers the other; the action ends with each call answered as shown, x1 run once.
    ended = await worker("pydantic_ai", "continue", gateway, tools_dir, tmp_path, secret)
    assert ended["returns"] == {"call-1": "[('x1', 'deleted x1'), ('x2', 'ToolCallRejected')]\n"}
    assert calls(call_log) == ["delete_item x1"]
