"""ipybox as an MCP server, driven by the mcp 2.x client over stdio and streamable HTTP.

Every test runs the real server as a subprocess (``python -m ipybox.mcp_server``) with ``TMPDIR``
pointing at a directory of its own, so what each session leaves behind (kernel processes, run and
state directories) can be checked after the client goes away.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import stat
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from codegen_support import EVERYTHING_BIN, everything_params
from mcp import Client, StdioServerParameters, types
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.server.streamable_http import EventMessage
from mcp.shared.exceptions import MCPError
from mcp_types import JSONRPCNotification
from memory_support import reset_resident_peak, resident, resident_peak
from network_support import serving
from servers.fixtures import stdio_server, wait_for_exit

import ipybox
from ipybox import UsageError
from ipybox.mcp_server._eventstore import BoundedEventStore

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[1]
# Starting the server (import mcp) and its first kernel on a loaded 2-core machine.
START_TIMEOUT = 60.0
# The server's own shutdown after SIGTERM: uvicorn, then every session's kernel.
CLEANUP_TIMEOUT = 20.0
# How much more memory the server may use to refuse a file: the request, the reply, allocator slack.
SERVER_MEMORY_GROWTH = 50 * 1024**2


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _png() -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" + b"\xff\x00\x00" * 2 + b"\x00" + b"\x00\x00\xff" * 2)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@dataclass
class Elicitor:
    """The client's user: approves tool calls unless their arguments say "decline me"."""

    messages: list[str] = field(default_factory=list[str])

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        self.messages.append(params.message)
        if "decline me" in params.message:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"approve": True})


def _server_env(tmp: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env["TMPDIR"] = str(tmp)
    return env


def _stdio(workspace: Path, tmp: Path, *options: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "ipybox.mcp_server", "--workspace", str(workspace), *options],
        env=_server_env(tmp),
        cwd=str(REPO),
    )


def _processes(tmp: Path) -> set[int]:
    """Processes whose command line mentions ``tmp``: the kernels (and their bwrap) of the sessions."""
    found: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(tmp) in cmdline and state != "Z":
            found.add(int(proc.name))
    return found


def _session_dirs(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("ipybox"))


_IN_DELETE_SELF = 0x400
_IN_IGNORED = 0x8000


