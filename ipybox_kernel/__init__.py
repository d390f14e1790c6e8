"""What code in an ipybox kernel uses to call MCP tools on the host.

Every call goes over one unix socket to the host's tool server, which asks the application to
approve it and then calls the MCP server. Importing this package loads the standard library only.

    from ipybox_kernel import call_tool

    output = call_tool("github", "search_issues", {"query": "is:open label:bug"})
    output.structured, output.text, output.content

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

from ._client import (
    MCPServerCrashed,
    MCPServerStartError,
    ToolCallError,
    ToolCallRejected,
    ToolCallTimeout,
    ToolExecutionError,
    ToolNotFound,
    ToolOutput,
    ToolServerUnavailable,
    acall_tool,
    call_tool,
)

__all__ = (
    "MCPServerCrashed",
    "MCPServerStartError",
    "ToolCallError",
    "ToolCallRejected",
    "ToolCallTimeout",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolOutput",
    "ToolServerUnavailable",
    "acall_tool",
    "call_tool",
)
