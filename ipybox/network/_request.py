"""`NetworkRequest`: a connection to an unlisted destination, waiting for the application's decision."""

from __future__ import annotations

from dataclasses import dataclass

from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest
from ipybox._approval._rendering import request_text, shown_name

from ._policy import parse_ip

__all__ = ("NETWORK_SERVER", "NETWORK_TOOL", "NetworkRequest")

# What a network request looks like to code written for tool calls (adapters, logs): ipybox's own
# "connect" tool, whose arguments are the destination.
NETWORK_SERVER = "ipybox"
NETWORK_TOOL = "connect"
# What its arguments are: the proxy makes them, never kernel code.
CONNECT_SCHEMA = {
    "type": "object",
    "properties": {"host": {"type": "string"}, "port": {"type": "integer"}},
    "required": ["host", "port"],
    "additionalProperties": False,
}


@dataclass(eq=False, kw_only=True)
class NetworkRequest(ApprovalRequest):
    """Kernel code wants to connect to a destination the executor's `Network` does not list.

    An `ApprovalRequest` of its own kind: it appears among the execution's events, is decided by
    the same policy, callback or `Execution.answer`, and adapters turn it into their framework's
    interrupt like a tool call (as ipybox's ``connect`` tool, with ``host`` and ``port`` as its
    arguments). `ApprovalRules` decides it by ``allow_net``/``deny_net`` (destinations written as in
    `Network.allow`), never by its tool patterns.

    Approving it lets this one connection through (still only to public addresses, unless an
    address entry of the `Network` allows the address); ``accept(remember=True)`` allows the
    destination for the rest of the executor's life.
    """

    host: str
    """The destination host as kernel code named it (a name or an address), normalized."""
    port: int
    execution_id: str
    """The execution whose code asked (also the first part of `id`)."""

    def __str__(self) -> str:
        return f"network connection to {self.destination}"

    @property
    def destination(self) -> str:
        """``host:port`` as shown to a person: the host quoted unless it is a plain name or address."""
        return shown_destination(self.host, self.port)

    @property
    def rule_name(self) -> str:
        """``"network:<host>:<port>"``, for messages; `ApprovalRules` matches destinations with
        ``allow_net``/``deny_net``, never with tool patterns."""
        return f"network:{self.destination}"

    @property
    def headline(self) -> str:
        return f"Network connection from kernel code to {self.destination}, made by the host's network proxy"

    @property
    def description(self) -> str:
        return request_text(self)

    async def accept(self, *, remember: bool = False) -> None:
        """Let the connection through; with ``remember``, every later one to this destination too
        (for the executor's life)."""
        self.decide(ApprovalDecision(approved=True, remember=remember))


def shown_destination(host: str, port: int) -> str:
    """``host:port`` for a person to read; the host is kernel code's text, quoted unless plain."""
    address = parse_ip(host)
    if address is not None:
        return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    return f"{shown_name(host)}:{port}"


def network_request_fields(host: str, port: int) -> dict[str, object]:
    """The `ApprovalRequest` fields of a network request for ``host:port``."""
    return {
        "server_name": NETWORK_SERVER,
        "tool_name": NETWORK_TOOL,
        "tool_args": {"host": host, "port": port},
        "input_schema": CONNECT_SCHEMA,
        "server": f"this executor's network proxy connects to {shown_destination(host, port)}",
        "host": host,
        "port": port,
    }
