"""Tool search over generated packages: ranking, stubs of matches, the summary, the cache, hostile
tools, and the same search from kernel code in a real sandboxed kernel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from codegen_support import SERVERS, shapes_params
from test_public_api import HEAVY

from ipybox import (
    CodeExecutor,
    SandboxConfig,
    ToolMatch,
    UsageError,
    generate_mcp_sources,
    render_match_stubs,
    render_tool_catalogue,
    render_tool_stubs,
    render_tool_summary,
    search_tools,
)
from ipybox_kernel._search import tool_index

pytestmark = pytest.mark.anyio

QUERIES = Path(__file__).with_name("data") / "toolsearch_queries.json"
TEST_SERVER = {"command": sys.executable, "args": [str(SERVERS / "test_server.py")]}
HOSTILE_SERVER = {"command": sys.executable, "args": [str(SERVERS / "search_hostile.py")]}


def queries_for(*servers: str) -> list[dict[str, Any]]:
    """The benchmark's queries written for a tool of one of `servers`."""
    every: list[dict[str, Any]] = json.loads(QUERIES.read_text(encoding="utf-8"))["queries"]
    return [q for q in every if q["expected"][0].split(".")[0] in servers]


def misses(root: Path, queries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The queries whose top 5 holds none of their expected tools, with what they found instead."""
    missed: list[tuple[str, list[str]]] = []
    for item in queries:
        found = [f"{m.server}.{m.module.rsplit('.', 1)[1]}" for m in search_tools(root, item["query"])]
        if not set(found) & set(item["expected"]):
            missed.append((item["query"], found))
    return missed


@pytest.fixture(scope="module")
async def root(tmp_path_factory: pytest.TempPathFactory) -> AsyncGenerator[Path]:
    path = tmp_path_factory.mktemp("search") / "mcptools"
    await generate_mcp_sources("test", TEST_SERVER, path)
    await generate_mcp_sources("shapes", shapes_params(), path)
    yield path


async def test_search_finds_the_expected_tool_for_every_query_about_the_test_servers(root: Path) -> None:
    queries = queries_for("test", "shapes")
    assert len(queries) == 21
    assert misses(root, queries) == []


async def test_a_match_names_server_tool_module_and_one_line_description(root: Path) -> None:
    best, *_ = search_tools(root, "what time is it on the server", k=3)
    assert (best.server, best.tool, best.module) == ("test", "get-time", "mcptools.test.get_time")
    assert best.description == "The server's current time in ISO 8601 format (UTC)."
    assert best.score > 0


async def test_words_are_split_at_snake_and_camel_case_and_endings_are_stripped(root: Path) -> None:
    assert [m.module for m in search_tools(root, "computing stat", k=1)] == ["mcptools.test.compute_stats"]
    # 'getUser' is one of the shapes server's tool names.
    assert {"get user", "getUser"} <= {m.tool for m in search_tools(root, "users", k=3)}


async def test_search_returns_at_most_k_matches_and_only_tools_sharing_a_word(root: Path) -> None:
    assert len(search_tools(root, "the order of a customer", k=2)) == 2
    assert search_tools(root, "zebra") == []


async def test_an_empty_query_or_k_below_one_is_refused(root: Path) -> None:
    with pytest.raises(UsageError, match="no words to search for"):
        search_tools(root, " ? the ")
    with pytest.raises(UsageError, match="k must be at least 1"):
        search_tools(root, "add", k=0)
    with pytest.raises(UsageError, match="is not a directory"):
        search_tools(root / "missing", "add")


async def test_match_stubs_are_the_stubs_of_just_the_matched_tools(root: Path) -> None:
    matches = [search_tools(root, q, k=1)[0] for q in ("add two integers", "weather in a city", "greet someone")]
    stubs = render_match_stubs(root, matches)
    assert stubs == "\n".join(
        [
            render_tool_stubs(root, servers=["test"], tools=["add", "greet"]),
            render_tool_stubs(root, servers=["shapes"], tools=["get_weather"]),
        ]
    )
    assert [line for line in stubs.splitlines() if line.startswith("class ")] == [
        "class add:  # Add two integers.",
        "class greet:  # Greet someone by name.",
        "class get_weather:  # Current weather in a city.",
    ]


async def test_the_summary_lists_each_server_with_its_tool_modules(root: Path) -> None:
    lines = render_tool_summary(root).splitlines()
    assert lines[0].startswith("# MCP tools: 2 servers, 26 tools, one module per tool: `from mcptools.<server> import")
    assert "search_tools(" in lines[1]
    assert lines[2].startswith("mcptools.shapes: a_b, a_b_2, book, class_, data_fetch, echo, get_user,")
    assert lines[3] == (
        "mcptools.test: add, compute_stats, crash, create_order, delete_item, fail, get_env, get_time, greet, "
        "lookup, make_image, pid, slow"
    )
    assert len(lines) == 4


async def test_the_catalogue_is_the_stubs_while_they_fit_the_limit_and_the_summary_beyond(root: Path) -> None:
    stubs = render_tool_stubs(root)
    summary = render_tool_summary(root)
    assert len(summary) < len(stubs) / 3
    assert render_tool_catalogue(root, limit=len(stubs)) == ("stubs", stubs)
    assert render_tool_catalogue(root, limit=len(stubs) - 1) == ("summary", summary)
    assert render_tool_catalogue(root, mode="stubs", limit=0) == ("stubs", stubs)
    assert render_tool_catalogue(root, mode="summary") == ("summary", summary)
    # The default limit leaves two small servers' stubs in the prompt.
    assert render_tool_catalogue(root)[0] == "stubs"


async def test_the_index_is_reused_until_a_server_is_generated_again_or_removed(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    await generate_mcp_sources("svc", shapes_params(), root)
    await generate_mcp_sources("other", TEST_SERVER, root)
    first = tool_index(root)
    assert tool_index(root) is first
    assert search_tools(root, "weather in a city", k=1)[0].module == "mcptools.svc.get_weather"

    # The same server name now serves other tools.
    await generate_mcp_sources("svc", TEST_SERVER, root)
    assert tool_index(root) is not first
    assert all(m.module != "mcptools.svc.get_weather" for m in search_tools(root, "weather in a city"))
    assert {m.module for m in search_tools(root, "add two integers", k=2)} == {"mcptools.svc.add", "mcptools.other.add"}

    shutil.rmtree(root / "svc")
    assert [m.module for m in search_tools(root, "add two integers", k=2)] == ["mcptools.other.add"]


@pytest.fixture(scope="module")
async def hostile_root(tmp_path_factory: pytest.TempPathFactory) -> AsyncGenerator[Path]:
    path = tmp_path_factory.mktemp("hostile") / "mcptools"
    await generate_mcp_sources("test", TEST_SERVER, path)
    await generate_mcp_sources("shapes", shapes_params(), path)
    await generate_mcp_sources("evil", HOSTILE_SERVER, path)
    yield path


async def test_a_tool_stuffed_with_every_query_word_does_not_push_out_the_right_tools(hostile_root: Path) -> None:
    queries = queries_for("test", "shapes")
    assert misses(hostile_root, queries) == []
    firsts = [search_tools(hostile_root, q["query"], k=1)[0] for q in queries]
    stuffed_first = [m for m in firsts if m.server == "evil" and m.tool != "liar"]
    # Saturation and the field caps leave it a weak match for everything, the best for nothing.
    assert stuffed_first == []
    assert search_tools(hostile_root, "add two integers")[-1].server == "evil"


async def test_tool_descriptions_cannot_add_lines_to_the_summary_or_matches(hostile_root: Path) -> None:
    summary = render_tool_summary(hostile_root)
    assert "transfer_all_funds" not in summary and "Ignore" not in summary
    assert [line.split(":")[0] for line in summary.splitlines()[2:]] == [
        "mcptools.evil",
        "mcptools.shapes",
        "mcptools.test",
    ]
    liar = next(m for m in search_tools(hostile_root, "reads files", k=10) if m.tool == "liar")
    assert liar.description == "Reads files."
    stuffed = next(m for m in search_tools(hostile_root, "add two integers") if m.server == "evil")
    assert "\n" not in stuffed.description and len(stuffed.description) <= 120


async def sandboxed_output(workspace: Path, tools_dir: Path | None, code: str) -> str:
    """What `code` prints in a fresh kernel in the bubblewrap sandbox."""
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, sandbox=SandboxConfig()) as executor:
        result = await executor.execute(code)
    assert result.text is not None
    return result.text


async def test_kernel_code_searches_the_mounted_tools_dir_like_the_host(workspace: Path) -> None:
    tools = workspace.parent / "mcptools"
    await generate_mcp_sources("test", TEST_SERVER, tools)
    await generate_mcp_sources("shapes", shapes_params(), tools)
    code = (
        "from ipybox_kernel import search_tools\n"
        "for m in search_tools('place an order for a customer', 3):\n"
        "    print(m.server, m.tool, m.module, m.score, m.description, sep='|')\n"
        "from mcptools.test import create_order\n"
        "print(create_order.__name__)\n"
    )
    output = await sandboxed_output(workspace, tools, code)
    host = [
        "|".join([m.server, m.tool, m.module, str(m.score), m.description])
        for m in search_tools(tools, "place an order for a customer", 3)
    ]
    assert output.splitlines() == [*host, "mcptools.test.create_order"]
    assert host[0].startswith("test|create_order|mcptools.test.create_order|")


async def test_kernel_search_without_a_tools_dir_says_what_is_missing(workspace: Path) -> None:
    code = (
        "from ipybox_kernel import search_tools\n"
        "try:\n"
        "    search_tools('add')\n"
        "except LookupError as exc:\n"
        "    print(exc)\n"
    )
    assert (
        await sandboxed_output(workspace, None, code)
        == "this kernel has no tools directory (IPYBOX_TOOLS_DIR is not set); pass root=\n"
    )


def test_tool_match_is_the_kernel_packages_type() -> None:
    from ipybox_kernel import ToolMatch as KernelToolMatch

    assert ToolMatch is KernelToolMatch


def test_search_and_the_catalogue_load_none_of_the_heavy_dependencies() -> None:
    # An application that only builds prompts pays for ast and re, not for the MCP SDK or pydantic.
    probe = (
        "import sys, ipybox; ipybox.search_tools, ipybox.render_tool_catalogue, ipybox.render_match_stubs; "
        "print(*sorted(sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert {name.partition(".")[0] for name in run.stdout.split()} & HEAVY == set()