async def _wait_for_removal(path: Path) -> None:
    """Wait, through inotify, until the directory ``path`` has been removed."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        if libc.inotify_add_watch(fd, os.fsencode(path), _IN_DELETE_SELF) < 0:
            assert ctypes.get_errno() == errno.ENOENT, os.strerror(ctypes.get_errno())
            return  # removed before the watch was set
        with anyio.fail_after(CLEANUP_TIMEOUT):
            while True:
                await anyio.wait_readable(fd)
                data = os.read(fd, 4096)
                # struct inotify_event: wd, mask, cookie, len, then a name of len bytes (none for the watched path).
                offset = 0
                while offset < len(data):
                    _, mask, _, length = struct.unpack_from("iIII", data, offset)
                    if mask & (_IN_DELETE_SELF | _IN_IGNORED):
                        return
                    offset += 16 + length
    finally:
        os.close(fd)


async def _assert_clean(tmp: Path) -> None:
    """No kernel is left running and no session directory is left in ``tmp``."""
    for pid in _processes(tmp):
        await wait_for_exit(pid)
    assert _session_dirs(tmp) == []


async def _call(client: Client, tool: str, **arguments: Any) -> types.CallToolResult:
    return await client.call_tool(tool, arguments)


# -- stdio -------------------------------------------------------------------------------------


async def test_a_stdio_client_registers_a_server_calls_its_tools_from_code_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    workspace, tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmp.mkdir()
    user = Elicitor()
    params = stdio_server().model_dump(mode="json", exclude_none=True)
    with anyio.fail_after(START_TIMEOUT * 2):
        async with Client(_stdio(workspace, tmp), elicitation_callback=user, mode="legacy") as client:
            assert client.server_info is not None
            assert (client.server_info.name, client.server_info.version) == ("ipybox", ipybox.__version__)
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {"execute_ipython_cell", "register_mcp_server", "list_mcp_servers", "get_tool_stubs"} <= set(tools)
            assert {"install_package", "reset", "upload_file", "download_file"} <= set(tools)
            assert "timeout" in tools["execute_ipython_cell"].input_schema["properties"]
            read_only = {name for name, tool in tools.items() if tool.annotations and tool.annotations.read_only_hint}
            assert read_only == {"list_mcp_servers", "get_tool_stubs", "search_tools", "download_file"}

            registered = await _call(client, "register_mcp_server", server_name="test", server_params=params)
            assert not registered.is_error, _text(registered)
            assert "from mcptools.test import" in _text(registered)
            assert "class add:" in _text(registered)

            listing = _text(await _call(client, "list_mcp_servers"))
            assert listing.startswith("test: ")
            assert "add" in listing and "greet" in listing
            stubs = _text(await _call(client, "get_tool_stubs", server_name="test", tools=["greet"]))
            assert "class greet:" in stubs and "class add:" not in stubs
            found = _text(await _call(client, "search_tools", query="greet someone", k=1))
            assert "class greet:" in found and "class add:" not in found

            first = await _call(client, "execute_ipython_cell", code="x = 40\nprint('x is', x)")
            assert _text(first) == "x is 40\n"
            called = await _call(
                client,
                "execute_ipython_cell",
                code="from mcptools.test import add\nprint(add.run(add.Params(a=x, b=2)).result)",
            )
            assert not called.is_error, _text(called)
            assert _text(called) == "42\n"
            prompt = user.messages[-1]
            assert prompt.startswith("MCP tool call test.add, run by the host through: ") and "test_server.py" in prompt
            assert '\n  "a": 40\n' in prompt and "\n    | from mcptools.test import add\n" in prompt

            declined = await _call(
                client,
                "execute_ipython_cell",
                code="from mcptools.test import greet\ngreet.run(greet.Params(name='decline me'))",
            )
            assert declined.is_error
            assert "ToolCallRejected" in _text(declined) and "declined" in _text(declined)

            shown = await _call(
                client,
                "execute_ipython_cell",
                code=f"from IPython.display import Image, display\ndisplay(Image(data={_png()!r}))",
            )
            images = [c for c in shown.content if isinstance(c, types.ImageContent)]
            assert len(images) == 1 and images[0].mime_type == "image/png"
            assert base64.b64decode(images[0].data) == _png()

            from_tool = await _call(
                client,
                "execute_ipython_cell",
                code="from mcptools.test import make_image\nmake_image.run({'color': 'blue'})\nprint('done')",
            )
            tool_images = [c for c in from_tool.content if isinstance(c, types.ImageContent)]
            assert len(tool_images) == 1 and tool_images[0].mime_type == "image/png", from_tool.content
            assert base64.b64decode(tool_images[0].data).startswith(b"\x89PNG")

            failed = await _call(client, "execute_ipython_cell", code="print('before')\n1/0")
            assert failed.is_error
            assert _text(failed).startswith("before\n")
            assert "ZeroDivisionError: division by zero" in _text(failed) and "----> 2 1/0" in _text(failed)

            # An event nothing sets: runs until the timeout interrupts it.
            forever = "import threading\nprint('started')\nthreading.Event().wait()"
            slow = await _call(client, "execute_ipython_cell", code=forever, timeout=1)
            assert slow.is_error
            assert "timeout of 1 s" in _text(slow) and "started" in _text(slow) and "keeps its state" in _text(slow)

            long = await _call(client, "execute_ipython_cell", code="print('a' * 5000 + 'END')", max_output_chars=1000)
            assert not long.is_error
            assert "4004 of 5004 characters cut" in _text(long)
            assert _text(long).startswith("a" * 600) and _text(long).rstrip().endswith("END")

            still = await _call(client, "execute_ipython_cell", code="x + 2")
            assert _text(still) == "42\n"
            reset = await _call(client, "reset")
            assert not reset.is_error
            gone = await _call(client, "execute_ipython_cell", code="x")
            assert gone.is_error and "NameError" in _text(gone)
        await _assert_clean(tmp)


async def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(tmp_path: Path) -> None:
    workspace, tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmp.mkdir()
    with anyio.fail_after(START_TIMEOUT * 2):
        options = ("--max-file-mb", "0.01", "--approval", "deny", "--allow", "test.add", "--env", "GREETING=hello")
        async with Client(_stdio(workspace, tmp, *options), mode="legacy") as client:
            unknown = await _call(client, "get_tool_stubs", server_name="nope")
            assert unknown.is_error and "'nope'" in _text(unknown) and "register_mcp_server" in _text(unknown)

            invalid = await _call(client, "register_mcp_server", server_name="bad", server_params={"cmd": "x"})
            assert invalid.is_error and "'command'" in _text(invalid)
            unreachable = await _call(
                client, "register_mcp_server", server_name="gone", server_params={"command": "/nonexistent/server"}
            )
            assert unreachable.is_error and "'gone'" in _text(unreachable)
            wrong_type = await client.call_tool("execute_ipython_cell", {"code": 42})
            assert wrong_type.is_error and "code" in _text(wrong_type)

            for timeout in (-1, 10**9):
                bad_timeout = await _call(client, "execute_ipython_cell", code="1", timeout=timeout)
                assert bad_timeout.is_error and "timeout must be between 0 and 3600 seconds" in _text(bad_timeout)
            env = await _call(client, "execute_ipython_cell", code="import os\nos.environ.get('GREETING')")
            assert _text(env) == "'hello'\n"

            huge = await _call(client, "execute_ipython_cell", code="#" * 1_000_001)
            assert huge.is_error and "1000001 characters; the limit is 1000000" in _text(huge)

            garbage = await _call(client, "upload_file", path="data.bin", content_base64="\x00\xff not base64 ###")
            assert garbage.is_error and "not valid base64" in _text(garbage)
            escape = await _call(client, "upload_file", path="../outside", content_base64="aGk=")
            assert escape.is_error and "../outside" in _text(escape)
            assert not (tmp_path / "outside").exists()
            too_big = await _call(
                client, "upload_file", path="big", content_base64=base64.b64encode(bytes(20000)).decode()
            )
            assert too_big.is_error and "upload limit" in _text(too_big)
            missing = await _call(client, "download_file", path="missing.txt")
            assert missing.is_error and "missing.txt" in _text(missing)
            bad_package = await _call(client, "install_package", name="--index-url=http://evil")
            assert bad_package.is_error

            test = stdio_server().model_dump(mode="json", exclude_none=True)
            assert not (await _call(client, "register_mcp_server", server_name="test", server_params=test)).is_error
            policy = await _call(
                client,
                "execute_ipython_cell",
                code="from mcptools.test import add, greet\nprint(add.run({'a': 1, 'b': 1}))\ngreet.run({'name': 'x'})",
            )
            assert policy.is_error and _text(policy).startswith("result=2\n")
            assert "ToolCallRejected" in _text(policy) and "not allowed by the approval rules" in _text(policy)

            blob = bytes(range(256))
            uploaded = await _call(
                client, "upload_file", path="in/data.bin", content_base64=base64.b64encode(blob).decode()
            )
            assert not uploaded.is_error, _text(uploaded)
            assert (workspace / "in" / "data.bin").read_bytes() == blob
            ran = await _call(
                client,
                "execute_ipython_cell",
                code="data = open('in/data.bin', 'rb').read()\nopen('out.bin', 'wb').write(data[::-1])\nlen(data)",
            )
            assert _text(ran) == "256\n"
            downloaded = await _call(client, "download_file", path="out.bin")
            resources = [c for c in downloaded.content if isinstance(c, types.EmbeddedResource)]
            assert len(resources) == 1
            resource = resources[0].resource
            assert isinstance(resource, types.BlobResourceContents)
            assert base64.b64decode(resource.blob) == blob[::-1]
        await _assert_clean(tmp)


def _server_pid(workspace: Path) -> int:
    """The ipybox MCP server process serving ``workspace``."""
    found = [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit()
        and b"ipybox.mcp_server" in (cmdline := _cmdline(proc))
        and str(workspace).encode() in cmdline
    ]
    assert len(found) == 1, found
    return found[0]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


async def test_download_file_refuses_a_huge_sparse_file_by_its_size_without_reading_it(tmp_path: Path) -> None:
    workspace, tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmp.mkdir()
    huge = 100 * 1024**3
    with anyio.fail_after(START_TIMEOUT * 2):
        async with Client(_stdio(workspace, tmp), mode="legacy") as client:
            made = await _call(
                client,
                "execute_ipython_cell",
                code=f"import os\nwith open('huge.bin', 'wb') as f:\n    os.truncate(f.fileno(), {huge})",
            )
            assert not made.is_error, _text(made)
            server = _server_pid(workspace)
            reset_resident_peak(server)
            before = resident(server)
            refused = await _call(client, "download_file", path="huge.bin")
            assert resident_peak(server) - before < SERVER_MEMORY_GROWTH
            assert refused.is_error
            assert f"is {huge} bytes, more than the limit of {20 * 1024**2} bytes" in _text(refused)
            assert "--max-file-mb" in _text(refused)
            (workspace / "huge.bin").unlink()
        await _assert_clean(tmp)


async def test_without_elicitation_the_policy_decides_and_the_default_rejection_names_the_option(
    tmp_path: Path,
) -> None:
    workspace, tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmp.mkdir()
    config = tmp_path / "ipybox.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {"test": stdio_server().model_dump(mode="json", exclude_none=True)},
                "approval": {"allow": ["test.add", "test.gre*"], "allowReadOnly": True},
            }
        )
    )
    code = """
