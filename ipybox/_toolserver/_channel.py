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

Either may end with ``"unmarked": true``: nobody is shown the calls of the request's execution (its
policy is ``"auto"``), so its later requests need no ``mark``, and the kernel stops flushing and
marking its output before them. It only spares the kernel work; a request is answered the same with
or without a mark.

The names, limits and error kinds both sides share are written once, in ``ipybox_kernel._protocol``
(standard library only), which the kernel uses and this module imports.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ipybox_kernel._protocol import (
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    MAX_LINE_BYTES,
    MAX_MODULE_CHARS,
    MAX_REPLY_BYTES,
    ErrorKind,
)

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
    """The kernel's output mark that follows what the cell printed before the call (ipybox._engine._outputmarks)."""
    line: int | None = None
    """The line of the cell's code that made the call, as the kernel says (ipybox._engine._callsite): any
    number, since one outside the code is shown as unknown rather than failing the call."""
    module: str | None = Field(default=None, max_length=MAX_MODULE_CHARS)
    """The module the call came through, as the kernel says."""


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


def encode_reply(reply: ToolResultReply | ToolErrorReply, *, unmarked: bool = False) -> bytes:
    """The reply as one line of JSON, newline included; with ``"unmarked": true`` when ``unmarked``."""
    data = reply.model_dump_json(exclude_none=isinstance(reply, ToolErrorReply)).encode()
    return data[:-1] + b',"unmarked":true}\n' if unmarked else data + b"\n"
