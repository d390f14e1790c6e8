"""Fixtures the adapter tests share: generated tools for the test MCP server, and an executor."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from ipybox import CodeExecutor


@pytest.fixture(scope="module")
async def executor(tools_dir: Path, module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    """A sandboxed executor with the test server's tools, approval "ask", shared by a module."""
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir) as ex:
        yield ex