from mcptools.test import add, greet, lookup, get_time
calls = [(add, {'a': 1, 'b': 2}), (greet, {'name': 'Ada'}), (lookup, {'key': 'k'}), (get_time, {})]
for tool, args in calls:
    try:
        print('ok', tool.run(args))
    except Exception as exc:
        print('rejected', exc)
"""
    # The default client mode negotiates the 2026 protocol, which has no way to ask the user.
    with anyio.fail_after(START_TIMEOUT * 2):
        async with Client(_stdio(workspace, tmp, "--config", str(config), "--deny", "test.greet")) as client:
            assert "test: " in _text(await _call(client, "list_mcp_servers"))
            result = await _call(client, "execute_ipython_cell", code=code)
            lines = _text(result).splitlines()
            assert lines[0] == "ok result=3"
            assert lines[1].startswith("rejected") and "denied by the approval rules" in lines[1]
            assert lines[2].startswith("ok ")
            assert lines[3].startswith("rejected") and "cannot ask its user" in lines[3]
            assert "--approval auto" in lines[3] and "--allow test.get-time" in lines[3]

        async with Client(_stdio(workspace, tmp, "--config", str(config), "--approval", "auto")) as client:
            result = await _call(client, "execute_ipython_cell", code=code)
            assert [line.split()[0] for line in _text(result).splitlines()] == ["ok", "ok", "ok", "ok"]
        await _assert_clean(tmp)


# -- streamable HTTP ---------------------------------------------------------------------------


@dataclass
class HttpIpybox:
    url: str
    token: str
    tmp: Path
    workspace: Path
    stderr: list[str] = field(default_factory=list[str])
    _line: anyio.Event = field(default_factory=anyio.Event)

    def add_line(self, line: str) -> None:
        self.stderr.append(line)
        self._line.set()
        self._line = anyio.Event()

    async def wait_stderr(self, text: str) -> str:
        """The first line of the server's stderr that contains ``text``, once it has written one."""
        while True:
            found = next((line for line in self.stderr if text in line), None)
            if found is not None:
                return found
            await self._line.wait()


_TOKEN_FILE = "its bearer token is in "


