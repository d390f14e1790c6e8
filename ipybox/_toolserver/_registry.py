"""The MCP side of the tool server: registered servers, their long-lived sessions, and calls.

A server is started (or connected to) only for a call that was approved, so kernel code cannot
start host processes by asking. Sessions are shared by concurrent calls, probed after being idle,
started again after a crash, and closed on `Sessions.reset` and when the tool server stops. Each
one is owned by a task in the tool server's task group. Every failure of a call comes out as
`ToolCallFailed` through the one boundary, `tool_errors`.
"""

from __future__ import annotations

import logging
import os
import tempfile
import types
from collections.abc import Awaitable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
from mcp import ClientSession
from mcp import types as mcp_types
from opentelemetry import context as otel_context

from ipybox._approval._decisions import ApprovalDecision, read_only_copy
from ipybox._approval._rendering import closest_key, forbidden_keys, quote
from ipybox._exceptions import UsageError
from ipybox._mcp._oauth import OAuth, PausableDeadline, current_deadline, pausable_deadline
from ipybox._mcp._schemacheck import forget_schemas, value_problem
from ipybox._mcp._serverasks import (
    MAX_ASKS_PER_CALL,
    MAX_MESSAGE_CHARS,
    ClientFeatures,
    answer_problem,
    form_schema_problem,
    session_callbacks,
    url_problem,
)
from ipybox._mcp._servers import (
    HttpServer,
    StdioServer,
    describe_server,
    http_refusals,
    open_session,
    parse_server_params,
)

from ._boundary import ToolCallFailed, tool_errors
from ._channel import ToolRequest, ToolResultReply

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = (
    "IDLE_PROBE_AFTER",
    "PROBE_TIMEOUT",
    "STDERR_TAIL_BYTES",
    "ElicitationAsker",
    "Sessions",
    "Target",
    "check_arguments",
)

logger = logging.getLogger(__name__)

# A server can exit unseen while a session is idle; after this long unused, a ping checks it first.
IDLE_PROBE_AFTER = 5.0
# A live server answers a ping within milliseconds; a slower one is busy, and the call goes ahead.
PROBE_TIMEOUT = 2.0
# Enough of a failed server's stderr for its error and a short traceback, small enough for a message.
STDERR_TAIL_BYTES = 4096


class ElicitationAsker(Protocol):
    """Decides a server's question asked during ``call`` (`ApprovalGate.elicitation`)."""

    def __call__(
        self, call: ToolRequest, /, *, server: str, fields: Mapping[str, Any], refusal: str | None = None
    ) -> Awaitable[ApprovalDecision]: ...


@dataclass(eq=False)
class _InFlight:
    """A call being made on a session, and how many questions its server asked during it."""

    request: ToolRequest
    deadline: PausableDeadline | None
    """The call's timeout, which stands still while a person answers its server's question."""
    asks: int = 0


