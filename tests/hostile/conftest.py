"""Helpers for the hostile suite: run code and collect events, find processes, snapshot run dirs."""

# The suite checks the executor's own run directories and kernel process, which are private.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import os
import socket
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, StdioServer
from ipybox._kernel import Kernel

# SIGKILLed processes are gone within milliseconds; this only bounds a real leak.
PROCESS_EXIT_DEADLINE = 10.0

FAULTY_SERVER = Path(__file__).with_name("faulty_server.py")
TEST_SERVER = Path(__file__).parent.parent / "servers" / "test_server.py"


def faulty_server() -> StdioServer:
    """The MCP server whose tools misbehave on purpose (see faulty_server.py)."""
    return StdioServer(command=sys.executable, args=(str(FAULTY_SERVER),))


def plain_server() -> StdioServer:
    """The project's well-behaved test MCP server over stdio."""
    return StdioServer(command=sys.executable, args=(str(TEST_SERVER), "--transport", "stdio"))


async def run(
    executor: CodeExecutor, code: str, *, accept: bool = True, timeout: float | None = None
) -> CodeExecutionResult:
    """Run code to its result, answering every approval request with ``accept``."""
    result: CodeExecutionResult | None = None
    async for event in executor.execute(code, timeout=timeout):
        if isinstance(event, ApprovalRequest):
            await (event.accept() if accept else event.reject("hostile suite"))
        elif isinstance(event, CodeExecutionResult):
            result = event
    assert result is not None
    return result


def kernel_of(executor: CodeExecutor) -> Kernel:
    kernel = executor._kernels.kernel
    assert isinstance(kernel, Kernel)
    return kernel


def run_dirs(executor: CodeExecutor) -> list[Path]:
    """The host directories this executor created (its home and its kernel's run dir)."""
    assert executor._side.home is not None
    return [executor._side.home, kernel_of(executor).run_dir]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a unique run dir or file name)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


async def wait_until_gone(text: str) -> None:
    """Wait until no process mentions ``text``: a killed PID namespace is torn down asynchronously."""
    with anyio.fail_after(PROCESS_EXIT_DEADLINE):
        for pid in processes_mentioning(text):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                # A pidfd turns readable when its process exits.
                await anyio.wait_readable(fd)
            finally:
                os.close(fd)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` in the host's process tree."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def listening_loopback_ports() -> list[int]:
    """TCP ports the host listens on at 127.0.0.1, ::1 or any address (from /proc/net/tcp{,6})."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, state = fields[1], fields[3]
            if state == "0A":  # LISTEN
                ports.add(int(address.rsplit(":", 1)[1], 16))
    return sorted(ports)


def loopback_listener() -> socket.socket:
    """A TCP listener on the host's 127.0.0.1, so there is always at least one port to attack."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


@pytest.fixture(scope="module")
async def auto_executor(module_workspace: Path, tools_dir: Path) -> AsyncGenerator[CodeExecutor]:
    """A sandboxed executor with the test tools, approving every call by policy."""
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="auto") as ex:
        yield ex
