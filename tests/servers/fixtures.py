"""Fixtures and helpers that run the test MCP server, a ToolServer, and a stand-in kernel.

The "kernel" here is a plain Python subprocess that imports ``ipybox_kernel`` with the tool socket
and token in its environment, exactly the way code in a sandboxed kernel reaches the host.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from ipybox._approval._decisions import ApprovalDecision
from ipybox._kernel._process import wait_for_exit as process_exit
from ipybox._mcp._servers import HttpServer, StdioServer
from ipybox._toolserver._channel import ToolRequest
from ipybox._toolserver._server import ToolServer

__all__ = (
    "ASKING_SERVER_SCRIPT",
    "SERVER_SCRIPT",
    "TRACING_SERVER_SCRIPT",
    "Channel",
    "GateCall",
    "RecordingGate",
    "http_server",
    "server_params",
    "sse_server",
    "stdio_server",
    "stop_process",
    "streamable_http_server",
    "tool_channel",
    "wait_for_exit",
)

SERVER_SCRIPT = Path(__file__).with_name("test_server.py")
# A server whose tools elicit, sample and list roots during the call (ipybox._mcp._serverasks).
ASKING_SERVER_SCRIPT = Path(__file__).with_name("asking_server.py")
# A server that returns the trace context its requests carried in _meta.
TRACING_SERVER_SCRIPT = Path(__file__).with_name("tracing_server.py")

# A cold `import mcp` plus uvicorn's start on a loaded 2-core machine stays well below this.
START_TIMEOUT = 30.0
# uvicorn finishes in-flight requests on SIGTERM; a server still running after this is killed.
STOP_GRACE = 5.0
# MCP's stdio client gives a server 2 s to exit after stdin closes, then kills it.
EXIT_TIMEOUT = 10.0
# A stand-in kernel does a handful of calls; this only catches a hang.
KERNEL_TIMEOUT = 60.0

Transport = Literal["stdio", "streamable-http", "sse"]


def stdio_server(
    *, started_file: Path | None = None, call_log: Path | None = None, env: Mapping[str, str] | None = None
) -> StdioServer:
    """Parameters that make the ToolServer start the test server over stdio."""
    args = [str(SERVER_SCRIPT), "--transport", "stdio"]
    if started_file is not None:
        args += ["--started-file", str(started_file)]
    if call_log is not None:
        args += ["--call-log", str(call_log)]
    return StdioServer(command=sys.executable, args=tuple(args), env=env)


@contextmanager
def http_server(transport: Literal["streamable-http", "sse"], script: Path = SERVER_SCRIPT) -> Generator[HttpServer]:
    """Run the test server (or ``script``) over streamable HTTP or SSE on 127.0.0.1; stop it afterwards."""
    process = subprocess.Popen(
        [sys.executable, str(script), "--transport", transport],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    try:
        yield HttpServer(type=transport, url=_wait_ready(process))
    finally:
        stop_process(process)
        assert process.stdout is not None
        process.stdout.close()


def stop_process(process: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """Terminate a server process, and kill it if it is still running after ``grace`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen[bytes]) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    received = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while b"\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the test server did not print READY within {START_TIMEOUT:g} s")
            if not selector.select(remaining):
                continue
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the test server exited with {process.wait()} before it was ready")
            received += chunk
    line = received.partition(b"\n")[0].decode()
    assert line.startswith("READY "), line
    return line.removeprefix("READY ")


@pytest.fixture(scope="session")
def streamable_http_server() -> Iterator[HttpServer]:
    """The test server over streamable HTTP, shared by the whole session."""
    with http_server("streamable-http") as params:
        yield params


@pytest.fixture(scope="session")
def sse_server() -> Iterator[HttpServer]:
    """The test server over SSE, shared by the whole session."""
    with http_server("sse") as params:
        yield params


@pytest.fixture(params=["stdio", "streamable-http", "sse"])
def server_params(request: pytest.FixtureRequest) -> StdioServer | HttpServer:
    """The test server's parameters, once per transport."""
    if request.param == "stdio":
        return stdio_server()
    return request.getfixturevalue("streamable_http_server" if request.param == "streamable-http" else "sse_server")


@dataclass(frozen=True)
class GateCall:
    """What a gate was asked about: the request and what the host knows of its server."""

    request: ToolRequest
    server: str
    annotations: Mapping[str, Any] | None
    input_schema: Mapping[str, Any] | None = None

    @property
    def server_name(self) -> str:
        return self.request.server

    @property
    def tool_name(self) -> str:
        return self.request.tool

    @property
    def seq(self) -> int:
        return self.request.seq


@dataclass
class RecordingGate:
    """A gate that records every call it is asked about and rejects the tools listed in `deny`."""

    deny: dict[str, str | None] = field(default_factory=dict[str, "str | None"])
    calls: list[GateCall] = field(default_factory=list[GateCall])

    async def __call__(
        self,
        request: ToolRequest,
        /,
        *,
        server: str,
        annotations: Mapping[str, Any] | None,
        input_schema: Mapping[str, Any] | None = None,
    ) -> ApprovalDecision:
        self.calls.append(GateCall(request, server, annotations, input_schema))
        if request.tool in self.deny:
            return ApprovalDecision(approved=False, reason=self.deny[request.tool])
        return ApprovalDecision(approved=True)

    @property
    def tools(self) -> list[str]:
        return [call.tool_name for call in self.calls]


# Runs in the stand-in kernel: make the calls given as JSON in argv[1] and print one JSON result each.
_KERNEL_CALLS = """
import json, sys
import ipybox_kernel

def run(server, tool, arguments=None):
    try:
        output = ipybox_kernel.call_tool(server, tool, arguments)
    except ipybox_kernel.ToolCallError as error:
        extra = {name: getattr(error, name) for name in ("reason", "timeout", "output")
                 if hasattr(error, name)}
        return {"error": type(error).__name__, "message": str(error), "server_name": error.server_name,
                "tool_name": error.tool_name, **extra}
    return {"structured": output.structured, "text": output.text, "content": output.content}

print(json.dumps([run(*call) for call in json.loads(sys.argv[1])]))
"""


@dataclass
class Channel:
    """A running ToolServer and the environment a kernel needs to reach it."""

    tool_server: ToolServer
    env: dict[str, str]
    directory: Path

    async def run_python(self, code: str, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Run code in a stand-in kernel process; return its stdout (stderr goes to the test log)."""
        with anyio.fail_after(KERNEL_TIMEOUT):
            result = await anyio.run_process(
                [sys.executable, "-c", code, *args], env=dict(env or self.env), stderr=None, check=True
            )
        return result.stdout.decode()

    async def calls(self, *calls: tuple[Any, ...], env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Make tool calls ``(server, tool, arguments)`` from one stand-in kernel; return their outcomes.

        An outcome is ``{"structured", "text", "content"}`` or ``{"error": <class name>, "message", ...}``.
        """
        out = await self.run_python(_KERNEL_CALLS, json.dumps(calls), env=env)
        return json.loads(out)

    async def call(self, server: str, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """One tool call from a stand-in kernel."""
        (outcome,) = await self.calls((server, tool, arguments))
        return outcome


@asynccontextmanager
async def tool_channel(
    servers: Mapping[str, StdioServer | HttpServer | Mapping[str, Any]],
    gate: Any = None,
    **options: Any,
) -> AsyncGenerator[Channel]:
    """Run a ToolServer with these servers registered, in a short temporary directory."""
    # pytest's tmp_path is often too long for a unix socket path (107 bytes).
    with tempfile.TemporaryDirectory(prefix="ipybox-") as directory:
        token = secrets.token_urlsafe(24)
        socket_path = Path(directory) / "tools.sock"
        tool_server = ToolServer(socket_path=socket_path, token=token, gate=gate or RecordingGate(), **options)
        for name, params in servers.items():
            tool_server.register(name, params)
        env = {**os.environ, "IPYBOX_TOOL_SOCKET": str(socket_path), "IPYBOX_TOOL_TOKEN": token}
        async with anyio.create_task_group() as tg:
            await tg.start(tool_server.run)
            try:
                yield Channel(tool_server, env, Path(directory))
            finally:
                tg.cancel_scope.cancel()


async def wait_for_exit(pid: int) -> None:
    """Wait until a process has exited (it may be a zombie not yet reaped by its parent)."""
    with anyio.fail_after(EXIT_TIMEOUT):
        await process_exit(pid)
