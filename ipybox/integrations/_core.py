"""What the framework adapters share: the tool's text for the model, approval payloads and decisions,
starting or re-attaching a code action by key, replaying its events, and its outcome.

Every adapter turns one framework tool call into one keyed `Execution` and maps that execution's
`ApprovalRequest` events onto the framework's own human-in-the-loop mechanism. The frameworks pause a
run by ending it (an interrupt, a deferred call) and resume by calling the tool again from the top,
so a tool body runs once per approval. The code must run once in total: the adapter re-attaches to the
paused execution by its key and walks its event log again, feeding stored decisions back (answering is
idempotent) and not repeating progress already shown.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

import anyio

from ipybox import (
    Approval,
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    Execution,
    ExecutionError,
    ExecutionLost,
    Image,
    InvalidLocator,
    IpyboxError,
    KernelError,
    UsageError,
    render_skill_stubs,
)
from ipybox._mcp._serverasks import ElicitationRequest, url_host
from ipybox.codegen._toolsearch import CatalogueMode, render_match_stubs, render_tool_catalogue, search_tools

__all__ = (
    "DEFAULT_TTL",
    "SEARCH_TOOL_DESCRIPTION",
    "SEARCH_TOOL_NAME",
    "TOOL_NAME",
    "ActionOutcome",
    "ApprovalPayload",
    "Catalogue",
    "Durable",
    "Suspended",
    "ToolText",
    "as_answered",
    "check_answers",
    "describe_tools",
    "drive",
    "parse_decision",
    "search_stubs",
    "start_or_attach",
    "suspending",
    "tool_instructions",
)

TOOL_NAME = "execute_code"
# How long an adapter keeps a code action paused at an approval nobody answers: long enough for a
# person to come back to a chat, short enough that abandoned runs free their kernel the same day.
DEFAULT_TTL = 3600.0
# Keys of code actions this process started, kept to tell a resumed tool call whose execution is gone
# (its executor was replaced) from a first call. Bounded: only keys are kept, oldest dropped first.
_STARTED_KEYS = 10_000

_GUIDE = """\
Run Python code in a stateful, sandboxed IPython kernel. Variables, imports and functions persist \
between calls; the workspace directory is the only writable place and there is no network. Print what \
you need to see: only printed output, the last expression's value and displayed images come back. \
Magics and top-level `await` work.{tools}"""

_TOOLS_GUIDE = """ Call the tools below from the code through their generated modules \
(`from mcptools.<server> import <tool>`, then `<tool>.run(<tool>.Params(...))`, or \
`await <tool>.arun(...)` to run several at once with asyncio.gather). Each call may wait for a \
person's approval; a refused call raises `ipybox_kernel.ToolCallRejected`, which the code can \
catch. Process tool results in Python and print only what matters.{search}

{catalogue}"""

_SEARCH_GUIDE = """ There are too many tools to show their signatures here, so only servers and \
tool names are listed: before calling a tool, call the `{name}` tool with what you need done; it \
returns the typed stubs (Params, Result, run) of the best-matching tools."""

_CODE_SEARCH_GUIDE = """ There are too many tools to show their signatures here, so only servers \
and tool names are listed: find tools and read their signatures in code first, as the list says."""

# `render_tool_summary` starts with two lines on how to import and find tools.
_SUMMARY_HEADER_LINES = 2

Catalogue = Literal["auto", "stubs", "summary"]
"""What the instructions show of the generated tools: ``"stubs"`` every tool's typed stub,
``"summary"`` only servers and tool names (the model gets stubs by search), ``"auto"`` the stubs
while they fit `STUBS_PROMPT_LIMIT` characters, else the summary."""

SEARCH_TOOL_NAME = "search_tools"
SEARCH_TOOL_DESCRIPTION = (
    "Find the MCP tools the code can call by what they should do (e.g. 'weather forecast for a city'). "
    "Returns the typed Python stubs (Params, Result, run) of the best matches, to use in execute_code."
)
# Matches one search returns at most: 20 stubs are a few thousand characters.
SEARCH_LIMIT = 20