@asynccontextmanager
async def _http_ipybox(tmp_path: Path, *options: str, token: str | None = "s3cret-token") -> AsyncGenerator[HttpIpybox]:
    """The server over HTTP with ``token`` (None: the server makes one up and says in which file)."""
    workspace, tmp, run = tmp_path / "ws", tmp_path / "tmp", tmp_path / "run"
    workspace.mkdir()
    tmp.mkdir()
    env = {**_server_env(tmp), "XDG_RUNTIME_DIR": str(run)}
    if token is not None:
        env["IPYBOX_MCP_TOKEN"] = token
    command = [sys.executable, "-m", "ipybox.mcp_server", "--transport", "http", "--port", "0", "--allow-register"]
    command += ["--workspace", str(workspace), *options]
    process = await anyio.open_process(command, env=env, cwd=REPO)
    server = HttpIpybox(url="", token=token or "", tmp=tmp, workspace=workspace)

    async def drain(stream: anyio.abc.ByteReceiveStream) -> None:
        buffer = ""
        async for chunk in stream:
            buffer += chunk.decode(errors="replace")
            while "\n" in buffer:
                line, buffer = buffer.split("\n", 1)
                server.add_line(line)

    try:
        async with anyio.create_task_group() as tg:
            assert process.stderr is not None
            tg.start_soon(drain, process.stderr)
            with anyio.fail_after(START_TIMEOUT):
                server.url = (await server.wait_stderr("listening on ")).rsplit(" ", 1)[1]
            if token is None:
                told = await server.wait_stderr(_TOKEN_FILE)
                server.token = Path(told.split(_TOKEN_FILE, 1)[1].split(" ", 1)[0]).read_text().strip()
            yield server
            process.terminate()
            with anyio.fail_after(CLEANUP_TIMEOUT):
                await process.wait()
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
        await process.aclose()


@asynccontextmanager
async def _http_client(
    server: HttpIpybox, *, elicitation: Elicitor | None = None, mode: str = "legacy"
) -> AsyncGenerator[Client]:
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=START_TIMEOUT) as http:
        transport = streamable_http_client(server.url, http_client=http)
        async with Client(transport, elicitation_callback=elicitation, mode=mode) as client:
            yield client


async def test_an_http_response_stream_carries_event_ids_and_a_retry_hint_and_is_replayed_after_a_lost_connection(
    tmp_path: Path,
) -> None:
    """A client that lost the stream of a request reconnects with Last-Event-ID and gets the answer."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    async with _http_ipybox(tmp_path) as server:
        headers = {"Authorization": f"Bearer {server.token}", "Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(headers=headers, timeout=START_TIMEOUT) as http:
            response = await http.post(server.url, json=initialize)
            events = [line for line in response.text.splitlines() if line.startswith(("id:", "retry:", "data:"))]
            assert "retry: 1000" in events
            first_id = next(line.removeprefix("id:").strip() for line in events if line.startswith("id:"))
            # The connection was lost after the first event: ask for what followed it.
            session = {"mcp-session-id": response.headers["mcp-session-id"], "Last-Event-ID": first_id}
            async with http.stream("GET", server.url, headers=session) as replay:
                text = ""
                async for chunk in replay.aiter_text():
                    text += chunk
                    if '"serverInfo"' in text:
                        break
    assert '"id":1' in text.replace(" ", "") and '"name":"ipybox"' in text.replace(" ", "")


async def test_http_sessions_are_isolated_and_a_closed_session_leaves_no_kernel_behind(tmp_path: Path) -> None:
    async with _http_ipybox(tmp_path) as server:
        async with httpx2.AsyncClient() as anonymous:
            refused = await anonymous.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert refused.status_code == 401
            assert "send the header 'Authorization: Bearer <token>'" in refused.json()["error"]["message"]
            assert "IPYBOX_MCP_TOKEN" in refused.json()["error"]["message"]

        user = Elicitor()
        with anyio.fail_after(START_TIMEOUT * 2):
            # This client probes for the sessionless 2026 protocol first and falls back to a session.
            async with _http_client(server, mode="auto") as other:
                started = await _call(other, "execute_ipython_cell", code="import os\nos.getcwd()")
                assert not started.is_error
                others = _processes(server.tmp)
                assert others
                async with _http_client(server, elicitation=user) as first:
                    everything = everything_params() if EVERYTHING_BIN.exists() else None
                    if everything is not None:
                        registered = await _call(
                            first, "register_mcp_server", server_name="everything", server_params=everything
                        )
                        assert not registered.is_error, _text(registered)
                        echoed = await _call(
                            first,
                            "execute_ipython_cell",
                            code="from mcptools.everything import echo\nprint(echo.run({'message': 'hi from code'}))",
                        )
                        assert "hi from code" in _text(echoed), _text(echoed)
                    test = stdio_server().model_dump(mode="json", exclude_none=True)
                    assert not (
                        await _call(first, "register_mcp_server", server_name="test", server_params=test)
                    ).is_error
                    await _call(first, "execute_ipython_cell", code="secret = 7\nopen('mine.txt', 'w').write('a')")
                    added = await _call(
                        first,
                        "execute_ipython_cell",
                        code="from mcptools.test import add\nadd.run({'a': secret, 'b': 1}).result",
                    )
                    assert _text(added) == "8\n"
                    assert any(m.startswith("MCP tool call test.add,") for m in user.messages)

                    seen = await _call(other, "execute_ipython_cell", code="secret")
                    assert seen.is_error and "NameError" in _text(seen)
                    files = await _call(other, "execute_ipython_cell", code="os.path.exists('mine.txt')")
                    assert _text(files) == "False\n"
                    assert "No MCP servers" in _text(await _call(other, "list_mcp_servers"))
                    assert len(list((server.workspace / "sessions").iterdir())) == 2
                    firsts = _processes(server.tmp) - others
                    assert firsts

                # Ending the session (the client's DELETE) stops its kernel; the other one keeps running.
                for pid in firsts:
                    await wait_for_exit(pid)
                assert _processes(server.tmp) == others
                alive = await _call(other, "execute_ipython_cell", code="print('still here')")
                assert _text(alive) == "still here\n"
    # Directories are removed just after the kernels stop; once the server has exited, all must be gone.
    await _assert_clean(server.tmp)


# Kernel code that sends what once ended the tool server, and the executor and every HTTP session
# with it: one line of deeply nested JSON (no token needed), then other garbage, each on its own connection.
_GARBAGE = """
import json, os, socket
replies = []
for line in [b"[" * 100_000 + b"\\n", b'{"a":' * 100_000 + b"\\n", b"\\xff\\x00 not json\\n", b"\\n"]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(os.environ["IPYBOX_TOOL_SOCKET"])
        sock.sendall(line)
        replies.append(json.loads(sock.makefile("rb").readline())["error"])
