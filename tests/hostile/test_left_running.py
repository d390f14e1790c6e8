"""Code left running by an earlier code action, making a request as the running one: the person is told.

Under one "ask" policy for every code action, the policy memory of ipybox._engine._gate has nothing to
refuse: a thread or process left by cell 1 that copies cell 2's execution id would be shown beside
cell 2's code as if cell 2 made the call. The host sees such code in /proc for itself (never by
asking the kernel) and says so on the request and in its text; cell 2's own calls, its own threads'
included, carry no such statement.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from approval_support import collect

from ipybox import CodeExecutor
from ipybox._approval._rendering import LEFT_RUNNING_WARNING

pytestmark = pytest.mark.anyio

# Cell 1: what any kind of left-behind code uses. `call(execution)` sends delete_item as that
# execution over the tool socket, as the kernel's own client does; the outcome goes to a pipe.
SETUP = r"""
import os, sys, time, threading, _thread, subprocess
from ipybox_kernel._protocol import EXECUTION_ENV
first = os.environ[EXECUTION_ENV]
ids_r, ids_w = os.pipe()  # cell 2 writes its id here, for a process that cannot see the kernel's memory
out_r, out_w = os.pipe()  # the left-behind code writes the outcome of its call here
CALL = '''
import os
from ipybox_kernel import ToolCallRejected
from ipybox_kernel._client import _parse_reply
from ipybox_kernel._transport import round_trip
def call(execution):
    try:
        _parse_reply('test', 'delete_item', round_trip('test', 'delete_item', {'item_id': 'left'}, execution, None))
        return 'ran'
    except ToolCallRejected as e:
        return 'rejected: ' + str(e.reason)
'''
exec(CALL)
def copy_the_running_id():
    # Loops until the kernel's environment names another cell, then calls as that cell.
    while os.environ[EXECUTION_ENV] == first:
        time.sleep(0.002)
    os.write(out_w, (call(os.environ[EXECUTION_ENV]) + '\n').encode())
def read_the_running_id():
    os.write(out_w, (call(os.read(ids_r, 200).decode()) + '\n').encode())
SCRIPT = CALL + f'''
os.write({out_w}, (call(os.read({ids_r}, 200).decode()) + '\\n').encode())
'''
"""

LEAVE = {
    "threading.Thread": "threading.Thread(target=copy_the_running_id, daemon=True).start()",
    "_thread": "ident = _thread.start_new_thread(copy_the_running_id, ())",
    "os.fork": "if os.fork() == 0:\n    read_the_running_id()\n    os._exit(0)",
    "subprocess": "child = subprocess.Popen([sys.executable, '-c', SCRIPT], pass_fds=(ids_r, out_w))",
}

# Cell 2: hands its id to whoever reads the pipe (the attacker's processes could get it elsewhere),
# then waits for the left-behind code's outcome.
CELL_2 = """
import select
os.write(ids_w, os.environ[EXECUTION_ENV].encode())
ready, _, _ = select.select([out_r], [], [], 120)
print('left ->', os.read(out_r, 4000).decode().strip() if ready else 'nothing')
"""

# Cell 2's own calls: from its main thread, a thread it starts and joins, and a subprocess it waits for.
OWN_CALLS = r"""
import os, subprocess, sys, threading
from mcptools.test import add
from ipybox_kernel import ToolCallRejected
def own(name):
    try:
        add.run({'a': 2, 'b': 3})
        print(name, 'ran')
    except ToolCallRejected as e:
        print(name, 'rejected:', e.reason)
own('main')
thread = threading.Thread(target=own, args=('thread',))
thread.start()
thread.join()
child = subprocess.run(
    [sys.executable, '-c', 'from mcptools.test import add\nfrom ipybox_kernel import ToolCallRejected\n'
     'try:\n    add.run({"a": 2, "b": 3})\nexcept ToolCallRejected as e:\n    print("subprocess rejected:", e.reason)'],
    capture_output=True, text=True,
)
print(child.stdout.strip())
print(child.stderr[-500:])
"""


ONE_CALL = "from mcptools.test import add\ntry:\n    add.run({'a': 1, 'b': 1})\nexcept Exception:\n    pass"


# Every request is rejected with this reason.
NO = {"add": False, "delete_item": False}


@pytest.mark.parametrize("kind", list(LEAVE))
async def test_a_call_from_code_left_by_the_last_cell_that_copies_the_running_id_is_shown_as_of_uncertain_origin(
    workspace: Path, tools_dir: Path, kind: str
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="ask") as executor:
        requests, left = await collect(executor, SETUP + LEAVE[kind], NO, reason="asked")
        assert (requests, left.text) == ([], "")

        requests, second = await collect(executor, CELL_2, NO, reason="asked")
        assert second.text == "left -> rejected: asked\n", second.text
        # The call claimed cell 2 (the kernel cannot be asked who made it) and was asked about as
        # cell 2's: with the host's statement that cell 1's code is alive and may have made it.
        assert [(r.tool_name, dict(r.tool_args)) for r in requests] == [("delete_item", {"item_id": "left"})]
        (request,) = requests
        assert request.left_running is not None
        named = re.search(r"left running by code action (\S+) is alive in the kernel", request.left_running)
        assert named is not None and f"{named[1]}:1" != request.id, request.left_running
        lines = request.description.splitlines()
        assert lines[1] == f"{LEFT_RUNNING_WARNING} {request.left_running}"


async def test_calls_of_the_running_cell_its_own_threads_and_processes_included_carry_no_such_statement(
    workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="ask") as executor:
        # Earlier cells that started threads and processes and waited for them leave nothing behind.
        for _ in range(2):
            requests, own = await collect(executor, OWN_CALLS, NO, reason="asked")
            assert [r.tool_name for r in requests] == ["add"] * 3
            assert [r.left_running for r in requests] == [None] * 3
            assert all(LEFT_RUNNING_WARNING not in r.description for r in requests)
            assert own.text.splitlines()[:3] == [
                "main rejected: asked",
                "thread rejected: asked",
                "subprocess rejected: asked",
            ], own.text


async def test_a_thread_that_was_left_and_has_ended_no_longer_marks_the_next_cells_calls(
    workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval="ask") as executor:
        await collect(
            executor,
            "import threading\nrelease = threading.Event()\nt = threading.Thread(target=release.wait)\nt.start()",
        )
        requests, _ = await collect(executor, ONE_CALL, NO)
        assert [r.left_running is not None for r in requests] == [True]
        # The cell that ends it sees it alive when it began; the next one does not.
        await collect(executor, "release.set()\nt.join()")
        requests, _ = await collect(executor, ONE_CALL, NO)
        assert [r.left_running for r in requests] == [None]