_SKILLS_GUIDE = """

Skills are code saved because it worked: reuse one with `from skills.<name> import run` before \
writing the same code again. To keep new code that worked, put it in a module with a docstring and a \
typed `run(...)`, and call `ipybox_kernel.save_skill(name, code, description)` (it asks for approval \
like a tool call).{stubs}"""


@dataclass(frozen=True)
class ToolText:
    """The instructions for a code-action tool, and what they show of the generated tools."""

    text: str
    catalogue: CatalogueMode | None
    """``"stubs"`` or ``"summary"``; None when there are no generated tools."""

    @property
    def needs_search(self) -> bool:
        """Whether the model needs a search tool to read the stubs of the tools it calls."""
        return self.catalogue == "summary"


def describe_tools(
    tools_dir: Path | str | None,
    *,
    servers: Sequence[str] | None = None,
    catalogue: Catalogue = "auto",
    search_tool: str | None = None,
    skills_dir: Path | str | None = None,
) -> ToolText:
    """`tool_instructions`' text, with the catalogue mode it chose (adapters offer a search tool
    next to the code tool when it is ``"summary"``).

    Args:
        tools_dir: Where `generate_mcp_sources` wrote the tool packages.
        servers: Only these servers' tools (all when None).
        catalogue: What to show of the tools (see `Catalogue`).
        search_tool: The name of the search tool the model has next to this one; the summary
            points to it. None: the summary points to the search in kernel code.
        skills_dir: The executor's skills directory: the text says how to save skills and shows
            the stubs of the saved ones (None: no skills).
    """
    if catalogue not in ("auto", "stubs", "summary"):
        raise UsageError(f"catalogue must be 'auto', 'stubs' or 'summary', got {catalogue!r}")
    skills = _skills_text(skills_dir)
    if tools_dir is None or not Path(tools_dir).is_dir():
        return ToolText(_GUIDE.format(tools="") + skills, None)
    mode, listing = render_tool_catalogue(tools_dir, mode=catalogue, servers=servers)
    # Nothing generated (or nothing of `servers`): the text describes the kernel alone.
    if not listing.strip() or (mode == "summary" and len(listing.splitlines()) <= _SUMMARY_HEADER_LINES):
        return ToolText(_GUIDE.format(tools="") + skills, None)
    search = ""
    if mode == "summary":
        search = _SEARCH_GUIDE.format(name=search_tool) if search_tool else _CODE_SEARCH_GUIDE
    tools = _TOOLS_GUIDE.format(search=search, catalogue=listing.strip())
    return ToolText(_GUIDE.format(tools=tools) + skills, mode)


def _skills_text(skills_dir: Path | str | None) -> str:
    if skills_dir is None:
        return ""
    stubs = render_skill_stubs(skills_dir).strip()
    return _SKILLS_GUIDE.format(stubs="\n\n" + stubs if stubs else "")


def tool_instructions(
    tools_dir: Path | str | None,
    *,
    servers: list[str] | None = None,
    catalogue: Catalogue = "auto",
    skills_dir: Path | str | None = None,
) -> str:
    """How a model should use the code-action tool, with the typed stubs of the generated MCP tools.

    The same text serves as the tool's description or as part of a system prompt. It changes only
    when sources are generated again, so it keeps a prompt cache valid between calls.

    Args:
        tools_dir: Where `generate_mcp_sources` wrote the tool packages (None or a missing or empty
            directory: the text describes the kernel alone).
        servers: Only these servers' tools (all when None).
        catalogue: ``"auto"`` (default): every tool's stub while they fit 32,000 characters, else only
            servers and tool names; ``"stubs"`` or ``"summary"`` forces one. In the summary the model
            finds tools and their signatures by search in kernel code.
        skills_dir: The executor's skills directory: the text says how to save skills and shows
            the stubs of the saved ones (None: no skills).
    """
    return describe_tools(tools_dir, servers=servers, catalogue=catalogue, skills_dir=skills_dir).text


