"""Which code action a request from the kernel belongs to, when code of an earlier one is still there.

The kernel is one process: a thread left behind by one code action can read the running one's id
from the kernel's memory or environment. A request the host cannot attribute must never be decided
by a later code action's more permissive policy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from network_support import serving

from ipybox import (
    ApprovalChain,
    ApprovalRequest,
    ApprovalRules,
    CodeExecutionResult,
    CodeExecutor,
    Network,
    ToolCallDecided,
    ToolCallEvent,
    ToolCallFinished,
)
from ipybox._approval._policies import Approval

pytestmark = pytest.mark.anyio

# Left running by a code action whose policy rejects every call: two threads that wait for the
# next code action, then call delete_item as it. One is started through _thread (ipykernel gives
# such a thread the context of whichever cell runs now); the other copies the running cell's id
# from the kernel's environment, where subprocesses read it, and sends the request itself.
LEAVE_THREADS = """
import _thread, os, threading
from ipybox_kernel import ToolCallRejected, call_tool
from ipybox_kernel._client import _parse_reply
from ipybox_kernel._protocol import EXECUTION_ENV
from ipybox_kernel._transport import round_trip
release, outcomes, finished = threading.Event(), {}, threading.Semaphore(0)
def attempt(name, call):
    release.wait()
    try:
        call()
        outcomes[name] = 'ran'
    except ToolCallRejected as e:
        outcomes[name] = 'rejected: ' + str(e.reason)
    finished.release()
_thread.start_new_thread(attempt, ('_thread', lambda: call_tool('test', 'delete_item', {'item_id': 'a1'})))
def forged():
    line = round_trip('test', 'delete_item', {'item_id': 'a2'}, os.environ[EXECUTION_ENV], None)
    _parse_reply('test', 'delete_item', line)
threading.Thread(target=attempt, args=('copied id', forged)).start()
print('left running')
"""

RELEASE_THREADS = """
release.set()
for _ in range(2):
    assert finished.acquire(timeout=60)
for name in sorted(outcomes):
    print(name, '->', outcomes[name])