@dataclass(eq=False, kw_only=True)
class _Session:
    """One live MCP session, owned by a task in the tool server's task group."""

    session: ClientSession
    calls: dict[int, _InFlight]
    """The calls being made on it, by the id of their request: what a server's question belongs to."""
    tools: dict[str, mcp_types.Tool]
    stderr: IO[str]
    last_used: float
    close_requested: anyio.Event = field(default_factory=anyio.Event)
    closed: anyio.Event = field(default_factory=anyio.Event)
    close_reason: str | None = None
    final_stderr: str | None = None

    @property
    def usable(self) -> bool:
        return not self.close_requested.is_set()

    def close(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.close_requested.set()

    def stderr_tail(self) -> str:
        if self.final_stderr is not None:
            return self.final_stderr
        return _read_tail(self.stderr)


@dataclass(eq=False)
class _Entry:
    """A registered server and, once connected, its session."""

    name: str
    params: StdioServer | HttpServer
    description: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    live: _Session | None = None
    tools: dict[str, mcp_types.Tool] | None = None
    """The server's tools as it last listed them; kept after its session closes, for the gate."""
    targets: dict[str, tuple[mcp_types.Tool, Target]] = field(
        default_factory=dict[str, "tuple[mcp_types.Tool, Target]"]
    )
    """What the gate sees of each tool called, made once per listing: the read-only copies of a
    tool's schema and annotations are shared by its calls' requests instead of made for each."""


@dataclass(frozen=True)
class Target:
    """What the gate is told about the server of a call, before it is approved."""

    server: str
    """What the host will run or call: the command line or URL (no secret values)."""
    annotations: Mapping[str, Any] | None
    """The tool's MCP annotations as last listed; None before the server was ever connected."""
    input_schema: Mapping[str, Any] | None
    """The tool's input schema as last listed; None before the server was ever connected."""


class Sessions:
    """The registered MCP servers by name, and a session with each one that is in use.

    Args:
        call_timeout: Seconds one MCP call may take, not counting approval (nor a person
            authorizing an OAuth server); None for no limit.
        connect_timeout: Seconds to start or reach a server and list its tools.
        oauth: Tokens and authorization of OAuth servers, shared by all their sessions.
        elicitation: Decides the questions servers ask during calls; None declines them all.
        features: Sampling and roots offered to servers (ipybox._mcp._serverasks).
    """

    def __init__(
        self,
        *,
        call_timeout: float | None,
        connect_timeout: float,
        oauth: OAuth,
        elicitation: ElicitationAsker | None = None,
        features: ClientFeatures | None = None,
    ) -> None:
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.oauth = oauth
        self.elicitation = elicitation
        self.features = features or ClientFeatures()
        self.idle_probe_after = IDLE_PROBE_AFTER
        self.task_group: anyio.abc.TaskGroup | None = None
        """Owns the sessions; set by the tool server while it runs."""
        self._entries: dict[str, _Entry] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    @property
    def servers(self) -> Mapping[str, StdioServer | HttpServer]:
        """The registered servers by name (a read-only snapshot)."""
        return types.MappingProxyType({name: entry.params for name, entry in self._entries.items()})

    def register(self, name: str, params: StdioServer | HttpServer | Mapping[str, Any]) -> None:
        """Register (or replace) a server; see `ToolServer.register`."""
        parsed = parse_server_params(params)
        old = self._entries.get(name)
        if old is not None and old.live is not None:
            old.live.close(f"MCP server {name!r} was registered again")
        self._entries[name] = _Entry(name, parsed, describe_server(parsed))

    async def reset(self) -> None:
        """Close every session; servers are started again on their next call."""
        lives = [entry.live for entry in self._entries.values() if entry.live is not None]
        for live in lives:
            live.close("the tool server was reset")
        self.forget_sessions()
        for live in lives:
            await live.closed.wait()

    def forget_sessions(self) -> None:
        """Drop every session (their owner tasks are gone or going)."""
        for entry in self._entries.values():
            entry.live = None

    async def target(self, request: ToolRequest) -> Target:
        """What the gate sees of the request's server, without starting it.

        Raises:
            ToolCallFailed: No such server; or it is connected and has no such tool.
        """
        entry = self._entry(request)
        live = entry.live
        if live is not None and live.usable:
            # Connected already: an unknown tool is refused without asking the application.
            spec = await self._find_tool(entry, live, request)
        else:
            # Not connected, and not to be before this call is approved: the gate gets the
            # annotations of the server's last listing, if there was one.
            spec = entry.tools.get(request.tool) if entry.tools is not None else None
        # Checked against the listed schema itself: the target's copy is frozen (tuples for arrays),
        # which a JSON Schema validator does not take for JSON.
        check_arguments(spec.input_schema if spec is not None else None, request)
        return _target(entry, spec)

    async def call(
        self, request: ToolRequest, checked: Target | None = None, *, trace: Context | None = None
    ) -> ToolResultReply:
        """Make an approved call: start or reach its server if needed, then call the tool.

        Args:
            request: The call.
            checked: The `target` its arguments were checked against before it was approved.
            trace: The OpenTelemetry context the MCP request is sent in (the call's span), None for
                the ambient one.

        Raises:
            ToolCallFailed: The server could not be started, the tool is unknown, or the call failed.
        """
        entry = self._entry(request)
        # Started here if it is not running; or, approval having taken long, reset or replaced meanwhile.
        live = await self._session(entry, request)
        spec = await self._find_tool(entry, live, request)
        # Checked again only against a schema the gate's check did not see: the first call to a server
        # was asked about before its schema was known, and a new listing may have changed it.
        if checked is None or checked is not _target(entry, spec):
            check_arguments(spec.input_schema, request)
        return await self._call(entry, live, request, trace)

    def _entry(self, request: ToolRequest) -> _Entry:
        entry = self._entries.get(request.server)
        if entry is None:
            known = ", ".join(repr(n) for n in sorted(self._entries)) or "none"
            raise ToolCallFailed(
                "unknown_server",
                f"no MCP server named {request.server!r} is registered with this executor (registered: {known})",
            )
        return entry

    async def _find_tool(self, entry: _Entry, live: _Session, request: ToolRequest) -> mcp_types.Tool:
        spec = live.tools.get(request.tool)
        if spec is None:
            # The server may have added the tool since it was listed.
            with tool_errors(f"listing the tools of MCP server {entry.name!r}"):
                with anyio.fail_after(self.connect_timeout):
                    _replace_listing(entry, live, await _list_all_tools(live.session))
            spec = live.tools.get(request.tool)
        if spec is None:
            known = ", ".join(repr(n) for n in sorted(live.tools)) or "none"
            raise ToolCallFailed(
                "unknown_tool", f"MCP server {request.server!r} has no tool named {request.tool!r} (its tools: {known})"
            )
        return spec

    async def _session(self, entry: _Entry, request: ToolRequest) -> _Session:
        live = await self._connect(entry, request)
        if anyio.current_time() - live.last_used < self.idle_probe_after:
            return live
        try:
            with tool_errors(f"pinging MCP server {entry.name!r}"), anyio.move_on_after(PROBE_TIMEOUT):
                await live.session.send_ping()
        except ToolCallFailed as failed:
            if failed.kind != "server_crashed":
                return live  # it answered, if not with a pong: alive
            live.close(f"MCP server {entry.name!r} had exited")
            live = await self._connect(entry, request)
        live.last_used = anyio.current_time()
        return live

    async def _connect(self, entry: _Entry, request: ToolRequest) -> _Session:
        live = entry.live
        if live is not None and live.usable:
            return live  # the common case, without a checkpoint for the lock
        async with entry.lock:
            live = entry.live
            if live is not None and live.usable:
                return live
            tg = self.task_group
            if tg is None:
                raise ToolCallFailed("internal", "the tool server is shutting down")
            try:
                live = await tg.start(self._own_session, entry)
            except ToolCallFailed as failed:
                failed.message += f"\n(while calling tool {request.tool!r})"
                raise ToolCallFailed("server_start", failed.message, output=failed.output) from failed
            except UsageError as exc:
                raise ToolCallFailed("server_start", f"cannot start MCP server {entry.name!r}: {exc}") from exc
            entry.live = live
            _replace_listing(entry, live, live.tools)
            return live

    async def _own_session(self, entry: _Entry, *, task_status: anyio.abc.TaskStatus[_Session]) -> None:
        """Open a session, hand it out through ``task_status``, keep it open until asked to close."""
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
            live: _Session | None = None
            calls: dict[int, _InFlight] = {}
            try:
                with tool_errors(f"MCP server {entry.name!r} failed to start or connect"):
                    async with open_session(
                        entry.name,
                        entry.params,
                        connect_timeout=self.connect_timeout,
                        errlog=stderr,
                        oauth=self.oauth,
                        callbacks=self._callbacks(entry, calls),
                    ) as session:
                        with anyio.fail_after(self.connect_timeout):
                            tools = await _list_all_tools(session)
                        live = _Session(
                            session=session, calls=calls, tools=tools, stderr=stderr, last_used=anyio.current_time()
                        )
                        task_status.started(live)
                        await live.close_requested.wait()
            except ToolCallFailed as failed:  # top level of a background task: it must not end the tool server
                if live is None:
                    tail = _read_tail(stderr)
                    if tail:
                        failed.message += f"\nits stderr ends with:\n{tail}"
                    failed.output = tail or None
                    raise
                logger.debug("the session with MCP server %r ended: %s", entry.name, failed)
            finally:
                if live is not None:
                    live.final_stderr = _read_tail(stderr)
                    live.close_requested.set()
                    live.closed.set()

    async def _call(
        self, entry: _Entry, live: _Session, request: ToolRequest, trace: Context | None = None
    ) -> ToolResultReply:
        server, tool, seq = request.server, request.tool, request.seq
        result: mcp_types.CallToolResult | None = None
        refusals = http_refusals(live.session)
        mark = refusals.mark() if refusals is not None else (0, 0)
        try:
            with tool_errors(f"the call to tool {tool!r} of MCP server {server!r}"):
                try:
                    # Not fail_after: the deadline stands still while a person authorizes (OAuth step-up).
                    with pausable_deadline(self.call_timeout) as deadline:
                        live.calls[id(request)] = _InFlight(request, current_deadline())
                        # Current only around the request: the MCP SDK injects the current span into
                        # its _meta (and starts its own client span under it); a server started for
                        # this call must not keep it as the context of its session's task.
                        token = None if trace is None else otel_context.attach(trace)
                        try:
                            result = await live.session.call_tool(tool, request.arguments)
                        finally:
                            if token is not None:
                                otel_context.detach(token)
                            del live.calls[id(request)]
                except RuntimeError as exc:
                    # The client checks structured results against the tool's output schema.
                    raise ToolCallFailed(
                        "tool_error", f"MCP server {server!r} returned an invalid result for tool {tool!r}: {exc}"
                    ) from exc
        except ToolCallFailed as failed:
            if failed.kind == "server_crashed":
                raise self._crashed(entry, live, request) from failed
            why = refusals.explain(mark) if refusals is not None and failed.kind == "tool_error" else None
            if why is not None:
                # The transport says only "Server returned an error response"; the HTTP status,
                # WWW-Authenticate and the OAuth flow's error say what happened.
                raise ToolCallFailed(
                    "tool_error", f"the call to tool {tool!r} of MCP server {server!r} was refused: {why}"
                ) from failed
            raise
        if deadline.cancelled_caught:  # the deadline passed
            assert self.call_timeout is not None
            raise ToolCallFailed(
                "timeout",
                f"the call to tool {tool!r} of MCP server {server!r} timed out after {self.call_timeout:g} s "
                "(the executor's tool call timeout)",
                timeout=self.call_timeout,
            )
        assert result is not None
        live.last_used = anyio.current_time()
        text = "\n".join(item.text for item in result.content if isinstance(item, mcp_types.TextContent))
        if result.is_error:
            raise ToolCallFailed(
                "tool_error", f"tool {tool!r} of MCP server {server!r} failed: {text or 'no error message'}"
            )
        # Not validated again: the MCP client has validated the result, and validating copies it whole.
        return ToolResultReply.model_construct(
            seq=seq,
            structured=result.structured_content,
            text=text,
            content=[item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in result.content],
        )

    def _crashed(self, entry: _Entry, live: _Session, request: ToolRequest) -> ToolCallFailed:
        tail = live.stderr_tail()
        if live.close_reason is not None:
            why = f"the session was closed because {live.close_reason}"
        else:
            why = "the server exited or dropped the connection; the next call starts it again"
            live.close(f"MCP server {entry.name!r} dropped the connection")
        message = (
            f"the connection to MCP server {request.server!r} ended during the call to tool {request.tool!r}: {why}"
        )
        if tail:
            message += f"\nits stderr ends with:\n{tail}"
        return ToolCallFailed("server_crashed", message, output=tail or None)

    # -- what servers ask of the client (ipybox._mcp._serverasks) ---------------------------------------

    def _callbacks(self, entry: _Entry, calls: dict[int, _InFlight]) -> dict[str, Any]:
        """The session's answers to server requests: elicitation always (decided as a call is),
        sampling always (declined without a handler, but advertised only with one), roots only
        when configured."""

        async def elicit(context: object, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
            return await self._elicit(entry, calls, params)

        async def sample(context: object, params: mcp_types.CreateMessageRequestParams) -> Any:
            return await self._sample(entry, params)

        return session_callbacks(self.features, elicit=elicit, sample=sample)

    async def _elicit(
        self, entry: _Entry, calls: dict[int, _InFlight], params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult:
        declined = mcp_types.ElicitResult(action="decline")
        # Every call in flight here is the running code action's (the gate checks it again); with
        # several, the question is shown as the first's, since MCP does not say which one asked.
        call = next(iter(calls.values()), None)
        if call is None or self.elicitation is None:
            # Not during a call of kernel code: nobody's code action to decide it by.
            logger.warning("declined a question MCP server %r asked outside any tool call", entry.name)
            return declined
        call.asks += 1
        if call.asks > MAX_ASKS_PER_CALL:
            logger.warning(
                "declined question %d of MCP server %r during one call (at most %d are asked)",
                call.asks,
                entry.name,
                MAX_ASKS_PER_CALL,
            )
            return declined
        url = isinstance(params, mcp_types.ElicitRequestURLParams)
        fields: dict[str, Any] = {"mode": "url" if url else "form", "message": params.message}
        if isinstance(params, mcp_types.ElicitRequestURLParams):
            fields["url"] = params.url
            problem = url_problem(params.url)
        else:
            fields["requested_schema"] = params.requested_schema
            problem = form_schema_problem(params.requested_schema)
        if len(params.message) > MAX_MESSAGE_CHARS:
            problem = f"its message is {len(params.message):,} characters long (at most {MAX_MESSAGE_CHARS:,})"
            fields["message"] = params.message[:MAX_MESSAGE_CHARS]  # the hook gets no more than is allowed
        refusal = None if problem is None else f"ipybox declined the server's question unasked: {problem}"
        with call.deadline.paused() if call.deadline is not None else nullcontext():
            decision = await self.elicitation(call.request, server=entry.description, fields=fields, refusal=refusal)
        if not decision.approved or decision.content is None:
            return declined
        if isinstance(params, mcp_types.ElicitRequestURLParams):
            return mcp_types.ElicitResult(action="accept")
        content = dict(decision.content)
        if answer_problem(params.requested_schema, content) is not None:
            return declined  # the gate checked it already; a gate of the application's may not have
        return mcp_types.ElicitResult(action="accept", content=content)

    async def _sample(self, entry: _Entry, params: mcp_types.CreateMessageRequestParams) -> Any:
        handler = self.features.sampling
        if handler is None:
            return mcp_types.ErrorData(
                code=mcp_types.INVALID_REQUEST,
                message=(
                    "ipybox declines sampling: the application running this client has not opted in (it gives "
                    "a handler with ClientFeatures(sampling=...)); the code calling your tools cannot answer it"
                ),
            )
        try:
            return await handler(entry.name, params)
        except Exception as exc:  # the application's handler: any failure is a refusal
            logger.exception("the sampling handler failed for MCP server %r", entry.name)
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the client's sampling handler refused ({type(exc).__name__})"
            )


def _target(entry: _Entry, spec: mcp_types.Tool | None) -> Target:
    """What the gate sees of a tool, made once for each listing of it."""
    if spec is None:
        return Target(entry.description, None, None)
    cached = entry.targets.get(spec.name)
    if cached is not None and cached[0] is spec:
        return cached[1]
    dumped = spec.annotations.model_dump(by_alias=True, mode="json", exclude_none=True) if spec.annotations else None
    target = Target(entry.description, read_only_copy(dumped), read_only_copy(spec.input_schema))
    entry.targets[spec.name] = (spec, target)
    return target


def _replace_listing(entry: _Entry, live: _Session, tools: dict[str, mcp_types.Tool]) -> None:
    """Make ``tools`` the server's listing; what was made from the one it replaces is dropped."""
    replaced = [spec.input_schema for spec in (entry.tools or {}).values()]
    replaced += [spec.input_schema for spec in live.tools.values() if live.tools is not tools]
    live.tools = entry.tools = tools
    entry.targets.clear()
    # Checks are kept by the schema object (ipybox._mcp._schemacheck): the new listing's are new.
    kept = {id(spec.input_schema) for spec in tools.values()}
    forget_schemas(schema for schema in replaced if id(schema) not in kept)


def check_arguments(schema: Mapping[str, Any] | None, request: ToolRequest) -> None:
    """Refuse a call whose arguments the tool's input schema refuses (a key it forbids, or a value
    that does not fit), before anyone is asked; the check is bounded (ipybox._mcp._schemacheck).

    Raises:
        ToolCallFailed: ``invalid_arguments``, naming the key and the declared key closest to it, or
            the argument and what the schema says of it.
    """
    if schema is None:
        return
    forbidden = forbidden_keys(schema, request.arguments)
    if not forbidden:
        problem = value_problem(schema, request.arguments)
        if problem is not None:
            raise ToolCallFailed(
                "invalid_arguments",
                f"the arguments of tool {quote(request.tool)} of MCP server {quote(request.server)} do not fit its "
                f"input schema: {problem}. The call was not made.",
            )
        return
    key = forbidden[0]
    close = closest_key(schema, key)
    hint = f"did you mean {quote(close)}?" if close else "the schema declares no key like it."
    raise ToolCallFailed(
        "invalid_arguments",
        f"tool {quote(request.tool)} of MCP server {quote(request.server)} takes no argument {quote(key)} "
        f"(its input schema forbids keys it does not declare); {hint} The call was not made.",
    )


async def _list_all_tools(session: ClientSession) -> dict[str, mcp_types.Tool]:
    tools: dict[str, mcp_types.Tool] = {}
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.update((tool.name, tool) for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _read_tail(stderr: IO[str]) -> str:
    try:
        fd = stderr.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - STDERR_TAIL_BYTES)
        data = os.pread(fd, size - start, start)
    except (OSError, ValueError):
        return ""
    text = data.decode("utf-8", errors="replace")
    if start > 0:
        text = text.partition("\n")[2]
    return text.strip()
