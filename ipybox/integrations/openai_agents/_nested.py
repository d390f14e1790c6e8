"""The interrupting shape of the OpenAI Agents tool: MCP approvals as the outer run's interruptions.

The SDK has no way for a running function tool to ask for approval, but it does surface the
approvals of a nested agent run as the outer run's interruptions, and resumes the nested run from the
outer `RunState` (`Agent.as_tool`). So the code action is a nested agent whose "model" drives the
kernel: the first model call starts the execution, each approval request becomes a call of a
pass-through tool ``server__tool`` that needs approval, and the end of the code becomes the nested
run's final message. (A new call runs its code directly and hands over to the nested run only when
the code asks for its first approval: code without MCP calls costs no nested run.) The execution's
key lives in those nested call ids, which the `RunState` keeps, so a resumed run re-attaches to the
same paused execution and a resume whose execution is gone reports "execution lost" and runs
nothing. `tests/integrations/test_openai_agents.py` pins the SDK behaviour this relies on.
"""

from __future__ import annotations

import contextvars
import re
import secrets
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
from agents import (
    Agent,
    FunctionTool,
    MessageOutputItem,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    RunResult,
    RunResultStreaming,
    ToolOutputImage,
    ToolOutputText,
    Usage,
)
from agents.agent_tool_state import get_agent_tool_state_scope, peek_agent_tool_run_result
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic import ValidationError

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutor,
    Execution,
    ExecutionLost,
    InvalidLocator,
    UsageError,
)
from ipybox._approval._rendering import safe_json
from ipybox.integrations._core import (
    ActionOutcome,
    ApprovalPayload,
    Decide,
    Durable,
    Suspended,
    drive,
    start_or_attach,
    suspending,
)
from ipybox_kernel._search import tool_index

from ._shared import CodeArgs, NeedsApproval, OutputHandler, action_step_span, output_sink, tool_output

__all__ = ("interrupting_tool",)

_KEY_PREFIX = "openai-agents:"
# Separates the execution key from the request id in a nested call id ("<key>|<request id>"), and
# with durable approvals from the suspended action's locator ("<key>|<request id>|<locator>"): the
# RunState keeps call ids, and none of the three has a "|".
_SEP = "|"
# Each MCP call is one turn of the nested run; the SDK's default of 10 turns would end long actions.
_MAX_MCP_CALLS = 10_000
# Outcomes waiting for the SDK to ask for the nested run's output (normally at once); bounded so
# that runs abandoned in between cannot grow the host's memory.
_OUTCOMES = 1_000
# Outer tool call ids remembered as handed over to a nested run: only ids, oldest dropped first.
_HANDED_OVER = 10_000
# OpenAI tool names: letters, digits, '_' and '-', at most 64.
_NAME_LIMIT = 64
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")

# Outer tool calls whose code action was handed over to a nested run (bounded, oldest dropped).
_handed_over: OrderedDict[str, None] = OrderedDict()
# Nested calls of suspended actions whose approval gate ran in this process (approved): the nested
# model reads them as the approval when it resumes the action (bounded, oldest dropped).
_approved_suspended: OrderedDict[str, None] = OrderedDict()
# The key of the execution a new nested run takes over instead of starting one, with the request it
# stopped at when it was suspended (durable approvals: there is no execution here to re-walk).
_handoff: contextvars.ContextVar[tuple[str, ApprovalPayload | None] | None] = contextvars.ContextVar(
    "ipybox_openai_agents_handoff", default=None
)
_tool_context: contextvars.ContextVar[ToolContext[Any] | None] = contextvars.ContextVar(
    "ipybox_openai_agents_tool_context", default=None
)


