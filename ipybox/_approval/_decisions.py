"""Approval of MCP tool calls: the request an application answers, its decision, and `ApprovalRules`
(the policy protocol and chains: `_policies`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal, NoReturn, TypeAlias, cast

import anyio

from ipybox._engine._callsite import CallSite
from ipybox._exceptions import UsageError
from ipybox.network._policy import Entry, any_entry_allows, parse_entry

from ._rendering import request_text, safe_json, shown_name, undeclared_keys

__all__ = (
    "ApprovalCallback",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalRules",
    "DecidedBy",
    "read_only_copy",
)

DecidedBy: TypeAlias = Literal["application", "policy", "callback", "adapter", "timeout", "ipybox"]
"""What made a decision: ``"application"`` an answer to the request's event (`ApprovalRequest.accept`,
`Execution.answer`: a person, as a rule), ``"policy"`` ``"auto"``, `ApprovalRules` or another
`ApprovalPolicy`, ``"callback"`` an approval callback, ``"adapter"`` a framework adapter with its
framework's answer (an interrupt's resume value, a deferred call's result, a handler),
``"timeout"`` nobody answered in time, ``"ipybox"`` ipybox itself (a call from code left running,
a call it cannot attribute, an execution that ended or that nobody can answer)."""


@dataclass(frozen=True, kw_only=True)
class ApprovalDecision:
    """The answer to an `ApprovalRequest`: the one decision type of policies, callbacks, the
    application's answers and the framework adapters."""

    approved: bool
    reason: str | None = None
    """Why, for a person and for the kernel code: a rejected call raises
    ``ToolCallRejected(reason)``."""
    by: DecidedBy = "application"
    """What made the decision; ipybox sets it where the decision comes from (a policy's or a
    callback's decision is marked as theirs whatever they wrote here)."""
    remember: bool = field(default=False, repr=False)
    """For a `NetworkRequest`: allow the destination for the rest of the executor's life (ignored
    for tool calls, so left out of the repr that tool-call logs show)."""
    content: Mapping[str, Any] | None = field(default=None, repr=False)
    """For an `ElicitationRequest`: the answer (the form's values; ``{}`` in URL mode). An
    approval without one declines the server's question (ignored for tool calls; left out of the
    repr, since it may hold what a person typed)."""


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


def read_only_copy(value: Any) -> Any:
    """A deep, read-only copy of JSON-like data: mappings become `_FrozenDict`, lists tuples.

    A `_FrozenDict` is returned as it is: only this function makes one, so everything in it is
    frozen already (a tool's input schema, frozen once per listing, is shared by its requests).
    """
    kind = type(cast("object", value))
    # Exact types first: JSON data is only these, and the abstract checks below cost more than the copy.
    if kind is str or kind is int or kind is bool or kind is float or value is None or kind is _FrozenDict:
        return value
    if kind is dict:
        return _FrozenDict({key: read_only_copy(item) for key, item in cast("dict[str, Any]", value).items()})
    if kind is list:
        return tuple(read_only_copy(item) for item in cast("list[Any]", value))
    if isinstance(value, Mapping):
        items = cast("Mapping[str, Any]", value).items()
        return _FrozenDict({key: read_only_copy(item) for key, item in items})
    if isinstance(value, list | tuple):
        return tuple(read_only_copy(item) for item in cast("list[Any] | tuple[Any, ...]", value))
    return value


# Characters of one value in str(request), a line for logs.
_SHORT_CHARS = 200


