"""Kernel code that forges the output marks a tool request waits for (ipybox._engine._outputmarks), or names one it
never sends.

Before it shows a call for approval, the host waits for the call's mark behind the output printed
before the call. The mark comes from kernel code, so the wait is bounded (`OUTPUT_MARK_WAIT`),
marks are kept per execution and bounded in number, and a mark that is malformed, too large or for
another execution is not taken for the call's. Host memory is the peak resident size of this test
process, which runs the executor.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from memory_support import reset_resident_peak, resident, resident_peak

from ipybox import Approval, ApprovalRequest, CodeExecutionChunk, CodeExecutionResult, CodeExecutor
from ipybox._engine._outputmarks import OUTPUT_MARK_WAIT

pytestmark = pytest.mark.anyio

# Bounds what must end on its own: an approval shown after the deadline, a flood drained.
DEADLINE = 60.0
# The mark the raw request names; the kernel's own marks count from 1 and never get there.
FORGED = 900_001

# Kernel code: a tool request written to the tool socket by hand, naming mark FORGED (which the
# kernel's own marks never reach), and markers of the kernel's own making.
RAW = f"""
import json, os, socket
k = get_ipython().kernel
parent = k.get_parent()
other = {{'header': {{**parent['header'], 'msg_id': 'another-execution'}}}}

def forge(content, parent=parent):
    # Session.send of the class: around the kernel's output guard, as hostile code can.
    type(k.session).send(k.session, k.iopub_socket, 'ipybox_mark', content, parent=parent, ident=b'ipybox_mark')

def raw_call():
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(os.environ['IPYBOX_TOOL_SOCKET'])
    request = {{
        'token': os.environ['IPYBOX_TOOL_TOKEN'], 'seq': 1, 'execution': parent['header']['msg_id'],
        'server': 'test', 'tool': 'greet', 'arguments': {{'name': 'raw'}}, 'mark': {FORGED},
    }}
    sock.sendall(json.dumps(request).encode() + b'\\n')
    reply = json.loads(sock.makefile('rb').readline())
    sock.close()
    return reply
"""

FORGERIES = {
    "never sent": "",
    "sent for another execution": f"forge({{'mark': {FORGED}}}, parent=other)",
    "sent larger than a mark can be": f"forge({{'mark': {FORGED}, 'pad': 'x' * 100_000}})",
    "sent with a malformed number": f"forge({{'mark': str({FORGED})}}); forge({{'mark': {FORGED}.0}}); "
    f"forge({{'mark': [{FORGED}]}}); forge({{'marks': {FORGED}}})",
}


@pytest.fixture(scope="module")
async def executor(module_workspace: Path, tools_dir: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir) as ex:
        yield ex


async def asked_after(executor: CodeExecutor, code: str) -> tuple[list[float], CodeExecutionResult]:
    """Run code, accepting each approval request; the seconds from the start to each request."""
    start = anyio.current_time()
    waited: list[float] = []
    result = None
    with anyio.fail_after(DEADLINE):
        async for event in executor.execute(code):
            if isinstance(event, ApprovalRequest):
                waited.append(anyio.current_time() - start)
                await event.accept()
            elif isinstance(event, CodeExecutionResult):
                result = event
    assert result is not None
    return waited, result


async def calls_keep_their_order(executor: CodeExecutor) -> None:
    code = "from mcptools.test import greet\nfor i in range(10):\n    print(i)\n    greet.run({'name': str(i)})"
    text = ""
    with anyio.fail_after(DEADLINE):
        async for event in executor.execute(code):
            if isinstance(event, CodeExecutionChunk):
                text += event.text
            elif isinstance(event, ApprovalRequest):
                assert text.endswith(f"{event.tool_args['name']}\n")
                await event.accept()


@pytest.mark.parametrize("forgery", FORGERIES)
async def test_a_request_whose_mark_is_missing_or_forged_is_shown_after_the_deadline_and_runs(
    executor: CodeExecutor, forgery: str
) -> None:
    code = f"{RAW}\n{FORGERIES[forgery]}\nprint(raw_call()['text'])"
    [waited], result = await asked_after(executor, code)
    # Not before: the forged marks were not taken for the call's. Not long after: the fail_after.
    assert waited >= OUTPUT_MARK_WAIT
    assert result.text == "Hello, raw!\n"
    await calls_keep_their_order(executor)


def approve(request: ApprovalRequest) -> bool:
    return True


@pytest.mark.parametrize("approval", [pytest.param("auto", id="auto"), pytest.param(approve, id="a callback")])
async def test_a_call_decided_without_asking_does_not_wait_for_its_mark(
    module_workspace: Path, tools_dir: Path, approval: Approval
) -> None:
    code = (
        f"{RAW}\n"
        "import time\n"
        "from mcptools.test import greet\n"
        "greet.run(greet.Params(name='warm'))  # the server's start is not the call's\n"
        "start = time.monotonic()\n"
        "raw_call()\n"
        "print(time.monotonic() - start)"
    )
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval=approval) as ex:
        with anyio.fail_after(DEADLINE):
            result = await ex.execute(code)
    assert float(result.text) < OUTPUT_MARK_WAIT


# Kernel code: marks for the running cell sent straight from the IOPub thread as fast as the host
# takes them (the socket told not to drop any), DISTINCT numbers once each and then one number many
# times; then a print and a call, whose request is shown however many marks came before it.
FLOOD = """
import threading, zmq
from mcptools.test import greet
k = get_ipython().kernel
s = k.session
io = k.iopub_socket.io_thread
msg = s.msg('ipybox_mark', {}, parent=k.get_parent())
header, parent, metadata = s.pack(msg['header']), s.pack(msg['parent_header']), s.pack(msg['metadata'])

def frames(n):
    content = b'{"mark": %d}' % n
    mac = s.auth.copy()
    for part in (header, parent, metadata, content):
        mac.update(part)
    return [b'ipybox_mark', b'<IDS|MSG>', mac.hexdigest().encode(), header, parent, metadata, content]

done = threading.Event()
def send_all():
    io.socket.setsockopt(zmq.XPUB_NODROP, 1)
    for n in range(10**6, 10**6 + DISTINCT):
        io.socket.send_multipart(frames(n), copy=False)
    same = frames(1)
    for _ in range(10_000):
        io.socket.send_multipart(same, copy=False)
    done.set()
io.schedule(send_all)
done.wait()
print('flooded')
_ = greet.run(greet.Params(name='after the flood'))
"""
# Distinct forged marks. Kept, they took the host 13 MB per 100,000 (measured with the bound lifted).
DISTINCT = 150_000
# What the host may grow by while it is flooded: the bounded queue of parsed messages and allocator
# slack (2.7 MB measured with 100,000).
HOST_MEMORY_GROWTH = 10 * 1024**2


async def test_a_flood_of_forged_marks_leaves_host_memory_bounded_and_the_executor_keeps_its_order(
    executor: CodeExecutor,
) -> None:
    await asked_after(executor, "1")  # warm: the first execution's own allocations are not the flood's
    reset_resident_peak()
    before = resident()
    waited, result = await asked_after(executor, FLOOD.replace("DISTINCT", str(DISTINCT)))
    assert resident_peak() - before < HOST_MEMORY_GROWTH
    assert len(waited) == 1 and result.text == "flooded\n"
    await calls_keep_their_order(executor)
