"""The execution's clock while a call waits for approval: a wait costs nothing, computing does."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, Execution, ExecutionTimeout, Timeouts

pytestmark = pytest.mark.anyio

# The cell's timeout: short, so that the attack's free compute would be many times over it.
TIMEOUT = 2.0
# Bounds a wrong outcome (the cell computing on while nobody answers), not the expected one.
DEADLINE = 60.0

CALL = "from mcptools.test import add\nprint(add.run({'a': 1, 'b': 2}).result)"

COMPUTE_WHILE_WAITING = f"""
import threading
stop = threading.Event()
def spin():
    while not stop.is_set():
        pass
threading.Thread(target=spin, daemon=True).start()
{CALL}
"""


async def test_a_thread_that_computes_while_a_call_waits_for_approval_runs_into_the_timeout(
    workspace: Path, tools_dir: Path
) -> None:
    # A kernel that computes in one thread takes seconds to take an interrupt on a loaded machine.
    timeouts = Timeouts(interrupt_grace=DEADLINE / 2)
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="auto", timeouts=timeouts) as executor:
        # Imports made and the MCP server started: the timed cell reaches its call at once.
        assert (await executor.execute(CALL)).text == "3\n"
        requests: list[ApprovalRequest] = []
        with anyio.fail_after(DEADLINE), pytest.raises(ExecutionTimeout):
            # Nobody answers: the main thread waits while the other thread computes.
            async for event in executor.execute(COMPUTE_WHILE_WAITING, timeout=TIMEOUT, approval="ask"):
                if isinstance(event, ApprovalRequest):
                    requests.append(event)
        # The call was asked for, and the timeout came while it waited.
        [request] = requests
        assert request.decision is not None and not request.decision.approved
        # Interrupted, not restarted: the kernel (and the spinning thread) lives on.
        assert (await executor.execute("stop.set()\nprint('stopped')")).text == "stopped\n"


async def test_a_cell_that_only_waits_for_a_long_approval_does_not_time_out(workspace: Path, tools_dir: Path) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="auto") as executor:
        # Imports made and the MCP server started, so that the timed cell does little but wait.
        assert (await executor.execute(CALL)).text == "3\n"
        await call_approved_late(executor.execute(CALL, timeout=TIMEOUT, approval="ask"))


async def call_approved_late(execution: Execution) -> None:
    """Approve `CALL` long after its timeout, and check it ran."""
    result: CodeExecutionResult | None = None
    async for event in execution:
        if isinstance(event, ApprovalRequest):
            # A person taking several times the cell's timeout to answer: the wait is the point.
            await anyio.sleep(4 * TIMEOUT)
            await event.accept()
        elif isinstance(event, CodeExecutionResult):
            result = event
    assert result is not None and result.text == "3\n"
