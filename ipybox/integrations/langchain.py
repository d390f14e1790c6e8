"""LangChain / LangGraph: ipybox as the code-action tool of an agent, every MCP call it makes a
LangGraph interrupt.

```python
from ipybox.integrations.langchain import IpyboxTool

agent = create_agent(model, tools=[IpyboxTool(executor=executor)], checkpointer=InMemorySaver())
```

With a checkpointer, each MCP call the running code makes pauses the graph with `interrupt()`; the
value looks like `HumanInTheLoopMiddleware`'s per-call request, and the answer is one of its
decisions (``{"type": "approve"}``, ``{"type": "reject", "message": "..."}``), given by interrupt id.
LangGraph resumes by running the tool again from the top; the tool then re-attaches to the execution
that waited in the kernel meanwhile and replays its events, so the code runs once. Without a
checkpointer nothing can pause, and the executor's own approval policy decides.

Needs ``pip install "ipybox[langchain]"``.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, NoReturn, NotRequired, Self, TypedDict, cast

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.messages.content import create_image_block, create_text_block
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.config import get_config, get_stream_writer
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.runtime import Runtime, get_runtime
from langgraph.types import interrupt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutor,
    Execution,
    ExecutionLost,
    InvalidLocator,
    UsageError,
)
from ipybox.codegen._toolsearch import CatalogueMode

from ._core import (
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
    check_answers,
    describe_tools,
    drive,
    search_stubs,
    start_or_attach,
    suspending,
)
from ._langgraph import Queue, queue_of
from ._langsmith import action_runs

__all__ = ("IpyboxSearchTool", "IpyboxTool", "McpApprovalRequest", "McpDecision", "OutputEvent", "ipybox_tools")

# Channels of a task's saved writes once it raised an interrupt, or was resumed from one (the names
# the graph output's "__interrupt__" key also uses).
_PAUSE_CHANNELS = frozenset({"__interrupt__", "__resume__"})
# Image types the chat models that take images accept; others (SVG) are named in the text instead.
_MODEL_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class McpApprovalRequest(TypedDict):
    """The value of the interrupt raised for one MCP call of the running code.

    The first five keys are those of `HumanInTheLoopMiddleware`'s per-call request, so a UI built
    for it shows this one too; the others are ipybox's.
    """

    type: Literal["tool_approval"]
    tool_call_id: str
    """Id of the model's ``execute_code`` call whose code makes this MCP call."""
    name: str
    """``"server.tool"``."""
    args: dict[str, Any]
    description: str
    """What will run, as text to show a person (`ApprovalRequest.description`): every string the
    kernel or a server chose quoted and escaped, long values cut with a note (``args`` is whole)."""
    request_id: str
    """ipybox's id of the request, ``"<execution id>:<n>"``; an answer may echo it."""
    server: str
    tool: str
    undeclared_args: list[str]
    """Keys of ``args`` the tool's input schema does not declare."""
    arguments_checked: bool
    """Whether ``args`` were checked against the tool's input schema (not before its server was
    first listed)."""
    annotations: NotRequired[dict[str, Any]]
    """The MCP tool's annotations (``readOnlyHint`` ...), when it has any."""
    question: NotRequired[dict[str, Any]]
    """When a server asks a question during a call (``tool`` is ``"elicitation/create"``): its
    mode and form schema or URL (`ApprovalPayload.question`); answer it with
    ``{"type": "answer", "content": {...}}``."""
    locator: NotRequired[str]
    """With durable approvals (``IpyboxTool(secret=...)``): the suspended code action's locator, kept
    in the checkpoint; the tool resumes the action from it in whichever process resumes the graph."""
    ipybox_interrupts: NotRequired[int]
    """With durable approvals: how many interrupts this tool call raised before this one."""


