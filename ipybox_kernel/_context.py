"""Threads and thread-pool work carry the execution that started them.

ipykernel keeps the running cell (its parent message) in context variables, so output and tool
calls can be told apart by the cell that made them. A new thread, though, starts with an empty
context and falls back to whichever cell runs *now*: a thread started by cell 1 that prints while
cell 2 runs had its output land in cell 2's result, and its tool calls asked for approval as cell
2's. asyncio tasks already copy the context they are created in.

So a thread started while a cell runs gets a copy of the starting context (what Python 3.14 does
with ``Thread(context=...)``), and work submitted to a thread pool runs in the submitter's context
(what ``asyncio.to_thread`` does), whichever thread of the pool picks it up. Threads started
outside any cell (ipykernel's own, at start-up) keep the old fallback.

Not covered: threads started through ``_thread.start_new_thread`` or by C code (their tool calls
name no cell and are refused), and output written straight to file descriptor 1 or 2, which has no
context at all.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any, cast

from ._protocol import EXECUTION_ENV

# The execution whose cell code (IPython's run_code) the calling context runs under; set only while
# run_code runs, and copied into the threads, thread-pool work and asyncio tasks that code starts.
# Code that runs in the execution's context outside it (IPython event hooks, input and AST
# transformers, which an earlier cell may have registered) does not have it.
CELL_CODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("ipybox_cell_code", default=None)
# Whether `mark_cell_code` runs in this kernel (ipybox's launcher and a gateway kernel's set-up call
# it). In a stock IPython kernel that imports ipybox_kernel nothing marks the cell's code, so there
# is nothing to tell hooks from the cell by, and calls are not refused for it.
_marking = False


def carry_execution_context(kernel: Any) -> None:
    """Make threads and thread-pool work keep the cell they were started from (see the module doc)."""
    start_thread = threading.Thread.start
    submit = concurrent.futures.ThreadPoolExecutor.submit

    def start(self: threading.Thread) -> None:
        if execution_of(kernel, inherited=False) is not None:
            context = contextvars.copy_context()
            run = self.run
            # Bound here, so a subclass's own run() is what runs in the context.
            self.run = lambda: context.run(run)
        start_thread(self)

    def submit_in_context(
        self: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        return submit(self, contextvars.copy_context().run, fn, *args, **kwargs)

    threading.Thread.start = start
    concurrent.futures.ThreadPoolExecutor.submit = submit_in_context


def mark_cell_code(shell: Any, kernel: Any) -> None:
    """Make `CELL_CODE` name the running execution while IPython runs the cell's own code."""
    global _marking
    run_code = shell.run_code

    async def run_cell_code(*args: Any, **kwargs: Any) -> Any:
        token = CELL_CODE.set(execution_of(kernel, inherited=True))
        try:
            return await run_code(*args, **kwargs)
        finally:
            CELL_CODE.reset(token)

    shell.run_code = run_cell_code
    _marking = True


def outside_cell_code(msg_id: str) -> bool:
    """Whether the calling context belongs to execution ``msg_id`` but is not its cell's code, nor
    started by it: an IPython event hook or transformer, which may be an earlier cell's."""
    return _marking and CELL_CODE.get() != msg_id


def announce_execution(kernel: Any) -> None:
    """Tell subprocesses started by the cell which cell it is (a pre_execute hook)."""
    msg_id = execution_of(kernel, inherited=True)
    if msg_id is not None:
        os.environ[EXECUTION_ENV] = msg_id


def execution_of(kernel: Any, *, inherited: bool) -> str | None:
    """The msg_id of the execute request the calling context belongs to, if any.

    With ``inherited=False``, only if the context holds it itself: a thread without one (started by
    C code, say) would otherwise get ipykernel's fallback, the cell that happens to run now.
    """
    own: object = getattr(kernel, "_shell_parent", None)
    try:
        if not inherited and isinstance(own, contextvars.ContextVar):
            parent: Any = cast("contextvars.ContextVar[Any]", own).get(None)
        else:
            parent = kernel.get_parent()
        header = cast("dict[str, object]", parent["header"])
        msg_id = header.get("msg_id") if header.get("msg_type") == "execute_request" else None
    except (AttributeError, KeyError, TypeError):
        return None
    return msg_id if isinstance(msg_id, str) else None
