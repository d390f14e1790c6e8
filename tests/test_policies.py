"""Approval policies on their own: the protocol, chains, who decided, the hook's plumbing. No kernel:
policies are functions of a request (the real-kernel runs are in test_tools.py and
tests/hostile/test_attribution.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from ipybox import (
    ApprovalChain,
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalRules,
    CodeExecutor,
    NetworkRequest,
    ToolCallDecided,
    ToolCallEvent,
    ToolCallRequested,
    UsageError,
)
from ipybox._approval._policies import Approval, decide_by_policy, policy_name
from ipybox._engine._toolevents import notify
from ipybox.network._request import network_request_fields

pytestmark = pytest.mark.anyio


def request(server: str = "github", tool: str = "search_issues", annotations: Mapping[str, Any] | None = None):
    return ApprovalRequest(
        id="x1:1", server_name=server, tool_name=tool, tool_args={"q": "bug"}, server="cmd", annotations=annotations
    )


async def decide(policy: Approval, req: ApprovalRequest | None = None) -> tuple[ApprovalDecision | None, str | None]:
    decision, decider = await decide_by_policy(policy, req or request())
    return decision, None if decider is None else policy_name(decider)


class OnlyOnFridays:
    """An application's own policy: decides some requests, passes the rest."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision | None:
        self.seen.append(request.rule_name)
        if request.tool_name == "deploy":
            return ApprovalDecision(approved=False, reason="not on a Friday")
        return None


async def test_the_modes_rules_and_callbacks_answer_in_one_vocabulary() -> None:
    assert await decide("ask") == (None, None)
    assert await decide("auto") == (ApprovalDecision(approved=True, by="policy"), "auto")
    rules = ApprovalRules(allow=["github.*"])
    assert await decide(rules) == (ApprovalDecision(approved=True, by="policy"), "ApprovalRules")
    assert await decide(ApprovalRules(allow=["other.*"])) == (None, None)

    def approve(request: ApprovalRequest) -> bool:
        return True

    assert await decide(approve) == (ApprovalDecision(approved=True, by="callback"), approve.__qualname__)


