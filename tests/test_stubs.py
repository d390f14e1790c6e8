"""Prompt stubs rendered from generated packages."""

from __future__ import annotations

import ast
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from codegen_support import (
    EVERYTHING_BIN,
    EVERYTHING_MISSING,
    everything_params,
    shapes_params,
    tools_as_generation_lists,
)

from ipybox._exceptions import UsageError
from ipybox.codegen._codegen import generate_mcp_sources
from ipybox.codegen._stubs import render_tool_stubs

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module-scoped so the packages are generated once for the whole module.
    return "asyncio"


@pytest.fixture(scope="module")
async def root(tmp_path_factory: pytest.TempPathFactory) -> AsyncGenerator[Path]:
    path = tmp_path_factory.mktemp("stubs") / "mcptools"
    await generate_mcp_sources("shapes", shapes_params(), path)
    yield path


async def test_stubs_show_import_line_models_fields_and_signatures(root: Path) -> None:
    stubs = render_tool_stubs(root)
    assert stubs.startswith("# MCP server 'shapes': one module per tool, `from mcptools.shapes import <tool>`")
    rate = stubs[stubs.index("class rate:") : stubs.index("class tool_1st_tool:")]
    assert rate.splitlines() == [
        "class rate:  # Rate an order.",
        "    class Address:",
        "        street: str",
        "        city: str",
        "        zip: str | None = None  # Postal code",
        "    class Item:  # A line of an order.",
        "        sku: str  # Stock keeping unit",
        "        qty: int  # ge=1; How many",
        "    class Params:",
        "        items: list[Item]",
        "        ship_to: Address",
        "        rush: bool = False",
        "    class ResultAddress:",
        "        street: str",
        "        city: str",
        "        zip: str | None = None  # Postal code",
        "    class ResultItem:  # A rated line.",
        "        label: str",
        "        score: float",
        "    class Result:",
        "        total: float",
        "        items: list[ResultItem]",
        "        ship_to: ResultAddress",
        "        tags: dict[str, str] | None = None",
        "    def run(params: Params) -> Result: ...",
    ]
    assert "class get_weather:  # Current weather in a city.\n    class Params:\n        city: str\n" in stubs
    assert "conditions: Literal['sunny', 'cloudy', 'rain']" in stubs
    assert "class unicode:  # Returns the tool's own name, 'Ünïcödé'." in stubs
    ast.parse(stubs)


async def test_stubs_can_be_limited_to_servers_and_tools(root: Path) -> None:
    by_original = render_tool_stubs(root, servers=["shapes"], tools=["rate", "get-weather"])
    by_module = render_tool_stubs(root, tools=["get_weather", "rate"])
    assert by_original == by_module
    assert [line for line in by_original.splitlines() if line.startswith("class ")] == [
        "class get_weather:  # Current weather in a city.",
        "class rate:  # Rate an order.",
    ]


async def test_unknown_servers_and_tools_are_usage_errors(root: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no generated package for server\(s\) 'nope'; generated: 'shapes'"):
        render_tool_stubs(root, servers=["nope"])
    with pytest.raises(UsageError, match=r"no generated module for tool\(s\) 'nope'"):
        render_tool_stubs(root, tools=["rate", "nope"])
    with pytest.raises(UsageError, match=r"tools takes a list of names, got the string 'rate'; pass \['rate'\]"):
        render_tool_stubs(root, tools="rate")
    with pytest.raises(UsageError, match="is not a directory"):
        render_tool_stubs(tmp_path / "missing")
    assert render_tool_stubs(tmp_path) == ""


async def test_stubs_are_rendered_without_importing_the_generated_code(root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "mcptools" / "shapes"
    copy.mkdir(parents=True)
    for path in (root / "shapes").glob("*.py"):
        (copy / path.name).write_text(path.read_text())
    marker = tmp_path / "imported"
    rate = copy / "rate.py"
    header, rest = rate.read_text().split("\n", 1)
    rate.write_text(f"{header}\n__import__('pathlib').Path({str(marker)!r}).touch()\n{rest}")
    assert "class rate:" in render_tool_stubs(copy.parent)
    assert not marker.exists()


class _Unwanted:
    """Stands for a foreign tree hung on ``ast``'s shared ``Load()``: copying it is the bug."""

    def __deepcopy__(self, memo: object) -> _Unwanted:
        raise AssertionError("a foreign object hung on ast.Load() was copied")


async def test_stubs_do_not_copy_what_other_code_hangs_on_asts_shared_context_objects(root: Path) -> None:
    # IPython's tracebacks (through `executing`) set `parent` on every node they walk, the shared
    # Load() singleton included; a deep copy of any name then copied the whole traceback's tree.
    before = render_tool_stubs(root)
    name = ast.parse("x", mode="eval").body
    assert isinstance(name, ast.Name)
    load: Any = name.ctx
    load.parent = _Unwanted()
    try:
        assert render_tool_stubs(root) == before
    finally:
        del load.parent


@pytest.mark.skipif(not EVERYTHING_BIN.exists(), reason=EVERYTHING_MISSING)
async def test_stubs_of_server_everything_are_much_smaller_than_its_json_schemas(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    await generate_mcp_sources("everything", everything_params(), root)
    listed = await tools_as_generation_lists("everything", everything_params())
    raw = json.dumps([tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in listed])
    stubs = render_tool_stubs(root)
    assert len(stubs) < 0.5 * len(raw), f"stubs {len(stubs)} chars vs raw JSON {len(raw)} chars"
    assert len([line for line in stubs.splitlines() if line.startswith("class ")]) == len(listed)
    assert "    def run(params: Params) -> Result: ..." in stubs  # get-structured-content
    ast.parse(stubs)


def test_the_kernels_json_number_types_read_as_plain_types() -> None:
    from ipybox.codegen._stubs import _cut

    node = ast.parse("dict[str, JsonInt] | Annotated[Literal[0, 1.5, False], JsonEqual] | None", mode="eval").body
    assert _cut(node) == "dict[str, int] | Literal[0, 1.5, False] | None"