async def search_stubs(tools_dir: Path | None, query: str, k: int = 5, *, servers: Sequence[str] | None = None) -> str:
    """What a search tool answers the model: the stubs of the tools that best match `query`, or
    why there are none (a text, never an exception: the model reads it and asks again)."""
    k = min(max(k, 1), SEARCH_LIMIT)

    def find() -> str:
        if tools_dir is None or not tools_dir.is_dir():
            return "No MCP tools are generated for this kernel."
        matches = search_tools(tools_dir, query, k, servers=servers)
        if not matches:
            return f"No tool matches {query!r}; describe what the tool should do in other words."
        return render_match_stubs(tools_dir, matches)

    try:
        # Reads the generated modules the first time: off the event loop.
        return await anyio.to_thread.run_sync(find)
    except UsageError as exc:
        return f"search failed: {exc}"


@dataclass(frozen=True, kw_only=True)
class ApprovalPayload:
    """A JSON-ready view of one `ApprovalRequest`, the value a framework's interrupt carries."""

    request_id: str
    """Stable id of the request, ``"<execution id>:<n>"``; echoed back with the decision."""
    server: str
    tool: str
    args: Mapping[str, Any]
    """The whole arguments, as data (never cut); show them to a person through `description`."""
    description: str
    """What will run, as text to show a person (`ApprovalRequest.description`): the tool, what the
    host runs for its server, and every argument, with each string the kernel or a server chose
    quoted and escaped, undeclared keys flagged, and long values cut with a note (the whole is in
    ``args``)."""
    annotations: Mapping[str, Any] | None = None
    undeclared_args: tuple[str, ...] = ()
    """Keys of ``args`` the tool's input schema does not declare (`ApprovalRequest.undeclared_args`)."""
    arguments_checked: bool = False
    """Whether ``args`` were checked against the tool's input schema (False before the server was
    ever listed: see `ApprovalRequest.input_schema`)."""
    left_running: str | None = None
    """The host's statement that code left running by an earlier code action may have made this
    request (`ApprovalRequest.left_running`; also first in ``description``)."""
    call_site: Mapping[str, Any] | None = None
    """The line of the code action that made the call: ``{"line", "text", "module"}``
    (`ApprovalRequest.call_site`; also in ``description``)."""
    question: Mapping[str, Any] | None = None
    """For a server's question during a call (an `ElicitationRequest`, tool ``elicitation/create``):
    ``{"mode", "during_tool", "requested_schema"}`` in form mode or ``{"mode", "during_tool", "url",
    "url_host"}`` in URL mode, for a UI that shows a form. The server's message is in ``args`` as
    sent and in ``description`` escaped; show ``description``. Answer with ``{"type": "answer",
    "content": {...}}`` (`parse_decision`); an approval without content declines the question."""
    locator: str | None = None
    """With durable approvals (an adapter given a ``secret``): the suspended code action's locator
    (`CodeExecutor.suspend`), kept in the framework's state so any process can resume it."""

    @classmethod
    def of(cls, request: ApprovalRequest) -> ApprovalPayload:
        question: dict[str, Any] | None = None
        if isinstance(request, ElicitationRequest):
            question = {"mode": request.mode, "during_tool": request.during_tool}
            if request.mode == "form":
                question["requested_schema"] = _plain(request.requested_schema or {})
            else:
                question["url"] = request.url
                question["url_host"] = url_host(request.url or "")
        return cls(
            request_id=request.id,
            server=request.server_name,
            tool=request.tool_name,
            args=request.tool_args,
            description=request.description,
            annotations=request.annotations,
            undeclared_args=request.undeclared_args,
            arguments_checked=request.input_schema is not None,
            left_running=request.left_running,
            call_site=None if (site := request.call_site) is None else asdict(site),
            question=question,
        )

    @property
    def name(self) -> str:
        """``"server.tool"``."""
        return f"{self.server}.{self.tool}"

    @property
    def call_name(self) -> str:
        """``"server__tool"``: the MCP call as a tool name a framework accepts (no dots)."""
        return f"{self.server}__{self.tool}"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (lists, dicts, strings, numbers): checkpointers and UIs can store it."""
        data: dict[str, Any] = {
            "request_id": self.request_id,
            "name": self.name,
            "server": self.server,
            "tool": self.tool,
            "args": _plain(self.args),
            "description": self.description,
            "undeclared_args": list(self.undeclared_args),
            "arguments_checked": self.arguments_checked,
        }
        if self.annotations:
            data["annotations"] = _plain(self.annotations)
        if self.left_running is not None:
            data["left_running"] = self.left_running
        if self.call_site is not None:
            data["call_site"] = dict(self.call_site)
        if self.question is not None:
            data["question"] = _plain(self.question)
        if self.locator is not None:
            data["locator"] = self.locator
        return data


def _plain(value: Any) -> Any:
    """A deep copy of JSON-like data with plain dicts and lists (request args are read-only views)."""
    if isinstance(value, Mapping):
        items = cast("Mapping[object, Any]", value).items()
        return {str(k): _plain(v) for k, v in items}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in cast("list[Any] | tuple[Any, ...]", value)]
    return value


def parse_decision(value: object) -> tuple[ApprovalDecision, str | None]:
    """Read a resume value, and the request id it names (None: it names none): an `ApprovalDecision`,
    a bool, or the frameworks' shape ``{"type": "approve"}`` / ``{"type": "reject", "message": "..."}``
    (optionally with ``"request_id"``), whose ``message`` is the decision's ``reason``. A server's
    question (`ApprovalPayload.question`) is answered with ``{"type": "answer", "content": {...}}``.

    Raises:
        UsageError: Anything else; the message shows the accepted shapes.
    """
    if isinstance(value, ApprovalDecision):
        return value, None
    if isinstance(value, bool):
        return ApprovalDecision(approved=value), None
    if isinstance(value, Mapping):
        data: Mapping[str, object] = value  # pyright: ignore[reportUnknownVariableType]
        kind, message, request_id = data.get("type"), data.get("message"), data.get("request_id")
        if kind == "answer":
            content = data.get("content")
            if (
                set(data) <= {"type", "content", "request_id"}
                and isinstance(content, Mapping)
                and (request_id is None or isinstance(request_id, str))
            ):
                answer = {str(k): v for k, v in cast("Mapping[object, Any]", content).items()}
                return ApprovalDecision(approved=True, content=answer), request_id
        unknown = set(data) - {"type", "message", "request_id"}
        if (
            kind in ("approve", "reject")
            and not unknown
            and (message is None or isinstance(message, str))
            and (request_id is None or isinstance(request_id, str))
        ):
            if kind == "approve" and message is not None:
                raise UsageError("an approval decision {'type': 'approve'} takes no 'message'")
            return ApprovalDecision(approved=kind == "approve", reason=message), request_id
    raise UsageError(
        f"cannot read {value!r} as an approval decision; resume with {{'type': 'approve'}} or "
        "{'type': 'reject', 'message': 'why'}, or a server's question with {'type': 'answer', 'content': {...}} "
        "(an optional 'request_id' must be the request's id)"
    )


def as_answered(request: ApprovalRequest, decision: ApprovalDecision) -> ApprovalDecision:
    """``decision`` as an adapter applies it: an answer (content) given to anything but a server's
    question refuses it, so that a form's values never pass for the approval of a tool call."""
    if decision.content is None or isinstance(request, ElicitationRequest):
        return decision
    return ApprovalDecision(
        approved=False, reason=f"an answer with content is for a server's question, not for {request.tool_name!r}"
    )


