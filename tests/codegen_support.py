"""Helpers shared by the code generation tests: test servers, importing generated code, subprocesses."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

REPO = Path(__file__).resolve().parents[1]
SERVERS = REPO / "tests" / "servers"
EVERYTHING_BIN = REPO / "node_modules" / ".bin" / "mcp-server-everything"
EVERYTHING_MISSING = (
    f"server-everything is not installed at {EVERYTHING_BIN}; "
    "run `npm install --no-save @modelcontextprotocol/server-everything` in the repository"
)
# A Python MCP server takes about a second to import mcp and start on a loaded 2-core machine.
SERVER_START_TIMEOUT = 30.0
SUBPROCESS_TIMEOUT = 60.0


def shapes_params(*args: str) -> dict[str, Any]:
    """Stdio parameters of the test server with awkward names and nested models."""
    return {"command": sys.executable, "args": [str(SERVERS / "codegen_shapes.py"), *args]}


def everything_params() -> dict[str, Any]:
    return {"command": str(EVERYTHING_BIN)}


def hostile_breakouts(marker: str) -> list[str]:
    """The strings the hostile test server puts everywhere, for a given marker file."""
    spec = importlib.util.spec_from_file_location("codegen_hostile", SERVERS / "codegen_hostile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    breakouts: Callable[[str], list[str]] = module.breakouts
    return breakouts(marker)


def load_package(root: Path, package: str) -> dict[str, ModuleType]:
    """Import every module of a generated package in this process, under a fresh top-level name.

    A unique alias for ``root`` keeps packages of different tests (all called ``mcptools``) apart.
    """
    alias = f"_generated_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(alias, root / "__init__.py", submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None
    top = importlib.util.module_from_spec(spec)
    sys.modules[alias] = top
    spec.loader.exec_module(top)
    modules: dict[str, ModuleType] = {}
    for path in sorted((root / package).glob("*.py")):
        name = package if path.stem == "__init__" else f"{package}.{path.stem}"
        modules[path.stem] = importlib.import_module(f"{alias}.{name}")
    return modules


def package_files(root: Path, package: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / package).iterdir()) if p.is_file()}


async def run_python(code: str, root: Path) -> str:
    """Run code in a sandboxed ipybox kernel that sees the generated package under ``root``.

    Tool calls go the real way: the kernel's ``ipybox_kernel`` stub, the executor's tool server
    (which starts the servers recorded in the manifest), approved by policy.
    """
    from ipybox import CodeExecutor

    workspace = root.parent / f"workspace-{uuid.uuid4().hex[:8]}"
    workspace.mkdir()
    with anyio.fail_after(SUBPROCESS_TIMEOUT):
        async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto") as executor:
            return (await executor.execute(code)).text


async def run_json(code: str, root: Path) -> Any:
    """`run_python`, for code whose last output line is JSON."""
    return json.loads((await run_python(code, root)).strip().splitlines()[-1])


@asynccontextmanager
async def http_server(transport: str, *args: str) -> AsyncGenerator[str]:
    """Start the shapes server over streamable HTTP (``"http"``) or SSE and yield its URL."""
    process: Process = await anyio.open_process([sys.executable, str(SERVERS / "codegen_shapes.py"), transport, *args])
    try:
        assert process.stdout is not None
        with anyio.fail_after(SERVER_START_TIMEOUT):
            buffer = ""
            async for chunk in TextReceiveStream(process.stdout):
                buffer += chunk
                if "\n" in buffer:
                    break
        line = buffer.split("\n", 1)[0]
        assert line.startswith("URL "), line
        yield line.removeprefix("URL ")
    finally:
        process.terminate()
        with anyio.move_on_after(SERVER_START_TIMEOUT):
            await process.wait()
        if process.returncode is None:
            process.kill()
        await process.aclose()


async def tools_as_generation_lists(name: str, params: dict[str, Any]) -> list[Any]:
    """The server's tools as generation lists them: with the same client capabilities advertised
    (``session_callbacks``; a server may list some tools only to a client that can answer them)."""
    from ipybox._mcp._serverasks import ClientFeatures, session_callbacks
    from ipybox._mcp._servers import open_session, parse_server_params

    async def never(context: object, request: object) -> Any:
        raise AssertionError("listing tools asked nothing of the client")

    callbacks = session_callbacks(ClientFeatures(), elicit=never, sample=never)
    async with open_session(name, parse_server_params(params), callbacks=callbacks) as session:
        return list((await session.list_tools()).tools)
