"""Search over generated tool packages: which tools fit a task described in plain words.

Standard library only: kernel code calls `search_tools` on the read-only tools mount, and the host
(`ipybox.search_tools`) uses this same index, so both rank alike.

Ranking is BM25F (Robertson and Zaragoza's BM25 over weighted fields). A tool's text is split into
fields: its name (module and MCP tool name, snake and camel case split), its description (the
docstring of ``run``), its parameters (names, server-side aliases and descriptions) and its
server's name. Words are lower-cased, function words dropped and plural/verb endings stripped, so
that "deleting files" meets ``delete_file``. Each term's field frequencies are length-normalized,
weighted and summed, then saturated: a term adds less than its inverse document frequency however
often a tool repeats it. With each field cut to a fixed number of words, a tool cannot buy rank by
repetition or by listing every word of the catalogue (a long field dilutes every term in it).

A package's terms come from the index file `generate_mcp_sources` writes next to its modules when
that file is current, else from parsing the modules (`ipybox_kernel._records`). The index is cached
per tools directory and rebuilt when a server package is generated again,
added or removed: `generate_mcp_sources` replaces a package's directory, which changes the root's
and that directory's inode and mtime, so one ``stat`` per server is the whole check.
"""

from __future__ import annotations

import heapq
import math
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from ._catalog import server_packages
from ._protocol import TOOLS_DIR_ENV
from ._records import read_package
from ._terms import SERVER_TERMS, terms

__all__ = ("ToolIndex", "ToolMatch", "search_tools", "tool_index")

# Field weights and length normalization (b): a word in the name says most about what a tool does;
# parameters say what it needs, which queries mention less often. Names are short by nature, so
# their length says little (low b).
_FIELDS: dict[str, tuple[float, float]] = {
    "name": (3.0, 0.3),
    "description": (1.0, 0.75),
    "params": (0.6, 0.75),
    "server": (0.5, 0.0),
}
# BM25's term-frequency saturation: the usual value.
_K1 = 1.2

# Indexes kept per process (one per tools directory searched).
_CACHED_INDEXES = 8
# Queries longer than this are cut: a query is a task description, not a document.
_QUERY_TERMS = 64


@dataclass(frozen=True)
class ToolMatch:
    """A tool that matches a search, best first in the list `search_tools` returns.

    Attributes:
        server: The MCP server's name, as given to `generate_mcp_sources`.
        tool: The MCP tool's name.
        module: The module to import, e.g. ``mcptools.github.search_issues``.
        description: The first line of the tool's description, on one line.
        score: The BM25F score; only its order among one search's matches means anything.
    """

    server: str
    tool: str
    module: str
    description: str
    score: float


@dataclass(frozen=True)
class _Entry:
    server: str
    tool: str
    module: str
    description: str


