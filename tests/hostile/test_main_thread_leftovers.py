"""Code an earlier code action left in the kernel's main thread, calling a tool during a later one.

Such code has no thread or process of its own, so the host's look at /proc (test_left_running)
cannot see it. What is closed, per route:

- IPython event hooks (pre/post_execute, pre/post_run_cell) and input transformers run in the
  running execution's context but outside its cell code: ipybox_kernel refuses their calls before
  they reach the host, so nobody is asked about them beside code that did not make them;
- asyncio tasks (and loop callbacks) keep the context of the cell that created them, so they name
  that cell, which has ended: the host refuses them.

The running cell's own calls (direct, from its threads, from tasks it gathers) still go to the
person. What stays open (signal handlers, trace functions, finalizers and patched functions run
inside the cell's own code; code that undoes ipybox_kernel's check) is in SECURITY.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from approval_support import collect

from ipybox import CodeExecutor

pytestmark = pytest.mark.anyio

# Cell 1 defines what the leftover does: call delete_item, and record how the call ended.
SETUP = """
from mcptools.test import delete_item
from ipybox_kernel import ToolCallError
outcomes = []
def leftover(*args, **kwargs):
    try:
        delete_item.run({'item_id': 'left'})
        outcomes.append('ran')
    except ToolCallError as e:
        outcomes.append(f'{type(e).__name__}: {e.reason if hasattr(e, "reason") else e}')
"""

LEAVE = {
    "pre_execute": "get_ipython().events.register('pre_execute', leftover)",
    "pre_run_cell": "get_ipython().events.register('pre_run_cell', leftover)",
    "post_run_cell": "get_ipython().events.register('post_run_cell', leftover)",
    "post_execute": "get_ipython().events.register('post_execute', leftover)",
    "input_transformer": (
        "def transform(lines):\n    leftover()\n    return lines\n"
        "get_ipython().input_transformers_post.append(transform)"
    ),
}

UNREGISTER = {
    "input_transformer": "get_ipython().input_transformers_post.remove(transform)",
}

# Cell 2 calls nothing itself.
CELL_2 = "x = 1 + 1"


@pytest.mark.parametrize("route", list(LEAVE))
async def test_a_tool_call_from_an_ipython_hook_an_earlier_cell_left_is_refused_and_nobody_is_asked(
    workspace: Path, tools_dir: Path, route: str
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="ask") as executor:
        requests, _ = await collect(executor, SETUP + LEAVE[route])
        # Hooks that fire after the registering cell's code (post_*) already ran once in cell 1.
        requests, _ = await collect(executor, CELL_2)
        assert requests == [], [r.description for r in requests]
        unregister = UNREGISTER.get(route, f"get_ipython().events.unregister({route!r}, leftover)")
        requests, result = await collect(executor, f"{unregister}\nprint(outcomes)")
        assert requests == []
        outcomes = eval(result.text)  # a list of strings the cell printed
        assert outcomes, result.text
        assert set(outcomes) == {"ToolCallRejected: outside the code action's own code"}, outcomes


LEAVE_TASK = """
import asyncio
from mcptools.test import delete_item
from ipybox_kernel import ToolCallError
outcomes = []
go = asyncio.Event()
async def left_task():
    await go.wait()
    try:
        await asyncio.to_thread(delete_item.run, {'item_id': 'left'})
        outcomes.append('ran')
    except ToolCallError as e:
        outcomes.append(type(e).__name__)
task = asyncio.get_running_loop().create_task(left_task())
"""

# Cell 2 lets the loop run the task while it runs (top-level await), then reports.
RUN_TASK = "go.set()\nawait asyncio.wait_for(asyncio.shield(task), 60)\nprint(outcomes)"


async def test_an_asyncio_task_an_earlier_cell_left_names_that_cell_and_is_refused_by_the_host(
    workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="ask") as executor:
        requests, first = await collect(executor, LEAVE_TASK)
        assert (requests, first.text) == ([], "")
        requests, second = await collect(executor, RUN_TASK)
        assert requests == [], [r.description for r in requests]
        assert second.text == "['ToolCallRejected']\n", second.text


# The running cell's own calls: direct, from a thread it joins, from tasks it gathers, from a hook
# it fires itself within its own code.
OWN_CALLS = """
import asyncio, threading
from mcptools.test import add
from ipybox_kernel import acall_tool
add.run({'a': 1, 'b': 1})
thread = threading.Thread(target=add.run, args=({'a': 2, 'b': 2},))
thread.start()
thread.join()
await asyncio.gather(acall_tool('test', 'add', {'a': 3, 'b': 3}), acall_tool('test', 'add', {'a': 4, 'b': 4}))
print('done')
"""


async def test_the_running_cells_own_calls_threads_and_gathered_tasks_included_are_still_asked(
    workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="ask") as executor:
        requests, result = await collect(executor, OWN_CALLS)
        assert result.text == "done\n", result.text
        assert sorted(r.tool_args["a"] for r in requests) == [1, 2, 3, 4]
