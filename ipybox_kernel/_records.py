"""What the search index needs of one server package, read from its index file or its modules.

Standard library only (the kernel's search uses it). `generate_mcp_sources` writes
``<package>/.search-index.json`` next to the modules it generates: per tool its module, MCP name,
one-line description and index terms, plus every module's size. Reading that file instead of
parsing each module with `ast` is what makes the first search of a large catalogue fast.

The file is input like any other in the tools directory: kernel code run without a sandbox could
have written it. It is read with a size limit and its shape checked field by field; it is used only
when it lists exactly the modules on disk, with their sizes, none of them changed after it was
written, and was made by this version of the term extraction. Anything else (a missing, stale,
foreign or malformed file) falls back to parsing the modules. Whoever could plant a current file
could as well have rewritten the modules it describes, so it grants nothing more; its descriptions
are flattened to one safe line like those read from the modules.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ._catalog import load_server, param_fields, run_def, server_name, tool_name
from ._terms import (
    DESCRIPTION_LIMIT,
    DESCRIPTION_TERMS,
    FIRST_LINE_CHARS,
    NAME_TERMS,
    PARAM_TERMS,
    TERMS_VERSION,
    tool_fields,
)
from ._text import first_line

__all__ = ("INDEX_FILE", "ServerRecords", "ToolRecord", "index_file_text", "read_package")

INDEX_FILE = ".search-index.json"
# The largest index file read. A real one takes ~3 KB per tool (at most 1,000 tools a server);
# the limit bounds what a planted file can make the host parse.
_MAX_BYTES = 8 * 1024 * 1024
# Characters of one stored string: the longest term a real description yields is far shorter.
_MAX_STRING = 1024
_FIELD_CAPS = {"name": NAME_TERMS, "description": DESCRIPTION_TERMS, "params": PARAM_TERMS}


@dataclass(frozen=True)
class ToolRecord:
    """One tool as the index needs it."""

    module: str
    tool: str
    description: str
    """The first line of its description, at most `DESCRIPTION_LIMIT` characters."""
    fields: Mapping[str, list[str]]
    """Index terms of its name, description and parameters."""


@dataclass(frozen=True)
class ServerRecords:
    """One generated package: its MCP server's name and its tools."""

    name: str
    tools: tuple[ToolRecord, ...]


def _record(module: str, tool: str, tree: ast.Module) -> ToolRecord:
    run = run_def(tree)
    doc = (ast.get_docstring(run, clean=True) if run is not None else None) or ""
    description = first_line(doc[:FIRST_LINE_CHARS], limit=DESCRIPTION_LIMIT)
    return ToolRecord(module, tool, description, tool_fields(module, tool, doc, param_fields(tree)))


def index_file_text(files: Mapping[str, str]) -> str:
    """The index file of a package whose files (name → source) are `files`; deterministic, so an
    unchanged server's package stays byte for byte the same."""
    modules = {name: len(text.encode("utf-8")) for name, text in sorted(files.items()) if _is_module(name)}
    tools: list[dict[str, Any]] = []
    for name in modules:
        tree = ast.parse(files[name], filename=name)
        run = run_def(tree)
        called = None if run is None else tool_name(run)
        if called is not None:
            record = _record(name.removesuffix(".py"), called, tree)
            tools.append({**vars(record), "fields": dict(record.fields)})
    data = {"version": TERMS_VERSION, "modules": modules, "tools": tools}
    return json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"


def _is_module(name: str) -> bool:
    return name.endswith(".py") and name != "__init__.py"


def read_package(directory: Path) -> ServerRecords | None:
    """The package in `directory` from its index file when that is current, else from its modules;
    None when `directory` holds no generated package.

    Raises:
        SyntaxError: A module had to be parsed and is not valid Python.
    """
    init = directory / "__init__.py"
    if not init.is_file():
        return None
    name = server_name(init)
    if name is None:
        return None
    tools = _from_index_file(directory)
    if tools is None:
        server = load_server(directory)
        if server is None:
            return None
        tools = tuple(_record(t.module, t.name, t.tree) for t in server.tools)
    return ServerRecords(name, tools)


def _from_index_file(directory: Path) -> tuple[ToolRecord, ...] | None:
    try:
        fd = os.open(directory / INDEX_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as file:
            written = os.fstat(file.fileno()).st_mtime_ns
            data = file.read(_MAX_BYTES + 1)
        if len(data) > _MAX_BYTES:
            return None
        parsed: object = json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None
    modules = _modules_on_disk(directory, written)
    if modules is None:
        return None
    return _validated(parsed, modules)


def _modules_on_disk(directory: Path, written: int) -> dict[str, int] | None:
    """Module name → size, or None when one changed after the index file was written."""
    found: dict[str, int] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if _is_module(entry.name):
                    info = entry.stat()
                    if info.st_mtime_ns > written:
                        return None
                    found[entry.name] = info.st_size
    except OSError:
        return None
    return found


def _validated(data: object, modules: Mapping[str, int]) -> tuple[ToolRecord, ...] | None:
    """The tools of a parsed index file that matches `modules`; None for any other shape."""
    if not isinstance(data, dict):
        return None
    top = cast("dict[str, object]", data)
    if top.get("version") != TERMS_VERSION or top.get("modules") != modules:
        return None
    items = top.get("tools")
    if not isinstance(items, list):
        return None
    tools: list[ToolRecord] = []
    for item in cast("list[object]", items):
        record = _tool(item)
        if record is None or f"{record.module}.py" not in modules:
            return None
        tools.append(record)
    return tuple(tools)


def _tool(item: object) -> ToolRecord | None:
    if not isinstance(item, dict):
        return None
    entry = cast("dict[str, object]", item)
    module, tool, description, fields = (entry.get(k) for k in ("module", "tool", "description", "fields"))
    if not (
        set(entry) == {"module", "tool", "description", "fields"}
        and isinstance(module, str)
        and module.isidentifier()
        and _short(tool)
        and _short(description)
        and isinstance(fields, dict)
    ):
        return None
    terms = cast("dict[str, object]", fields)
    if set(terms) != set(_FIELD_CAPS):
        return None
    checked: dict[str, list[str]] = {}
    for field, cap in _FIELD_CAPS.items():
        words = terms[field]
        if not isinstance(words, list) or len(cast("list[object]", words)) > cap:
            return None
        if not all(_short(word) for word in cast("list[object]", words)):
            return None
        checked[field] = cast("list[str]", words)
    return ToolRecord(module, cast("str", tool), first_line(cast("str", description), limit=DESCRIPTION_LIMIT), checked)


def _short(value: object) -> bool:
    return isinstance(value, str) and len(value) <= _MAX_STRING
