"""What a tool call from kernel code returns, and the exceptions it raises when it returns nothing.

Standard library only, like the rest of ``ipybox_kernel``. `ERROR_TYPES` says which exception each
error kind of the contract (``ipybox_kernel._protocol.ErrorKind``) raises; ``ipybox_kernel._client``
turns each reply into a `ToolOutput` or one of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._protocol import ErrorKind

__all__ = (
    "ERROR_TYPES",
    "MCPServerCrashed",
    "MCPServerStartError",
    "ToolCallBudgetExceeded",
    "ToolCallError",
    "ToolCallRejected",
    "ToolCallTimeout",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolOutput",
    "ToolServerUnavailable",
)


class ToolCallError(Exception):
    """A tool call did not return a result.

    Attributes:
        server_name: The MCP server the call was for.
        tool_name: The tool the call was for.
        message: What went wrong, naming the server and tool.
    """

    def __init__(self, server_name: str, tool_name: str, message: str) -> None:
        super().__init__(message)
        self.server_name = server_name
        self.tool_name = tool_name
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take extra keyword arguments, so rebuild from the instance dict.
        return (_rebuild_error, (type(self), self.message, dict(self.__dict__)))


def _rebuild_error(cls: type[ToolCallError], message: str, state: dict[str, Any]) -> ToolCallError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ToolCallRejected(ToolCallError):
    """The application did not approve the call; it was not made.

    Attributes:
        reason: The reason the application gave, if any.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, reason: str | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.reason = reason


class ToolCallBudgetExceeded(ToolCallError):
    """The code action has used up a budget the application set (tool calls per code action, or time
    waiting for approvals); the call was not made and nobody was asked. Later calls of the same code
    action fail the same way; the next code action starts afresh."""


class ToolServerUnavailable(ToolCallError):
    """The kernel cannot reach the host's tool server (not configured, stopped, or refused)."""


class ToolNotFound(ToolCallError, LookupError):
    """No MCP server of that name is registered, or the server has no tool of that name."""


class ToolExecutionError(ToolCallError):
    """The tool ran and reported an error (MCP ``isError``), or the server refused the call."""


class ToolCallTimeout(ToolCallError, TimeoutError):
    """The MCP call took longer than the executor's tool call timeout.

    Attributes:
        timeout: The timeout that was exceeded, in seconds.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, timeout: float | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.timeout = timeout


class MCPServerStartError(ToolCallError):
    """The MCP server could not be started or connected to.

    Attributes:
        output: The last lines the server wrote to stderr, if any.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, output: str | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.output = output


class MCPServerCrashed(ToolCallError):
    """The connection to the MCP server ended during the call; the next call starts it again.

    Attributes:
        output: The last lines the server wrote to stderr, if any.
    """

    def __init__(self, server_name: str, tool_name: str, message: str, *, output: str | None = None) -> None:
        super().__init__(server_name, tool_name, message)
        self.output = output


@dataclass(frozen=True)
class ToolOutput:
    """The result of a tool call.

    Attributes:
        structured: The MCP ``structuredContent``, when the tool returned any.
        text: The text content items, joined with newlines.
        content: Every MCP content item (text, image, audio, resource) as MCP wire JSON.
    """

    structured: dict[str, Any] | None
    text: str
    content: list[dict[str, Any]]


# The exception each error kind of a reply raises (tests/test_protocol.py pins that every kind is
# here); a kind missing from it (a newer host's) raises a plain ToolCallError.
ERROR_TYPES: dict[ErrorKind, type[ToolCallError]] = {
    "bad_request": ToolCallError,
    "too_large": ToolCallError,
    "unauthorized": ToolServerUnavailable,
    "unknown_server": ToolNotFound,
    "unknown_tool": ToolNotFound,
    "invalid_arguments": ToolCallError,
    "rejected": ToolCallRejected,
    "over_budget": ToolCallBudgetExceeded,
    "approval_failed": ToolCallError,
    "server_start": MCPServerStartError,
    "server_crashed": MCPServerCrashed,
    "timeout": ToolCallTimeout,
    "tool_error": ToolExecutionError,
    "internal": ToolCallError,
}