print(replies)
"""


async def test_an_http_sessions_directory_is_removed_when_it_ends_and_the_other_sessions_stays(tmp_path: Path) -> None:
    write = "import os\nopen('notes.txt', 'w').write('x')\nos.symlink('/etc', 'planted-link')\nprint(os.getcwd())"
    async with _http_ipybox(tmp_path) as server, _http_client(server) as staying:
        with anyio.fail_after(START_TIMEOUT * 2):
            stays = Path(_text(await _call(staying, "execute_ipython_cell", code=write)).strip())
            async with _http_client(server) as leaving:
                leaves = Path(_text(await _call(leaving, "execute_ipython_cell", code=write)).strip())
                assert stays.parent == leaves.parent == server.workspace / "sessions" and stays != leaves
                assert (server.workspace / "sessions" / leaves.name / "notes.txt").is_file()
        # The client's DELETE does not wait for the session to close; its directory goes once its kernel stopped.
        await _wait_for_removal(server.workspace / "sessions" / leaves.name)
        assert sorted(p.name for p in (server.workspace / "sessions").iterdir()) == [stays.name]
        assert Path("/etc/passwd").is_file()  # the link was removed, not followed
        assert (server.workspace / "sessions" / stays.name / "notes.txt").read_text() == "x"
        still = await _call(staying, "execute_ipython_cell", code="open('notes.txt').read()")
        assert _text(still) == "'x'\n"


async def test_one_sessions_kernel_attacking_its_tool_socket_leaves_both_sessions_working(tmp_path: Path) -> None:
    async with _http_ipybox(tmp_path, "--approval", "auto") as server:
        with anyio.fail_after(START_TIMEOUT * 2):
            async with _http_client(server) as attacker, _http_client(server) as bystander:
                assert _text(await _call(bystander, "execute_ipython_cell", code="x = 'kept'\nprint(x)")) == "kept\n"
                test = stdio_server().model_dump(mode="json", exclude_none=True)
                registered = await _call(attacker, "register_mcp_server", server_name="test", server_params=test)
                assert not registered.is_error, _text(registered)

                attacked = await _call(attacker, "execute_ipython_cell", code=_GARBAGE)
                assert _text(attacked) == "['bad_request', 'bad_request', 'bad_request', 'bad_request']\n"

                assert _text(await _call(bystander, "execute_ipython_cell", code="print(x)")) == "kept\n"
                code = "from mcptools.test import add\nprint(add.run(add.Params(a=40, b=2)).result)"
                called = await _call(attacker, "execute_ipython_cell", code=code)
                assert _text(called) == "42\n", _text(called)
    await _assert_clean(server.tmp)


def test_http_beyond_loopback_without_a_token_is_refused_and_names_the_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "IPYBOX_MCP_TOKEN"}
    command = [sys.executable, "-m", "ipybox", "mcp", "--transport", "http", "--workspace", str(tmp_path)]
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.org"):
        run = subprocess.run(
            [*command, "--host", host, "--port", "0"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
        )
        assert run.returncode == 2, run.stderr
        assert "IPYBOX_MCP_TOKEN" in run.stderr and "without a bearer token" in run.stderr, run.stderr


def _innermost(error: BaseException) -> BaseException:
    """The one exception inside nested groups of one (what the SDK's task groups wrap it in)."""
    inner: list[BaseException] = list(getattr(error, "exceptions", ()))
    return _innermost(inner[0]) if len(inner) == 1 else error


async def test_an_sdk_client_with_a_wrong_or_no_token_is_told_which_file_holds_the_token_and_how_to_choose_one(
    tmp_path: Path,
) -> None:
    async with _http_ipybox(tmp_path, token=None) as server:
        token_file = (await server.wait_stderr(_TOKEN_FILE)).split(_TOKEN_FILE, 1)[1].split(" ", 1)[0]
        for headers, reason in (
            ({}, "no Authorization header"),
            ({"Authorization": "Bearer guessed"}, "wrong bearer token"),
            # The right token without its scheme, as a user pasting it into a client's header field sends it.
            ({"Authorization": server.token}, "the Authorization header is not a bearer token"),
        ):
            async with httpx2.AsyncClient(headers=headers, timeout=START_TIMEOUT) as http:
                # The real SDK client over real HTTP, as a user writes it (its default mode probes first).
                with pytest.raises(BaseException) as raised, anyio.fail_after(START_TIMEOUT):
                    async with Client(streamable_http_client(server.url, http_client=http)):
                        pass
            error = _innermost(raised.value)
            assert isinstance(error, MCPError), repr(raised.value)
            expected = f"ipybox MCP server: 401 Unauthorized, {reason}; the token is in {token_file} "
            assert str(error).startswith(expected), str(error)
            assert "IPYBOX_MCP_TOKEN=<token>" in str(error) and "--bearer-token" in str(error)
            assert "send the header 'Authorization: Bearer <token>'" in str(error)
            # Clients that read the challenge (RFC 6750) find the same advice there.
            async with httpx2.AsyncClient(headers=headers, timeout=START_TIMEOUT) as http:
                challenge = (await http.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})).headers[
                    "www-authenticate"
                ]
            assert challenge.startswith('Bearer realm="ipybox"')
            # RFC 6750: a request that sent no credentials gets no error code.
            assert ('error="invalid_token"' in challenge) == (reason != "no Authorization header"), challenge
            assert (token_file in challenge) == (reason != "no Authorization header"), challenge
            # The refusal named the file, never the token.
            assert server.token not in str(error) and server.token not in challenge


