"""Tool search and compact catalogues, for prompts that cannot hold every tool's stubs.

With tens of servers the stubs of all tools (`render_tool_stubs`) outgrow a system prompt. Then a
prompt gets the catalogue summary instead (servers and tool names), and the model finds the tools
it needs by search: in kernel code with ``ipybox_kernel.search_tools``, or through a host tool
that calls `search_tools` and `render_match_stubs`. The ranking is ``ipybox_kernel``'s, so host
and kernel find the same tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ipybox._exceptions import UsageError
from ipybox_kernel._search import ToolIndex, ToolMatch, tool_index

from ._stubs import render_tool_stubs

__all__ = (
    "CatalogueMode",
    "ToolMatch",
    "catalogue_mode",
    "render_match_stubs",
    "render_tool_catalogue",
    "render_tool_summary",
    "search_tools",
)

# Characters of stubs a prompt still gets in full: ~7.7k tokens at the 4.2 characters per token
# bench/toolsearch.py measures for stubs (o200k_base), about 95 tools of typical size. That is a
# large system prompt already and ~4% of a 200k-token context; past it the stubs crowd out the
# task, while the summary stays small (5% of the stubs' size for the benchmark's 372 tools).
STUBS_PROMPT_LIMIT = 32_000

CatalogueMode = Literal["stubs", "summary"]


def _index(root_dir: Path | str) -> ToolIndex:
    try:
        return tool_index(root_dir)
    except NotADirectoryError:
        raise UsageError(
            f"{str(root_dir)!r} is not a directory; pass the root_dir given to generate_mcp_sources"
        ) from None
    except SyntaxError as exc:
        raise UsageError(f"{exc.filename!r} is not valid Python ({exc.msg}); generate its server again") from None


def search_tools(
    root_dir: Path | str, query: str, k: int = 5, *, servers: Sequence[str] | None = None
) -> list[ToolMatch]:
    """Find the generated tools that best match a task described in plain words.

    Ranks by BM25F over tool names (snake and camel case split), descriptions and parameter
    names and descriptions. The index is built on first use and kept per tools directory until a
    server in it is generated again, added or removed. Reads files: call it from a worker thread
    in async code (``anyio.to_thread.run_sync``).

    Args:
        root_dir: The tools directory `generate_mcp_sources` wrote to.
        query: What the tool should do ("list open issues with a label").
        k: How many matches at most.
        servers: Only these servers' tools (server names or package names); all when None.

    Returns:
        The best matches first; tools that share no word with the query are left out.

    Raises:
        UsageError: `root_dir` is not a directory or holds a module that does not parse, the query
            has no words, or `k` is below 1.
    """
    index = _index(root_dir)
    try:
        return index.search(query, k, servers=None if servers is None else frozenset(servers))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def render_match_stubs(root_dir: Path | str, matches: Sequence[ToolMatch]) -> str:
    """The stubs (as `render_tool_stubs` renders them) of the tools `search_tools` found.

    Servers appear in the order of their best match, each with its matched tools.

    Raises:
        UsageError: A match names a server or tool that is no longer generated under `root_dir`.
    """
    by_server: dict[str, list[str]] = {}
    for match in matches:
        by_server.setdefault(match.server, []).append(match.tool)
    return "\n".join(render_tool_stubs(root_dir, servers=[s], tools=tools) for s, tools in by_server.items())


def render_tool_summary(root_dir: Path | str, *, servers: Sequence[str] | None = None) -> str:
    """A compact catalogue for prompts: per server its import path and tool module names.

    Two header lines say how to import a tool and how kernel code finds tools by search; then
    one line per server. Only identifiers (package and module names) are listed, never text a
    server wrote, so a tool cannot add lines or instructions to it.

    Args:
        root_dir: The tools directory `generate_mcp_sources` wrote to.
        servers: Only these servers (server names or package names); all when None.

    Raises:
        UsageError: `root_dir` is not a directory or holds a module that does not parse.
    """
    if isinstance(servers, str):
        raise UsageError(f"servers takes a list of names, got the string {servers!r}; pass [{servers!r}]")
    index = _index(root_dir)
    package = index.package
    wanted = None if servers is None else set(servers)
    listed = [
        (p, modules)
        for name, p, modules in index.servers
        if modules and (wanted is None or name in wanted or p in wanted)
    ]
    total = sum(len(modules) for _, modules in listed)
    lines = [
        f"# MCP tools: {len(listed)} servers, {total} tools, one module per tool: "
        f"`from {package}.<server> import <tool>`, then `<tool>.run(<tool>.Params(...))`.",
        '# Find tools by what they do: `from ipybox_kernel import search_tools; search_tools("<task>", k=5)` '
        "lists the best matches (module, one-line description); `help(<tool>)` shows a module's Params and run().",
    ]
    lines.extend(f"{package}.{p}: {', '.join(modules)}" for p, modules in listed)
    return "\n".join(lines) + "\n"


def catalogue_mode(stubs: str, *, limit: int = STUBS_PROMPT_LIMIT) -> CatalogueMode:
    """``"stubs"`` when all of `stubs` fit in `limit` characters, else ``"summary"``."""
    return "stubs" if len(stubs) <= limit else "summary"


def render_tool_catalogue(
    root_dir: Path | str,
    *,
    mode: CatalogueMode | Literal["auto"] = "auto",
    limit: int = STUBS_PROMPT_LIMIT,
    servers: Sequence[str] | None = None,
) -> tuple[CatalogueMode, str]:
    """The tools for a prompt: all stubs while they are small, else the summary.

    Args:
        root_dir: The tools directory `generate_mcp_sources` wrote to.
        mode: ``"auto"`` picks by size (`catalogue_mode`); ``"stubs"`` or ``"summary"`` forces one.
        limit: The size in characters up to which ``"auto"`` gives the stubs.
        servers: Only these servers (server names or package names); all when None.

    Returns:
        The mode used, and the text. In ``"summary"`` mode, tell the model how to get stubs (a
        search tool that returns `render_match_stubs`) or let it search in kernel code.

    Raises:
        UsageError: `root_dir` is not a directory or holds a module that does not parse.
    """
    if mode == "summary":
        return "summary", render_tool_summary(root_dir, servers=servers)
    stubs = render_tool_stubs(root_dir, servers=servers)
    chosen = catalogue_mode(stubs, limit=limit) if mode == "auto" else mode
    return (chosen, stubs) if chosen == "stubs" else (chosen, render_tool_summary(root_dir, servers=servers))
