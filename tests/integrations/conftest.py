"""Fixtures the adapter tests share: generated tools for the test MCP server, and an executor."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from servers.fixtures import stdio_server

from ipybox import CodeExecutor, generate_mcp_sources


@pytest.fixture(scope="module")
async def tools_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mcptools/test/...` generated from the project's test MCP server (stdio)."""
    root = tmp_path_factory.mktemp("tools") / "mcptools"
    await generate_mcp_sources("test", stdio_server(), root)
    return root


@pytest.fixture(scope="module")
async def executor(tools_dir: Path, module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    """A sandboxed executor with the test server's tools, approval "ask", shared by a module."""
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir) as ex:
        yield ex
