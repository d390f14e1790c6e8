"""Approval of MCP tool calls: the request an application answers, and approval policies."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal, NoReturn, TypeAlias, cast

import anyio

from ._exceptions import UsageError

__all__ = (
    "Approval",
    "ApprovalCallback",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalRules",
    "check_approval",
    "decide_by_policy",
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ApprovalDecision:
    """The answer to an `ApprovalRequest`."""

    approved: bool
    reason: str | None = None
    by: Literal["application", "policy", "timeout"] = "application"
    remember: bool = field(default=False, repr=False)
    """For a `NetworkRequest`: allow the destination for the rest of the executor's life (ignored
    for tool calls, so left out of the repr that tool-call logs show)."""


class _FrozenDict(dict[str, Any]):
    """A read-only dict: JSON encoders and ``dict(...)`` take it like any dict, changes raise.

    Copies (``copy.copy``, ``copy.deepcopy``, pickling) are ordinary, mutable dicts.
    """

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("ApprovalRequest.tool_args is read-only; copy.deepcopy() it for a mutable copy")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only  # pyright: ignore[reportAssignmentType]

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: _thaw(value) for key, value in self.items()}

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (self.__deepcopy__({}),)


def _freeze(value: Any) -> Any:
    """A deep, read-only copy of JSON-like data: mappings become `_FrozenDict`, lists tuples."""
    if isinstance(value, Mapping):
        items = cast("Mapping[str, Any]", value).items()
        return _FrozenDict({key: _freeze(item) for key, item in items})
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in cast("list[Any] | tuple[Any, ...]", value))
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _thaw(item) for key, item in cast("dict[str, Any]", value).items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in cast("tuple[Any, ...]", value)]
    return value


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
    """The arguments, as a deep read-only copy (nested mappings read-only, lists as tuples); it
    serializes to JSON like a dict. The call runs with the arguments parsed on the host, never
    with this object, so neither the application nor kernel code can change what runs after the
    request was made."""
    server: str
    """What the host will run or call for this server: its command line or URL."""
    annotations: Mapping[str, Any] | None = None
    """The tool's MCP annotations, e.g. ``{"readOnlyHint": True}``."""
    _decided: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _decision: ApprovalDecision | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.tool_args = _freeze(self.tool_args)

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.tool_args.items())
        return f"{self.server_name}.{self.tool_name}({args})"

    @property
    def rule_name(self) -> str:
        """What `ApprovalRules` patterns are matched against: ``"server.tool"``."""
        return f"{self.server_name}.{self.tool_name}"

    @property
    def description(self) -> str:
        """One line saying what will run if approved."""
        return f"MCP tool call {self}, run by the host through: {self.server}"

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


ApprovalCallback: TypeAlias = Callable[
    [ApprovalRequest], "bool | ApprovalDecision | Awaitable[bool | ApprovalDecision]"
]
"""Decides a request: returns True/False or an `ApprovalDecision`, directly or as an awaitable."""


@dataclass(frozen=True, kw_only=True)
class ApprovalRules:
    """Decide tool calls by rules; calls no rule covers are decided by ``otherwise``.

    Patterns are shell-style globs over ``"server.tool"``, e.g. ``"github.*"`` or ``"*.search_*"``,
    and over ``"network:<host>:<port>"`` for a `NetworkRequest` (``"network:*.example.org:443"``).
    A matching ``deny`` pattern wins over everything else.

    Attributes:
        allow: Calls to approve without asking.
        deny: Calls to reject without asking.
        allow_read_only: Approve tools whose MCP annotations say ``readOnlyHint: true``. The hint
            comes from the MCP server: enable this only for servers you trust to label tools truthfully.
        otherwise: What happens to the rest: ask the application, accept, or reject.
    """

    allow: Sequence[str] = ()
    deny: Sequence[str] = ()
    allow_read_only: bool = False
    otherwise: Literal["ask", "accept", "reject"] = "ask"

    def __post_init__(self) -> None:
        if isinstance(self.allow, str) or isinstance(self.deny, str):
            raise UsageError("ApprovalRules allow/deny take a list of patterns, not a single string")
        if self.otherwise not in ("ask", "accept", "reject"):
            raise UsageError(f"ApprovalRules otherwise must be 'ask', 'accept' or 'reject', got {self.otherwise!r}")

    def decide(self, request: ApprovalRequest) -> ApprovalDecision | None:
        """The rules' decision, or None when the application must be asked."""
        name = request.rule_name
        if any(fnmatchcase(name, p) for p in self.deny):
            return ApprovalDecision(approved=False, reason=f"{name} is denied by the approval rules", by="policy")
        if any(fnmatchcase(name, p) for p in self.allow):
            return ApprovalDecision(approved=True, by="policy")
        if self.allow_read_only and (request.annotations or {}).get("readOnlyHint") is True:
            return ApprovalDecision(approved=True, by="policy")
        if self.otherwise == "accept":
            return ApprovalDecision(approved=True, by="policy")
        if self.otherwise == "reject":
            return ApprovalDecision(approved=False, reason=f"{name} is not allowed by the approval rules", by="policy")
        return None


Approval: TypeAlias = Literal["ask", "auto"] | ApprovalRules | ApprovalCallback
"""How tool calls are approved: ``"ask"`` (each becomes an `ApprovalRequest` event the application
answers), ``"auto"`` (all approved), `ApprovalRules`, or a callback."""


def check_approval(approval: object) -> None:
    """Raises UsageError unless ``approval`` is a valid policy."""
    if approval in ("ask", "auto") or isinstance(approval, ApprovalRules) or callable(approval):
        return
    raise UsageError(f"approval must be 'ask', 'auto', an ApprovalRules or a callable, got {approval!r}")


async def decide_by_policy(approval: Approval, request: ApprovalRequest) -> ApprovalDecision | None:
    """The policy's decision, or None when the application must be asked (an event)."""
    if approval == "ask":
        return None
    if approval == "auto":
        return ApprovalDecision(approved=True, by="policy")
    if isinstance(approval, ApprovalRules):
        return approval.decide(request)
    if not callable(approval):
        raise UsageError(f"invalid approval policy {approval!r}")
    try:
        answer: object = approval(request)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:  # the application's callback: any failure means "no"
        logger.exception("approval callback failed")
        # The reason reaches kernel code: the type only, since the message may name host details.
        reason = f"the approval callback failed ({type(exc).__name__}); the host's log has the details"
        return ApprovalDecision(approved=False, reason=reason, by="policy")
    if isinstance(answer, ApprovalDecision):
        return answer
    if isinstance(answer, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
        return ApprovalDecision(approved=answer, by="policy")
    return ApprovalDecision(
        approved=False,
        reason=f"the approval callback returned {answer!r}, not a bool or ApprovalDecision",
        by="policy",
    )
