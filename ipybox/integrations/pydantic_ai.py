"""PydanticAI: a toolset whose code action asks PydanticAI's human-in-the-loop machinery to approve each
MCP call the running code makes.

``Agent(model, toolsets=[IpyboxToolset(executor)])`` gives the model one tool, ``execute_code``, and
instructions with the typed stubs of the generated MCP tools. Each MCP call of the running code is
approved in one of two ways, tried in this order:

- **Inline**: the call is offered to the run's `HandleDeferredToolCalls` capability as a tool call of
  its own, named ``server__tool`` with the MCP call's arguments. `ToolApproved` lets it run;
  `ToolDenied` (its message as the reason) raises ``ToolCallRejected`` in the code, which may catch it.
- **Across runs**: when no handler answers, the tool raises `ApprovalRequired` with the call's JSON
  payload (`pending_mcp_calls` reads it back) and the run ends with `DeferredToolRequests`. The code
  stays paused in the kernel. Resume with `DeferredToolResults` (`mcp_approval_results` builds them):
  the tool re-attaches to the paused execution by its tool call id and walks its events again, so
  the code never runs twice. A plain `ToolApproved()` approves; a bare `ToolDenied` aborts the whole
  action (PydanticAI does not call the tool again, so the toolset cancels the execution before the
  next model request and the kernel is free for the next action).
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic_ai import (
    AbstractToolset,
    ApprovalRequired,
    BinaryContent,
    CustomEvent,
    DeferredToolRequests,
    DeferredToolResults,
    InstructionPart,
    RunContext,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
    ToolFailed,
    ToolsetTool,
)
from pydantic_ai.messages import ModelRequest, ToolCallPart, ToolReturnPart
from pydantic_ai.tools import AgentDepsT
from pydantic_core import SchemaValidator, core_schema

from ipybox import (
    Approval,
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutor,
    Execution,
    ExecutionLost,
    InvalidLocator,
    UsageError,
)
from ipybox.integrations._core import (
    DEFAULT_TTL,
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    TOOL_NAME,
    ActionOutcome,
    ApprovalPayload,
    Catalogue,
    Decide,
    Durable,
    Suspended,
    ToolText,
    check_answers,
    describe_tools,
    drive,
    parse_decision,
    search_stubs,
    start_or_attach,
    suspending,
)

# ApprovalPayload is what pending_mcp_calls returns; Decision is the deprecated shape of what
# mcp_approval_results takes (an ApprovalDecision or a bool).
__all__ = (
    "ApprovalPayload",
    "Decision",
    "IpyboxToolset",
    "KernelOutputEvent",
    "mcp_approval_results",
    "pending_mcp_calls",
)

_KEY_PREFIX = "pydantic_ai"
_MODEL_IMAGES = ("image/png", "image/jpeg")


_ARGS_VALIDATOR = SchemaValidator(
    core_schema.typed_dict_schema(
        {"code": core_schema.typed_dict_field(core_schema.str_schema())}, extra_behavior="forbid"
    )
)
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "Python source to run in the kernel."}},
    "required": ["code"],
    "additionalProperties": False,
}
_SEARCH_ARGS_VALIDATOR = SchemaValidator(
    core_schema.typed_dict_schema(
        {
            "query": core_schema.typed_dict_field(core_schema.str_schema()),
            "k": core_schema.typed_dict_field(core_schema.int_schema(ge=1, le=20), required=False),
        },
        extra_behavior="forbid",
    )
)
_SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What the tool should do, in words."},
        "k": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5, "description": "How many tools."},
    },
    "required": ["query"],
    "additionalProperties": False,
}
_DESCRIPTION = (
    "Run Python code in a stateful, sandboxed IPython kernel. The instructions say which MCP tools the "
    "code can call and how."
)


@dataclass(frozen=True)
class Decision:
    """Deprecated: pass an `ipybox.ApprovalDecision` (whose ``reason`` this ``message`` is) or a bool
    to `mcp_approval_results`."""

    approved: bool
    message: str | None = None
    request_id: str | None = None

    def __post_init__(self) -> None:
        warnings.warn(
            "ipybox.integrations.pydantic_ai.Decision is deprecated; use ipybox.ApprovalDecision(approved=..., "
            "reason=...) or a bool",
            DeprecationWarning,
            stacklevel=3,
        )

    @classmethod
    def approve(cls) -> Decision:
        return cls(approved=True)

    @classmethod
    def reject(cls, message: str | None = None) -> Decision:
        return cls(approved=False, message=message)


@dataclass(kw_only=True)
class KernelOutputEvent(CustomEvent, name="ipybox_kernel_output"):
    """Text the running code printed, emitted live into the run's event stream (`ctx.emit`).

    PydanticAI stamps `tool_call_id` and `tool_name` with the code action's call. Output already
    emitted is not emitted again when a resumed run replays the action.
    """

    text: str
    stream: Literal["stdout", "stderr", "result"]


class IpyboxToolset(AbstractToolset[AgentDepsT]):
    """One tool, ``execute_code``, running code actions in an ipybox `CodeExecutor`.

    Code errors come back as a failed tool result (`ToolFailed`) carrying the output and the clean
    traceback, not as `ModelRetry`: the code did run, and may have changed the kernel's state or the
    workspace, so the model should read what happened and decide, not be told to repeat the call,
    and a run of errors does not use up the tool's retries and fail the run. An execution that is
    gone (its executor was restarted, its ttl expired) is reported the same way, as "execution lost",
    and nothing is run again. Displayed PNG and JPEG images come back as `BinaryContent` in the tool
    result, which the model sees.

    The toolset's instructions are the code-action guide and the stubs of the generated tools. They
    are read again only when the tools directory changes (`generate_mcp_sources` for another
    server), and sent with ``on_change="append"``: a change is appended to the conversation instead
    of rewriting the cached instruction prefix.

    Args:
        executor: A running executor; its ``tools_dir`` is where the stubs are read from.
        id: The toolset's id, unique among an agent's toolsets (also names the instructions' source).
        tool_name: The tool's name.
        servers: Show only these servers' tools in the instructions (all when None).
        approval: The approval policy of the toolset's executions. ``"ask"`` (the default) sends every
            MCP call to PydanticAI as above. None uses the executor's own policy; `ApprovalRules`,
            ``"auto"`` or a callback decide without PydanticAI (only calls they leave to ``"ask"``
            reach it). Without a `HandleDeferredToolCalls` capability, ``"ask"`` needs
            `DeferredToolRequests` among the run's output types: PydanticAI refuses the deferred
            call otherwise, and the paused action ends after its ``ttl``.
        ttl: Seconds a code action may stay paused waiting for an approval before it is cancelled.
        timeout: Seconds a code action may run, not counting approval waits (default: the
            executor's).
        catalogue: What the instructions show of the generated tools: ``"auto"`` (default) every
            tool's stub while they fit 32,000 characters, else only servers and tool names;
            ``"stubs"`` or ``"summary"`` forces one. While the summary is shown, the toolset also
            offers ``search_tools`` (query, k), which returns the stubs of the best matches; it
            reads the tools directory only and needs no approval.
        secret: Durable approvals (the executor's kernel must be a `GatewayKernel`): a code action
            that asks for an approval nobody answers inline is suspended (`CodeExecutor.suspend`,
            held ``ttl`` seconds) and its locator put in the deferred call's metadata, which
            `mcp_approval_results` copies into the results; a run resumed from stored message
            history in any process with the same secret resumes the action from it. At least 32
            random bytes, the same on every worker. None: the action waits in this process.
    """

    def __init__(
        self,
        executor: CodeExecutor,
        *,
        id: str = "ipybox",
        tool_name: str = TOOL_NAME,
        servers: Sequence[str] | None = None,
        approval: Approval | None = "ask",
        ttl: float | None = DEFAULT_TTL,
        timeout: float | None = None,
        catalogue: Catalogue = "auto",
        secret: bytes | None = None,
    ) -> None:
        if isinstance(servers, str):
            raise UsageError(f"servers takes a list of names, got the string {servers!r}; pass [{servers!r}]")
        if tool_name == SEARCH_TOOL_NAME:
            raise UsageError(f"{SEARCH_TOOL_NAME!r} names the toolset's search tool; give the code tool another name")
        self.executor = executor
        self._id = id
        self.tool_name = tool_name
        self._servers = list(servers) if servers is not None else None
        self._approval: Approval | None = approval
        self._ttl = ttl
        self._timeout = timeout
        self._durable = Durable.of(secret, ttl)
        self._tool_def = ToolDefinition(
            name=tool_name,
            parameters_json_schema=_PARAMETERS,
            description=_DESCRIPTION,
            # One kernel runs one action at a time; calls in one response run in the order written.
            sequential=True,
        )
        self._catalogue: Catalogue = catalogue
        self._search_def = ToolDefinition(
            name=SEARCH_TOOL_NAME, parameters_json_schema=_SEARCH_PARAMETERS, description=SEARCH_TOOL_DESCRIPTION
        )
        self._instructions: tuple[object, ToolText] | None = None
        # The request each paused execution surfaced as ApprovalRequired: a resumed call's approval
        # answers that request only, never one the code reaches after an approval of something else
        # (such as the whole action, by an ApprovalRequiredToolset around this one).
        self._surfaced: weakref.WeakKeyDictionary[Execution, str] = weakref.WeakKeyDictionary()

    @property
    def id(self) -> str:
        return self._id

    async def get_instructions(self, ctx: RunContext[AgentDepsT]) -> InstructionPart:
        # Called before every model request, after the request that carries the results of the
        # previous tool calls joined the history: the one place a toolset sees a call PydanticAI
        # denied without calling the tool again.
        self._abort_denied(ctx)
        return InstructionPart(self._render_instructions().text, dynamic=True, on_change="append", name="tools")

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        tools = {
            self.tool_name: ToolsetTool(
                toolset=self, tool_def=self._tool_def, max_retries=1, args_validator=_ARGS_VALIDATOR
            )
        }
        if self._render_instructions().needs_search:
            tools[SEARCH_TOOL_NAME] = ToolsetTool(
                toolset=self, tool_def=self._search_def, max_retries=1, args_validator=_SEARCH_ARGS_VALIDATOR
            )
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT], tool: ToolsetTool[AgentDepsT]
    ) -> str | list[str | BinaryContent]:
        if name == SEARCH_TOOL_NAME:
            return await search_stubs(
                self.executor.tools_dir, tool_args["query"], tool_args.get("k", 5), servers=self._servers
            )
        code: str = tool_args["code"]
        key = self._key(ctx, ctx.tool_call_id or uuid.uuid4().hex)
        metadata = ctx.tool_call_metadata
        durable = self._durable
        first: ApprovalDecision | None = None
        try:
            if durable is not None and _answers_a_request(metadata) and "locator" in metadata:
                # A durable resume: the action waits on the gateway, suspended by whichever process
                # ran it; its locator is bound to this tool call's key.
                first, shown = _resume_decision({k: v for k, v in metadata.items() if k != "locator"})
                execution = durable.resume(self.executor, metadata["locator"], key, first, shown)
            elif _answers_a_request(metadata):
                # A resume with a decision on one of this action's requests: its execution must
                # exist, even in a process that never started it (which start_or_attach cannot tell).
                execution = self.executor.attach(key)
            else:
                execution = start_or_attach(
                    self.executor, key, code, approval=self._approval, ttl=self._ttl, timeout=self._timeout
                )
        except ExecutionLost as exc:
            raise ToolFailed(ActionOutcome.lost(exc).text) from None
        except InvalidLocator as exc:
            raise ToolFailed(f"refused to resume the code action, nothing was run: {exc}") from None
        resumed = ctx.tool_call_approved and first is None

        async def defer(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
            self._surfaced[execution] = request.id
            raise ApprovalRequired(metadata=payload.to_json())

        later: Decide = defer if durable is None else suspending(self.executor, execution, durable, defer)

        async def ask(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
            nonlocal resumed
            if resumed and self._surfaced.get(execution) == request.id:
                resumed = False
                decision, request_id = _resume_decision(ctx.tool_call_metadata)
                check_answers(execution, request, request_id)
                return decision
            decision = await _ask_inline(ctx, payload)
            if decision is not None:
                return decision
            try:
                return await later(request, payload)
            except Suspended as suspended:
                raise ApprovalRequired(metadata=suspended.payload.to_json()) from None

        async def show(chunk: CodeExecutionChunk) -> None:
            await ctx.emit(KernelOutputEvent(text=chunk.text, stream=chunk.stream))

        try:
            outcome = await drive(execution, ask, on_output=show)
        except anyio.get_cancelled_exc_class():
            # The run was cancelled: nothing can resume this call, so free the kernel.
            execution.cancel()
            raise
        if outcome.failed:
            raise ToolFailed(outcome.text)
        return _tool_return(outcome)

    def _key(self, ctx: RunContext[AgentDepsT], tool_call_id: str) -> str:
        # The conversation id is taken from the message history a resumed run is given, so it is
        # stable across the runs of one action, as the tool call id is.
        return f"{_KEY_PREFIX}:{self._id}:{ctx.conversation_id or ''}:{tool_call_id}"

    def _abort_denied(self, ctx: RunContext[AgentDepsT]) -> None:
        request = ctx.messages[-1] if ctx.messages else None
        if not isinstance(request, ModelRequest):
            return
        for part in request.parts:
            if isinstance(part, ToolReturnPart) and part.outcome == "denied":
                with contextlib.suppress(ExecutionLost):  # else not an action of this toolset
                    self.executor.attach(self._key(ctx, part.tool_call_id)).cancel()

    def _render_instructions(self) -> ToolText:
        root, skills = self.executor.tools_dir, self.executor.skills_dir
        # A saved skill changes the instructions as much as generated tools do.
        stamp = (_tree_stamp(root), _tree_stamp(skills))
        if self._instructions is None or self._instructions[0] != stamp:
            text = describe_tools(
                root,
                servers=self._servers,
                catalogue=self._catalogue,
                search_tool=SEARCH_TOOL_NAME,
                skills_dir=skills,
            )
            self._instructions = (stamp, text)
        return self._instructions[1]


def _tree_stamp(root: Path | None) -> object:
    """Changes whenever `generate_mcp_sources` writes to ``root`` (it renames a staged package into
    place), at the cost of one directory scan instead of parsing every generated module."""
    if root is None:
        return None
    try:
        with os.scandir(root) as entries:
            return (root.stat().st_mtime_ns, sorted((e.name, e.stat().st_mtime_ns) for e in entries))
    except OSError:
        return None


def _answers_a_request(metadata: object) -> bool:
    return isinstance(metadata, Mapping) and "request_id" in metadata


def _resume_decision(metadata: object) -> tuple[ApprovalDecision, str | None]:
    """The decision a resumed call carries, and the request it names: none (a plain `ToolApproved()`)
    approves; else what `mcp_approval_results` wrote."""
    return (ApprovalDecision(approved=True), None) if metadata is None else parse_decision(metadata)


async def _ask_inline(ctx: RunContext[Any], payload: ApprovalPayload) -> ApprovalDecision | None:
    """Offer the MCP call to the run's `HandleDeferredToolCalls` handler; None when nobody answers."""
    if ctx.tool_manager is None:
        return None
    call = ToolCallPart(payload.call_name, dict(payload.args), tool_call_id=payload.request_id)
    requests = DeferredToolRequests(approvals=[call], metadata={payload.request_id: payload.to_json()})
    results = await ctx.tool_manager.resolve_deferred_tool_calls(requests)
    verdict = results.to_tool_call_results().get(payload.request_id) if results is not None else None
    if verdict is None:
        return None
    # PydanticAI's verdicts, converted here: a denial's message is the reason.
    if isinstance(verdict, ToolApproved):
        if verdict.override_args is not None:
            reason = "the approver tried to change the call's arguments, which ipybox cannot do"
            return ApprovalDecision(approved=False, reason=reason)
        return ApprovalDecision(approved=True)
    if isinstance(verdict, ToolDenied):
        return ApprovalDecision(approved=False, reason=verdict.message)
    reason = f"the approval handler answered with {type(verdict).__name__}, not an approval"
    return ApprovalDecision(approved=False, reason=reason)


def _tool_return(outcome: ActionOutcome) -> str | list[str | BinaryContent]:
    if not outcome.images:
        return outcome.text
    content: list[str | BinaryContent] = [outcome.text] if outcome.text else []
    for image in outcome.images:
        if image.mime in _MODEL_IMAGES:
            content.append(BinaryContent(data=image.data, media_type=image.mime))
        else:
            content.append(f"(an {image.mime} image was displayed; models are shown PNG and JPEG only)")
    return content


def pending_mcp_calls(requests: DeferredToolRequests) -> dict[str, ApprovalPayload]:
    """The MCP calls waiting for approval in a run's `DeferredToolRequests`, by tool call id.

    Approvals of other tools in ``requests`` are left out; answer them as usual.
    """
    pending: dict[str, ApprovalPayload] = {}
    for call in requests.approvals:
        data = requests.metadata.get(call.tool_call_id)
        if data is None or not {"request_id", "server", "tool", "args", "description"} <= data.keys():
            continue
        pending[call.tool_call_id] = ApprovalPayload(
            request_id=data["request_id"],
            server=data["server"],
            tool=data["tool"],
            args=data["args"],
            description=data["description"],
            annotations=data.get("annotations"),
            undeclared_args=tuple(data.get("undeclared_args", ())),
            arguments_checked=data.get("arguments_checked") is True,
            left_running=data.get("left_running"),
            call_site=data.get("call_site"),
            question=data.get("question"),
            locator=data.get("locator"),
        )
    return pending


def mcp_approval_results(
    requests: DeferredToolRequests,
    decisions: Mapping[str, ApprovalDecision | Decision | bool],
    *,
    answered_by: Mapping[str, str] | None = None,
) -> DeferredToolResults:
    """Results that resume a run with a decision on each MCP call, by tool call id.

    Each decision, approval or rejection, is sent as `ToolApproved` with the decision in its
    metadata: PydanticAI then calls the tool again, which re-attaches to the paused code and answers
    the MCP call, and a rejection raises ``ToolCallRejected(reason)`` in the code, which may go on.
    (A bare `ToolDenied` aborts the whole code action instead.) A decision is an `ApprovalDecision`
    or a bool (the deprecated `Decision` is still read). A server's question during a call (a
    payload with ``question``) is accepted only by an `ApprovalDecision` with ``content`` (its
    answer); an approval without one declines it.

    Raises:
        UsageError: A key of ``decisions`` is not one of ``pending_mcp_calls(requests)``.
    """
    pending = pending_mcp_calls(requests)
    if unknown := sorted(set(decisions) - set(pending)):
        raise UsageError(
            f"no MCP call waits for approval under tool call id(s) {unknown}; "
            f"decide the ids of pending_mcp_calls(requests): {sorted(pending)}"
        )
    results = DeferredToolResults(answered_by=dict(answered_by or {}))
    for tool_call_id, value in decisions.items():
        results.approvals[tool_call_id] = ToolApproved()
        # A durable action's locator goes with the decision: the process that resumes the run
        # resumes the action from it.
        locator = pending[tool_call_id].locator
        durable = {"locator": locator} if locator is not None else {}
        if isinstance(value, ApprovalDecision) and value.approved and value.content is not None:
            results.metadata[tool_call_id] = {
                "type": "answer",
                "content": dict(value.content),
                "request_id": pending[tool_call_id].request_id,
                **durable,
            }
            continue
        approved, reason = _approved_and_reason(value)
        # The frameworks' resume shape (parse_decision reads it back): "message" is the reason.
        results.metadata[tool_call_id] = {
            "type": "approve" if approved else "reject",
            "request_id": pending[tool_call_id].request_id,
            **({"message": reason} if not approved and reason else {}),
            **durable,
        }
    return results


def _approved_and_reason(value: ApprovalDecision | Decision | bool) -> tuple[bool, str | None]:
    if isinstance(value, bool):
        return value, None
    if isinstance(value, Decision):
        return value.approved, value.message
    return value.approved, value.reason
