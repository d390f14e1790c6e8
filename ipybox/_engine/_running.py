"""Running one execution on a kernel: output, timeout, interruption and the outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio

from ipybox._exceptions import CodeExecutionError, ExecutionCancelled, ExecutionTimeout, IpyboxError, KernelDied
from ipybox._kernel import KernelEvent, KernelHandle

from ._execution import Execution, ExecutionDriver
from ._output import OutputCollector, clean_traceback
from ._results import CodeExecutionChunk

__all__ = ("run_execution",)


async def run_execution(
    kernel: KernelHandle,
    driver: ExecutionDriver,
    msg_id: str,
    *,
    workspace: Path,
    output_chars: int,
    interrupt_grace: float,
    approval_wait: float | None,
    on_expired: Callable[[Execution, str], None],
    events: AsyncIterator[KernelEvent] | None = None,
    before: Sequence[CodeExecutionChunk] = (),
) -> None:
    """Run the driver's code on ``kernel`` and settle its outcome.

    ``events``: the kernel's events of an execution already running (a resumed one), instead of
    running the code; ``before``: the output it had sent to the host that suspended it.

    Timeouts interrupt the kernel and kill it if it does not stop within ``interrupt_grace``; on a
    kernel whose CPU time the host cannot see, waits for approval stop the clock for at most
    ``approval_wait`` seconds in all (None: the timeout; see `ExecutionDriver.within_budget`);
    cancellation (`Execution.cancel`, shutdown) does the same and re-raises. ``on_expired`` is
    told when the execution was cancelled because its ttl ran out.
    """
    execution = driver.execution
    collector = OutputCollector(workspace, driver, output_chars)
    for chunk in before:
        collector.replay(chunk)
    finished = anyio.Event()
    error: IpyboxError | None = None
    timed_out = restarted = False

    async def consume() -> None:
        nonlocal error
        try:
            async for event in events if events is not None else kernel.execute(execution.code, msg_id=msg_id):
                collector.add(event)
        except KernelDied as exc:
            error = exc
        finally:
            finished.set()

    start = anyio.current_time()
    try:
        if execution.timeout is None:
            # Nothing to watch, so no watcher task: it would cost a few event-loop turns per execution.
            await consume()
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                timed_out = not await driver.within_budget(finished, kernel.cpu_seconds, unseen_pause=approval_wait)
                if timed_out:
                    kernel.interrupt()
                    with anyio.move_on_after(interrupt_grace):
                        await finished.wait()
                    if not finished.is_set():
                        restarted = True
                        await kernel.kill_and_wait()
                        tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class():
        # Cancelled by Execution.cancel() or executor shutdown: stop the code, keep the kernel.
        with anyio.CancelScope(shield=True):
            kernel.interrupt()
            with anyio.move_on_after(interrupt_grace):
                await finished.wait()
            if not finished.is_set():
                await kernel.kill_and_wait()
        if execution.expired:
            driver.fail(
                ExecutionCancelled(
                    f"the execution waited for an approval longer than its ttl of {execution.ttl:g} s and "
                    "was cancelled; the kernel was interrupted and keeps its state"
                )
            )
            on_expired(execution, f"was cancelled after waiting longer than its ttl of {execution.ttl:g} s")
        else:
            driver.fail(ExecutionCancelled("the execution was cancelled; the kernel was interrupted"))
        raise
    duration = anyio.current_time() - start
    text = collector.text()
    if timed_out:
        assert execution.timeout is not None
        driver.fail(ExecutionTimeout(execution.timeout, restarted=restarted, output=text))
    elif error is not None:
        driver.fail(error)
    elif collector.error is not None:
        e = collector.error
        driver.fail(CodeExecutionError(e.ename, e.evalue, clean_traceback(e.traceback), output=text))
    else:
        driver.succeed(collector.result(duration))