def interrupting_tool(
    executor: CodeExecutor,
    *,
    name: str,
    description: str,
    needs_approval: NeedsApproval,
    on_output: OutputHandler | None,
    ttl: float | None,
    timeout: float | None,
    durable: Durable | None = None,
) -> FunctionTool:
    """The nested kernel-driver agent as a tool: MCP approvals become the outer run's interruptions."""
    calls = {**_call_names(executor.tools_dir), **_builtin_call_names(executor)}
    driver = _KernelDriver(executor, calls, on_output=on_output, ttl=ttl, timeout=timeout, durable=durable)
    kernel = Agent[Any](
        name="ipybox kernel",
        tools=[
            _approval_gate(executor, call, f"MCP tool {label}: {summary}") for call, (label, summary) in calls.items()
        ],
        model=driver,
    )

    async def output(result: RunResult | RunResultStreaming) -> str:
        # The SDK passes this value on as the tool's output; text and images are what it accepts.
        return cast("str", driver.output(result))

    tool = kernel.as_tool(
        tool_name=name,
        tool_description=description,
        custom_output_extractor=output,
        # The outer run's config may name a model for every agent; the kernel driver must stay.
        run_config=RunConfig(model=driver, workflow_name="ipybox code action"),
        max_turns=_MAX_MCP_CALLS,
        needs_approval=needs_approval,
        parameters=CodeArgs,
        input_builder=lambda data: str(data.get("params", {})["code"]),
    )
    invoke = tool.on_invoke_tool

    async def invoke_with_context(ctx: ToolContext[Any], arguments: str) -> Any:
        # The nested model gets no run context; the application's output handler needs it.
        token = _tool_context.set(ctx)
        try:
            code = _fresh_code(ctx, arguments)
            if code is None:
                return await invoke(ctx, arguments)
            # A new call: run the code straight away, and pay for a nested agent run (about 3 ms of
            # the SDK's CPU) only when it asks for an approval.
            key, step = await driver.begin(code)
            if isinstance(step, ActionOutcome):
                return tool_output(step)
            _handed_over[ctx.tool_call_id] = None
            while len(_handed_over) > _HANDED_OVER:
                _handed_over.popitem(last=False)
            handoff = _handoff.set((key, step if step.locator is not None else None))
            try:
                return await invoke(ctx, arguments)
            finally:
                _handoff.reset(handoff)
        finally:
            _tool_context.reset(token)

    tool.on_invoke_tool = invoke_with_context
    return tool


def _fresh_code(ctx: ToolContext[Any], arguments: str) -> str | None:
    """The code of a tool call seen for the first time, or None for a resumed one (or arguments the
    SDK's own path should report on).

    A resumed call has a nested run the SDK keeps for it (in memory, or restored from a `RunState`);
    this asks the SDK's agent-tool state for it, and also remembers the calls this process handed over
    to a nested run, so that both must fail before a resumed call could start its code again.
    """
    if ctx.tool_call is None or ctx.tool_call_id in _handed_over:
        return None
    if peek_agent_tool_run_result(ctx.tool_call, scope_id=get_agent_tool_state_scope(ctx)) is not None:
        return None
    try:
        return CodeArgs.model_validate_json(arguments).code
    except ValidationError:
        return None


def _call_name(server: str, tool: str) -> str:
    return _UNSAFE_NAME.sub("_", f"{server}__{tool}")[:_NAME_LIMIT]


def _call_names(tools_dir: Path | None) -> dict[str, tuple[str, str]]:
    """``server__tool`` → (name, description) for every generated tool under ``tools_dir``, from the
    tool search's index (read from the generated files; nothing is imported)."""
    if tools_dir is None or not tools_dir.is_dir():
        return {}
    entries = tool_index(tools_dir).entries
    return {_call_name(e.server, e.tool): (f"{e.server}.{e.tool}", e.description) for e in entries}


def _builtin_call_names(executor: CodeExecutor) -> dict[str, tuple[str, str]]:
    """The approval tools for ipybox's own tools that this executor's kernel code can ask for:
    package installs (``%pip``), saving skills and, when unlisted destinations are asked, network
    connections. Without them such a request could not become an interruption and was refused."""
    calls = {_call_name("ipybox", "install_package"): ("ipybox.install_package", "install a package for the kernel")}
    if executor.skills_dir is not None:
        calls[_call_name("ipybox", "save_skill")] = ("ipybox.save_skill", "save code as a skill later code can import")
    if executor.network is not None and executor.network.unlisted == "ask":
        calls[_call_name("ipybox", "connect")] = ("ipybox.connect", "open a network connection to host:port")
    return calls


def _approval_gate(executor: CodeExecutor, call_name: str, description: str) -> FunctionTool:
    """A tool named after one MCP tool that needs approval; it runs only once the call was approved,
    and lets the paused call run."""

    async def approved(ctx: ToolContext[Any], arguments: str) -> str:
        key, request_id, locator = _split_call_id(ctx.tool_call_id)
        if locator is not None:
            # A suspended action: the nested model resumes it from the locator, approved.
            _approved_suspended[ctx.tool_call_id] = None
            while len(_approved_suspended) > _HANDED_OVER:
                _approved_suspended.popitem(last=False)
            return "approved"
        try:
            executor.attach(key).approval(request_id).decide(ApprovalDecision(approved=True, by="adapter"))
        except ExecutionLost:
            return "approved, but the code action is gone"
        return "approved"

    return FunctionTool(
        name=call_name,
        description=description,
        params_json_schema={"type": "object", "additionalProperties": True},
        on_invoke_tool=approved,
        strict_json_schema=False,
        needs_approval=True,
    )


