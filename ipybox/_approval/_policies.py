"""Approval policies: the one protocol every way of deciding a request implements, and chains of them.

A policy looks at an `ApprovalRequest` and either decides it or passes (returns None). What every
policy of an execution passes on is decided by the application's answer to the request's event
(`ApprovalRequest.accept`/`reject`), a person's answer as a rule. ``"ask"`` is the policy that
always passes, ``"auto"`` the one that approves everything, `ApprovalRules` decide what their
patterns cover, and a callback decides everything it is given. `ApprovalChain` asks its policies in
turn: the first decision wins.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from ipybox._exceptions import UsageError

from ._decisions import ApprovalCallback, ApprovalDecision, ApprovalRequest, ApprovalRules

__all__ = ("Approval", "ApprovalChain", "ApprovalPolicy", "check_approval", "decide_by_policy", "policy_name")

logger = logging.getLogger(__name__)


@runtime_checkable
class ApprovalPolicy(Protocol):
    """Decides approval requests, or passes them on.

    ``decide`` returns an `ApprovalDecision`, or None to pass the request to the next policy of an
    `ApprovalChain` (and, after the last, to the application's answer to the request's event). It
    may be a coroutine. An exception from it rejects the request (with the exception's type as the
    reason, since its message may name host details), like a failing callback.

    `ApprovalRules` implement it; so can any object of the application's.
    """

    def decide(self, request: ApprovalRequest, /) -> ApprovalDecision | Awaitable[ApprovalDecision | None] | None:
        """The decision on ``request``, or None to pass it on."""
        ...


Approval: TypeAlias = Literal["ask", "auto"] | ApprovalPolicy | ApprovalCallback
"""How requests are approved: ``"ask"`` (each becomes an `ApprovalRequest` event the application
answers), ``"auto"`` (all approved), an `ApprovalPolicy` (`ApprovalRules`, an `ApprovalChain`, one of
the application's), or a callback that decides every request it gets."""


@dataclass(frozen=True, init=False)
class ApprovalChain:
    """Policies asked in turn; the first that decides a request decides it.

    What all of them pass on goes to the application's answer to the request's event, as with
    ``"ask"``. For example, rules first, then a person for what they leave open::

        ApprovalChain(ApprovalRules(allow=["github.search_*"], deny=["github.delete_*"]), "ask")

    or rules first, then a callback that asks a chat channel::

        ApprovalChain(ApprovalRules(deny=["*.delete_*"]), ask_on_slack)

    Members are what ``approval=`` takes: ``"auto"``, ``"ask"``, `ApprovalPolicy` objects (chains
    are flattened into this one) and callbacks. A callback and ``"auto"`` decide everything, so
    they end a chain; ``"ask"`` passes everything to a person, so only the last member may be it.

    Two chains of equal members are equal, so that an executor can tell that an execution runs
    under the same policy as the earlier ones (see `CodeExecutor.execute`).

    Raises:
        UsageError: A member is not a policy, or ``"ask"`` is not the last one.
    """

    policies: tuple[Approval, ...]

    def __init__(self, *policies: Approval) -> None:
        flat: list[Approval] = []
        for policy in policies:
            check_approval(policy)
            flat.extend(policy.policies if isinstance(policy, ApprovalChain) else (policy,))
        if not flat:
            raise UsageError("ApprovalChain needs at least one policy, e.g. ApprovalChain(ApprovalRules(...), 'ask')")
        if "ask" in flat[:-1]:
            raise UsageError(
                "'ask' leaves every request to a person, so no policy after it would ever be asked; put it last"
            )
        object.__setattr__(self, "policies", tuple(flat))

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision | None:
        """The first decision of the chain's policies, or None if they all pass."""
        decision, _ = await decide_by_policy(self, request)
        return decision


def check_approval(approval: object) -> None:
    """Raises UsageError unless ``approval`` is a valid policy."""
    if approval in ("ask", "auto") or isinstance(approval, ApprovalPolicy) or callable(approval):
        return
    raise UsageError(
        f"approval must be 'ask', 'auto', an ApprovalRules, an ApprovalChain, an object with a decide(request) "
        f"method or a callable, got {approval!r}"
    )


def policy_name(policy: object) -> str:
    """How events and logs name a policy: ``"auto"``, ``"ApprovalRules"``, a callback's qualified name."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, ApprovalPolicy):
        return type(policy).__name__
    return getattr(policy, "__qualname__", None) or type(policy).__name__


async def decide_by_policy(approval: Approval, request: ApprovalRequest) -> tuple[ApprovalDecision | None, object]:
    """The policy's decision, or None when the application must be asked (an event); with the
    policy (the chain's member) that decided, None when none did.

    A decision's ``by`` says what made it: ``"policy"`` for a policy object or ``"auto"``,
    ``"callback"`` for a callback, whatever the decider wrote there.
    """
    if isinstance(approval, ApprovalChain):
        for member in approval.policies:
            decision, decider = await decide_by_policy(member, request)
            if decision is not None:
                return decision, decider
        return None, None
    if approval == "ask":
        return None, None
    if approval == "auto":
        return ApprovalDecision(approved=True, by="policy"), approval
    if isinstance(approval, ApprovalRules):  # the common case, without a coroutine
        decision = _stamped(approval.decide(request), "policy")
        return decision, None if decision is None else approval
    decide = getattr(approval, "decide", None)  # an ApprovalPolicy (a protocol isinstance costs more)
    if decide is not None:
        decision = _stamped(await _call(decide, request, "policy"), "policy")
        return decision, None if decision is None else approval
    answer = await _call(approval, request, "callback")  # pyright: ignore[reportArgumentType]
    if isinstance(answer, bool):
        return ApprovalDecision(approved=answer, by="callback"), approval
    if isinstance(answer, ApprovalDecision):
        return _stamped(answer, "callback"), approval
    reason = f"the approval callback returned {answer!r}, not a bool or ApprovalDecision"
    return ApprovalDecision(approved=False, reason=reason, by="callback"), approval


async def _call(decide: Callable[[ApprovalRequest], object], request: ApprovalRequest, kind: str) -> object:
    try:
        answer = decide(request)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:  # the application's code: any failure means "no"
        logger.exception("approval %s failed", kind)
        # The reason reaches kernel code: the type only, since the message may name host details.
        reason = f"the approval {kind} failed ({type(exc).__name__}); the host's log has the details"
        return ApprovalDecision(approved=False, reason=reason, by="callback" if kind == "callback" else "policy")
    if kind == "policy" and answer is not None and not isinstance(answer, ApprovalDecision):
        reason = f"the approval policy returned {answer!r}, not an ApprovalDecision or None"
        return ApprovalDecision(approved=False, reason=reason, by="policy")
    return answer


def _stamped(decision: object, by: Literal["policy", "callback"]) -> ApprovalDecision | None:
    """The decision with ``by`` saying what made it (None passes)."""
    if not isinstance(decision, ApprovalDecision):
        return None
    return decision if decision.by == by else replace(decision, by=by)