"""

OWN_CALL = "from mcptools.test import add\nprint(add.run({'a': 2, 'b': 3}).result)"
CATCH_OWN_CALL = (
    "from ipybox_kernel import ToolCallRejected\n"
    "from mcptools.test import add\n"
    "try:\n"
    "    print(add.run({'a': 2, 'b': 3}).result)\n"
    "except ToolCallRejected as e:\n"
    "    print('rejected:', e.reason)"
)
REFUSED = "rejected: ipybox cannot tell this request from one made by code that code action"


async def run_under(
    executor: CodeExecutor, code: str, approval: Approval
) -> tuple[list[ApprovalRequest], CodeExecutionResult]:
    """Run code under its own policy; approval requests are collected and rejected."""
    requests: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for event in executor.execute(code, approval=approval):
        if isinstance(event, ApprovalRequest):
            requests.append(event)
            await event.reject("asked")
        elif isinstance(event, CodeExecutionResult):
            result = event
    assert result is not None
    return requests, result


async def test_threads_left_by_a_code_action_that_rejects_every_call_cannot_call_tools_under_the_next_ones_auto(
    workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
        strict = ApprovalRules(otherwise="reject")
        _, left = await run_under(executor, LEAVE_THREADS, strict)
        assert left.text == "left running\n"

        requests, released = await run_under(executor, RELEASE_THREADS, "auto")
        assert requests == []
        outcomes = dict(line.split(" -> ", 1) for line in released.text.splitlines())
        assert set(outcomes) == {"_thread", "copied id"}
        # Neither ran: the _thread thread names no cell of its own; the copied id is the running
        # cell's, but code of the earlier action may be behind it, and that one rejected everything.
        assert all(outcome.startswith("rejected: ") for outcome in outcomes.values()), outcomes
        assert "reset()" in outcomes["copied id"]

        # The later action's own calls cannot be told apart from those either: refused, with the fix.
        requests, own = await run_under(executor, CATCH_OWN_CALL, "auto")
        assert requests == []
        assert own.text.startswith(REFUSED) and "reset()" in own.text

        # A fresh kernel holds nothing of the earlier action: its policy decides again.
        await executor.reset()
        requests, fresh = await run_under(executor, OWN_CALL, "auto")
        assert (requests, fresh.text) == ([], "5\n")


async def test_a_later_code_action_under_a_different_policy_has_its_calls_refused_with_the_fix(
    workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="auto") as executor:
        # Earlier actions under "auto" (the executor's) gave their code everything already: a later
        # stricter action decides as usual.
        assert (await executor.execute(OWN_CALL)).text == "5\n"
        requests, asked = await run_under(executor, CATCH_OWN_CALL, "ask")
        assert [r.tool_name for r in requests] == ["add"]
        assert asked.text == "rejected: asked\n"
        # Back to "auto" after code ran under "ask": refused, naming the earlier action and the fix.
        requests, refused = await run_under(executor, CATCH_OWN_CALL, "auto")
        assert requests == []
        assert refused.text.startswith(REFUSED) and "reset()" in refused.text


async def test_a_thread_left_by_a_code_action_that_rejects_everything_cannot_connect_under_the_next_ones_auto(
    workspace: Path,
) -> None:
    with serving() as web:
        # The server's address may be reached once the name is approved; the name is not listed.
        network = Network(allow=[f"127.0.0.1:{web.port}"], unlisted="ask", hosts={"web.test": "127.0.0.1"})
        async with CodeExecutor(workspace=workspace, tools_dir=None, network=network) as executor:
            leave = (
                "import threading, urllib.request, urllib.error\n"
                "release, done, outcome = threading.Event(), threading.Event(), []\n"
                "def connect():\n"
                "    release.wait()\n"
                "    try:\n"
                f"        outcome.append(urllib.request.urlopen('http://web.test:{web.port}/left').read().decode())\n"
                "    except urllib.error.HTTPError as e:\n"
                "        outcome.append(f'{e.code} {e.reason}')\n"
                "    done.set()\n"
                "threading.Thread(target=connect).start()\n"
            )
            await run_under(executor, leave, ApprovalRules(otherwise="reject"))
            requests, released = await run_under(
                executor, "release.set()\nassert done.wait(60)\nprint(outcome[0])", "auto"
            )
            assert requests == []
            assert released.text.startswith("403 ") and "reset()" in released.text, released.text
            assert web.paths == []


async def test_composed_policies_keep_left_behind_code_from_a_later_actions_laxer_chain(
    workspace: Path, tools_dir: Path
) -> None:
    events: list[ToolCallEvent] = []
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, on_tool_call=events.append) as executor:
        strict = ApprovalChain(ApprovalRules(deny=["test.*"]), "ask")
        _, left = await run_under(executor, LEAVE_THREADS, strict)
        assert left.text == "left running\n"

        # An equal chain (another object with the same members) is the same policy: it decides.
        again = ApprovalChain(ApprovalRules(deny=["test.*"]), "ask")
        requests, denied = await run_under(executor, CATCH_OWN_CALL, again)
        assert requests == [] and denied.text == "rejected: test.add is denied by the approval rules\n"

        # A chain that approves what the earlier one denied: neither the threads left behind nor the
        # action's own call may be decided by it.
        lax = ApprovalChain(ApprovalRules(allow=["test.*"]), "ask")
        requests, released = await run_under(executor, RELEASE_THREADS, lax)
        assert requests == []
        outcomes = dict(line.split(" -> ", 1) for line in released.text.splitlines())
        assert all(outcome.startswith("rejected: ") for outcome in outcomes.values()), outcomes
        requests, own = await run_under(executor, CATCH_OWN_CALL, lax)
        assert requests == [] and own.text.startswith(REFUSED)

    # The hook saw every refusal as ipybox's, none as the lax chain's, and no call ran.
    decided = [e for e in events if isinstance(e, ToolCallDecided)]
    assert len(decided) == 4 and not any(e.decision.approved for e in decided)
    assert [e.decision.by for e in decided] == ["policy", "ipybox", "ipybox", "ipybox"]
    assert decided[0].call_id is not None and all(e.call_id is None for e in decided[1:])
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [e.error for e in finished] == ["rejected"] * 4