def check_answers(execution: Execution, request: ApprovalRequest, request_id: str | None) -> None:
    """Make sure a resume value that names a request (``request_id``) answers ``request``.

    Raises:
        ExecutionLost: It names another request: the execution it answered is gone. The waiting
            call is refused and the execution cancelled.
    """
    if request_id is None or request_id == request.id:
        return
    # Refuse the waiting call first, so the kernel is not left blocked on it while the cancel
    # interrupts the code.
    execution.answer(request.id, False, "the approval answered another execution's request")
    execution.cancel()
    raise ExecutionLost(f"the decision answers request {request_id!r}, but the execution waits on {request.id!r}")


@dataclass(frozen=True, kw_only=True)
class ActionOutcome:
    """How a code action ended, in the terms a tool result needs."""

    text: str
    """The output, or for a failure the output followed by what went wrong (a clean traceback)."""
    images: tuple[Image, ...] = ()
    error: IpyboxError | None = None
    """None when the code completed; `CodeExecutionError` when it raised; `ExecutionLost` when the
    execution is gone and nothing was re-run; another `ExecutionError` when it timed out or was
    cancelled."""
    result: CodeExecutionResult | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @classmethod
    def lost(cls, error: ExecutionLost) -> ActionOutcome:
        return cls(text=f"execution lost, nothing was re-run: {error}", error=error)


