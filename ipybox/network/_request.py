"""`NetworkRequest`: a connection to an unlisted destination, waiting for the application's decision."""

from __future__ import annotations

from dataclasses import dataclass

from ipybox._approval import ApprovalDecision, ApprovalRequest

__all__ = ("NETWORK_SERVER", "NETWORK_TOOL", "NetworkRequest")

# What a network request looks like to code written for tool calls (adapters, logs): ipybox's own
# "connect" tool, whose arguments are the destination.
NETWORK_SERVER = "ipybox"
NETWORK_TOOL = "connect"


@dataclass(eq=False, kw_only=True)
class NetworkRequest(ApprovalRequest):
    """Kernel code wants to connect to a destination the executor's `Network` does not list.

    An `ApprovalRequest` of its own kind: it appears among the execution's events, is decided by
    the same policy, callback or `Execution.answer`, and adapters turn it into their framework's
    interrupt like a tool call (as ipybox's ``connect`` tool, with ``host`` and ``port`` as its
    arguments). `ApprovalRules` patterns see it as ``"network:<host>:<port>"``.

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
        return f"network connection to {self.host}:{self.port}"

    @property
    def rule_name(self) -> str:
        return f"network:{self.host}:{self.port}"

    @property
    def description(self) -> str:
        return f"{self} from kernel code, made by the host's network proxy: {self.server}"

    async def accept(self, *, remember: bool = False) -> None:
        """Let the connection through; with ``remember``, every later one to this destination too
        (for the executor's life)."""
        self.decide(ApprovalDecision(approved=True, remember=remember))


def network_request_fields(host: str, port: int) -> dict[str, object]:
    """The `ApprovalRequest` fields of a network request for ``host:port``."""
    return {
        "server_name": NETWORK_SERVER,
        "tool_name": NETWORK_TOOL,
        "tool_args": {"host": host, "port": port},
        "server": f"this executor's network proxy connects to {host}:{port}",
        "host": host,
        "port": port,
    }
