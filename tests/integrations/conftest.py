"""Fixtures the adapter tests share: generated tools for the test MCP server, and an executor."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.testing import InProcessKernel


@pytest.fixture(scope="module", params=["in_process", "sandboxed"])
async def executor(
    request: pytest.FixtureRequest, tools_dir: Path, module_workspace: Path
) -> AsyncGenerator[CodeExecutor]:
    """An executor with the test server's tools, approval "ask", shared by a module: each adapter test
    runs on the in-process kernel (the fast tier) and on a sandboxed one."""
    if request.param == "in_process":
        executor = CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None)
    else:
        executor = CodeExecutor(workspace=module_workspace, tools_dir=tools_dir)
    async with executor as ex:
        yield ex
