"""Approval of MCP tool calls: the request an application answers, and approval policies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

__all__ = ("ApprovalDecision", "ApprovalRequest")


@dataclass(frozen=True, kw_only=True)
class ApprovalDecision:
    """The answer to an `ApprovalRequest`."""

    approved: bool
    reason: str | None = None
    by: Literal["application", "policy", "timeout"] = "application"


@dataclass(eq=False, kw_only=True)
class ApprovalRequest:
    """A tool call from the kernel that waits for the application's decision.

    The call does not run until `accept` is awaited; `reject` makes the kernel code raise
    ``ipybox_kernel.ToolCallRejected`` with the reason. Answering twice is harmless: the first
    answer counts.
    """

    id: str
    """Stable id: ``f"{execution_id}:{n}"`` for the n-th tool call of the execution."""
    server_name: str
    tool_name: str
    tool_args: Mapping[str, Any]
    server: str
    """What the host will run or call for this server: its command line or URL."""
    annotations: Mapping[str, Any] | None = None
    """The tool's MCP annotations, e.g. ``{"readOnlyHint": True}``."""
    _decided: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _decision: ApprovalDecision | None = field(default=None, repr=False)

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.tool_args.items())
        return f"{self.server_name}.{self.tool_name}({args})"

    @property
    def decision(self) -> ApprovalDecision | None:
        """The decision, once made."""
        return self._decision

    async def accept(self) -> None:
        """Let the call run."""
        self.decide(ApprovalDecision(approved=True))

    async def reject(self, reason: str | None = None) -> None:
        """Refuse the call; the kernel code gets ``ToolCallRejected(reason)``."""
        self.decide(ApprovalDecision(approved=False, reason=reason))

    def decide(self, decision: ApprovalDecision) -> bool:
        """Record a decision unless one was made already; True if this one counted."""
        if self._decision is not None:
            return False
        self._decision = decision
        self._decided.set()
        return True

    async def wait(self) -> ApprovalDecision:
        """Wait for the decision."""
        await self._decided.wait()
        assert self._decision is not None
        return self._decision