class McpDecision(BaseModel):
    """The answer to an `McpApprovalRequest`: `HumanInTheLoopMiddleware`'s approve or reject decision.

    Resume with plain data, ``{"type": "approve"}`` or ``{"type": "reject", "message": "why"}``;
    LangGraph checks it against this model before it stores it (the interrupt's
    ``response_schema``), so a wrong answer raises pydantic's ``ValidationError`` from ``ainvoke``
    and the same interrupt can be answered again.
    """

    # A model, not a union of TypedDicts: LangGraph builds a validator from the schema on every
    # interrupt, which takes ~0.02 ms for a model and milliseconds for a discriminated union.
    model_config = ConfigDict(extra="forbid")

    type: Literal["approve", "reject", "answer"]
    message: str | None = None
    """Why the call is rejected; the code sees it as ``ToolCallRejected.reason``."""
    content: dict[str, Any] | None = None
    """With ``"answer"``: the answer to a server's question (its form's values, ``{}`` in URL
    mode). Only an answer accepts a question; an approval declines it. Checked against the form
    before it is sent; an answer to a tool call refuses the call."""
    request_id: str | None = None
    """The request this answers, if the answer says; another request's id reports the execution lost."""

    @model_validator(mode="after")
    def _approval_has_no_message(self) -> Self:
        if self.type == "approve" and self.message is not None:
            raise ValueError("an approval {'type': 'approve'} takes no 'message'")
        if (self.type == "answer") != (self.content is not None):
            raise ValueError("{'type': 'answer'} needs 'content', and only an answer takes it")
        if self.type == "answer" and self.message is not None:
            raise ValueError("an answer {'type': 'answer'} takes no 'message'")
        return self


class OutputEvent(TypedDict):
    """What the tool writes to the graph's ``custom`` stream for each piece of kernel output."""

    type: Literal["ipybox.output"]
    tool_call_id: str
    stream: Literal["stdout", "stderr", "result"]
    text: str


class _Args(BaseModel):
    code: str = Field(description="Python code to run in the kernel.")
    # Injected by ToolNode from the model's tool call; not part of the schema the model sees.
    tool_call_id: Annotated[str, InjectedToolCallId]


