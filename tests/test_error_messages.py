"""Errors a new user meets first name their cause and the fix (one test per message)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ipybox import CodeExecutionError, CodeExecutor, UsageError
from ipybox._cli import main as cli_main

pytestmark = pytest.mark.anyio


def test_a_plain_with_on_a_code_executor_says_to_use_async_with(tmp_path: Path) -> None:
    with (
        pytest.raises(
            UsageError, match=r"async context manager: write 'async with CodeExecutor\(\.\.\.\) as executor:'"
        ),
        CodeExecutor(workspace=tmp_path),
    ):
        pass


def test_generate_with_the_server_command_but_no_double_dash_shows_the_command_with_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["generate", "time", "mcp-server-time", "--root", "tools"])
    assert exited.value.code == 2
    assert (
        "unrecognized arguments: mcp-server-time; put the server's command after '--', "
        "e.g. ipybox generate time --root tools -- mcp-server-time"
    ) in capsys.readouterr().err


def test_the_mcp_server_without_bubblewrap_fails_at_start_naming_no_sandbox(tmp_path: Path) -> None:
    # An MCP client shows a server that started as connected: without bwrap it must not start.
    done = subprocess.run(
        [sys.executable, "-m", "ipybox.mcp_server", "--workspace", str(tmp_path)],
        env={"PATH": str(tmp_path / "no-bwrap-here"), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "bubblewrap is not installed" in done.stderr and "pass --no-sandbox" in done.stderr, done.stderr
    assert "sandbox=None" not in done.stderr


async def test_ipybox_tool_invoked_with_only_the_code_says_to_pass_a_tool_call(tmp_path: Path) -> None:
    from ipybox.integrations.langchain import IpyboxTool

    tool = IpyboxTool(executor=CodeExecutor(workspace=tmp_path, tools_dir=None))
    with pytest.raises(UsageError, match=r"needs its id: pass a ToolCall, e\.g\. await tool\.ainvoke\("):
        await tool.ainvoke({"code": "6 * 7"})
    with pytest.raises(UsageError, match="runs asynchronously only"):
        tool.invoke({"code": "6 * 7"})


async def _error_of(executor: CodeExecutor, code: str) -> CodeExecutionError:
    with pytest.raises(CodeExecutionError) as raised:
        await executor.execute(code)
    return raised.value


async def test_a_name_lookup_in_a_kernel_without_network_says_the_sandbox_has_none(executor: CodeExecutor) -> None:
    error = await _error_of(executor, "import socket\nsocket.create_connection(('pypi.org', 443), timeout=30)")
    assert error.ename == "gaierror"
    assert "('pypi.org'): this sandboxed kernel has no network" in error.evalue
    assert "Network(allow=[...])" in error.evalue and "--allow-net HOST" in error.evalue


@pytest.mark.parametrize(
    ("tools_dir", "code", "expected"),
    [
        (None, "import mcptools", "this kernel has no tools directory (the executor's tools_dir is None)"),
        (
            "nowhere/mcptools",
            "from mcptools.weather import get_forecast",
            "/nowhere/mcptools) did not exist when this kernel started, so no tools are mounted",
        ),
        (
            "mcptool",
            "from mcptools.weather import get_forecast",
            "this kernel's tools directory is imported as 'mcptool' (the name of the executor's tools_dir)",
        ),
        (
            "mcptools",
            "from mcptools.time import get_current_time",
            "no server 'time' was generated into the tools directory (servers there: none). Register it first",
        ),
    ],
    ids=["no tools_dir", "a tools_dir that does not exist", "a tools_dir of another name", "a server never generated"],
)
async def test_importing_tools_the_kernel_lacks_names_the_tools_dir_and_what_to_do(
    workspace: Path, tmp_path: Path, tools_dir: str | None, code: str, expected: str
) -> None:
    # "nowhere" is outside the workspace, where ipybox does not create a missing tools directory.
    base = tmp_path if tools_dir is not None and tools_dir.startswith("nowhere") else workspace
    async with CodeExecutor(workspace=workspace, tools_dir=None if tools_dir is None else base / tools_dir) as executor:
        error = await _error_of(executor, code)
    assert error.ename == "ModuleNotFoundError"
    assert expected in error.evalue, error.evalue
