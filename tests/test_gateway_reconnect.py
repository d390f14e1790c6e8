"""A lost websocket to a kernel on a real Jupyter Kernel Gateway is opened again to the same kernel,
and the running execution goes on; when that cannot be, the execution fails with
`KernelConnectionLost` and the next one gets a fresh kernel.

The connection runs through a TCP relay on 127.0.0.1 that the tests cut, keep down and bring back.
Kernel code that must wait for the test (so that it prints while the connection is down, not before)
waits on a unix socket the test listens on: the gateway's kernels run on this machine.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from servers.gateway import Gateway, Relay, relay

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutor,
    ExecutionTimeout,
    GatewayKernel,
    KernelConnectionLost,
    Timeouts,
    UsageError,
)

pytestmark = pytest.mark.anyio

# Deadline for what must end on its own (a reconnection, a failed execution, a recovery).
RECOVERY = 60.0
# How late a reconnect deadline may be noticed on a loaded machine.
MARGIN = 15.0
SHORT_RECONNECT = 3.0
SHORT_TIMEOUT = 3.0
# ipybox._gateway._remotekernel's bound on one DELETE.
DELETE_TIMEOUT = 10.0
BLOCK = "import threading\nprint('running', flush=True)\nthreading.Event().wait()"


@pytest.fixture
async def go_socket() -> AsyncGenerator[tuple[str, anyio.abc.SocketListener]]:
    """A unix socket the kernel connects to, to wait for the test's word (a short path: the limit is 108)."""
    with tempfile.TemporaryDirectory(prefix="ipybox-") as directory:
        path = os.path.join(directory, "signal")
        async with await anyio.create_unix_listener(path) as listener:
            yield path, listener


async def drop(hop: Relay, gateway: Gateway, kernel_id: str, *, hold: bool = False) -> None:
    """Cut the connection and keep the path down until the gateway has noticed (it buffers from then on)."""
    hop.down(hold=hold)
    await hop.cut()
    await gateway.wait_disconnected(kernel_id)


@asynccontextmanager
async def through_relay(
    gateway: Gateway, workspace: Path, *, tools_dir: Path | None = None, reconnect_timeout: float = 30.0
) -> AsyncGenerator[tuple[Relay, CodeExecutor, str]]:
    """An executor whose kernel is on the gateway behind a relay, with a variable set; and the
    kernel's id. Every kernel it started is deleted when it stops."""
    before = set(gateway.kernel_ids())
    async with relay(gateway.url) as hop:
        kernel = GatewayKernel(
            hop.url, token=gateway.token, reconnect_timeout=reconnect_timeout, allow_unisolated_kernel=True
        )
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=kernel) as ex:
            await ex.execute("kept = 'from before the drop'")
            [kernel_id] = set(gateway.kernel_ids()) - before
            yield hop, ex, kernel_id
    # Only this test's kernels: one an earlier test gave up on may still be finishing its shutdown.
    assert not set(gateway.kernel_ids()) - before


async def next_runs_on_a_fresh_kernel(ex: CodeExecutor, gateway: Gateway, lost: str) -> None:
    """The next execution runs on a fresh kernel, and the lost one was deleted on the gateway."""
    with anyio.fail_after(RECOVERY):
        assert (await ex.execute("print('kept' in globals())")).text == "False\n"
    assert lost not in gateway.kernel_ids()