class ToolIndex:
    """The BM25F index of one tools directory's generated packages."""

    def __init__(self, root: Path, *, name: str | None = None) -> None:
        """Read and index every generated package under `root`.

        Args:
            root: The tools directory.
            name: The package name the tools are imported under; `root`'s own name by default.

        Raises:
            SyntaxError: A generated module is not valid Python.
        """
        self.root = root
        self.package = name or root.name
        self.entries: list[_Entry] = []
        self.servers: list[tuple[str, str, list[str]]] = []
        field_terms: list[dict[str, list[str]]] = []
        for directory in server_packages(root):
            server = read_package(directory)
            if server is None:
                continue
            self.servers.append((server.name, directory.name, [t.module for t in server.tools]))
            server_field = terms(f"{server.name} {directory.name}", SERVER_TERMS)
            for tool in server.tools:
                module = f"{self.package}.{directory.name}.{tool.module}"
                self.entries.append(_Entry(server.name, tool.tool, module, tool.description))
                field_terms.append({**tool.fields, "server": server_field})
        self._postings = self._weigh(field_terms)

    def _weigh(self, field_terms: list[dict[str, list[str]]]) -> dict[str, list[tuple[int, float]]]:
        count = len(field_terms)
        average = {
            field: max(1.0, sum(len(doc[field]) for doc in field_terms) / count) if count else 1.0 for field in _FIELDS
        }
        pseudo: list[dict[str, float]] = []
        frequency: Counter[str] = Counter()
        for doc in field_terms:
            weighted: dict[str, float] = {}
            for field, (weight, b) in _FIELDS.items():
                words = doc[field]
                norm = 1.0 - b + b * len(words) / average[field]
                for term, tf in Counter(words).items():
                    weighted[term] = weighted.get(term, 0.0) + weight * tf / norm
            pseudo.append(weighted)
            frequency.update(weighted.keys())
        postings: dict[str, list[tuple[int, float]]] = {}
        for number, weighted in enumerate(pseudo):
            for term, tf in weighted.items():
                df = frequency[term]
                idf = math.log(1.0 + (count - df + 0.5) / (df + 0.5))
                postings.setdefault(term, []).append((number, idf * tf / (_K1 + tf)))
        return postings

    def search(self, query: str, k: int = 5, *, servers: Collection[str] | None = None) -> list[ToolMatch]:
        """The `k` tools that best match `query`, best first; tools matching no word are left out.

        With `servers` (server or package names), only those servers' tools are ranked.

        Raises:
            ValueError: `query` has no words to search for, or `k` is below 1.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        words = terms(query, _QUERY_TERMS)
        if not words:
            raise ValueError(f"the query {query[:80]!r} has no words to search for; describe what the tool should do")
        scores: dict[int, float] = {}
        for term in dict.fromkeys(words):
            for number, weight in self._postings.get(term, ()):
                scores[number] = scores.get(number, 0.0) + weight
        if servers is not None:
            scores = {n: score for n, score in scores.items() if self._in(self.entries[n], servers)}
        # Ties go to the catalogue's order (server, then module), so results are stable.
        best = heapq.nsmallest(k, scores.items(), key=lambda item: (-item[1], item[0]))
        return [ToolMatch(**vars(self.entries[number]), score=round(score, 4)) for number, score in best]

    @staticmethod
    def _in(entry: _Entry, servers: Collection[str]) -> bool:
        return entry.server in servers or entry.module.rsplit(".", 2)[-2] in servers


def _signature(root: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a package under `root` is generated again, added or removed."""
    found: list[tuple[str, int, int]] = []
    with os.scandir(root) as entries:
        for entry in entries:
            # The packages server_packages() reads, and so followed like there.
            if entry.name.isidentifier() and entry.is_dir():
                info = entry.stat()
                found.append((entry.name, info.st_ino, info.st_mtime_ns))
    info = root.stat()
    return (("", info.st_ino, info.st_mtime_ns), *sorted(found))


_cache: OrderedDict[Path, tuple[tuple[tuple[str, int, int], ...], ToolIndex]] = OrderedDict()
_cache_lock = threading.Lock()


def tool_index(root: Path | str) -> ToolIndex:
    """The index of the tools directory `root`, read again only when a package in it changed.

    Raises:
        NotADirectoryError: `root` is not a directory.
        SyntaxError: A generated module is not valid Python.
    """
    path = Path(os.path.realpath(root))
    if not path.is_dir():
        raise NotADirectoryError(
            f"{str(root)!r} is not a tools directory; pass the directory the tools were generated to"
        )
    signature = _signature(path)
    with _cache_lock:
        cached = _cache.get(path)
        if cached is not None and cached[0] == signature:
            _cache.move_to_end(path)
            return cached[1]
    # Built outside the lock: a slow build for one directory does not hold up searches in another.
    index = ToolIndex(path, name=Path(root).name)
    with _cache_lock:
        _cache[path] = (signature, index)
        _cache.move_to_end(path)
        while len(_cache) > _CACHED_INDEXES:
            _cache.popitem(last=False)
    return index


def search_tools(query: str, k: int = 5, *, root: Path | str | None = None) -> list[ToolMatch]:
    """Find the generated tools that best match a task described in plain words.

    ::

        for match in search_tools("open issues with a label", k=3):
            print(match.module, "-", match.description)
        from mcptools.github import search_issues   # then help(search_issues.run), search_issues.Params

    Args:
        query: What the tool should do, in words ("send an email with an attachment").
        k: How many matches at most.
        root: The tools directory; in an ipybox kernel, the one the host mounted (default).

    Raises:
        ValueError: `query` has no words to search for, or `k` is below 1.
        LookupError: No root was given and this kernel has no tools directory.
    """
    if root is None:
        given = os.environ.get(TOOLS_DIR_ENV)
        if not given:
            raise LookupError(f"this kernel has no tools directory ({TOOLS_DIR_ENV} is not set); pass root=")
        root = given
    return tool_index(root).search(query, k)