def _short(value: Any) -> str:
    text = safe_json(value)
    if len(text) <= _SHORT_CHARS:
        return text
    return f"{text[:_SHORT_CHARS]}...(+{len(text) - _SHORT_CHARS:,} characters)"


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
    input_schema: Mapping[str, Any] | None = field(default=None, repr=False)
    """The tool's input schema as its server last listed it (read-only), which the arguments were
    checked against: keys it forbids were refused before this request was made, keys it does not
    declare are in `undeclared_args`. None when the server has not been listed yet: ipybox starts
    a server only for an approved call, so the first call to one is asked about unchecked (and
    checked once the server is listed, before the call is made)."""
    call_site: CallSite | None = None
    """The line of the code action that made the call (the kernel's report of a line number, the
    text from the host's copy of the code; see `CallSite`); None for a `NetworkRequest`.
    `description` shows it under the headline."""
    left_running: str | None = None
    """The host's statement that code left running by an earlier code action (a thread or process it
    started) is alive in the kernel, so this request may come from that code and not from the
    running code action; None when the host saw no such code when the code action began. On a
    kernel on a gateway, whose threads the host cannot see, every request after the kernel's first
    code action says that its origin cannot be established. The host sees this in /proc, never by
    asking the kernel; code left in the kernel's main thread (hooks, patched functions) it cannot see
    (SECURITY.md, "Attribution of requests"). `description` shows it first."""
    # Made by the first `wait`: most requests are decided by a policy before anyone waits.
    _decided: anyio.Event | None = field(default=None, repr=False)
    _decision: ApprovalDecision | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.tool_args = read_only_copy(self.tool_args)
        if self.input_schema is not None:
            self.input_schema = read_only_copy(self.input_schema)

    def __str__(self) -> str:
        """One line for logs: ``server.tool(key="value", ...)``, keys that are not plain names quoted,
        every value cut to a few hundred characters with a note saying so; `description` shows more."""
        args = ", ".join(f"{shown_name(k)}={_short(v)}" for k, v in self.tool_args.items())
        return f"{self.rule_name}({args})"

    @property
    def rule_name(self) -> str:
        """What `ApprovalRules` tool patterns are matched against: ``"server.tool"`` (names that are
        not plain identifiers are shown quoted, see `description`)."""
        return f"{shown_name(self.server_name)}.{shown_name(self.tool_name)}"

    @property
    def undeclared_args(self) -> tuple[str, ...]:
        """Argument keys the tool's `input_schema` does not declare (but allows); empty without one."""
        return undeclared_keys(self.input_schema, self.tool_args)

    @property
    def headline(self) -> str:
        """The first line of `description`: what will run, with every name quoted where needed."""
        return f"MCP tool call {self.rule_name}, run by the host through: {safe_json(self.server)}"

    @property
    def description(self) -> str:
        """What will run if approved, as text to show a person: the tool, what the host runs for its
        server, the tool's hints, then one line per argument.

        Every string kernel code or a server chose (keys, values, names) is quoted and escaped, so
        none can start a line or hide characters; keys the input schema does not declare are
        flagged; a value longer than a few thousand characters is cut with a note saying how much
        is shown (the whole is in `tool_args`). ``ipybox.save_skill``'s code is shown whole.
        """
        return request_text(self)

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
        if self._decided is not None:
            self._decided.set()
        return True

    async def wait(self) -> ApprovalDecision:
        """Wait for the decision."""
        if self._decision is None:
            if self._decided is None:
                self._decided = anyio.Event()
            await self._decided.wait()
        assert self._decision is not None
        return self._decision


ApprovalCallback: TypeAlias = Callable[
    [ApprovalRequest], "bool | ApprovalDecision | Awaitable[bool | ApprovalDecision]"
]
"""Decides a request: returns True/False or an `ApprovalDecision`, directly or as an awaitable."""


