"""The wire protocol between the kernel's tool-call stub and the host's ToolServer.

The stub (``ipybox_kernel``, stdlib only) talks to the ToolServer over one unix socket. Each message
is one line of UTF-8 JSON; a connection carries one request at a time and gets one reply to it, so
the stub keeps a few connections open and reuses them. Every request carries the executor's token.

A request names a server and a tool and carries arguments, nothing else: no command, URL or
environment. The host looks the server up by name in its own registry::

    {"token": "...", "seq": 7, "execution": "<msg_id>" | null,
     "server": "github", "tool": "search_issues", "arguments": {...}, "mark": 3}

``mark`` (optional) names the output mark the kernel put on IOPub behind what the cell printed
before the call (``ipybox_kernel._marks``); the host shows the call for approval after that output.

A reply is either a result or an error of one of the `ErrorKind` kinds::

    {"seq": 7, "ok": true, "structured": {...} | null, "text": "...", "content": [...]}
    {"seq": 7, "ok": false, "error": "rejected", "message": "...", "reason": "..."}

The kernel side mirrors these names in ``ipybox_kernel/_client.py``; keep the two in step.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = (
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_LINE_BYTES",
    "MAX_REPLY_BYTES",
    "ErrorKind",
    "ToolErrorReply",
    "ToolRequest",
    "ToolResultReply",
    "encode_reply",
)

# Large enough for big arguments and inline images, small enough that a flood of such lines stays bounded.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Far deeper than any tool's arguments; shallow enough that the host's recursive walks over a request
# (json, pydantic, the approval's read-only copy) stay far from Python's recursion limit.
MAX_JSON_DEPTH = 64
# Arrays, objects and list items a request may hold: each becomes a Python object of 30-60 bytes on
# the host, so this bounds what parsing one request can take (~64 MB) whatever its line length.
MAX_JSON_VALUES = 1_000_000
# Room for results of several MB (their text is sent twice: as text and as a content item), small
# enough that a server's runaway result fails as that call's error instead of filling the kernel.
MAX_REPLY_BYTES = 64 * 1024 * 1024

ErrorKind = Literal[
    # Not JSON, deeper than MAX_JSON_DEPTH, MAX_JSON_VALUES or more values, or not a valid request.
    "bad_request",
    # A request line over MAX_LINE_BYTES, or past the host's budget for unanswered requests (the
    # connection is then closed); or a reply over MAX_REPLY_BYTES (the connection keeps serving).
    "too_large",
    "unauthorized",  # missing or wrong token; the connection is closed
    "unknown_server",  # no server of that name is registered
    "unknown_tool",  # the server has no tool of that name
    "invalid_arguments",  # the arguments do not fit the tool's input schema (a key or a value); nobody was asked
    "rejected",  # the application did not approve the call
    "approval_failed",  # approving the call failed on the host; the call was not made
    "server_start",  # the MCP server could not be started or connected to
    "server_crashed",  # the connection to the MCP server ended during the call
    "timeout",  # the MCP call took longer than the ToolServer's call timeout
    "tool_error",  # the tool ran and reported an error, or the server refused the call
    "internal",  # a bug on the host; the message says where
]


class ToolRequest(BaseModel):
    """One tool call as the kernel sends it. Anything beyond these fields is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    token: str = Field(max_length=1024)
    seq: int = Field(ge=0)
    execution: str | None = Field(default=None, max_length=1024)
    server: str = Field(min_length=1, max_length=1024)
    tool: str = Field(min_length=1, max_length=1024)
    arguments: dict[str, Any] = Field(default_factory=dict[str, Any])
    mark: int | None = Field(default=None, ge=1, lt=2**63)
    """The kernel's output mark that follows what the cell printed before the call (ipybox._marks)."""


class ToolResultReply(BaseModel):
    """The result of a tool call that completed."""

    seq: int
    ok: Literal[True] = True
    structured: dict[str, Any] | None
    """The MCP ``structuredContent``, when the tool returned any."""
    text: str
    """The text content items, joined with newlines."""
    content: list[dict[str, Any]]
    """Every MCP content item (text, image, audio, resources) as MCP wire JSON (camelCase)."""


class ToolErrorReply(BaseModel):
    """Why a tool call was not made, or failed."""

    seq: int | None
    ok: Literal[False] = False
    error: ErrorKind
    message: str
    """A readable message naming the server and tool and, where there is one, the fix."""
    reason: str | None = None
    """For ``rejected``: the reason the application gave, if any."""
    timeout: float | None = None
    """For ``timeout``: the timeout that was exceeded, in seconds."""
    output: str | None = None
    """For ``server_start`` and ``server_crashed``: the last lines the server wrote to stderr."""


def encode_reply(reply: ToolResultReply | ToolErrorReply) -> bytes:
    """The reply as one line of JSON, newline included."""
    return reply.model_dump_json(exclude_none=isinstance(reply, ToolErrorReply)).encode() + b"\n"