def _split_call_id(call_id: str) -> tuple[str, str, str | None]:
    """(key, request id, locator or None) of a nested call id."""
    key, _, rest = call_id.partition(_SEP)
    request_id, sep, locator = rest.partition(_SEP)
    return key, request_id, locator if sep else None


@dataclass
class _Busy:
    """The adapter's code actions of one executor: who drives the kernel now, who is paused."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    paused: dict[str, Execution] = field(default_factory=dict[str, Execution])


_executors: weakref.WeakKeyDictionary[CodeExecutor, _Busy] = weakref.WeakKeyDictionary()


def _busy(executor: CodeExecutor) -> _Busy:
    busy = _executors.get(executor)
    if busy is None:
        busy = _executors[executor] = _Busy()
    return busy


class _Ask(Exception):
    """Stops the walk of an execution at a request that needs the run's approval."""

    def __init__(self, request: ApprovalRequest, payload: ApprovalPayload) -> None:
        super().__init__(request.id)
        self.request = request
        self.payload = payload


async def _ask(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
    raise _Ask(request, payload)


def _field(item: object, name: str) -> Any:
    if isinstance(item, Mapping):
        return cast("Mapping[str, Any]", item).get(name)
    return getattr(item, name, None)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[Any] = list(content or [])
    return "".join(str(_field(part, "text") or "") for part in parts)


class _KernelDriver(Model):
    """The nested agent's model: it runs the code and answers with the kernel's next step."""

    def __init__(
        self,
        executor: CodeExecutor,
        calls: Mapping[str, tuple[str, str]],
        *,
        on_output: OutputHandler | None,
        ttl: float | None,
        timeout: float | None,
        durable: Durable | None = None,
    ) -> None:
        self._executor = executor
        self._durable = durable
        self._calls = calls
        self._on_output = on_output
        self._ttl = ttl
        self._timeout = timeout
        self._outcomes: OrderedDict[str, ActionOutcome] = OrderedDict()

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        asked = [_field(item, "call_id") for item in items if _field(item, "type") == "function_call"]
        # One code action at a time per kernel: drive them in turn, so that a second one never starts
        # (and waits behind a paused one in the kernel, a deadlock) without knowing why it cannot run.
        async with _busy(self._executor).lock:
            if not asked:
                handed_over = _handoff.get()
                if handed_over is None:
                    return self._respond(*await self._start(_text(_field(items[0], "content"))))
                key, suspended = handed_over
                if suspended is not None:
                    return self._respond(key, suspended)
                execution = self._executor.attach(key)
            else:
                key, _, locator = _split_call_id(str(asked[0]))
                _busy(self._executor).paused.pop(key, None)
                if locator is not None and self._durable is not None:
                    return self._respond(key, await self._resume(key, str(asked[0]), locator, items, self._durable))
                try:
                    execution = self._executor.attach(key)
                    # A call output whose request is still open was rejected (an approved one ran its
                    # gate, which answered it); the output is the application's rejection message.
                    for item in items:
                        if _field(item, "type") == "function_call_output":
                            request_id = _split_call_id(str(_field(item, "call_id")))[1]
                            request = execution.approval(request_id)
                            if request.decision is None:
                                # The SDK's rejection message, converted here: it is the reason.
                                reason = _text(_field(item, "output")) or None
                                request.decide(ApprovalDecision(approved=False, reason=reason, by="adapter"))
                except ExecutionLost as exc:
                    return self._respond(key, ActionOutcome.lost(exc))
            return self._respond(key, await self._advance(key, execution, resumed=True))

    async def _resume(
        self, key: str, call_id: str, locator: str, items: list[Any], durable: Durable
    ) -> ActionOutcome | ApprovalPayload:
        """Resume a suspended action from the locator its nested call carried, with the run's answer:
        approved if its gate ran here, else rejected with the call's output (the rejection message)."""
        if call_id in _approved_suspended:
            del _approved_suspended[call_id]
            decision = ApprovalDecision(approved=True)
        else:
            outputs = [_field(i, "output") for i in items if _field(i, "type") == "function_call_output"]
            decision = ApprovalDecision(approved=False, reason=_text(outputs[-1]) if outputs else None)
        try:
            execution = durable.resume(self._executor, locator, key, decision, _split_call_id(call_id)[1])
        except InvalidLocator as exc:
            return ActionOutcome(text=f"refused to resume the code action, nothing was run: {exc}", error=exc)
        except ExecutionLost as exc:
            return ActionOutcome.lost(exc)
        with action_step_span(execution, resumed=True) as ended:
            step = await self._step(key, execution)
            ended(step)
        return step

    async def begin(self, code: str) -> tuple[str, ActionOutcome | ApprovalPayload]:
        """Start a code action outside a nested run, and run it to its first approval or its end."""
        async with _busy(self._executor).lock:
            return await self._start(code)

    async def _start(self, code: str) -> tuple[str, ActionOutcome | ApprovalPayload]:
        """The one place a code action starts."""
        key = f"{_KEY_PREFIX}{secrets.token_hex(12)}"
        busy = _busy(self._executor)
        for other, execution in list(busy.paused.items()):
            if execution.done:
                del busy.paused[other]
            else:
                return key, ActionOutcome(
                    text="not run: another code action is paused in this kernel, waiting for an MCP call to be "
                    "approved, and the kernel runs one action at a time; run this code again once it is answered",
                    error=UsageError("the kernel is paused in another code action"),
                )
        execution = start_or_attach(self._executor, key, code, approval="ask", ttl=self._ttl, timeout=self._timeout)
        return key, await self._advance(key, execution, resumed=False)

    async def _advance(self, key: str, execution: Execution, *, resumed: bool) -> ActionOutcome | ApprovalPayload:
        """Run the execution on to its next approval request for the run, or its end."""
        with action_step_span(execution, resumed=resumed) as ended:
            step = await self._step(key, execution)
            ended(step)
        return step

    async def _step(self, key: str, execution: Execution) -> ActionOutcome | ApprovalPayload:
        sink = output_sink(self._on_output, _tool_context.get())
        decide: Decide = _ask
        if self._durable is not None:
            decide = suspending(self._executor, execution, self._durable, _ask)
        while True:
            try:
                return await drive(execution, decide, on_output=sink)
            except Suspended as suspended:
                # Nothing to hold here: the kernel went with the action, and its locator goes in the
                # nested call's id, which the RunState keeps.
                return suspended.payload
            except _Ask as ask:
                if _call_name(ask.payload.server, ask.payload.tool) in self._calls:
                    _busy(self._executor).paused[key] = execution
                    return ask.payload
                execution.answer(
                    ask.request.id,
                    False,
                    f"{ask.payload.name} has no generated module this tool was built with; generate the "
                    "server's sources and create the tool again",
                )

    def _respond(self, key: str, step: ActionOutcome | ApprovalPayload) -> ModelResponse:
        if isinstance(step, ApprovalPayload):
            return self._call(key, _call_name(step.server, step.tool), step)
        return self._finish(key, step)

    def _call(self, key: str, call_name: str, payload: ApprovalPayload) -> ModelResponse:
        call_id = f"{key}{_SEP}{payload.request_id}"
        if payload.locator is not None:
            call_id += f"{_SEP}{payload.locator}"
        # Whole, and escaped like every approval text: an approval UI shows this string as it is.
        arguments = safe_json(payload.to_json()["args"])
        call = ResponseFunctionToolCall(
            id=call_id, call_id=call_id, type="function_call", name=call_name, arguments=arguments
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def _finish(self, key: str, outcome: ActionOutcome) -> ModelResponse:
        self._outcomes[key] = outcome
        while len(self._outcomes) > _OUTCOMES:
            self._outcomes.popitem(last=False)
        text = ResponseOutputText(type="output_text", text=outcome.text, annotations=[], logprobs=[])
        message = ResponseOutputMessage(id=key, type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def output(self, result: RunResult | RunResultStreaming) -> str | list[ToolOutputText | ToolOutputImage]:
        """The tool output of a finished nested run: the outcome its last message stands for."""
        for item in reversed(result.new_items):
            if isinstance(item, MessageOutputItem):
                outcome = self._outcomes.pop(str(item.raw_item.id), None)
                if outcome is not None:
                    return tool_output(outcome)
        return str(result.final_output)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        # `as_tool` streams the nested run only with `on_stream`, which this tool never sets.
        raise UsageError("the ipybox kernel driver is not streamed; use ipybox_tool's on_output for progress")
