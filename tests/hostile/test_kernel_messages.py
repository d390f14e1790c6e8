"""Kernel code that sends Jupyter messages of its own, around the kernel's output guard.

The kernel holds its own session key and sockets, so nothing it sends can be trusted: the host
must stay within bounded memory whatever arrives, and keep working afterwards. Host memory is the
peak resident size of this test process, which runs the executor.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from memory_support import reset_resident_peak, resident, resident_peak

from ipybox import CodeExecutionError, CodeExecutor, KernelDied, Limits
from ipybox._kernel import message_limit

from .conftest import run

pytestmark = pytest.mark.anyio

# Output limit of the executor under attack: it sets the largest message the host takes.
OUTPUT_CHARS = 100_000
# How much more memory the host may use while it is flooded: ZMQ's few queued messages, the queue
# of parsed ones, one execution's output, and allocator slack. A leak or an unbounded queue blows
# through it within the first of the gigabytes sent.
HOST_MEMORY_GROWTH = 150 * 1024**2
# A flood runs at the speed the host drains it; this bounds a host that stopped draining.
FLOOD_DEADLINE = 120.0


def flood(*, size: int, count: int, extra_frames: int = 0) -> str:
    """Kernel code: ``count`` signed stream messages of ``size`` characters for the running cell,
    sent on the kernel's own iopub socket as fast as the host takes them.

    Serialized once and sent without copying, so the kernel spends almost nothing per message. The
    socket is told not to drop what the host cannot take yet (XPUB_NODROP): every message arrives,
    and so does the cell's end. ``extra_frames`` appends that many more frames of ``size`` bytes
    to each message (Jupyter's binary buffers).
    """
    return (
        "import threading, zmq\n"
        "k = get_ipython().kernel\n"
        "io = k.iopub_socket.io_thread\n"
        f"msg = k.session.msg('stream', {{'name': 'stdout', 'text': 'x' * {size}}}, parent=k.get_parent())\n"
        f"frames = k.session.serialize(msg) + [b'b' * {size}] * {extra_frames}\n"
        "done = threading.Event()\n"
        "def send_all():\n"
        "    # In the IOPub thread, which owns the socket.\n"
        "    io.socket.setsockopt(zmq.XPUB_NODROP, 1)\n"
        f"    for _ in range({count}):\n"
        "        io.socket.send_multipart(frames, copy=False)\n"
        "    done.set()\n"
        "io.schedule(send_all)\n"
        "done.wait()\n"
        "print('sent')\n"
    )


@pytest.fixture
async def executor(workspace: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=workspace, tools_dir=None, limits=Limits(output_chars=OUTPUT_CHARS)) as ex:
        await run(ex, "1")  # warm: the first execution's own allocations are not the flood's
        yield ex


async def still_works(executor: CodeExecutor) -> None:
    assert (await run(executor, "print(6 * 7)")).text == "42\n"


async def test_gigabytes_of_forged_output_within_the_message_limit_leave_host_memory_bounded(
    executor: CodeExecutor,
) -> None:
    size = message_limit(OUTPUT_CHARS) - 64 * 1024
    count = 4 * 1024**3 // size
    reset_resident_peak()
    before = resident()
    with anyio.fail_after(FLOOD_DEADLINE):
        result = await run(executor, flood(size=size, count=count))
    assert resident_peak() - before < HOST_MEMORY_GROWTH
    # What fits the output budget arrives; the rest is dropped unread and counted.
    assert result.text.startswith("x" * OUTPUT_CHARS)
    assert len(result.text) < 2 * OUTPUT_CHARS
    assert result.truncated_chars > 3 * 1024**3
    await still_works(executor)


async def test_a_forged_message_over_the_limit_stops_the_kernel_with_the_reason_and_the_next_execution_works(
    executor: CodeExecutor,
) -> None:
    size = 50 * 1024**2
    reset_resident_peak()
    before = resident()
    with anyio.fail_after(FLOOD_DEADLINE), pytest.raises(KernelDied) as info:
        await run(executor, flood(size=size, count=20))
    assert resident_peak() - before < HOST_MEMORY_GROWTH
    assert info.value.reason is not None
    assert "larger than the host accepts" in info.value.reason and "Limits.output_chars" in info.value.reason
    await still_works(executor)


async def test_a_forged_message_of_many_frames_leaves_host_memory_bounded(executor: CodeExecutor) -> None:
    size = 512 * 1024
    reset_resident_peak()
    before = resident()
    with anyio.fail_after(FLOOD_DEADLINE):
        result = await run(executor, flood(size=size, count=1, extra_frames=1200))
    assert resident_peak() - before < HOST_MEMORY_GROWTH
    # Read past, never held: the message is gone, the connection and the execution are not.
    assert result.text == "sent\n"
    await still_works(executor)


async def test_an_exception_larger_than_a_message_may_be_arrives_trimmed(executor: CodeExecutor) -> None:
    with anyio.fail_after(FLOOD_DEADLINE), pytest.raises(CodeExecutionError) as info:
        await executor.execute("raise ValueError('v' * 10**8)")
    error = info.value
    assert error.ename == "ValueError"
    assert error.evalue.startswith("v" * 1000)
    assert "characters cut" in error.evalue
    assert len(error.evalue) + len(error.traceback) < 2 * OUTPUT_CHARS
    await still_works(executor)


# Kernel code: write bytes that are not ZMTP straight into the kernel's accepted connections to the
# host (the unix sockets named after the kernel's ipc endpoints), past libzmq. 0xff is never a valid
# frame's flags, and there is enough of it that any header the host reads inside it is one.
WRITE_GARBAGE = """
import os, socket
hit = 0
for fd in map(int, os.listdir('/proc/self/fd')):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    try:
        if s.family == socket.AF_UNIX and 'zmq-' in str(s.getsockname()):
            s.send(b'\\xff' * 4096)
            hit += 1
    except OSError:
        pass  # the listening socket itself
    finally:
        s.close()
print(hit)
"""


async def test_kernel_code_that_writes_garbage_into_its_connections_is_stopped_with_the_reason(
    executor: CodeExecutor,
) -> None:
    with anyio.fail_after(FLOOD_DEADLINE), pytest.raises(KernelDied) as info:
        await run(executor, WRITE_GARBAGE)
    assert info.value.reason is not None
    assert "connection to the host: it sent a frame with flags 0xff" in info.value.reason
    await still_works(executor)