class IpyboxTool(BaseTool):
    """Runs the model's Python code in an ipybox kernel; the code can call the generated MCP tools.

    Use it asynchronously (``ainvoke``, ``astream``): the sync ``invoke`` raises `UsageError`.

    Approvals: when the graph has a checkpointer, every MCP call of the code is an `interrupt()`
    with an `McpApprovalRequest`; resume with `Command(resume={interrupt.id: decision})` where the
    decision is an `McpDecision`. The execution waits in the kernel between
    the interrupt and the resume, up to ``ttl`` seconds. Without a checkpointer, the executor's
    approval policy decides (a request it leaves to "ask" is rejected: nobody could answer it).

    Results come back as a `ToolMessage`: the text output, displayed images as image content
    blocks, and ``status="error"`` with the traceback when the code raised. Kernel output is also
    written to the graph's ``custom`` stream as it happens (`OutputEvent`), once per output even
    when the tool runs again on resume.
    """

    name: str = TOOL_NAME
    description: str = ""
    args_schema: type[BaseModel] = _Args  # pyright: ignore[reportIncompatibleVariableOverride]
    executor: CodeExecutor
    instructions: str = ""
    """How to use the kernel, with the stubs of the generated tools: the default description, and
    what to put in a system prompt instead when the description is kept short."""
    ttl: float | None = DEFAULT_TTL
    timeout: float | None = None
    secret: bytes | None = Field(default=None, repr=False, exclude=True)
    """The application's key for durable approvals (see ``__init__``)."""
    catalogue_mode: CatalogueMode | None = None
    """What `instructions` show of the generated tools: ``"stubs"``, ``"summary"`` (servers and tool
    names; the model needs `IpyboxSearchTool` or the kernel's search for signatures), None (no tools)."""

    def __init__(
        self,
        *,
        executor: CodeExecutor,
        name: str = TOOL_NAME,
        description: str | None = None,
        servers: Sequence[str] | None = None,
        ttl: float | None = DEFAULT_TTL,
        timeout: float | None = None,
        catalogue: Catalogue = "auto",
        search_tool: str | None = None,
        secret: bytes | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the tool.

        Args:
            executor: Runs the code; must be started (``async with CodeExecutor(...)``) before the
                tool is called, and stay running while the graph waits on an interrupt.
            name: The tool's name as the model sees it.
            description: What the model reads about the tool; by default `instructions`. Pass a
                short text when `instructions` go into the system prompt.
            servers: Describe only these MCP servers' tools (all generated ones when None).
            ttl: Seconds an execution waits for an answer to an interrupt before it is cancelled
                (None: no limit). A resume after that reports the execution as lost.
            timeout: Seconds the code may run, not counting approval waits (None: the
                executor's ``timeouts.execution``).
            catalogue: What `instructions` show of the tools: ``"auto"`` (default) every tool's
                stub while they fit 32,000 characters, else only servers and tool names;
                ``"stubs"`` or ``"summary"`` forces one.
            search_tool: The name of an `IpyboxSearchTool` the model also has; a summary points
                to it (else to the search in kernel code). `ipybox_tools` sets it.
            secret: Durable approvals (the executor's kernel must be a `GatewayKernel`): at each
                approval the code action is suspended (`CodeExecutor.suspend`, held ``ttl``
                seconds) and its locator put in the interrupt's value, which the checkpointer
                stores; the graph can then be resumed by any process with the same secret and
                checkpointer, and the action goes on there, once. At least 32 random bytes, the
                same on every worker. None: the action waits in this process.
            **kwargs: Other `BaseTool` fields (``tags``, ``metadata``, ``callbacks``...).
        """
        text = describe_tools(
            executor.tools_dir,
            servers=servers,
            catalogue=catalogue,
            search_tool=search_tool,
            skills_dir=executor.skills_dir,
        )
        super().__init__(
            executor=executor,
            name=name,
            description=text.text if description is None else description,
            instructions=text.text,
            ttl=ttl,
            timeout=timeout,
            catalogue_mode=text.catalogue,
            secret=secret,
            **kwargs,
        )
        Durable.of(secret, ttl)  # checks them now, not at the first interrupt

    def invoke(
        self, input: str | dict[str, Any] | ToolCall, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        # Before LangChain's own checks, whose errors are about its injected arguments instead.
        self._run()

    async def ainvoke(
        self, input: str | dict[str, Any] | ToolCall, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        if not (isinstance(input, dict) and input.get("type") == "tool_call"):
            # LangChain's own error names InjectedToolCallId, not what to pass.
            raise UsageError(
                f"{type(self).__name__} answers a model's tool call and needs its id: pass a ToolCall, e.g. "
                f"await tool.ainvoke({{'name': {self.name!r}, 'args': {{'code': '6 * 7'}}, 'id': 'call-1', "
                "'type': 'tool_call'}), or give the tool to an agent"
            )
        return await super().ainvoke(input, config, **kwargs)

    def _run(self, *args: object, **kwargs: object) -> NoReturn:
        raise UsageError(
            f"{type(self).__name__} runs asynchronously only: call 'await tool.ainvoke(...)', or run the "
            "agent with 'ainvoke' / 'astream'"
        )

    async def _arun(self, code: str, tool_call_id: str) -> ToolMessage:
        # BaseTool.arun runs this in the call's config context; LangGraph's config carries the
        # checkpointer the graph was compiled or invoked with.
        configurable = get_config().get("configurable", {})
        on_output = _output_writer(tool_call_id)
        values = self.executor.tracing.values
        if configurable.get(CONFIG_KEY_CHECKPOINTER) is None:
            # Nothing could pause and resume the graph: the executor's own policy decides.
            execution = self.executor.execute(code, approval=None, timeout=self.timeout)
            with action_runs(execution, resumed=False, values=values) as ended:
                outcome = await drive(execution, _nobody_to_ask, on_output=on_output)
                ended(outcome)
        else:
            thread_id = configurable.get("thread_id")
            if thread_id is None:
                raise UsageError(
                    "the graph has a checkpointer but no thread id: pass config={'configurable': {'thread_id': ...}}"
                )
            key = f"langchain:{thread_id}:{tool_call_id}"
            durable = Durable.of(self.secret, self.ttl)
            if durable is not None:
                return _message(
                    await self._durable_run(durable, key, code, tool_call_id, configurable, on_output),
                    tool_call_id,
                    self.name,
                )
            try:
                execution, resumed = await self._start_or_attach(key, code, configurable)
            except ExecutionLost as exc:
                outcome = ActionOutcome.lost(exc)
            else:
                queue = queue_of(self.executor)
                step = _step_of(thread_id)
                await queue.wait_for_turn(execution, step)
                # LangGraph hands resume values to a task's interrupts by position, so every request
                # is asked again in order on each run of the tool, decided or not.
                decide = _interrupter(tool_call_id, execution, queue, step)
                with action_runs(execution, resumed=resumed, values=values) as ended:
                    outcome = await drive(execution, decide, on_output=on_output, replay="all")
                    ended(outcome)
        return _message(outcome, tool_call_id, self.name)

    async def _durable_run(
        self,
        durable: Durable,
        key: str,
        code: str,
        tool_call_id: str,
        configurable: Mapping[str, Any],
        on_output: Callable[[CodeExecutionChunk], Awaitable[None]] | None,
    ) -> ActionOutcome:
        """Run (or resume) the code action with durable approvals.

        Each approval suspends the action and raises an interrupt whose value carries its locator and
        the number of interrupts this tool call raised before. LangGraph answers a task's interrupts
        by position, so a run of the tool (in any process) first reads the last interrupt it raised
        from the checkpoint, calls `interrupt` again for each one before it (their answers are
        stored) and for it: still unanswered, the graph pauses again with the same value and the
        kernel is not touched; answered, the action is resumed from the locator with the answer.
        """
        value = await _last_interrupt(configurable)
        values = self.executor.tracing.values
        asked = 0 if value is None else value.get("ipybox_interrupts", 0)
        for _ in range(asked):
            interrupt(None)  # answered already: returns the stored answer
        if value is None:
            execution = start_or_attach(self.executor, key, code, approval="ask", ttl=self.ttl, timeout=self.timeout)
            await queue_of(self.executor).wait_for_turn(execution, _step_of(configurable["thread_id"]))
            decide = suspending(self.executor, execution, durable, _cannot_wait)
        while True:
            if value is not None:
                # The first run raises GraphInterrupt here; never catch around this call.
                answer = interrupt(value, response_schema=McpDecision)
                asked += 1
                if answer.request_id not in (None, value["request_id"]):
                    return ActionOutcome.lost(
                        ExecutionLost(
                            f"the decision answers request {answer.request_id!r}, not {value['request_id']!r}"
                        )
                    )
                decision = ApprovalDecision(
                    approved=answer.type != "reject", reason=answer.message, content=answer.content
                )
                try:
                    # The answer goes to the call the interrupt showed (sealed in its locator), only.
                    execution = durable.resume(
                        self.executor, value.get("locator"), key, decision, value.get("request_id")
                    )
                except InvalidLocator as exc:
                    return ActionOutcome(text=f"refused to resume the code action, nothing was run: {exc}", error=exc)
                except ExecutionLost as exc:
                    return ActionOutcome.lost(exc)
                decide = suspending(self.executor, execution, durable, _cannot_wait)
            try:
                # A part resumed from a locator continues, in LangSmith, under this run of the tool.
                part = action_runs(execution, resumed=value is not None, values=values)  # pyright: ignore[reportPossiblyUnboundVariable]
                with part as ended:
                    outcome = await drive(execution, decide, on_output=on_output)  # pyright: ignore[reportPossiblyUnboundVariable]
                    ended(outcome)
                return outcome
            except Suspended as suspended:
                payload = suspended.payload.to_json()
                value = cast(
                    "McpApprovalRequest",
                    {"type": "tool_approval", "tool_call_id": tool_call_id, **payload, "ipybox_interrupts": asked},
                )

    async def _start_or_attach(self, key: str, code: str, configurable: Mapping[str, Any]) -> tuple[Execution, bool]:
        """The execution of this tool call, and whether it was started by an earlier run of the tool:
        its paused one on resume, else a new one.

        Raises:
            ExecutionLost: This is a resume but its execution is gone (the executor was replaced, its
                ttl passed, or it ran in another process); nothing is run.
        """
        try:
            return self.executor.attach(key), True
        except ExecutionLost:
            # The core knows the keys this process started; the checkpoint also knows a tool call
            # that interrupted in a process that is gone.
            if await _interrupted_before(configurable):
                raise ExecutionLost(
                    f"this tool call waited on an interrupt, but no execution with key {key!r} is known "
                    "here (the executor was replaced, its ttl passed, or it ran in another process)"
                ) from None
        return start_or_attach(self.executor, key, code, approval="ask", ttl=self.ttl, timeout=self.timeout), False


class _SearchArgs(BaseModel):
    query: str = Field(description="What the tool should do, in words.")
    k: int = Field(default=5, description="How many tools to return.", ge=1, le=20)


class IpyboxSearchTool(BaseTool):
    """Finds generated MCP tools by what they should do and returns their typed stubs.

    Give it to the model next to an `IpyboxTool` whose instructions show only the catalogue's
    summary (`ipybox_tools` does). It reads the tools directory only: no approval, no kernel.
    """

    name: str = SEARCH_TOOL_NAME
    description: str = SEARCH_TOOL_DESCRIPTION
    args_schema: type[BaseModel] = _SearchArgs  # pyright: ignore[reportIncompatibleVariableOverride]
    executor: CodeExecutor
    servers: list[str] | None = None
    """Search only these servers' tools (all when None)."""

    def _run(self, *args: object, **kwargs: object) -> NoReturn:
        raise UsageError(f"{type(self).__name__} runs asynchronously only: call 'await tool.ainvoke(...)'")

    async def _arun(self, query: str, k: int = 5) -> str:
        return await search_stubs(self.executor.tools_dir, query, k, servers=self.servers)


def ipybox_tools(
    executor: CodeExecutor,
    *,
    catalogue: Catalogue = "auto",
    servers: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[BaseTool]:
    """The code tool, and with it an `IpyboxSearchTool` when its instructions show only the summary.

    Args:
        executor: Runs the code (see `IpyboxTool`).
        catalogue: ``"auto"``, ``"stubs"`` or ``"summary"`` (see `IpyboxTool`).
        servers: Only these MCP servers' tools, in the instructions and the search.
        **kwargs: Other `IpyboxTool` arguments.
    """
    code = IpyboxTool(executor=executor, catalogue=catalogue, servers=servers, search_tool=SEARCH_TOOL_NAME, **kwargs)
    if code.catalogue_mode != "summary":
        return [code]
    return [code, IpyboxSearchTool(executor=executor, servers=None if servers is None else list(servers))]


async def _interrupted_before(configurable: Mapping[str, Any]) -> bool:
    """Whether the checkpoint holds an interrupt or resume of the task running this tool call."""
    return any(channel in _PAUSE_CHANNELS for channel, _ in await _task_writes(configurable))


async def _last_interrupt(configurable: Mapping[str, Any]) -> McpApprovalRequest | None:
    """The last durable interrupt the task running this tool call raised, from the checkpoint."""
    found: McpApprovalRequest | None = None
    for channel, value in await _task_writes(configurable):
        if channel != "__interrupt__":
            continue
        for item in cast("Sequence[Any]", value if isinstance(value, list | tuple) else [value]):
            data: object = getattr(item, "value", None)
            if isinstance(data, Mapping):
                fields = cast("Mapping[str, object]", data)
                if isinstance(fields.get("ipybox_interrupts"), int) and isinstance(fields.get("request_id"), str):
                    found = cast("McpApprovalRequest", fields)
    return found


async def _task_writes(configurable: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The writes the checkpoint holds for the task running this tool call: (channel, value)."""
    runtime = _runtime()
    info = None if runtime is None else runtime.execution_info
    if info is None:
        return []
    checkpointer: BaseCheckpointSaver[Any] = configurable[CONFIG_KEY_CHECKPOINTER]
    # The task's writes are saved with the checkpoint of the graph that runs it: its namespace is the
    # task's without the last `|`-separated part (the task's own).
    parent_ns = info.checkpoint_ns.rpartition("|")[0]
    saved = await checkpointer.aget_tuple(
        {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": parent_ns,
                "checkpoint_id": info.checkpoint_id,
            }
        }
    )
    writes = () if saved is None or saved.pending_writes is None else saved.pending_writes
    return [(channel, value) for task, channel, value in writes if task == info.task_id]


def _runtime() -> Runtime[Any] | None:
    """The graph's runtime; None when the tool is invoked outside a graph (its annotation says
    otherwise, but it reads an optional config entry)."""
    return cast("Runtime[Any] | None", get_runtime())


def _step_of(thread_id: str) -> str:
    """Identifies the graph step running this tool call; the same again when the step is resumed."""
    runtime = _runtime()
    info = None if runtime is None else runtime.execution_info
    return thread_id if info is None else f"{thread_id}:{info.checkpoint_id}"


def _interrupter(tool_call_id: str, execution: Execution, queue: Queue, step: str) -> Decide:
    async def decide(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
        # The payload's JSON has the rest of McpApprovalRequest's keys, annotations only when present.
        value = cast("McpApprovalRequest", {"type": "tool_approval", "tool_call_id": tool_call_id, **payload.to_json()})
        if request.decision is None:
            queue.pause(execution, step)
        # The first run raises GraphInterrupt here (the execution stays paused); a resumed run gets
        # the stored answer back. Never catch around this call.
        answer = interrupt(value, response_schema=McpDecision)
        # HumanInTheLoopMiddleware's decision shape, converted here: its message is the reason.
        check_answers(execution, request, answer.request_id)
        return ApprovalDecision(approved=answer.type != "reject", reason=answer.message, content=answer.content)

    return decide


async def _cannot_wait(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
    return ApprovalDecision(
        approved=False,
        reason=f"{payload.name} cannot wait for a person with durable approvals: only MCP tool calls are suspended "
        "(a server's question or a network connection is not); give the executor an approval policy for it",
    )


async def _nobody_to_ask(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
    return ApprovalDecision(
        approved=False,
        reason=f"nobody can approve {payload.name}: the executor's approval policy is 'ask' but the graph has no "
        "checkpointer to pause on; compile the graph with a checkpointer, or give CodeExecutor an approval "
        "policy (ApprovalRules, a callback or 'auto')",
    )


def _output_writer(tool_call_id: str) -> Callable[[CodeExecutionChunk], Awaitable[None]] | None:
    """Writes kernel output to the graph's custom stream; None outside a graph."""
    if _runtime() is None:
        return None
    write = get_stream_writer()

    async def on_output(chunk: CodeExecutionChunk) -> None:
        write(OutputEvent(type="ipybox.output", tool_call_id=tool_call_id, stream=chunk.stream, text=chunk.text))

    return on_output


def _message(outcome: ActionOutcome, tool_call_id: str, name: str) -> ToolMessage:
    text = outcome.text
    blocks: list[Any] = []
    for image in outcome.images:
        if image.mime in _MODEL_IMAGE_TYPES:
            blocks.append(create_image_block(base64=_b64(image.data), mime_type=image.mime))
        else:
            where = f" saved as {image.path}" if image.path is not None else ""
            text += f"\n[{image.mime} image{where}]"
    content: str | list[Any] = [create_text_block(text), *blocks] if blocks else text
    return ToolMessage(
        content=content,
        tool_call_id=tool_call_id,
        name=name,
        status="error" if outcome.failed else "success",
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
