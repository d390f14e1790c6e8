"""The competitor's side: ipybox 0.9.2 from PyPI, run by the throwaway venv in bench/.peer/venv.

Run by `run.py` as `bench/.peer/venv/bin/python bench/side_peer.py '<json config>'`; prints progress
to stderr and its report as the last line of stdout.
"""

from __future__ import annotations

import importlib
from contextlib import AbstractAsyncContextManager
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol, cast

import benchlib

__all__ = ("PeerSide",)


class _PeerResult(Protocol):
    @property
    def text(self) -> str | None: ...


class _PeerExecutor(Protocol):
    async def __aenter__(self) -> _PeerExecutor: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def execute(self, code: str) -> _PeerResult: ...


class _PeerExecutorFactory(Protocol):
    def __call__(self, *, kernel_env: dict[str, str], working_dir: Path, log_level: str) -> _PeerExecutor: ...


class _PeerGenerate(Protocol):
    async def __call__(self, server_name: str, server_params: dict[str, Any], root_dir: Path) -> list[str]: ...


class PeerSide:
    """ipybox 0.9.2 behind the benchmark's `Side` interface.

    Its sandbox (srt) cannot start a kernel on Linux, so it only has the unsandboxed variant.
    `execute()` accepts every tool call's approval request itself (approve_tool_calls stays at its
    default, True), which is 0.9.2's auto-accept path.
    """

    name = "peer"
    sandbox_variants = ("none",)
    mcp_unavailable: str | None = None

    def __init__(self) -> None:
        # Imported by name: a static import would resolve to this repository's ipybox.
        module = importlib.import_module("ipybox")
        self._executor_cls = cast(_PeerExecutorFactory, module.CodeExecutor)
        self._generate = cast(_PeerGenerate, module.generate_mcp_sources)
        self.version = f"ipybox {version('ipybox')} (mcpygen {version('mcpygen')}, mcp {version('mcp')})"

    def executor(self, work: Path, *, sandbox: str, tools: bool) -> AbstractAsyncContextManager[object]:
        # Generated modules import as `mcptools.<server>`; 0.9.2 finds them through PYTHONPATH.
        return self._executor_cls(kernel_env={"PYTHONPATH": str(work)}, working_dir=work, log_level="ERROR")

    async def execute(self, executor: object, code: str) -> str | None:
        result = await cast(_PeerExecutor, executor).execute(code)
        return result.text

    async def generate(self, server: str, params: dict[str, Any], root: Path) -> list[str]:
        return list(await self._generate(server, params, root))


async def _make() -> PeerSide:
    return PeerSide()


if __name__ == "__main__":
    benchlib.main(_make)