# The process's record of keys it has started, by any executor: a key found here but unknown to the
# executor belongs to an execution that is gone, and must not start again.
_started: OrderedDict[str, None] = OrderedDict()
# Per execution, how many of its events were already passed to a progress callback.
_shown: weakref.WeakKeyDictionary[Execution, int] = weakref.WeakKeyDictionary()


def start_or_attach(
    executor: CodeExecutor,
    key: str,
    code: str,
    *,
    approval: Approval | None = None,
    ttl: float | None = DEFAULT_TTL,
    timeout: float | None = None,
) -> Execution:
    """The execution of this tool call: the paused one when the framework calls the tool again,
    else a new one.

    Raises:
        ExecutionLost: The key was started in this process but its execution is gone (the executor
            was replaced, or the execution expired or was already delivered); nothing is run.
    """
    try:
        return executor.attach(key)
    except ExecutionLost:
        if key in _started:
            raise
    execution = executor.execute(code, key=key, approval=approval, ttl=ttl, timeout=timeout)
    _started[key] = None
    while len(_started) > _STARTED_KEYS:
        _started.popitem(last=False)
    return execution


Decide = Callable[[ApprovalRequest, ApprovalPayload], Awaitable[ApprovalDecision]]
"""An adapter's way to get a decision: ask the framework (which may end the run by raising its
interrupt exception, leaving the execution paused) or the application. The framework's own shape of
an answer becomes an `ApprovalDecision` there, at the adapter's edge (`parse_decision`,
`check_answers`)."""


async def drive(
    execution: Execution,
    decide: Decide,
    *,
    on_output: Callable[[CodeExecutionChunk], Awaitable[None]] | None = None,
    replay: Literal["undecided", "all"] = "undecided",
) -> ActionOutcome:
    """Walk the execution's events from the start until it ends, getting decisions as needed.

    Args:
        execution: From `start_or_attach`.
        decide: Called for approval requests; may raise to leave the execution paused.
        on_output: Called for output not passed to it in an earlier walk of this execution.
        replay: ``"undecided"`` asks `decide` only for requests without a decision;
            ``"all"`` for every request in order (frameworks that match resume values by position,
            like LangGraph), whose answer is then applied only if the request is still open.
    """
    index = 0
    try:
        async for event in execution.events():
            if isinstance(event, ApprovalRequest):
                if replay == "all" or event.decision is None:
                    decision = as_answered(event, await decide(event, ApprovalPayload.of(event)))
                    # Idempotent: a request decided already keeps its first decision.
                    event.decide(replace(decision, by="adapter", remember=False))
            elif isinstance(event, CodeExecutionChunk) and on_output is not None and index >= _shown.get(execution, 0):
                _shown[execution] = index + 1
                await on_output(event)
            elif isinstance(event, CodeExecutionResult):
                return ActionOutcome(text=event.text, images=event.images, result=event)
            index += 1
    except ExecutionLost as exc:
        return ActionOutcome.lost(exc)
    except CodeExecutionError as exc:
        text = "\n".join(part.strip("\n") for part in (exc.output, exc.traceback) if part.strip())
        return ActionOutcome(text=text or f"{exc.ename}: {exc.evalue}", error=exc)
    except (ExecutionError, KernelError) as exc:
        # A timeout, a cancellation (an expired ttl included), a kernel that died: the model reads what
        # happened and what the code printed before.
        output: str = getattr(exc, "output", "")
        return ActionOutcome(text=f"{output}\n{exc}".strip(), error=exc)
    raise AssertionError("an execution's events end with its result or its error")


