"""Fixtures the adapter tests share: generated tools for the test MCP server, and an executor."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.integrations import _core
from ipybox.integrations.openai_agents import _nested
from ipybox.testing import InProcessKernel


@pytest.fixture(scope="module", params=["in_process", "sandboxed"])
def kernel_kind(request: pytest.FixtureRequest) -> str:
    """Each adapter test runs on the in-process kernel (the fast tier) and on a sandboxed one."""
    return request.param


@pytest.fixture(scope="module")
def module_workspace(kernel_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace per variant: the tests leave marker files that count how often code ran."""
    return tmp_path_factory.mktemp(f"workspace-{kernel_kind}")


@pytest.fixture(scope="module")
async def executor(kernel_kind: str, tools_dir: Path, module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    """An executor with the test server's tools, approval "ask", shared by a module."""
    # The adapters remember, per process, the execution keys they started (a key started by an
    # executor since replaced is lost, not run again) and the OpenAI tool calls handed over to a
    # nested run. The two variants reuse the tests' thread and call ids (a model's are unique), so
    # each starts as a fresh process would.
    _core._started.clear()
    _nested._handed_over.clear()
    if kernel_kind == "in_process":
        executor = CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None)
    else:
        executor = CodeExecutor(workspace=module_workspace, tools_dir=tools_dir)
    async with executor as ex:
        yield ex


@pytest.fixture
async def asking_executor(tmp_path: Path) -> AsyncGenerator[CodeExecutor]:
    """An in-process executor with the asking server (tests/servers/asking_server.py), approval "ask"."""
    from server_asks_support import ASKING_STDIO

    async with CodeExecutor(workspace=tmp_path, tools_dir=None, kernel=InProcessKernel(), sandbox=None) as ex:
        ex.register_mcp_server("asking", ASKING_STDIO)
        yield ex
