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

Generated tool modules return a `ToolText` (a str with every content item: images, audio,
resources) for tools without an output schema, and build their arguments with `tool_arguments`.

and to keep code that worked as a skill, importable later as ``skills.<name>`` (the host asks for
approval first, like for any tool call)::

    from ipybox_kernel import list_skills, save_skill

    save_skill("city_weather", source, "Current weather of a city, one line")
    [skill.name for skill in list_skills()]

Exceptions, all raised in the kernel::

    ToolCallError                 the call did not return a result (server_name, tool_name, message)
    ├── ToolCallRejected          the application rejected it (reason)
    ├── ToolCallBudgetExceeded    the code action used up a budget of the host's Limits
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
    ToolCallBudgetExceeded,
    ToolCallError,
    ToolCallRejected,
    ToolCallTimeout,
    ToolExecutionError,
    ToolNotFound,
    ToolOutput,
    ToolServerUnavailable,
)

if TYPE_CHECKING:
    from ._arguments import JsonEqual as JsonEqual
    from ._arguments import JsonInt as JsonInt
    from ._arguments import JsonObject as JsonObject
    from ._arguments import UndeclaredArgumentWarning as UndeclaredArgumentWarning
    from ._arguments import tool_arguments as tool_arguments
    from ._content import AudioContent as AudioContent
    from ._content import Content as Content
    from ._content import EmbeddedResource as EmbeddedResource
    from ._content import ImageContent as ImageContent
    from ._content import OtherContent as OtherContent
    from ._content import ResourceLink as ResourceLink
    from ._content import TextContent as TextContent
    from ._content import ToolText as ToolText
    from ._search import ToolMatch as ToolMatch
    from ._search import search_tools as search_tools
    from ._skills import SkillInfo as SkillInfo
    from ._skills import list_skills as list_skills
    from ._skills import save_skill as save_skill

__all__ = (
    "AudioContent",
    "Content",
    "EmbeddedResource",
    "ImageContent",
    "JsonEqual",
    "JsonInt",
    "JsonObject",
    "MCPServerCrashed",
    "MCPServerStartError",
    "OtherContent",
    "ResourceLink",
    "SkillInfo",
    "TextContent",
    "ToolCallBudgetExceeded",
    "ToolCallError",
    "ToolCallRejected",
    "ToolCallTimeout",
    "ToolExecutionError",
    "ToolMatch",
    "ToolNotFound",
    "ToolOutput",
    "ToolServerUnavailable",
    "ToolText",
    "UndeclaredArgumentWarning",
    "acall_tool",
    "call_tool",
    "list_skills",
    "save_skill",
    "search_tools",
    "tool_arguments",
)


# Loaded on first use, not with every kernel: the search (ast, pathlib, its regexes) costs ~15 ms.
_LAZY = {
    # Generated tool modules: their results and arguments (the latter imports pydantic).
    **dict.fromkeys(
        ("AudioContent", "Content", "EmbeddedResource", "ImageContent", "OtherContent", "ResourceLink"),
        "._content",
    ),
    "TextContent": "._content",
    "ToolText": "._content",
    "JsonEqual": "._arguments",
    "JsonInt": "._arguments",
    "JsonObject": "._arguments",
    "UndeclaredArgumentWarning": "._arguments",
    "tool_arguments": "._arguments",
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