async def test_http_without_a_token_makes_one_up_so_a_local_process_can_neither_register_a_command_nor_run_code(
    tmp_path: Path,
) -> None:
    # The attack: any local process (another user's too) posts `register_mcp_server` with a host command
    # to the loopback server started without IPYBOX_MCP_TOKEN, with --allow-register. Before, it ran.
    marker = tmp_path / "registered-command-ran"
    evil = {"command": "/bin/sh", "args": ["-c", f"touch {marker}"]}
    register = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "register_mcp_server", "arguments": {"server_name": "evil", "server_params": evil}},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with _http_ipybox(tmp_path, token=None) as server:
        token_file = tmp_path / "run" / "ipybox" / f"mcp-{server.url.split(':')[-1].split('/')[0]}.token"
        assert token_file.read_text() == server.token + "\n" and len(server.token) >= 40
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        assert not any(server.token in line for line in server.stderr), "the token itself is never printed"
        async with httpx2.AsyncClient(timeout=START_TIMEOUT) as local:
            none: dict[str, str] = {}
            attempts = [none] * 20 + [{"Authorization": "Bearer guessed"}] * 20
            for headers in [*attempts, {"Authorization": server.token}]:
                refused = await local.post(server.url, json=register, headers={**accept, **headers})
                assert refused.status_code == 401, refused.text
            # DNS rebinding: a page of another site that resolves to 127.0.0.1 (its browser sends its own
            # Host and Origin, and can send no token) is refused before the token is even looked at.
            right = {**accept, "Authorization": f"Bearer {server.token}"}
            rebound = await local.post(server.url, json=register, headers={**right, "Host": "evil.example:80"})
            assert rebound.status_code == 421, rebound.text
            foreign = await local.post(server.url, json=register, headers={**right, "Origin": "http://evil.example"})
            assert foreign.status_code == 403, foreign.text
        with anyio.fail_after(START_TIMEOUT):
            # Each kind of refusal is logged with its reason, once for the client however often it retries.
            for reason in ("no Authorization header", "wrong bearer token", "not a bearer token"):
                line = await server.wait_stderr(reason)
                assert "refused a request from 127.0.0.1" in line, line
            assert "'evil.example:80'" in await server.wait_stderr("Invalid Host header")
            assert "'http://evil.example'" in await server.wait_stderr("Invalid Origin header")
        refusals = [line for line in server.stderr if "refused a request" in line]
        assert len(refusals) == 5, refusals
        assert not any(server.token in line or "guessed" in line for line in server.stderr)
        # The user, with the token from the file, is served.
        async with _http_client(server) as client:
            with anyio.fail_after(START_TIMEOUT * 2):
                assert _text(await _call(client, "execute_ipython_cell", code="1 + 1")) == "2\n"
    assert not marker.exists()
    assert not token_file.exists(), "the token file goes with the server"


