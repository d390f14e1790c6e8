"""The contract between the host and the kernel, written once: both sides import it from here.

Standard library only, like the rest of ``ipybox_kernel``: the kernel imports it in its sandbox (or
gets it pushed as source to a remote gateway kernel, ``ipybox._gateway._push``), and the host
imports the same names, so that a name, a message type, a limit or an error kind cannot drift
between the two. What each side does with them stays on its side: the request and reply shapes in
``ipybox/_toolserver/_channel.py``, the exception each error kind raises in ``ipybox_kernel._errors``.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = (
    "COMM_ID",
    "ERROR_KINDS",
    "EXECUTION_ENV",
    "HOLD_REPLY_TYPE",
    "HOLD_TYPE",
    "MARK_TYPE",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_LINE_BYTES",
    "MAX_MODULE_CHARS",
    "MAX_REPLY_BYTES",
    "NET_SOCKET_ENV",
    "REPLY_TYPE",
    "SKILLS_DIR_ENV",
    "SOCKET_ENV",
    "TOKEN_ENV",
    "TOOLS_DIR_ENV",
    "TRANSPORT_ENV",
    "TRANSPORT_KERNEL",
    "ErrorKind",
)

# -- the kernel's environment, set by the host (ipybox._kernel._home, ipybox.network, ipybox._gateway._push) --

# The tool server's unix socket, and the secret every request (and the network forwarder) sends first.
SOCKET_ENV = "IPYBOX_TOOL_SOCKET"
TOKEN_ENV = "IPYBOX_TOOL_TOKEN"
# Set to TRANSPORT_KERNEL in a kernel on a remote gateway: calls travel over the kernel protocol instead.
TRANSPORT_ENV = "IPYBOX_TOOL_TRANSPORT"
TRANSPORT_KERNEL = "kernel"
# The running cell's id, for a subprocess (it has no IPython to ask); set by ipybox_kernel._context.
EXECUTION_ENV = "IPYBOX_EXECUTION"
# Where the generated tool packages and the saved skills are mounted read-only.
TOOLS_DIR_ENV = "IPYBOX_TOOLS_DIR"
SKILLS_DIR_ENV = "IPYBOX_SKILLS_DIR"
# The host's network proxy socket the kernel's forwarder connects to (ipybox_kernel._netproxy).
NET_SOCKET_ENV = "IPYBOX_NET_SOCKET"

# -- Jupyter messages of ipybox's own ------------------------------------------------------------

# An output mark on IOPub, ``{"mark": n}``, behind what a cell printed before a tool call (ipybox_kernel._marks).
MARK_TYPE = "ipybox_mark"
# A remote kernel's tool request: a ``comm_msg`` on IOPub for this comm (ipybox_kernel._remote).
COMM_ID = "ipybox-tools"
# The host's acknowledgement or reply to it: a message of this type on the control channel.
REPLY_TYPE = "ipybox_tool_reply"
# A suspended execution's hold (ipybox_kernel._remote): ``{"op": "hold", "ttl": s}`` from the host that
# suspends it (``{"op": "drop"}`` takes it back), ``{"op": "release", "token": ...}`` from the one that
# resumes it, on the control channel;
# answered with a message of `HOLD_REPLY_TYPE`, ``{"ok": bool}``, to the asking client.
HOLD_TYPE = "ipybox_hold"
HOLD_REPLY_TYPE = "ipybox_hold_reply"

# -- limits of the tool channel (the host enforces them; the kernel fails early on its side) -------

# One request line: large enough for big arguments and inline images, small enough that a flood of
# such lines stays bounded.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Far deeper than any tool's arguments; shallow enough that the host's recursive walks over a request
# (json, pydantic, the approval's read-only copy) stay far from Python's recursion limit.
MAX_JSON_DEPTH = 64
# Arrays, objects and list items a request may hold: each becomes a Python object of 30-60 bytes on
# the host, so this bounds what parsing one request can take (~64 MB) whatever its line length.
MAX_JSON_VALUES = 1_000_000
# Characters of the module name a request's call site may give (a dotted module path).
MAX_MODULE_CHARS = 256
# Room for results of several MB (their text is sent twice: as text and as a content item), small
# enough that a server's runaway result fails as that call's error instead of filling the kernel.
MAX_REPLY_BYTES = 64 * 1024 * 1024

# -- the error kinds of a reply (each raises one exception in the kernel: ipybox_kernel._errors.ERROR_TYPES) --

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
    "over_budget",  # the code action used up a budget of the executor's Limits; nobody was asked
    "approval_failed",  # approving the call failed on the host; the call was not made
    "server_start",  # the MCP server could not be started or connected to
    "server_crashed",  # the connection to the MCP server ended during the call
    "timeout",  # the MCP call took longer than the ToolServer's call timeout
    "tool_error",  # the tool ran and reported an error, or the server refused the call
    "internal",  # a bug on the host; the message says where
]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
