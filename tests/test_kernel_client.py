"""The kernel side of the tool channel: ``ipybox_kernel``, in plain processes and in a real IPython kernel."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import tempfile
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import anyio
import pytest
from jupyter_client.manager import AsyncKernelManager
from servers.fixtures import KERNEL_TIMEOUT, tool_channel

import ipybox_kernel
from ipybox._approval._decisions import ApprovalDecision
from ipybox._mcp._servers import HttpServer
from ipybox._toolserver._channel import ToolRequest

pytestmark = pytest.mark.anyio

HEAVY_MODULES = (
    "ipybox",
    "mcp",
    "mcp_types",
    "pydantic",
    "pydantic_core",
    "anyio",
    "httpx",
    "httpx2",
    "IPython",
)


async def _python(code: str, env: dict[str, str] | None = None) -> str:
    with anyio.fail_after(KERNEL_TIMEOUT):
        result = await anyio.run_process([sys.executable, "-c", code], env=env, stderr=None, check=True)
    return result.stdout.decode()


def _without_channel() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("IPYBOX_TOOL_SOCKET", "IPYBOX_TOOL_TOKEN")}


async def test_importing_ipybox_kernel_loads_only_the_standard_library() -> None:
    code = "import sys, json, ipybox_kernel; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(await _python(code)))
    heavy = {name for name in loaded if name.split(".")[0] in HEAVY_MODULES}
    assert heavy == set()
    # acall_tool imports asyncio only when it is used.
    assert "asyncio" not in loaded


async def test_a_call_outside_an_ipybox_kernel_says_tool_calls_are_not_available() -> None:
    code = (
        "import ipybox_kernel\n"
        "try:\n    ipybox_kernel.call_tool('github', 'search', {})\n"
        "except ipybox_kernel.ToolServerUnavailable as e:\n    print(e.server_name, e.tool_name, e)\n"
    )
    out = await _python(code, env=_without_channel())
    assert out.startswith("github search tool calls are not available in this kernel")
    assert "IPYBOX_TOOL_SOCKET" in out


async def test_a_call_when_the_tool_server_is_gone_raises_tool_server_unavailable() -> None:
    env = {
        **_without_channel(),
        "IPYBOX_TOOL_SOCKET": "/nonexistent/tools.sock",
        "IPYBOX_TOOL_TOKEN": "t" * 32,
    }
    code = (
        "import ipybox_kernel\n"
        "try:\n    ipybox_kernel.call_tool('github', 'search', {})\n"
        "except ipybox_kernel.ToolServerUnavailable as e:\n    print(e)\n"
    )
    out = await _python(code, env=env)
    assert "cannot reach the tool server at '/nonexistent/tools.sock'" in out


async def test_arguments_that_are_not_json_or_not_a_dict_fail_before_anything_is_sent() -> None:
    env = {
        **_without_channel(),
        "IPYBOX_TOOL_SOCKET": "/nonexistent/tools.sock",
        "IPYBOX_TOOL_TOKEN": "t" * 32,
    }
    code = (
        "import ipybox_kernel\n"
        "try:\n    ipybox_kernel.call_tool('s', 't', {'when': object()})\n"
        "except ipybox_kernel.ToolCallError as e:\n    print(type(e).__name__, e)\n"
        "try:\n    ipybox_kernel.call_tool('s', 't', [1, 2])\n"
        "except TypeError as e:\n    print(type(e).__name__, e)\n"
    )
    not_json, not_dict = (await _python(code, env=env)).splitlines()
    assert not_json.startswith("ToolCallError the arguments for tool 't' are not JSON-serializable")
    assert not_dict == "TypeError arguments for tool 't' must be a dict, got list"


async def test_nan_or_infinity_in_arguments_fails_before_sending_naming_where_it_is() -> None:
    env = {
        **_without_channel(),
        "IPYBOX_TOOL_SOCKET": "/nonexistent/tools.sock",
        "IPYBOX_TOOL_TOKEN": "t" * 32,
    }
    code = (
        "import ipybox_kernel\n"
        "for arguments in ({'head': float('nan')}, {'rows': [1, {'w': float('-inf')}]}):\n"
        "    try:\n        ipybox_kernel.call_tool('s', 't', arguments)\n"
        "    except ipybox_kernel.ToolCallError as e:\n        print(type(e).__name__, e)\n"
    )
    nan, infinity = (await _python(code, env=env)).splitlines()
    assert nan == (
        "ToolCallError arguments['head'] for tool 't' is nan: JSON has no NaN or Infinity, "
        "so the call cannot carry it (nothing was sent)"
    )
    assert infinity.startswith("ToolCallError arguments['rows'][1]['w'] for tool 't' is -inf: JSON has no NaN")


def test_tool_output_is_frozen_and_errors_survive_pickling() -> None:
    output = ipybox_kernel.ToolOutput(structured={"a": 1}, text="1", content=[])
    with pytest.raises(FrozenInstanceError):
        output.text = "2"  # type: ignore[misc]
    rejected = ipybox_kernel.ToolCallRejected("github", "delete_repo", "rejected: no", reason="no")
    copy = pickle.loads(pickle.dumps(rejected))
    assert (type(copy), str(copy), copy.server_name, copy.tool_name, copy.reason) == (
        ipybox_kernel.ToolCallRejected,
        "rejected: no",
        "github",
        "delete_repo",
        "no",
    )
    assert isinstance(copy, ipybox_kernel.ToolCallError)
    assert issubclass(ipybox_kernel.ToolCallTimeout, TimeoutError)
    assert issubclass(ipybox_kernel.ToolNotFound, LookupError)


async def test_a_forked_child_opens_its_own_connection(streamable_http_server: HttpServer) -> None:
    code = (
        "import os\n"
        "from ipybox_kernel import call_tool\n"
        "print(call_tool('test', 'add', {'a': 1, 'b': 1}).text)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print(call_tool('test', 'add', {'a': 2, 'b': 2}).text, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(call_tool('test', 'add', {'a': 3, 'b': 3}).text)\n"
    )
    async with tool_channel({"test": streamable_http_server}) as channel:
        out = await channel.run_python(code)
    assert out.split() == ["2", "4", "6"]


async def test_interrupting_a_waiting_call_cancels_it_on_the_host_and_the_next_call_works(
    streamable_http_server: HttpServer,
) -> None:
    asked, cancelled = anyio.Event(), anyio.Event()

    async def gate(request: ToolRequest, **_: Any) -> ApprovalDecision:
        if request.tool != "delete_item":
            return ApprovalDecision(approved=True)
        asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("this gate only ends by being cancelled")

    # The process turns SIGINT into KeyboardInterrupt itself, as an IPython kernel does while it runs
    # a cell: started from a test run in the background, it would inherit SIGINT ignored.
    code = (
        "import signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from ipybox_kernel import call_tool\n"
        "print('ready', flush=True)\n"
        "try:\n    call_tool('test', 'delete_item', {'item_id': '1'})\n"
        "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
        "print(call_tool('test', 'greet', {'name': 'again'}).text, flush=True)\n"
    )
    async with tool_channel({"test": streamable_http_server}, gate) as channel:
        process = await anyio.open_process([sys.executable, "-c", code], env=channel.env)
        async with process:
            try:
                with anyio.fail_after(KERNEL_TIMEOUT):
                    await asked.wait()
                process.send_signal(signal.SIGINT)
                with anyio.fail_after(KERNEL_TIMEOUT):
                    await cancelled.wait()
                assert process.stdout is not None
                out = b""
                with anyio.fail_after(KERNEL_TIMEOUT):
                    async for chunk in process.stdout:
                        out += chunk
            finally:
                # A failed wait leaves the process blocked on the gate, which only ends by being
                # cancelled: without this, closing the process would wait for it for ever.
                if process.returncode is None:
                    process.kill()
    assert out.decode().split("\n")[:3] == ["ready", "interrupted", "Hello, again!"]


async def test_cancelling_an_awaited_call_cancels_it_on_the_host(streamable_http_server: HttpServer) -> None:
    asked, cancelled = anyio.Event(), anyio.Event()

    async def gate(request: ToolRequest, **_: Any) -> ApprovalDecision:
        if request.tool != "delete_item":
            return ApprovalDecision(approved=True)
        asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("this gate only ends by being cancelled")

    code = (
        "import asyncio\n"
        "from ipybox_kernel import acall_tool\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.wait_for(acall_tool('test', 'delete_item', {'item_id': '1'}), 1.0)\n"
        "    except TimeoutError:\n"
        "        print('gave up')\n"
        "asyncio.run(main())\n"
    )
    async with tool_channel({"test": streamable_http_server}, gate) as channel:
        await channel.call("test", "add", {"a": 1, "b": 1})  # start the server first
        out = await channel.run_python(code)
        with anyio.fail_after(KERNEL_TIMEOUT):
            await cancelled.wait()
    assert asked.is_set()
    assert out.strip() == "gave up"


async def _execute(km: AsyncKernelManager, code: str) -> tuple[str, list[dict[str, Any]]]:
    """Run code in the kernel; return the request's msg_id and its iopub messages until idle."""
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=KERNEL_TIMEOUT)
        msg_id = kc.execute(code)
        messages: list[dict[str, Any]] = []
        with anyio.fail_after(KERNEL_TIMEOUT):
            while True:
                msg = await kc.get_iopub_msg()
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                messages.append(msg)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    return msg_id, messages
    finally:
        kc.stop_channels()


