"""Server-everything: generation time, import time and structured results (skipped when not installed)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import anyio.to_thread
import pytest
from codegen_support import (
    EVERYTHING_BIN,
    EVERYTHING_MISSING,
    everything_params,
    load_package,
    run_json,
    tools_as_generation_lists,
)

from ipybox._mcp._servers import open_session, parse_server_params
from ipybox.codegen._codegen import GenerationReport, generate_package
from ipybox.codegen._modelgen import warm_up

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not EVERYTHING_BIN.exists(), reason=EVERYTHING_MISSING)]

# Targets from the issue: generation once the server is up, and importing the whole package.


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module-scoped so the package is generated once for the whole module.
    return "asyncio"


@pytest.fixture(scope="module")
async def everything(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncGenerator[tuple[Path, GenerationReport]]:
    root = tmp_path_factory.mktemp("everything") / "mcptools"
    # A host that generates has the generator loaded; its one-time import cost is not per server.
    await anyio.to_thread.run_sync(warm_up)
    yield root, await generate_package("everything", everything_params(), root)


async def test_every_tool_of_server_everything_gets_a_typed_module(
    everything: tuple[Path, GenerationReport],
) -> None:
    root, report = everything
    listed = await tools_as_generation_lists("everything", everything_params())
    assert sorted(t.name for t in report.sources.tools) == sorted(t.name for t in listed)
    assert all(not t.fallbacks for t in report.sources.tools)
    assert {"echo", "get_sum", "get_structured_content"} <= set(report.modules)
    assert sorted(p.stem for p in (root / "everything").glob("*.py")) == sorted(["__init__", *report.modules])


async def test_structured_content_validates_into_result(everything: tuple[Path, GenerationReport]) -> None:
    root, _ = everything
    tool = load_package(root, "everything")["get_structured_content"]
    params = tool.Params(location="Chicago")
    async with open_session("everything", parse_server_params(everything_params())) as session:
        called = await session.call_tool("get-structured-content", tool._arguments(params))
    result = tool.Result.model_validate(called.structured_content)
    assert isinstance(result.temperature, int | float) and isinstance(result.conditions, str)
    with pytest.raises(ValueError, match="Input should be 'New York', 'Chicago' or 'Los Angeles'"):
        tool.Params(location="Paris")


async def test_run_reaches_server_everything_end_to_end(everything: tuple[Path, GenerationReport]) -> None:
    root, _ = everything
    code = """
import json
from mcptools.everything import echo, get_sum, get_structured_content
weather = get_structured_content.run({"location": "New York"})
summed = get_sum.run(get_sum.Params(a=2, b=40))
print(json.dumps([echo.run({"message": "hi"}), summed, type(weather).__name__]))
"""
    echoed, summed, result_type = await run_json(code, root)
    assert echoed == "Echo: hi" and "42" in summed and result_type == "Result"
