"""Tool search: prompt size of all stubs vs the summary, search quality and latency.

    uv run --frozen python bench/toolsearch.py     # prints the numbers as JSON; ~2 minutes on 2 cores

The catalogue is generated in a temporary directory from five real MCP servers: the test suite's
`test` and `shapes` servers and the npm servers everything, filesystem and memory (62 tools). Each
is generated `--copies` times under distinct server names (``filesystem``, ``filesystem_2``, ...)
to reach a catalogue of over 300 tools, as a deployment with many similar servers would have. For
the latency at 1,000 tools the generated packages are copied again under further directory names
(generating them adds nothing to what is measured, only minutes). The index is built twice: from the
index files `generate_mcp_sources` writes (copied along), and from a copy without them (parsing
every module, as before those files existed).

Quality: tests/data/toolsearch_queries.json holds natural-language queries, each with the tools
that answer it. A query hits when one of those tools, from any copy of its server, is among the
top 5. Tokens are counted with bpe-openai, whose o200k_base and cl100k_base vocabularies ship
inside its wheel (tiktoken downloads its vocabularies at first use, which this machine cannot).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import bpe_openai

from ipybox import generate_mcp_sources, render_match_stubs, render_tool_stubs, render_tool_summary
from ipybox_kernel._records import INDEX_FILE
from ipybox_kernel._search import ToolIndex, search_tools, tool_index

REPO = Path(__file__).resolve().parents[1]
QUERIES = REPO / "tests" / "data" / "toolsearch_queries.json"
BIN = REPO / "node_modules" / ".bin"
K = 5


def server_params(scratch: Path) -> dict[str, dict[str, Any]]:
    """The five real servers, as generate_mcp_sources takes them."""
    servers = REPO / "tests" / "servers"
    return {
        "test": {"command": sys.executable, "args": [str(servers / "test_server.py")]},
        "shapes": {"command": sys.executable, "args": [str(servers / "codegen_shapes.py")]},
        "everything": {"command": str(BIN / "mcp-server-everything")},
        "filesystem": {"command": str(BIN / "mcp-server-filesystem"), "args": [str(scratch)]},
        "memory": {"command": str(BIN / "mcp-server-memory"), "env": {"MEMORY_FILE_PATH": str(scratch / "m.jsonl")}},
    }


async def build_catalogue(root: Path, scratch: Path, copies: int) -> None:
    for copy in range(1, copies + 1):
        for name, params in server_params(scratch).items():
            await generate_mcp_sources(name if copy == 1 else f"{name}_{copy}", params, root)


def original(server: str) -> str:
    return re.sub(r"_\d+$", "", server)


def quality(root: Path, queries: list[dict[str, Any]]) -> dict[str, Any]:
    hits = first = 0
    reciprocal: list[float] = []
    misses: list[dict[str, Any]] = []
    for item in queries:
        found = [
            f"{original(m.server)}.{m.module.rsplit('.', 1)[1]}" for m in search_tools(item["query"], K, root=root)
        ]
        ranks = [i for i, name in enumerate(found) if name in item["expected"]]
        hits += bool(ranks)
        first += bool(ranks) and ranks[0] == 0
        reciprocal.append(1 / (ranks[0] + 1) if ranks else 0.0)
        if not ranks:
            misses.append({"query": item["query"], "expected": item["expected"], "top5": found})
    return {
        "queries": len(queries),
        "recall_at_5": round(hits / len(queries), 3),
        "recall_at_1": round(first / len(queries), 3),
        "mrr_at_5": round(statistics.fmean(reciprocal), 3),
        "misses": misses,
    }


def tokens(text: str) -> dict[str, int]:
    return {name: len(bpe_openai.get_encoding(name).encode(text)) for name in ("o200k_base", "cl100k_base")}


def prompt_sizes(root: Path, queries: list[dict[str, Any]]) -> dict[str, Any]:
    stubs = render_tool_stubs(root)
    summary = render_tool_summary(root)
    # What search mode adds per query: the stubs of the top 5 matches.
    found = [render_match_stubs(root, search_tools(q["query"], K, root=root)) for q in queries]
    median_found = sorted(found, key=len)[len(found) // 2]
    return {
        "all_stubs": {"chars": len(stubs), **tokens(stubs)},
        "summary": {"chars": len(summary), **tokens(summary)},
        "top5_stubs_median": {"chars": len(median_found), **tokens(median_found)},
        "stubs_chars_per_o200k_token": round(len(stubs) / tokens(stubs)["o200k_base"], 2),
    }


def grow(root: Path, target: int) -> int:
    """Copy generated packages under new directory names until `root` holds at least `target` tools."""
    packages = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isidentifier())
    count = len(tool_index(root).entries)
    copy = 0
    while count < target:
        copy += 1
        for package in packages:
            shutil.copytree(package, root / f"{package.name}_x{copy}")
        count = len(tool_index(root).entries)
    return count


def build_without_index_files(root: Path) -> float:
    """Seconds to build the index by parsing every module, as before packages had index files."""
    plain = root.parent / "parsed" / root.name
    shutil.copytree(root, plain)
    for index_file in plain.glob(f"*/{INDEX_FILE}"):
        index_file.unlink()
    started = time.perf_counter()
    ToolIndex(plain)
    return time.perf_counter() - started


def latency(root: Path, queries: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    started = time.perf_counter()
    tools = len(ToolIndex(root).entries)
    build = time.perf_counter() - started
    parsing = build_without_index_files(root)
    tool_index(root)  # cached from here on, as for any search after the first
    samples: list[float] = []
    for _ in range(rounds):
        for item in queries:
            started = time.perf_counter()
            search_tools(item["query"], K, root=root)
            samples.append(time.perf_counter() - started)
    samples.sort()
    return {
        "tools": tools,
        "index_build_ms": round(build * 1000, 1),
        "index_build_parsing_ms": round(parsing * 1000, 1),
        "searches": len(samples),
        "median_ms": round(statistics.median(samples) * 1000, 3),
        "p95_ms": round(samples[int(len(samples) * 0.95)] * 1000, 3),
        "max_ms": round(samples[-1] * 1000, 3),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description="Tool search: prompt size, quality and latency.")
    parser.add_argument("--copies", type=int, default=6, help="times each server is generated (6: 372 tools)")
    parser.add_argument("--latency-tools", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20, help="passes over the queries for the latency")
    options = parser.parse_args()
    queries: list[dict[str, Any]] = json.loads(QUERIES.read_text(encoding="utf-8"))["queries"]
    with tempfile.TemporaryDirectory(prefix="ipybox-toolsearch-") as temp:
        scratch = Path(temp)
        single = scratch / "single" / "mcptools"
        root = scratch / "catalogue" / "mcptools"
        await build_catalogue(single, scratch, 1)
        await build_catalogue(root, scratch, options.copies)
        report: dict[str, Any] = {
            "catalogue_tools": len(tool_index(root).entries),
            "distinct_tools": len(tool_index(single).entries),
            "prompt": prompt_sizes(root, queries),
            "quality": quality(root, queries),
            "quality_distinct": quality(single, queries),
        }
        grow(root, options.latency_tools)
        report["latency"] = latency(root, queries, options.rounds)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    anyio.run(main)