@dataclass(frozen=True, kw_only=True)
class ApprovalRules:
    """Decide tool calls and network requests by rules; what no rule covers is decided by ``otherwise``.

    Tool calls and network destinations are separate: ``allow``/``deny`` match tool calls only,
    ``allow_net``/``deny_net`` network destinations (`NetworkRequest`) only, so no tool pattern can
    approve a connection.

    Tool patterns are shell-style globs over ``"server.tool"``, e.g. ``"github.*"`` or
    ``"github.search_*"``. The server part and the tool part are matched each on its own: ``*``
    never reaches across the dot between them (``"*.search_*"`` matches tool ``search_issues`` of
    any server, never a server named ``"x.search_y"``). Destinations are written as in
    `Network.allow` (``"api.example.org"``, ``"*.example.org:443"``, ``"203.0.113.0/24:*"``) and
    matched the same way: ``*`` only as a whole first label. A matching deny wins over everything
    else.

    Attributes:
        allow: Tool calls to approve without asking.
        deny: Tool calls to reject without asking.
        allow_net: Destinations to approve without asking (for this one connection; non-public
            addresses still need an address entry in the executor's `Network`).
        deny_net: Destinations to reject without asking.
        allow_read_only: Approve tools whose MCP annotations say ``readOnlyHint: true``. The hint
            comes from the MCP server: enable this only for servers you trust to label tools truthfully.
        otherwise: What happens to the rest (tool calls and destinations): ask the application,
            accept, or reject.
    """

    allow: Sequence[str] = ()
    deny: Sequence[str] = ()
    allow_net: Sequence[str] = ()
    deny_net: Sequence[str] = ()
    allow_read_only: bool = False
    otherwise: Literal["ask", "accept", "reject"] = "ask"
    _allow_net: tuple[Entry, ...] = field(init=False, repr=False, compare=False)
    _deny_net: tuple[Entry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("allow", "deny", "allow_net", "deny_net"):
            value: object = getattr(self, name)
            if isinstance(value, str):
                raise UsageError(f"ApprovalRules {name} takes a list of patterns, not a single string: [{value!r}]")
            object.__setattr__(self, name, tuple(cast("Sequence[str]", value)))
        for name in ("allow", "deny"):
            for pattern in cast("tuple[str, ...]", getattr(self, name)):
                check_tool_pattern(pattern, f"ApprovalRules {name}", f"{name}_net")
        for name in ("allow_net", "deny_net"):
            object.__setattr__(self, f"_{name}", _net_entries(getattr(self, name), f"ApprovalRules {name}"))
        if self.otherwise not in ("ask", "accept", "reject"):
            raise UsageError(f"ApprovalRules otherwise must be 'ask', 'accept' or 'reject', got {self.otherwise!r}")

    def decide(self, request: ApprovalRequest) -> ApprovalDecision | None:
        """The rules' decision, or None when the application must be asked."""
        from ipybox._mcp._serverasks import ElicitationRequest  # imports this module
        from ipybox.network._request import NetworkRequest  # imports this module

        if isinstance(request, ElicitationRequest):
            return None  # a server's question: rules decide tool calls and destinations, never answers
        name = request.rule_name
        if isinstance(request, NetworkRequest):
            if any_entry_allows(self._deny_net, request.host, request.port):
                return ApprovalDecision(approved=False, reason=f"{name} is denied by the approval rules", by="policy")
            if any_entry_allows(self._allow_net, request.host, request.port):
                return ApprovalDecision(approved=True, by="policy")
        else:
            if any(tool_pattern_matches(p, request.server_name, request.tool_name) for p in self.deny):
                return ApprovalDecision(approved=False, reason=f"{name} is denied by the approval rules", by="policy")
            if any(tool_pattern_matches(p, request.server_name, request.tool_name) for p in self.allow):
                return ApprovalDecision(approved=True, by="policy")
            if self.allow_read_only and (request.annotations or {}).get("readOnlyHint") is True:
                return ApprovalDecision(approved=True, by="policy")
        if self.otherwise == "accept":
            return ApprovalDecision(approved=True, by="policy")
        if self.otherwise == "reject":
            return ApprovalDecision(approved=False, reason=f"{name} is not allowed by the approval rules", by="policy")
        return None


def check_tool_pattern(pattern: object, where: str, net_option: str) -> None:
    """Refuse a tool pattern that is not a string, or that was written for a network destination
    (``"network:..."``: tool patterns never match destinations; ``net_option`` is where they go).

    Raises:
        UsageError: Naming the pattern and the fix.
    """
    if not isinstance(pattern, str) or not pattern:
        raise UsageError(f"{where} patterns are non-empty strings like 'github.search_*', got {pattern!r}")
    if pattern.lower().startswith("network:"):
        destination = pattern[len("network:") :]
        raise UsageError(
            f"{where} pattern {pattern!r} names a network destination, but tool patterns match tool calls "
            f"only; list the destination in {net_option} instead (written as in Network.allow, e.g. "
            f"{destination or '*.example.org:443'!r})"
        )


def tool_pattern_matches(pattern: str, server: str, tool: str) -> bool:
    """Whether the ``"server.tool"`` glob ``pattern`` matches the call, the server part matched against
    the server's name and the rest against the tool's, so that ``*`` never spans the dot between
    them. A pattern without a dot (``"*"``) matches the whole ``"server.tool"``."""
    if "." not in pattern:
        return fnmatchcase(f"{server}.{tool}", pattern)
    # Server names may hold dots themselves: any dot of the pattern may be the one between the parts.
    return any(
        fnmatchcase(server, pattern[:at]) and fnmatchcase(tool, pattern[at + 1 :])
        for at, char in enumerate(pattern)
        if char == "."
    )


def _net_entries(texts: Sequence[str], where: str) -> tuple[Entry, ...]:
    entries: list[Entry] = []
    for text in texts:
        try:
            entries.append(parse_entry(text))
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
    return tuple(entries)
