"""Our side: this repository's ipybox, run by the repository's own venv.

Run by `run.py` as `.venv/bin/python bench/side_ours.py '<json config>'`; prints progress to stderr
and its report as the last line of stdout.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal, cast

import benchlib
from mcp import ClientSession, StdioServerParameters, stdio_client

from ipybox import CodeExecutor, generate_mcp_sources
from ipybox.codegen._codegen import generate_package

__all__ = ("OursSide",)


class OursSide:
    """This repository's `CodeExecutor` behind the benchmark's `Side` interface.

    The default variant is the default bwrap sandbox; "none" is `sandbox=None`, timed only to get
    the sandbox's start overhead. Tool calls are approved with ``approval="auto"``.
    """

    name = "ours"
    sandbox_variants = ("auto", "none")
    mcp_unavailable: str | None = None

    def __init__(self) -> None:
        self.version = f"ipybox {version('ipybox')} (mcp {version('mcp')})"

    def executor(self, work: Path, *, sandbox: str, tools: bool) -> AbstractAsyncContextManager[object]:
        mode: Literal["auto"] | None = "auto" if sandbox == "auto" else None
        if not tools:
            return CodeExecutor(workspace=work, sandbox=mode)
        # The servers come from the manifest generate_mcp_sources wrote under tools_dir; their
        # parameters stay on the host.
        return CodeExecutor(workspace=work, sandbox=mode, tools_dir=work / "mcptools", approval="auto")

    async def execute(self, executor: object, code: str) -> str | None:
        result = await cast(CodeExecutor, executor).execute(code)
        return result.text

    async def generate(self, server: str, params: dict[str, Any], root: Path) -> list[str]:
        return list(await generate_mcp_sources(server, params, root))

    @asynccontextmanager
    async def direct_session(self, params: dict[str, Any]) -> AsyncGenerator[benchlib.DirectCall]:
        """The bench server called through the MCP SDK from this process: the floor under the
        kernel's tool calls (same server, same machine, taking turns with them)."""
        server = StdioServerParameters(command=params["command"], args=params["args"])
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()

            async def call(i: int) -> bool:
                result = await session.call_tool("add", {"a": i, "b": 1})
                return result.structured_content == {"result": i + 1}

            yield call

    async def generation_breakdown(self, server: str, params: dict[str, Any], root: Path) -> dict[str, float]:
        """Phases of one generation in ms, from the report generate_mcp_sources is built on."""
        report = await generate_package(server, params, root)
        return {phase: round(seconds * 1000, 1) for phase, seconds in report.timings.items()}


async def _make() -> OursSide:
    return OursSide()


if __name__ == "__main__":
    benchlib.main(_make)
