"""ipybox as an OpenAI Agents SDK tool: one code action, its MCP calls approved on the run.

``ipybox_tool(executor)`` returns a `FunctionTool` for an `Agent`. By default each MCP call the code
makes surfaces as an entry of ``result.interruptions``, named ``server__tool`` with the call's
arguments, and is answered the way SDK users know: ``state.approve(item)`` (``always_approve=True``
too), ``state.reject(item, rejection_message=...)``, then ``Runner.run(agent, state)``. The code waits,
paused, in the kernel meanwhile; the `RunState` can be serialised and restored.

The code action's approvals can also be decided while the tool waits, by a handler, with no
interruption (``approval=handler``), or by the executor's own policy (``approval=None``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeAlias

from agents import FunctionTool, RunContextWrapper, ToolOutputImage, ToolOutputText, function_tool
from agents.tool_context import ToolContext

from ipybox import ApprovalDecision, ApprovalRequest, CodeExecutor, UsageError
from ipybox.integrations._core import (
    DEFAULT_TTL,
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    TOOL_NAME,
    ApprovalPayload,
    Catalogue,
    Durable,
    describe_tools,
    drive,
    parse_decision,
    search_stubs,
    tool_instructions,
)

from ._nested import interrupting_tool
from ._shared import NeedsApproval, OutputHandler, action_step_span, output_sink, tool_output

__all__ = (
    "ApprovalHandler",
    "NeedsApproval",
    "OutputHandler",
    "ipybox_search_tool",
    "ipybox_tool",
    "ipybox_tools",
    "tool_instructions",
)

ApprovalHandler: TypeAlias = Callable[
    [RunContextWrapper[Any], ApprovalRequest],
    "bool | ApprovalDecision | Awaitable[bool | ApprovalDecision]",
]
"""Decides one MCP call while the tool waits: ``(run context, request) -> approved?``. The run context
is the tool's (``ctx.context`` is the application's context object, ``ctx.tool_call_id`` the call)."""


def ipybox_tool(
    executor: CodeExecutor,
    *,
    approval: Literal["interrupt"] | ApprovalHandler | None = "interrupt",
    needs_approval: NeedsApproval = False,
    on_output: OutputHandler | None = None,
    name: str = TOOL_NAME,
    description: str | None = None,
    ttl: float | None = DEFAULT_TTL,
    timeout: float | None = None,
    catalogue: Catalogue = "auto",
    search_tool: str | None = None,
    secret: bytes | None = None,
) -> FunctionTool:
    """A function tool that runs the model's Python code in the executor's kernel.

    Args:
        executor: A started `CodeExecutor`; its generated MCP tools are what the code may call.
        approval: How the MCP calls of the running code are approved:
            ``"interrupt"`` (default): each call is an entry of ``result.interruptions`` named
            ``server__tool``, answered on the `RunState`; the execution waits (at most ``ttl``
            seconds) while the run is interrupted;
            a callable (`ApprovalHandler`): called for each call while the tool waits, with no
            interruption;
            None: the executor's own policy (``ApprovalRules``, a callback, ``"auto"``); calls it
            leaves to be asked are rejected.
        needs_approval: Review the code before it runs: the SDK's ``needs_approval`` on this tool.
        on_output: Gets the code's output as it is printed, with the tool's context (the SDK has no
            custom tool events; put a queue or a websocket on your run context).
        name: The tool's name.
        description: The tool's description; default: `tool_instructions` with the typed stubs of
            the executor's generated tools.
        ttl: Seconds a code action may wait for an approval before it is cancelled.
        timeout: Seconds the code may run (time waiting for approvals not counted); None: the
            executor's default.
        catalogue: What the default description shows of the tools: ``"auto"`` every tool's stub
            while they fit 32,000 characters, else only servers and tool names; ``"stubs"`` or
            ``"summary"`` forces one.
        search_tool: The name of an `ipybox_search_tool` the agent also has; a summary points to
            it (else to the search in kernel code). `ipybox_tools` sets it.
        secret: Durable approvals, with ``approval="interrupt"`` (the executor's kernel must be a
            `GatewayKernel`): at each interruption the code action is suspended
            (`CodeExecutor.suspend`, held ``ttl`` seconds) and its locator kept in the nested
            call's id, which the `RunState` keeps; a run restored from ``to_string()`` in any
            process with the same secret resumes the action there, once. At least 32 random bytes,
            the same on every worker. None: the action waits in this process.

    Returns:
        The tool. Its output is the code's text output (a clean traceback when it raised), plus the
        PNG, JPEG, GIF or WebP images it displayed as `ToolOutputImage` parts the model can see.
    """
    if description is None:
        description = describe_tools(
            executor.tools_dir, catalogue=catalogue, search_tool=search_tool, skills_dir=executor.skills_dir
        ).text
    durable = Durable.of(secret, ttl)
    if approval == "interrupt":
        return interrupting_tool(
            executor,
            name=name,
            description=description,
            needs_approval=needs_approval,
            on_output=on_output,
            ttl=ttl,
            timeout=timeout,
            durable=durable,
        )
    if durable is not None:
        raise UsageError('durable approvals (secret=...) need approval="interrupt": only interruptions are stored')
    if approval is not None and not callable(approval):
        raise UsageError(f"approval must be 'interrupt', a callable or None, got {approval!r}")
    return _waiting_tool(
        executor,
        approval,
        name=name,
        description=description,
        needs_approval=needs_approval,
        on_output=on_output,
        timeout=timeout,
    )


def _waiting_tool(
    executor: CodeExecutor,
    handler: ApprovalHandler | None,
    *,
    name: str,
    description: str,
    needs_approval: NeedsApproval,
    on_output: OutputHandler | None,
    timeout: float | None,
) -> FunctionTool:
    """The tool without interruptions: the handler (or the executor's policy) decides while it waits."""

    async def execute_code(ctx: ToolContext[Any], code: str) -> str | list[ToolOutputText | ToolOutputImage]:
        """Run Python code in the sandboxed kernel.

        Args:
            code: The Python code to run.
        """

        async def decide(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
            if handler is None:
                reason = f"nobody can approve {payload.name} here: the application set no approval for this tool"
                return ApprovalDecision(approved=False, reason=reason)
            answer = handler(ctx, request)
            if inspect.isawaitable(answer):
                answer = await answer
            return parse_decision(answer)[0]

        # No key: nothing comes back to this execution, so a cancelled tool call cancels it.
        execution = executor.execute(code, approval="ask" if handler is not None else None, timeout=timeout)
        with action_step_span(execution, resumed=False) as ended:
            outcome = await drive(execution, decide, on_output=output_sink(on_output, ctx))
            ended(outcome)
        return tool_output(outcome)

    return function_tool(
        execute_code,
        name_override=name,
        description_override=description,
        needs_approval=needs_approval,
    )


def ipybox_tools(executor: CodeExecutor, *, catalogue: Catalogue = "auto", **kwargs: Any) -> list[FunctionTool]:
    """The code tool, and with it `ipybox_search_tool` when its description shows only the summary
    of a large catalogue.

    Args:
        executor: A started `CodeExecutor`.
        catalogue: ``"auto"``, ``"stubs"`` or ``"summary"`` (see `ipybox_tool`).
        **kwargs: Other `ipybox_tool` arguments.
    """
    text = describe_tools(
        executor.tools_dir, catalogue=catalogue, search_tool=SEARCH_TOOL_NAME, skills_dir=executor.skills_dir
    )
    kwargs.setdefault("description", text.text)
    code = ipybox_tool(executor, **kwargs)
    return [code, ipybox_search_tool(executor)] if text.needs_search else [code]


def ipybox_search_tool(executor: CodeExecutor, *, name: str = SEARCH_TOOL_NAME) -> FunctionTool:
    """A function tool that finds the executor's generated MCP tools by what they should do and
    returns their typed stubs. It reads the tools directory only: no approval, no kernel."""

    async def search_tools(query: str, k: int = 5) -> str:
        """Find tools by what they should do.

        Args:
            query: What the tool should do, in words.
            k: How many tools to return (at most 20).
        """
        return await search_stubs(executor.tools_dir, query, k)

    return function_tool(search_tools, name_override=name, description_override=SEARCH_TOOL_DESCRIPTION)
