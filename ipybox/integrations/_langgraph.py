"""The LangChain tool's turn queue: parallel tool calls of one LangGraph step on one kernel, which
runs one code action at a time."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass, field

import anyio
from langgraph.errors import GraphInterrupt

from ipybox import ApprovalRequest, CodeExecutor, Execution, IpyboxError

__all__ = ("Queue", "queue_of")


def _paused_map() -> weakref.WeakKeyDictionary[Execution, str]:
    return weakref.WeakKeyDictionary()


def _execution_set() -> weakref.WeakSet[Execution]:
    return weakref.WeakSet()


@dataclass
class Queue:
    """Which code actions on one executor (which runs them one at a time) wait on an interrupt.

    Parallel tool calls of one model turn are tasks of one LangGraph step, and the step ends only
    when every task has returned or interrupted. A code action queued behind one that waits on an
    interrupt of the same step would wait for a resume that cannot come before the step ends: it
    interrupts too, asking nothing, and runs when LangGraph runs the step again on resume. Behind a
    code action paused by another step (another thread, an unanswered earlier run) it just waits its
    turn, as it would behind a long-running one.
    """

    started: weakref.WeakSet[Execution] = field(default_factory=_execution_set)
    paused: weakref.WeakKeyDictionary[Execution, str] = field(default_factory=_paused_map)
    """Executions whose tool call raised an interrupt, and the step that raised it."""
    changed: anyio.Event = field(default_factory=anyio.Event)

    def pause(self, execution: Execution, step: str) -> None:
        self.paused[execution] = step
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for_turn(self, execution: Execution, step: str) -> None:
        """Return once ``execution`` has begun.

        Raises:
            GraphInterrupt: With no interrupt of its own, while an execution paused by the same step
                holds the kernel: LangGraph runs this tool call again when it resumes the step.
        """
        for other in [other for other in self.started if other.done]:
            self.started.discard(other)
        self.started.add(execution)
        # Executions run in the order they were started, and each tool call registers its own before
        # it first awaits: with no other unfinished one registered, nothing can hold this one up.
        while not execution.log and not execution.done and len(self.started) > 1:
            if any(
                other is not execution and at == step and _waits_for_person(other)
                for other, at in list(self.paused.items())
            ):
                raise GraphInterrupt(())
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_after, _first_event(execution), tg.cancel_scope)
                tg.start_soon(_cancel_after, self.changed.wait(), tg.cancel_scope)


async def _cancel_after(awaitable: Awaitable[object], scope: anyio.CancelScope) -> None:
    await awaitable
    scope.cancel()


async def _first_event(execution: Execution) -> None:
    with contextlib.suppress(IpyboxError):  # a failure is reported by drive()
        async for _ in execution.events():
            break


def _waits_for_person(execution: Execution) -> bool:
    return not execution.done and any(
        isinstance(event, ApprovalRequest) and event.decision is None for event in execution.log
    )


_queues: weakref.WeakKeyDictionary[CodeExecutor, Queue] = weakref.WeakKeyDictionary()


def queue_of(executor: CodeExecutor) -> Queue:
    """The queue of the code actions the LangChain tool runs on ``executor``."""
    return _queues.setdefault(executor, Queue())