async def test_a_dropped_connection_is_reopened_and_the_execution_goes_on_with_its_output_and_tool_calls_once(
    gateway: Gateway, workspace: Path, tools_dir: Path, go_socket: tuple[str, anyio.abc.SocketListener]
) -> None:
    path, listener = go_socket
    code = (
        "import socket, sys\n"
        "from mcptools.test import greet\n"
        "link = socket.socket(socket.AF_UNIX)\n"
        f"link.connect({path!r})\n"
        "print('first', flush=True)\n"
        "print(greet.run(greet.Params(name='in flight')))\n"
        "link.recv(1)\n"
        "for i in range(500):\n"
        "    print(i)\n"
        "sys.stdout.flush()\n"
        "link.sendall(b'.')\n"
        "print(greet.run(greet.Params(name='asked while down')))\n"
    )
    async with through_relay(gateway, workspace, tools_dir=tools_dir) as (hop, ex, kernel_id):
        chunks: list[str] = []
        names: list[object] = []
        with anyio.fail_after(RECOVERY):
            execution = ex.execute(code)
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    names.append(event.tool_args["name"])
                    if len(names) == 1:
                        # The call waits for approval when the connection drops, and is approved
                        # while it is down: the answer waits on the host for the connection.
                        await drop(hop, gateway, kernel_id)
                        await event.accept()
                        hop.up()
                    else:
                        await event.accept()
                elif isinstance(event, CodeExecutionChunk):
                    chunks.append(event.text)
                    if "".join(chunks).endswith("Hello, in flight!\n"):
                        # The kernel prints and asks for a tool while the connection is down:
                        # the gateway buffers both and replays them to the reopened connection.
                        await drop(hop, gateway, kernel_id)
                        async with await listener.accept() as link:
                            await link.send(b"g")
                            assert await link.receive(1) == b"."
                        hop.up()
            result = await execution
        expected = "first\nHello, in flight!\n" + "".join(f"{i}\n" for i in range(500))
        assert result.text == expected + "Hello, asked while down!\n"
        assert "".join(chunks) == result.text
        assert names == ["in flight", "asked while down"]
        # The same kernel, with its state.
        assert (await ex.execute("print(kept)")).text == "from before the drop\n"
        assert kernel_id in gateway.kernel_ids()


async def test_an_interrupt_made_while_the_connection_is_down_reaches_the_kernel_once_it_is_back(
    gateway: Gateway, workspace: Path
) -> None:
    code = (
        "import threading\n"
        "print('waiting', flush=True)\n"
        "try:\n"
        "    threading.Event().wait()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')"
    )
    async with through_relay(gateway, workspace) as (hop, ex, kernel_id):
        with anyio.fail_after(RECOVERY):
            execution = ex.execute(code)
            printed = ""
            async for event in execution:
                printed += event.text if isinstance(event, CodeExecutionChunk) else ""
                if printed == "waiting\n" and isinstance(event, CodeExecutionChunk):
                    await drop(hop, gateway, kernel_id)
                    ex.interrupt()
                    hop.up()
            assert (await execution).text == "waiting\ninterrupted\n"
        assert (await ex.execute("print(kept)")).text == "from before the drop\n"


async def test_a_connection_down_past_the_reconnect_timeout_fails_the_execution_and_a_fresh_kernel_follows(
    gateway: Gateway, workspace: Path
) -> None:
    async with through_relay(gateway, workspace, reconnect_timeout=SHORT_RECONNECT) as (hop, ex, lost):
        cut_at = math.inf
        with anyio.fail_after(RECOVERY), pytest.raises(KernelConnectionLost) as info:
            async for event in ex.execute(BLOCK):
                if isinstance(event, CodeExecutionChunk):
                    # Held, not refused: every attempt waits for an answer that never comes.
                    cut_at = anyio.current_time()
                    hop.down(hold=True)
                    await hop.cut()
        waited = anyio.current_time() - cut_at
        assert SHORT_RECONNECT <= waited < SHORT_RECONNECT + MARGIN
        assert info.value.kernel_id == lost and info.value.url == hop.url
        assert f"reconnecting failed for {SHORT_RECONNECT:g} s" in str(info.value)
        hop.up()
        await next_runs_on_a_fresh_kernel(ex, gateway, lost)