async def test_a_callbacks_decision_is_marked_as_the_callbacks_whatever_it_wrote() -> None:
    async def no(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(approved=False, reason="because", by="application")

    decision, _ = await decide(no)
    assert decision == ApprovalDecision(approved=False, reason="because", by="callback")


async def test_a_chain_asks_in_turn_and_the_first_decision_wins() -> None:
    fridays = OnlyOnFridays()
    chain = ApprovalChain(ApprovalRules(deny=["*.delete_*"]), fridays, ApprovalRules(allow=["github.*"]))
    assert await decide(chain, request(tool="delete_repo")) == (
        ApprovalDecision(approved=False, reason="github.delete_repo is denied by the approval rules", by="policy"),
        "ApprovalRules",
    )
    assert fridays.seen == []  # never asked: the rules before it decided
    decision, by = await decide(chain, request(tool="deploy"))
    assert decision == ApprovalDecision(approved=False, reason="not on a Friday", by="policy")
    assert by == "OnlyOnFridays"
    assert await decide(chain, request(tool="search")) == (
        ApprovalDecision(approved=True, by="policy"),
        "ApprovalRules",
    )
    # All pass: the request goes to the application's answer, as with "ask".
    assert await decide(chain, request(server="slack", tool="post")) == (None, None)
    assert fridays.seen == ["github.deploy", "github.search", "slack.post"]


async def test_rules_then_a_person_and_rules_then_a_callback() -> None:
    asked: list[str] = []

    def person(request: ApprovalRequest) -> bool:
        asked.append(request.rule_name)
        return False

    rules = ApprovalRules(allow=["github.search_*"])
    assert await decide(ApprovalChain(rules, "ask"), request(tool="merge")) == (None, None)
    then_callback = ApprovalChain(rules, person)
    assert (await decide(then_callback))[0] == ApprovalDecision(approved=True, by="policy")
    assert (await decide(then_callback, request(tool="merge")))[0] == ApprovalDecision(approved=False, by="callback")
    assert asked == ["github.merge"]


async def test_chains_flatten_compare_by_members_and_refuse_what_cannot_be_asked() -> None:
    rules = ApprovalRules(deny=["*.delete_*"])
    fridays = OnlyOnFridays()
    inner = ApprovalChain(rules, fridays)
    assert ApprovalChain(inner, "ask").policies == (rules, fridays, "ask")
    # Equal members, equal chains: the gate's "same policy as the earlier code" depends on it.
    assert ApprovalChain(ApprovalRules(deny=["*.delete_*"]), "ask") == ApprovalChain(rules, "ask")
    assert ApprovalChain(rules, "ask") != ApprovalChain(rules, "auto")
    assert hash(ApprovalChain(rules, "ask")) == hash(ApprovalChain(rules, "ask"))
    assert isinstance(ApprovalChain(rules), ApprovalPolicy) and isinstance(rules, ApprovalPolicy)
    with pytest.raises(UsageError, match=r"'ask' leaves every request to a person.*put it last"):
        ApprovalChain("ask", rules)
    with pytest.raises(UsageError, match="approval must be"):
        ApprovalChain(rules, "maybe")  # pyright: ignore[reportArgumentType]
    with pytest.raises(UsageError, match="at least one policy"):
        ApprovalChain()


async def test_a_failing_or_wrong_policy_rejects_and_names_only_the_type(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def decide(self, request: ApprovalRequest) -> ApprovalDecision | None:
            raise OSError("/secret/path")

    class Wrong:
        def decide(self, request: ApprovalRequest) -> object:
            return "yes"

    def wrong_callback(request: ApprovalRequest) -> object:
        return None

    with caplog.at_level(logging.ERROR):
        decision, _ = await decide(ApprovalChain(Broken(), "auto"))
    assert decision is not None and not decision.approved and decision.by == "policy"
    assert decision.reason == "the approval policy failed (OSError); the host's log has the details"
    decision, _ = await decide(Wrong())  # pyright: ignore[reportArgumentType]
    assert decision is not None and not decision.approved and "returned 'yes'" in (decision.reason or "")
    decision, _ = await decide(wrong_callback)  # pyright: ignore[reportArgumentType]
    assert decision == ApprovalDecision(
        approved=False, reason="the approval callback returned None, not a bool or ApprovalDecision", by="callback"
    )


async def test_network_requests_follow_the_net_rules_of_a_chain() -> None:
    connect = NetworkRequest(id="x1:2", **network_request_fields("api.example.org", 443), execution_id="x1")  # pyright: ignore[reportArgumentType]
    chain = ApprovalChain(ApprovalRules(allow=["*"]), ApprovalRules(allow_net=["api.example.org"]))
    assert await decide(chain, connect) == (ApprovalDecision(approved=True, by="policy"), "ApprovalRules")
    assert await decide(ApprovalChain(ApprovalRules(allow=["*"])), connect) == (None, None)


async def test_a_hook_that_raises_or_fails_to_await_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[ToolCallEvent] = []

    async def failing(event: ToolCallEvent) -> None:
        seen.append(event)
        raise RuntimeError("observer bug")

    def returns_junk(event: ToolCallEvent) -> Any:
        return 42

    event = ToolCallRequested(call_id="x1:1", server="s", tool="t", execution_id="x1", arguments={})
    with caplog.at_level(logging.ERROR):
        await notify(failing, event)
        await notify(returns_junk, event)
    assert seen == [event]
    assert "the tool-call hook failed on ToolCallRequested" in caplog.text
    decided = ToolCallDecided(
        call_id="x1:1",
        server="s",
        tool="t",
        execution_id="x1",
        decision=ApprovalDecision(approved=True),
        policy=None,
        waited=0.0,
    )
    with pytest.raises(AttributeError):
        decided.decision = ApprovalDecision(approved=False)  # pyright: ignore[reportAttributeAccessIssue]


def test_the_executor_refuses_what_is_not_a_policy_or_a_hook(tmp_path: Any) -> None:
    with pytest.raises(UsageError, match="an ApprovalChain, an object with a decide"):
        CodeExecutor(workspace=tmp_path, sandbox=None, approval=42)  # pyright: ignore[reportArgumentType]
    with pytest.raises(UsageError, match="on_tool_call must be a callable"):
        CodeExecutor(workspace=tmp_path, sandbox=None, on_tool_call="print")  # pyright: ignore[reportArgumentType]
    executor = CodeExecutor(workspace=tmp_path, sandbox=None, approval=ApprovalChain(ApprovalRules(), "ask"))
    executor.approval = ApprovalChain(OnlyOnFridays(), "auto")
    assert isinstance(executor.approval, ApprovalChain)
