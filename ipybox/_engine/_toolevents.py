"""What the application can observe of each tool call: requested, decided, finished.

The `ApprovalGate` and the `ToolServer` report every tool call of the kernel, and every connection
to an unlisted destination asked about (as ipybox's ``connect`` tool, like adapters show it), to
the executor's `ToolCallHook`: for metrics, logs and traces. An observer only: events are frozen
and carry no `ApprovalRequest` (whose `accept` could decide the call), and an exception from the
hook is logged and dropped, so a hook can neither change a decision nor break a call.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from ipybox._approval._decisions import ApprovalDecision

__all__ = ("ToolCallDecided", "ToolCallEvent", "ToolCallFinished", "ToolCallHook", "ToolCallRequested", "notify")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class _ToolCall:
    call_id: str | None
    """The request's id, ``f"{execution_id}:{n}"`` (`ApprovalRequest.id`); None for a call refused
    before it became a request (from code left running by an earlier code action, or one ipybox
    cannot attribute)."""
    server: str
    """The MCP server's name as kernel code sent it (``"ipybox"`` for ipybox's own tools and for
    network connections)."""
    tool: str
    """The tool's name (``"connect"`` for a network connection)."""
    execution_id: str | None
    """The execution that runs now, whose call this is (None: none runs)."""
    execution_key: str | None = None
    """That execution's ``key``, if it was started with one."""


@dataclass(frozen=True, kw_only=True)
class ToolCallRequested(_ToolCall):
    """A tool call reached the host and is about to be decided."""

    arguments: Mapping[str, Any]
    """The arguments, read-only (`ApprovalRequest.tool_args`). Kernel code chose them: they may hold
    personal data, and any text."""
    annotations: Mapping[str, Any] | None = None
    """The tool's MCP annotations as its server last listed them."""


@dataclass(frozen=True, kw_only=True)
class ToolCallDecided(_ToolCall):
    """The call was decided; it runs only if ``decision.approved``."""

    decision: ApprovalDecision
    """The decision; ``decision.by`` says what made it."""
    policy: str | None
    """The policy that decided (``"auto"``, ``"ApprovalRules"``, a callback's qualified name, the
    member of an `ApprovalChain` that decided); None when no policy did (an answer to the event, a
    timeout, ipybox's own refusal)."""
    waited: float
    """Seconds from the request to the decision."""


@dataclass(frozen=True, kw_only=True)
class ToolCallFinished(_ToolCall):
    """The call ended (for tool calls only: a connection's own life is reported by
    `Network.on_event`)."""

    error: str | None
    """None when the tool ran and returned; otherwise the kind of error the kernel code got
    (``"rejected"``, ``"tool_error"``, ``"timeout"``, ``"server_start"`` ...), or ``"cancelled"``
    when the kernel stopped waiting for it (an interrupted cell)."""
    duration: float
    """Seconds from the decision to the end (the tool's run, its server's start included)."""

    @property
    def ok(self) -> bool:
        return self.error is None


ToolCallEvent: TypeAlias = ToolCallRequested | ToolCallDecided | ToolCallFinished
"""One event of a tool call: requested, then decided, then (tool calls) finished."""

ToolCallHook: TypeAlias = Callable[[ToolCallEvent], "Awaitable[None] | None"]
"""Observes tool calls: called with each `ToolCallEvent`, in order, where it happens (the call
waits for it: keep it quick). A coroutine is awaited. What it raises is logged and dropped."""


async def notify(hook: ToolCallHook, event: ToolCallEvent) -> None:
    """Hand ``event`` to ``hook``; a failure of the hook is logged, never raised."""
    try:
        seen = hook(event)
        if inspect.isawaitable(seen):
            await seen
    except Exception:  # an observer: it must not decide or break the call
        logger.exception("the tool-call hook failed on %s", type(event).__name__)