async def test_an_execution_timeout_still_runs_out_while_the_connection_is_down(
    gateway: Gateway, workspace: Path
) -> None:
    async with through_relay(gateway, workspace) as (hop, ex, lost):
        began = math.inf
        with anyio.fail_after(RECOVERY), pytest.raises(ExecutionTimeout) as info:
            async for event in ex.execute(BLOCK, timeout=SHORT_TIMEOUT):
                if isinstance(event, CodeExecutionChunk):
                    began = anyio.current_time()
                    # Held: the fresh kernel's start waits for the path instead of failing at once.
                    await drop(hop, gateway, lost, hold=True)
        # The interrupt waited for the connection, which did not come back within the grace period:
        # the kernel was given up, as a local kernel that ignores an interrupt. Its DELETE waited for
        # the path until its own deadline.
        assert info.value.restarted
        assert anyio.current_time() - began < SHORT_TIMEOUT + Timeouts().interrupt_grace + DELETE_TIMEOUT + MARGIN
        hop.up()
        with anyio.fail_after(RECOVERY):
            assert (await ex.execute("print('kept' in globals())")).text == "False\n"
        # The DELETE may have reached the gateway once the path was back, or not (the gateway's
        # culling is the backstop for kernels a host could not delete).
        await gateway.delete(lost, missing_ok=True)


@pytest.mark.parametrize("what", ["deleted", "restarted"])
async def test_a_kernel_deleted_or_restarted_while_disconnected_fails_the_execution_and_a_fresh_kernel_follows(
    gateway: Gateway, workspace: Path, what: str
) -> None:
    async with through_relay(gateway, workspace) as (hop, ex, lost):
        with anyio.fail_after(RECOVERY), pytest.raises(KernelConnectionLost) as info:
            async for event in ex.execute(BLOCK):
                if isinstance(event, CodeExecutionChunk):
                    await drop(hop, gateway, lost)
                    await (gateway.delete(lost) if what == "deleted" else gateway.restart(lost))
                    hop.up()
        assert info.value.kernel_id == lost
        expected = "no longer has kernel" if what == "deleted" else "restarted"
        assert expected in str(info.value)
        await next_runs_on_a_fresh_kernel(ex, gateway, lost)


async def test_an_execution_whose_request_was_lost_with_the_connection_fails_instead_of_waiting_for_ever(
    gateway: Gateway, workspace: Path
) -> None:
    # The request is written, and lost on the way: the gateway never had it, so it has no reply to
    # replay. The kernel's answer to a later request shows that none will come.
    code = f"# {'x' * 4000}\nprint('ran')"
    async with through_relay(gateway, workspace) as (hop, ex, lost):
        swallowed = hop.swallow(len(code))
        execution = ex.execute(code)
        with anyio.fail_after(RECOVERY):
            await swallowed.wait()
            await hop.cut()
            with pytest.raises(KernelConnectionLost) as info:
                await execution
        assert "lost with the connection" in str(info.value) and info.value.kernel_id == lost
        await next_runs_on_a_fresh_kernel(ex, gateway, lost)


async def test_a_tool_answer_lost_with_the_connection_is_sent_again_once_it_is_back(
    gateway: Gateway, workspace: Path, tools_dir: Path
) -> None:
    # The answer is written, and lost on the way; the kernel, which has the call's acknowledgement,
    # would wait for it for ever.
    code = "from mcptools.test import greet\nprint(greet.run(greet.Params(name='lost')))"
    async with through_relay(gateway, workspace, tools_dir=tools_dir) as (hop, ex, kernel_id):
        with anyio.fail_after(RECOVERY):
            execution = ex.execute(code)
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    # More than a keep-alive ping: the answer's message.
                    swallowed = hop.swallow(100)
                    await event.accept()
                    await swallowed.wait()
                    await hop.cut()
            assert (await execution).text == "Hello, lost!\n"
        assert kernel_id in gateway.kernel_ids()


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, "30", True, None])
def test_a_reconnect_timeout_that_is_not_a_finite_number_of_seconds_is_refused(value: object) -> None:
    with pytest.raises(UsageError, match=r"reconnect_timeout must be a finite number of seconds, 0 or more \(0 turns"):
        GatewayKernel("http://127.0.0.1:9", reconnect_timeout=value)  # pyright: ignore[reportArgumentType]