def test_serving_http_without_a_token_must_be_asked_for_and_never_with_registration(tmp_path: Path) -> None:
    from ipybox.mcp_server._options import check_exposure

    env = {**_server_env(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    command = [sys.executable, "-m", "ipybox", "mcp", "--transport", "http", "--port", "0", "--no-token"]
    run = subprocess.run(
        [*command, "--allow-register", "--workspace", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "refusing --allow-register without a bearer token" in run.stderr and "drop --no-token" in run.stderr
    assert not (tmp_path / "run").exists()
    for host in ("127.0.0.1", "::1", "localhost"):
        with pytest.raises(UsageError, match="any local process could register a server"):
            check_exposure(host, None, allow_register=True)


def test_loopback_addresses_may_serve_http_without_a_token() -> None:
    from ipybox.mcp_server._options import check_exposure

    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        check_exposure(host, None)
    check_exposure("0.0.0.0", "a-token")


async def test_an_idle_kernel_is_shut_down_and_the_next_call_gets_a_fresh_one_with_the_same_servers(
    tmp_path: Path,
) -> None:
    workspace, tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmp.mkdir()
    params = stdio_server().model_dump(mode="json", exclude_none=True)
    options = ("--idle-ttl", "1", "--allow", "test.*")
    with anyio.fail_after(START_TIMEOUT * 2):
        async with Client(_stdio(workspace, tmp, *options), mode="legacy") as client:
            assert not (await _call(client, "register_mcp_server", server_name="test", server_params=params)).is_error
            await _call(client, "execute_ipython_cell", code="x = 1\nopen('kept.txt', 'w').write('yes')")
            kernels = _processes(tmp)
            assert kernels
            for pid in kernels:
                await wait_for_exit(pid)

            after = await _call(
                client,
                "execute_ipython_cell",
                code="from mcptools.test import add\nprint(open('kept.txt').read(), add.run({'a': 1, 'b': 1}))\nx",
            )
            assert after.is_error
            text = _text(after)
            assert "the kernel was shut down after 1 s without requests" in text
            assert "yes result=2" in text and "NameError" in text
        await _assert_clean(tmp)


def test_bad_options_and_config_files_stop_the_server_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"mcpServers": {"x": {"url": "ftp://nope"}}}))
    cases = [
        (["--ro-path", str(tmp_path / "missing")], "missing' does not exist; create it or remove it"),
        (["--config", str(config)], "server 'x' in config file"),
        (["--workspace", str(tmp_path / "nowhere")], "create it first"),
    ]
    for options, message in cases:
        run = subprocess.run(
            [sys.executable, "-m", "ipybox", "mcp", *options], capture_output=True, text=True, cwd=REPO, timeout=60
        )
        assert run.returncode == 2 and message in run.stderr, run.stderr


def test_ipybox_mcp_help_reads_well() -> None:

    out = subprocess.run(
        [sys.executable, "-m", "ipybox", "mcp", "--help"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    for option in ("--transport", "--bearer-token", "--workspace", "--config", "--approval", "--allow", "mcpServers"):
        assert option in out


def test_the_plugin_and_the_registry_entry_start_ipybox_with_valid_options() -> None:
    from ipybox._cli import _build_parser

    # The plugin runs this clone's ipybox through its start script (tests/test_plugin.py runs it with
    # the real Claude Code CLI); what it passes after the script are `ipybox mcp` options.
    plugin = json.loads((REPO / "plugin" / ".mcp.json").read_text())["mcpServers"]["ipybox"]
    assert plugin["command"] == "sh" and plugin["args"][0] == "${CLAUDE_PLUGIN_ROOT}/run-server.sh"
    assert (REPO / "plugin" / "run-server.sh").read_text().rstrip().endswith('ipybox mcp "$@"')
    args = _build_parser().parse_args(["mcp", *plugin["args"][1:]])
    assert args.subcommand == "mcp" and args.transport == "stdio"

    entry = json.loads((REPO / "server.json").read_text())
    package = entry["packages"][0]
    assert package["identifier"] == "ipybox" and package["transport"] == {"type": "stdio"}
    argv: list[str] = []
    for argument in package["packageArguments"]:
        is_positional = argument["type"] == "positional"
        argv += [argument["value"]] if is_positional else [argument["name"], argument["default"]]
    assert _build_parser().parse_args(argv).approval == "ask"
    skill = (REPO / "plugin" / "skills" / "ipybox" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: ipybox\ndescription: ")
    for tool in ("register_mcp_server", "get_tool_stubs", "execute_ipython_cell", "upload_file", "install_package"):
        assert tool in skill


def test_network_clients_may_register_servers_only_when_the_operator_allows_it(tmp_path: Path) -> None:
    from ipybox._cli import _build_parser
    from ipybox.mcp_server._options import config_from_args

    def allowed(*options: str) -> bool:
        args = _build_parser().parse_args(["mcp", "--workspace", str(tmp_path), *options])
        return config_from_args(args).allow_register

    assert allowed() is True
    assert allowed("--transport", "http") is False
    assert allowed("--transport", "http", "--allow-register") is True
    assert allowed("--no-register") is False


# -- skills ------------------------------------------------------------------------------------


async def test_with_a_skills_dir_the_server_saves_and_lists_skills_that_later_sessions_import(tmp_path: Path) -> None:
    workspace, tmp, skills = tmp_path / "ws", tmp_path / "tmp", tmp_path / "skills"
    workspace.mkdir()
    tmp.mkdir()
    user = Elicitor()
    code = '"""Doubles numbers."""\n\n\ndef run(x: int) -> int:\n    """Twice x."""\n    return 2 * x\n'
    params = _stdio(workspace, tmp, "--skills-dir", str(skills))
    with anyio.fail_after(START_TIMEOUT * 2):
        async with Client(params, elicitation_callback=user, mode="legacy") as client:
            assert "save_skill" in (client.instructions or "")
            tools = {t.name for t in (await client.list_tools()).tools}
            assert {"save_skill", "list_skills"} <= tools
            assert "No skills are saved yet" in _text(await _call(client, "list_skills"))

            saved = await _call(client, "save_skill", name="doubler", code=code, description="Doubles a number")
            assert _text(saved) == "saved skill 'doubler': `from skills.doubler import run`"
            refused = await _call(client, "save_skill", name="json", code=code, description="Shadows json")
            assert refused.is_error and "its name is the name of a module" in _text(refused)
            listing = _text(await _call(client, "list_skills"))
            assert "class doubler:  # Doubles a number" in listing and "def run(x: int) -> int" in listing

            used = await _call(client, "execute_ipython_cell", code="from skills.doubler import run\nprint(run(21))")
            assert _text(used) == "42\n"
            # Kernel code saves through the host, asking the client's user first.
            from_kernel = (
                "import ipybox_kernel\ntry:\n    ipybox_kernel.save_skill('halver', 'def run(x: int) -> float:\\n"
                "    return x / 2\\n', 'decline me')\nexcept ipybox_kernel.ToolCallRejected:\n    print('declined')"
            )
            assert _text(await _call(client, "execute_ipython_cell", code=from_kernel)) == "declined\n"
            assert user.messages[-1].startswith("MCP tool call ipybox.save_skill,")
        async with Client(params, elicitation_callback=user, mode="legacy") as client:
            again = await _call(client, "execute_ipython_cell", code="from skills.doubler import run\nprint(run(4))")
            assert _text(again) == "8\n"
            assert "halver" not in _text(await _call(client, "list_skills"))
        await _assert_clean(tmp)


_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80


async def _wait_for_entry(directory: Path) -> Path:
    """Wait, through inotify, until ``directory`` (made by someone else, if it is missing, in its
    existing parent) holds an entry; return that entry."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, os.fsencode(directory.parent), _IN_CREATE | _IN_MOVED_TO) >= 0
        watched = False
        with anyio.fail_after(START_TIMEOUT):
            while True:
                # Watch first, then look: an entry made in between is seen by the look.
                if not watched and directory.is_dir():
                    assert libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CREATE | _IN_MOVED_TO) >= 0
                    watched = True
                if watched and (entries := sorted(directory.iterdir())):
                    return entries[0]
                await anyio.wait_readable(fd)
                os.read(fd, 4096)
    finally:
        os.close(fd)


async def test_with_a_pool_a_new_http_session_runs_in_a_kernel_started_before_it_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    params = stdio_server().model_dump(mode="json", exclude_none=True)
    async with _http_ipybox(tmp_path, "--pool", "1", "--approval", "auto") as server:
        # Each pooled kernel gets its own directory in sessions/ when it starts, before any session exists.
        pooled = await _wait_for_entry(server.workspace / "sessions")
        with anyio.fail_after(START_TIMEOUT * 2):
            async with _http_client(server) as client:
                cwd = await _call(client, "execute_ipython_cell", code="import os\nprint(os.getcwd())")
                assert Path(_text(cwd).strip()) == pooled
                # The tools directory came with the kernel too: generated modules import and call through the host.
                registered = await _call(client, "register_mcp_server", server_name="test", server_params=params)
                assert not registered.is_error, _text(registered)
                added = await _call(
                    client,
                    "execute_ipython_cell",
                    code="from mcptools.test import add\nadd.run({'a': 2, 'b': 3}).result",
                )
                assert _text(added) == "5\n"
            await _wait_for_removal(pooled)
    await _assert_clean(server.tmp)
    assert [p.name for p in (server.workspace / "sessions").iterdir()] == []


async def test_with_a_pool_skills_and_a_network_a_new_http_session_uses_both_in_a_kernel_started_before_it(
    tmp_path: Path,
) -> None:
    skills = tmp_path / "skills"
    ipybox.save_skill(skills, "doubler", "def run(x: int) -> int:\n    return 2 * x\n", description="Doubles")
    options = ["--pool", "1", "--approval", "auto", "--skills-dir", str(skills)]
    with serving() as web:
        fetch = textwrap.dedent(
            f"""
            import http.client, os
            connection = http.client.HTTPConnection(os.environ["HTTP_PROXY"].removeprefix("http://"), timeout=30)
            connection.request("GET", f"http://127.0.0.1:{web.port}/session")
            print(connection.getresponse().read().decode())
            """
        )
        async with _http_ipybox(tmp_path, *options, "--allow-net", f"127.0.0.1:{web.port}") as server:
            pooled = await _wait_for_entry(server.workspace / "sessions")
            with anyio.fail_after(START_TIMEOUT * 2):
                async with _http_client(server) as client:
                    cwd = await _call(client, "execute_ipython_cell", code="import os\nprint(os.getcwd())")
                    assert Path(_text(cwd).strip()) == pooled
                    used = await _call(client, "execute_ipython_cell", code="from skills.doubler import run\nrun(21)")
                    assert _text(used) == "42\n"
                    code = "def run(x: int) -> int:\n    return x + 1\n"
                    saved = await _call(client, "save_skill", name="incrementer", code=code, description="Adds one")
                    assert not saved.is_error, _text(saved)
                    later = await _call(
                        client, "execute_ipython_cell", code="from skills.incrementer import run\nrun(1)"
                    )
                    assert _text(later) == "2\n"
                    fetched = await _call(client, "execute_ipython_cell", code=fetch)
                    assert _text(fetched) == f"hello /session for 127.0.0.1:{web.port}\n"
                await _wait_for_removal(pooled)
        assert web.paths == ["/session"]
    await _assert_clean(server.tmp)


def test_a_tool_glob_written_for_a_destination_is_refused_at_start_naming_allow_net(tmp_path: Path) -> None:
    """Issue #25, class 2: --allow globs once matched 'network:host:port' too; now they match tool
    calls only, and one written for a destination is refused rather than silently ignored."""
    base = [sys.executable, "-m", "ipybox", "mcp", "--workspace", str(tmp_path), "--ask-net"]
    for option, fix in (("--allow", "--allow-net"), ("--deny", "--deny-net")):
        command = [*base, option, "network:*.example.org:443"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT, cwd=REPO, check=False)
        assert done.returncode == 2 and f"list the destination in {fix}" in done.stderr, done.stderr
        assert "'*.example.org:443'" in done.stderr


def test_a_pool_is_refused_over_stdio_where_there_is_one_session(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ipybox", "mcp", "--workspace", str(tmp_path), "--pool", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT, cwd=REPO, check=False)
    assert done.returncode == 2 and "over stdio there is one session: drop --pool" in done.stderr


async def test_the_event_store_keeps_only_the_newest_events_and_replays_nothing_for_an_evicted_id() -> None:
    store = BoundedEventStore(max_events=3)
    message = JSONRPCNotification(jsonrpc="2.0", method="notifications/progress")
    ids = [await store.store_event("s", message) for _ in range(5)]
    replayed: list[str | None] = []

    async def send(event: EventMessage) -> None:
        replayed.append(event.event_id)

    assert await store.replay_events_after(ids[0], send) is None  # evicted
    assert await store.replay_events_after(ids[2], send) == "s"
    assert replayed == ids[3:]
