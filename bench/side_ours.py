"""Our side: this repository's ipybox, run by the repository's own venv.

Run by `run.py` as `.venv/bin/python bench/side_ours.py '<json config>'`; prints progress to stderr
and its report as the last line of stdout.

MCP metrics need `CodeExecutor(tools_dir=..., approval="auto")` and `generate_mcp_sources`; while
the library does not have them yet, those metrics are reported as n/a and everything else runs.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import AsyncGenerator, Awaitable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import benchlib

import ipybox
from ipybox import CodeExecutor

__all__ = ("OursSide",)

NOT_BUILT = "n/a (not built yet)"


class _Generate(Protocol):
    def __call__(self, server_name: str, server_params: Any, root_dir: Path) -> Awaitable[list[str]]: ...


class OursSide:
    """This repository's `CodeExecutor` behind the benchmark's `Side` interface.

    The default variant is the default bwrap sandbox; "none" is `sandbox=None`, timed only to get
    the sandbox's start overhead.
    """

    name = "ours"
    sandbox_variants = ("auto", "none")

    def __init__(self) -> None:
        self.version = f"ipybox {version('ipybox')} (mcp {version('mcp')})"
        params = inspect.signature(CodeExecutor).parameters
        generate: object = getattr(ipybox, "generate_mcp_sources", None)
        self._generate = cast(_Generate, generate) if callable(generate) else None
        missing = [p for p in ("tools_dir", "approval") if p not in params]
        if self._generate is None:
            missing.append("generate_mcp_sources")
        self.mcp_unavailable: str | None = NOT_BUILT if missing else None
        if missing:
            print(f"  MCP metrics {NOT_BUILT}: ipybox lacks {', '.join(missing)}", file=sys.stderr)
        self._servers: dict[str, dict[str, Any]] = {}

    def executor(self, work: Path, *, sandbox: str, tools: bool) -> AbstractAsyncContextManager[object]:
        mode: Literal["auto"] | None = "auto" if sandbox == "auto" else None
        extra: dict[str, Any] = {"tools_dir": work / "mcptools", "approval": "auto"} if tools else {}
        return self._running(CodeExecutor(workspace=work, sandbox=mode, **extra), tools=tools)

    @asynccontextmanager
    async def _running(self, executor: CodeExecutor, *, tools: bool) -> AsyncGenerator[CodeExecutor]:
        async with executor:
            register: object = getattr(executor, "register_mcp_server", None)
            if tools and callable(register):
                # Server parameters stay on the host: the executor is told them, the kernel is not.
                for name, params in self._servers.items():
                    registered = register(name, params)
                    if inspect.isawaitable(registered):
                        await registered
            yield executor

    async def execute(self, executor: object, code: str) -> str | None:
        result = await cast(CodeExecutor, executor).execute(code)
        return result.text

    async def generate(self, server: str, params: dict[str, Any], root: Path) -> list[str]:
        if self._generate is None:
            raise RuntimeError(self.mcp_unavailable)
        self._servers[server] = params
        return list(await self._generate(server, params, root))


async def _make() -> OursSide:
    return OursSide()


if __name__ == "__main__":
    benchlib.main(_make)
