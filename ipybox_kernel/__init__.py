"""What code in an ipybox kernel uses to call MCP tools on the host.

Every call goes over one unix socket to the host's tool server, which asks the application to
approve it and then calls the MCP server. Importing this package loads the standard library only.

    from ipybox_kernel import call_tool

    output = call_tool("github", "search_issues", {"query": "is:open label:bug"})
    output.structured, output.text, output.content

and to find the generated tool modules that fit a task (read from the tools directory, no call)::

    from ipybox_kernel import search_tools

    for match in search_tools("list open issues with a label", k=3):
        print(match.module, match.description)

and to keep code that worked as a skill, importable later as ``skills.<name>`` (the host asks for
approval first, like for any tool call)::

    from ipybox_kernel import list_skills, save_skill

    save_skill("city_weather", source, "Current weather of a city, one line")
    [skill.name for skill in list_skills()]

Exceptions, all raised in the kernel::

    ToolCallError                 the call did not return a result (server_name, tool_name, message)
    ├── ToolCallRejected          the application rejected it (reason)
    ├── ToolServerUnavailable     the host's tool server cannot be reached from this kernel
    ├── ToolNotFound              unknown server or tool (also a LookupError)
    ├── ToolExecutionError        the tool reported an error, or the server refused the call
    ├── ToolCallTimeout           the MCP call ran past the timeout (also a TimeoutError)
    ├── MCPServerStartError       the MCP server could not be started (output: its stderr tail)
    └── MCPServerCrashed          the MCP server died during the call (output: its stderr tail)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._client import acall_tool, call_tool
from ._errors import (
    MCPServerCrashed,
    MCPServerStartError,
    ToolCallError,
    ToolCallRejected,
    ToolCallTimeout,
    ToolExecutionError,
    ToolNotFound,
    ToolOutput,
    ToolServerUnavailable,
)

if TYPE_CHECKING:
    from ._search import ToolMatch as ToolMatch
    from ._search import search_tools as search_tools
    from ._skills import SkillInfo as SkillInfo
    from ._skills import list_skills as list_skills
    from ._skills import save_skill as save_skill

__all__ = (
    "MCPServerCrashed",
    "MCPServerStartError",
    "SkillInfo",
    "ToolCallError",
    "ToolCallRejected",
    "ToolCallTimeout",
    "ToolExecutionError",
    "ToolMatch",
    "ToolNotFound",
    "ToolOutput",
    "ToolServerUnavailable",
    "acall_tool",
    "call_tool",
    "list_skills",
    "save_skill",
    "search_tools",
)


# Loaded on first use, not with every kernel: the search (ast, pathlib, its regexes) costs ~15 ms.
_LAZY = {
    "ToolMatch": "._search",
    "search_tools": "._search",
    "SkillInfo": "._skills",
    "list_skills": "._skills",
    "save_skill": "._skills",
}

# Hidden from type checkers, which would otherwise take any attribute of the package for Any.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            from importlib import import_module

            value = getattr(import_module(_LAZY[name], __name__), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