@dataclass(frozen=True)
class Durable:
    """An adapter's durable approvals: a code action paused at an MCP call's approval is suspended
    (`CodeExecutor.suspend`) and its locator kept in the framework's own state, so that any process
    with the same ``secret`` resumes it (`CodeExecutor.resume`), once, within ``hold`` seconds."""

    secret: bytes
    hold: float

    @classmethod
    def of(cls, secret: bytes | None, ttl: float | None) -> Durable | None:
        """The adapter's setting from its ``secret`` and ``ttl`` arguments (None: not durable).

        Raises:
            UsageError: ``secret`` is too short, or ``ttl`` is None (a suspended action needs an
                end: its kernel is held on the gateway until then).
        """
        from ipybox._engine._suspension import check_hold, check_secret

        if secret is None:
            return None
        if ttl is None:
            raise UsageError("durable approvals (secret=...) need a ttl: the seconds a kernel holds a paused action")
        return cls(secret=check_secret(secret), hold=check_hold(ttl))

    def resume(
        self,
        executor: CodeExecutor,
        locator: object,
        key: str,
        decision: ApprovalDecision,
        request_id: object,
    ) -> Execution:
        """The suspended action of ``key`` resumed here from its ``locator`` (read from the framework's
        state: refused unless made with the secret, unchanged, unexpired and of this very action),
        with the framework's answer ``decision`` to the request ``request_id`` it showed. The answer
        goes to exactly the call the locator was suspended showing, and is refused if ``request_id``
        names another; the action's other pending calls are asked again.

        Raises:
            InvalidLocator: Refused; nothing was run.
            ExecutionLost: It expired, or this process applied its answer already; nothing was re-run.
        """
        if not isinstance(locator, str):
            raise InvalidLocator("the framework's state holds no locator string for this code action")
        if not isinstance(request_id, str):
            raise InvalidLocator("the framework's state names no request the answer is for")
        # A suspended call is a tool call, never a server's question: an answer with content refuses it.
        if decision.content is not None:
            decision = ApprovalDecision(approved=False, reason="an answer with content is for a server's question")
        decision = replace(decision, by="adapter", remember=False)
        return executor.resume(locator, secret=self.secret, key=key, decision=decision, request_id=request_id)


class Suspended(Exception):
    """Stops `drive` where the execution was suspended: the framework's interrupt carries ``locator``
    and the request it asks about (``payload``)."""

    def __init__(self, locator: str, payload: ApprovalPayload) -> None:
        super().__init__(payload.request_id)
        self.locator = locator
        self.payload = payload


def suspending(executor: CodeExecutor, execution: Execution, durable: Durable, otherwise: Decide) -> Decide:
    """A `Decide` that suspends the execution at a tool call's approval and raises `Suspended`.

    An execution can be suspended only while every call it makes waits for approval; with calls
    still on their way (``asyncio.gather``), it waits for their requests first. A request that
    cannot be suspended (a server's question, a network connection, a call left running) goes to
    ``otherwise``, the adapter's in-process way.
    """

    async def decide(request: ApprovalRequest, payload: ApprovalPayload) -> ApprovalDecision:
        if type(request) is ApprovalRequest:
            while request.decision is None and not execution.done:
                seen = len(execution.log)
                try:
                    locator = await executor.suspend(
                        execution, secret=durable.secret, ttl=durable.hold, shown=request.id
                    )
                except UsageError:
                    # A call of the execution is running or not yet asked: wait for what it does next.
                    if not await _next_event(execution, seen):
                        break
                    if any(
                        isinstance(event, ApprovalRequest) and type(event) is not ApprovalRequest
                        for event in execution.log[seen:]
                    ):
                        break
                    continue
                raise Suspended(locator, replace(payload, locator=locator))
        return await otherwise(request, payload)

    return decide


async def _next_event(execution: Execution, seen: int) -> bool:
    """Wait until the execution's log has more than ``seen`` events; False if it ended instead."""
    index = 0
    try:
        async for _ in execution.events():
            index += 1
            if index > seen:
                return True
    except IpyboxError:
        pass
    return False