async def test_in_an_ipython_kernel_images_are_displayed_and_calls_carry_the_cell_id(
    streamable_http_server: HttpServer,
) -> None:
    seen: list[ToolRequest] = []

    async def gate(request: ToolRequest, **_: Any) -> ApprovalDecision:
        seen.append(request)
        return ApprovalDecision(approved=True)

    code = (
        "from ipybox_kernel import call_tool, acall_tool\n"
        "out = call_tool('test', 'make_image', {'color': 'green'})\n"
        "out2 = await acall_tool('test', 'add', {'a': 1, 'b': 2})\n"
        "print(len(out.content), out2.structured)\n"
    )
    async with tool_channel({"test": streamable_http_server}, gate) as channel:
        with tempfile.TemporaryDirectory(prefix="ipybox-k") as run_dir:
            km = AsyncKernelManager(
                kernel_name="python3",
                transport="ipc",
                ip=str(Path(run_dir) / "k"),
                connection_file=str(Path(run_dir) / "k.json"),
            )
            await km.start_kernel(env=channel.env)  # pyright: ignore[reportUnknownMemberType]
            try:
                msg_id, messages = await _execute(km, code)
            finally:
                await km.shutdown_kernel(now=True)  # pyright: ignore[reportUnknownMemberType]
    displays = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    streams = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert errors == []
    assert len(displays) == 1 and set(displays[0]) == {"image/png"}
    assert streams == "1 {'result': 3}\n"
    assert [call.execution for call in seen] == [msg_id, msg_id]
