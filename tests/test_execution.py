"""The Execution handle: awaitable, iterable, replayable, idempotent by key, cancellable."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import anyio
import pytest
from memory_support import resident

from ipybox import (
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    ExecutionCancelled,
    ExecutionLost,
)
from ipybox._engine._keyed import RELEASED_KEYS
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

WARMUP_EXECUTIONS = 200
KEYED_EXECUTIONS = 5_000
# Remembered keys (bounded by RELEASED_KEYS) and allocator noise stay within a few MiB; one
# Execution with its log kept per key would take several times this.
KEYED_MEMORY_GROWTH = 16 * 2**20


async def test_a_second_consumer_replays_the_event_log_from_any_index(executor: CodeExecutor) -> None:
    execution = executor.execute("for i in range(3): print(i, flush=True)")
    first = [event async for event in execution]
    second = [event async for event in execution.events()]
    tail = [event async for event in execution.events(len(first) - 1)]
    assert first == second
    assert tail == [first[-1]]
    assert isinstance(first[-1], CodeExecutionResult)
    assert all(isinstance(e, CodeExecutionChunk) for e in first[:-1])


async def test_the_code_runs_whether_or_not_anyone_consumes_it(executor: CodeExecutor) -> None:
    executor.execute("unconsumed = 'ran'")
    assert (await executor.execute("unconsumed")).text == "'ran'\n"


async def test_starting_twice_with_the_same_key_runs_the_code_once(executor: CodeExecutor) -> None:
    await executor.execute("runs = 0")
    first = executor.execute("runs += 1", key="tool-call-1")
    second = executor.execute("runs += 1", key="tool-call-1")
    assert first is second
    assert executor.attach("tool-call-1") is first
    await first
    assert (await executor.execute("runs")).text == "1\n"


async def test_attaching_to_an_unknown_key_raises_execution_lost(executor: CodeExecutor) -> None:
    with pytest.raises(ExecutionLost, match="never started here"):
        executor.attach("no-such-key")


async def test_iteration_ends_by_raising_the_executions_error(executor: CodeExecutor) -> None:
    events: list[object] = []
    with pytest.raises(CodeExecutionError):
        async for event in executor.execute("print('x', flush=True)\nraise ValueError('bad')"):
            events.append(event)
    assert events == [CodeExecutionChunk(text="x\n", stream="stdout")]


async def test_cancel_stops_running_code_and_the_executor_keeps_its_state(workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace) as ex:
        await ex.execute("state = 'kept'")
        execution = ex.execute("import threading\nprint('go', flush=True)\nthreading.Event().wait()")
        async for _ in execution:
            break
        execution.cancel()
        with anyio.fail_after(10), pytest.raises(ExecutionCancelled):
            await execution
        assert execution.done
        assert (await ex.execute("state")).text == "'kept'\n"


async def test_cancelling_a_queued_execution_never_runs_it(workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace) as ex:
        await ex.execute("ran = False")
        # The blocker waits on a FIFO until the test writes to it, so the cancel surely lands while
        # it runs.
        release = workspace / "release"
        os.mkfifo(release)
        blocker = ex.execute(f"print('blocking', flush=True)\nopen({str(release)!r}, 'rb').read(1)")
        queued = ex.execute("ran = True")
        async for _ in blocker:
            break
        queued.cancel()

        def unblock() -> None:
            with release.open("wb") as fifo:  # opens once the kernel has the FIFO open for reading
                fifo.write(b"x")

        with anyio.fail_after(10):
            await anyio.to_thread.run_sync(unblock, abandon_on_cancel=True)
            await blocker
        with pytest.raises(ExecutionCancelled):
            await queued
        assert (await ex.execute("ran")).text == "False\n"


# What a key leaves behind is the executor's business, on the host: the 5,000 round trips run on the
# in-process kernel (about ten seconds), where on a sandboxed one they took 40 s of CPU and two minutes
# on a loaded machine for nothing the kernel adds. Host memory over a sandboxed kernel's executions
# is test_executor.py's thousand-execution test.
async def test_five_thousand_keyed_executions_leave_no_execution_behind_and_memory_flat(workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace, kernel=InProcessKernel(), sandbox=None) as executor:
        # Warm up first: the kernel client's caches and the interpreter's free lists fill once.
        for n in range(WARMUP_EXECUTIONS):
            await executor.execute("pass", key=f"warmup-{n}")
        gc.collect()
        before = resident()
        for n in range(KEYED_EXECUTIONS):
            await executor.execute("pass", key=f"flat-{n}")
        gc.collect()
        growth = resident() - before
        print(f"host RSS grew by {growth / 2**20:.1f} MiB over {KEYED_EXECUTIONS} keyed executions")
        assert len(executor._keyed) == 0
        # Released keys are remembered within a bound, so none of them can run twice.
        assert len(executor._keyed._released) <= RELEASED_KEYS
        with pytest.raises(ExecutionLost, match="not run again"):
            executor.execute("pass", key=f"flat-{KEYED_EXECUTIONS - 1}")
        assert growth < KEYED_MEMORY_GROWTH, f"host RSS grew by {growth / 2**20:.1f} MiB"
