"""What a remote MCP server may ask of ipybox's client during a tool call: elicitation, sampling, roots.

Everything in such a request is the server's text, aimed at whoever answers it. None of it is
answered by kernel code or silently:

- **Elicitation** (``elicitation/create``) becomes an `ElicitationRequest`, decided through the
  executor's approval path like a tool call (policy, callback, an event of the execution). Only an
  explicit answer (`ElicitationRequest.answer`, or an `ApprovalDecision` with ``content``) accepts
  it; everything else declines. The form's schema must be the flat, primitive one MCP allows, and
  the answer must fit it before it is sent. A URL is shown, never opened, with its host spelled
  unambiguously; URLs that could show one host and lead to another are declined unasked.
- **Sampling** (``sampling/createMessage``) is declined, unless the application gives a handler
  (`ClientFeatures.sampling`); kernel code never answers it.
- **Roots** (``roots/list``): ipybox advertises none unless the application configures some
  (`ClientFeatures.roots`), and answers with those only.
"""

from __future__ import annotations

import copy
import json
import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast
from urllib.parse import urlsplit

from ipybox._approval._decisions import ApprovalDecision, ApprovalRequest, read_only_copy
from ipybox._exceptions import UsageError

__all__ = (
    "ELICIT_METHOD",
    "MAX_ASKS_PER_CALL",
    "MAX_MESSAGE_CHARS",
    "ClientFeatures",
    "ElicitationRequest",
    "SamplingHandler",
    "answer_problem",
    "form_schema_problem",
    "session_callbacks",
    "settled",
    "url_host",
    "url_problem",
)

# The MCP method, as the tool name an elicitation shows to rules, hooks and adapters: no MCP tool
# can be named so (tool names hold no '/'), so it never passes for a tool call.
ELICIT_METHOD = "elicitation/create"
# A message longer than this is not a question for a person: declined unasked.
MAX_MESSAGE_CHARS = 20_000
# Fields of one form, and the size of its schema as JSON.
MAX_FIELDS = 50
MAX_SCHEMA_CHARS = 64_000
# Characters of one answer value, and of a URL.
MAX_VALUE_CHARS = 10_000
MAX_URL_CHARS = 2_000
# Elicitations one tool call may make; more are declined unasked (a server asking in a loop).
MAX_ASKS_PER_CALL = 5

# What MCP's PrimitiveSchemaDefinition allows in a form field (2025-11-25): strings (with format,
# length, enum/oneOf of constants), numbers, integers, booleans, and arrays of enum strings.
_FIELD_WORDS = frozenset(
    {
        "type",
        "title",
        "description",
        "default",
        "enum",
        "enumNames",
        "oneOf",
        "anyOf",
        "items",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
    }
)
_PRIMITIVES = frozenset({"string", "number", "integer", "boolean", "array"})
_FORMATS = frozenset({"email", "uri", "date", "date-time"})


@dataclass(eq=False, kw_only=True)
class ElicitationRequest(ApprovalRequest):
    """An MCP server asks the application a question during one of kernel code's tool calls.

    An `ApprovalRequest` of its own kind: it goes through the executor's approval path (policies, a
    callback, else an event of the execution) like the call it happened in, and the tool-call hook
    sees it as the server's ``elicitation/create``. ``server_name`` is the server, ``tool_name`` is
    ``"elicitation/create"``; `during_tool` is the tool whose call it interrupts.

    Everything in it (`message`, `requested_schema`, `url`) is the server's text. Only an explicit
    answer accepts it: `answer` with values that fit `requested_schema` (form mode), or with ``{}``
    in URL mode to say that the person went to the URL themselves; ipybox never opens it. Approving
    it without an answer (``accept()``, ``"auto"``, a callback returning True) declines it, so code
    written for tool calls never answers a server's question by accident.
    """

    during_tool: str
    """The tool whose call the server interrupted with this question."""
    mode: Literal["form", "url"]
    message: str
    """The server's text (shown escaped and bounded in `description`)."""
    requested_schema: Mapping[str, Any] | None = None
    """Form mode: the flat schema of the answer (checked: primitive fields only)."""
    url: str | None = None
    """URL mode: where the server wants the person to go (checked; never opened by ipybox)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.requested_schema is not None:
            self.requested_schema = read_only_copy(self.requested_schema)

    def __str__(self) -> str:
        return f"elicitation ({self.mode}) from MCP server {self.server_name!r} during tool {self.during_tool!r}"

    @property
    def headline(self) -> str:
        from ipybox._approval._rendering import shown_name

        return (
            f"MCP server {shown_name(self.server_name)} asks a question ({self.mode} mode) during the tool call "
            f"{shown_name(self.server_name)}.{shown_name(self.during_tool)}; the text below is the server's, "
            "not ipybox's"
        )

    @property
    def host(self) -> str | None:
        """URL mode: the URL's host as ASCII (an internationalised name as punycode)."""
        return url_host(self.url) if self.url is not None else None

    @property
    def description(self) -> str:
        from ipybox._approval._rendering import elicitation_text

        return elicitation_text(self)

    async def answer(self, content: Mapping[str, Any]) -> None:
        """Accept with ``content``: the form's values (form mode), or ``{}`` (URL mode: the person
        went to the URL themselves). Values that do not fit the schema decline it instead."""
        self.decide(ApprovalDecision(approved=True, content=dict(content)))

    async def decline(self, reason: str | None = None) -> None:
        """Decline the question (the server sees ``decline``)."""
        self.decide(ApprovalDecision(approved=False, reason=reason))


def settled(request: ElicitationRequest, decision: ApprovalDecision) -> ApprovalDecision:
    """``decision`` as it is sent to the server: an approval without an answer, or with one that does
    not fit the form, declines (with the reason)."""
    if not decision.approved:
        return replace(decision, content=None)
    content = decision.content
    why: str | None = None
    if content is None:
        why = (
            "approved without an answer: a server's question is answered only with ElicitationRequest.answer(...) "
            "or an ApprovalDecision with content"
        )
    elif request.mode == "url":
        why = "a URL-mode question takes no values (answer with {})" if content else None
    else:
        # A plain copy: the request's schema is read-only (tuples for arrays), which a validator misreads.
        problem = answer_problem(copy.deepcopy(request.requested_schema or {}), content)
        why = None if problem is None else f"the answer does not fit the server's form: {problem}"
    if why is None:
        return decision
    return ApprovalDecision(approved=False, reason=why, by=decision.by)


def form_schema_problem(schema: object) -> str | None:
    """What makes ``schema`` not a form MCP allows (an object of flat, primitive fields), or None."""
    if not isinstance(schema, Mapping):
        return "the requested schema is not an object"
    shown = json.dumps(schema, default=repr)
    if len(shown) > MAX_SCHEMA_CHARS:
        return f"the requested schema is {len(shown):,} characters long (at most {MAX_SCHEMA_CHARS:,})"
    schema = cast("Mapping[str, Any]", schema)
    if schema.get("type") != "object":
        return "the requested schema's type is not 'object'"
    extra = set(schema) - {"type", "properties", "required", "$schema", "title", "description"}
    if extra:
        return f"the requested schema has words a form may not: {sorted(extra)}"
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return "the requested schema's properties are not an object"
    properties = cast("Mapping[str, Any]", properties)
    if len(properties) > MAX_FIELDS:
        return f"the requested schema has {len(properties)} fields (at most {MAX_FIELDS})"
    for name, spec in properties.items():
        problem = _field_problem(spec)
        if problem is not None:
            return f"field {json.dumps(name)}: {problem}"
    required: object = schema.get("required", [])
    if not isinstance(required, list) or any(key not in properties for key in cast("list[object]", required)):
        return "the requested schema's 'required' is not a list of its fields"
    return None


def _field_problem(spec: object) -> str | None:
    if not isinstance(spec, Mapping):
        return "not a schema"
    spec = cast("Mapping[str, Any]", spec)
    extra = set(spec) - _FIELD_WORDS
    if extra:
        return f"words a form field may not have: {sorted(extra)} (only flat, primitive fields are allowed)"
    kind = spec.get("type")
    if kind not in _PRIMITIVES:
        return f"type {json.dumps(kind, default=repr)} is not string, number, integer, boolean or an array of choices"
    if "format" in spec and spec["format"] not in _FORMATS:
        return f"format {json.dumps(spec['format'], default=repr)} is not one MCP allows"
    for word in ("oneOf", "anyOf"):
        if word in spec and not _constants(spec[word]):
            return f"'{word}' may only list choices ({{'const': ..., 'title': ...}})"
    if "enum" in spec and not _strings(spec["enum"]):
        return "'enum' may only list strings"
    if kind == "array":
        items = spec.get("items")
        if not isinstance(items, Mapping):
            return "an array field must list its choices in 'items'"
        items = cast("Mapping[str, Any]", items)
        if set(items) - {"type", "enum", "anyOf", "oneOf"} or items.get("type", "string") != "string":
            return "an array field may only hold strings from a list of choices"
        if not (_strings(items.get("enum")) or _constants(items.get("anyOf")) or _constants(items.get("oneOf"))):
            return "an array field may only hold strings from a list of choices"
    elif "items" in spec:
        return "'items' belongs to array fields only"
    return None


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in cast("list[object]", value))


def _constants(value: object) -> bool:
    if not isinstance(value, list):
        return False
    for item in cast("list[object]", value):
        if not isinstance(item, Mapping) or not isinstance(cast("Mapping[str, Any]", item).get("const"), str):
            return False
        if set(cast("Mapping[str, Any]", item)) - {"const", "title"}:
            return False
    return True


def answer_problem(schema: Mapping[str, Any], content: object) -> str | None:
    """What makes ``content`` not an answer to the form ``schema`` (already checked flat), or None."""
    from ._schemacheck import schema_problem

    if not isinstance(content, Mapping):
        return "the answer is not an object"
    content = cast("Mapping[str, Any]", content)
    properties = cast("Mapping[str, Any]", schema.get("properties", {}))
    for key, value in content.items():
        if key not in properties:
            return f"the form has no field {json.dumps(key)}"
        if not _primitive(value):
            return f"field {json.dumps(key)} is not a string, number, boolean or list of strings"
    # Bounded (RE2, step and time budgets): the schema is the server's.
    return schema_problem(dict(schema), _thawed(content), "input", "the answer", listed=False)


def _primitive(value: object) -> bool:
    if isinstance(value, str):
        return len(value) <= MAX_VALUE_CHARS
    if isinstance(value, bool | int | float) or value is None:
        return True
    if isinstance(value, list | tuple):
        items = cast("list[object]", value)
        return len(items) <= MAX_FIELDS and all(isinstance(i, str) and len(i) <= MAX_VALUE_CHARS for i in items)
    return False


def _thawed(content: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(cast("tuple[Any, ...]", v)) if isinstance(v, tuple) else v for key, v in content.items()}


def url_host(url: str) -> str | None:
    """The host of ``url`` as ASCII: an internationalised name as its punycode (``xn--``), which
    cannot pass for another name; None when it has none that can be told."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    if not host:
        return None
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return None


def url_problem(url: str) -> str | None:
    """Why ``url`` is declined before anyone sees it, or None.

    Declined: anything but ``https`` (``http`` only to this machine), a user name or password
    before the host (``https://good.example@evil.example``), characters a browser reads otherwise
    than a parser (backslashes, spaces, controls), an unreadable host.
    """
    if len(url) > MAX_URL_CHARS:
        return f"the URL is {len(url):,} characters long (at most {MAX_URL_CHARS:,})"
    if any(char == "\\" or char.isspace() or unicodedata.category(char).startswith("C") for char in url):
        return "the URL holds backslashes, spaces or control characters, which browsers read differently"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"the URL cannot be read ({exc})"
    del port
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "the URL holds a user name before '@', which makes it look like it leads to another host"
    host = url_host(url)
    if host is None:
        return "the URL has no host that can be told"
    local = host in ("localhost", "127.0.0.1", "[::1]", "::1")
    if parts.scheme != "https" and not (parts.scheme == "http" and local):
        return f"the URL's scheme is {parts.scheme!r}, not https"
    return None


SamplingHandler: TypeAlias = Callable[[str, Any], "Awaitable[Any]"]
"""Answers a server's ``sampling/createMessage``: called with the server's name and the request's
``CreateMessageRequestParams``; returns a ``CreateMessageResult`` (or raises to refuse)."""


@dataclass(frozen=True, kw_only=True)
class ClientFeatures:
    """What ipybox's MCP client offers the servers it calls beyond tool calls.

    Elicitation needs nothing here: it goes through the executor's approval path. The rest is off
    unless given.

    Attributes:
        sampling: Answers servers' ``sampling/createMessage`` (an LLM call on the application's
            account, with the server's prompt). None (the default): ipybox declines it and does not
            advertise the capability. Kernel code never answers it.
        roots: The directories (``file://`` URIs, or paths) servers may be told of through
            ``roots/list``. Empty (the default): the capability is not advertised.
    """

    sampling: SamplingHandler | None = None
    roots: Sequence[str | Path] = ()
    _root_uris: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.sampling is not None and not callable(self.sampling):
            raise UsageError(f"ClientFeatures sampling must be an async callable, got {self.sampling!r}")
        if isinstance(self.roots, str | Path):
            raise UsageError(f"ClientFeatures roots takes a list of directories, not one: [{str(self.roots)!r}]")
        uris: list[str] = []
        for root in self.roots:
            if isinstance(root, Path) or not str(root).startswith("file://"):
                path = Path(root)
                if not path.is_absolute():
                    raise UsageError(f"ClientFeatures roots must be absolute paths or file:// URIs, got {root!r}")
                uris.append(path.as_uri())
            else:
                uris.append(str(root))
        object.__setattr__(self, "roots", tuple(self.roots))
        object.__setattr__(self, "_root_uris", tuple(uris))

    @property
    def root_uris(self) -> tuple[str, ...]:
        """The roots as ``file://`` URIs, as ``roots/list`` answers them."""
        return self._root_uris


def session_callbacks(
    features: ClientFeatures,
    *,
    elicit: Callable[[Any, Any], Awaitable[Any]],
    sample: Callable[[Any, Any], Awaitable[Any]],
) -> dict[str, Any]:
    """A client session's answers to server requests (`BoundedClientSession`'s keywords), which also
    say what it advertises: elicitation always, sampling only with a handler in ``features`` (it is
    declined otherwise), roots only when configured. Generation and the tool server both take them
    from here, so a server that lists tools by its client's capabilities lists the same to both.
    """
    callbacks: dict[str, Any] = {
        "elicitation_callback": elicit,
        "sampling_callback": sample,
        "offers_sampling": features.sampling is not None,
    }
    uris = features.root_uris
    if uris:
        import mcp_types

        async def list_roots(context: object) -> mcp_types.ListRootsResult:
            return mcp_types.ListRootsResult(roots=[mcp_types.Root(uri=uri) for uri in uris])  # pyright: ignore[reportArgumentType]

        callbacks["list_roots_callback"] = list_roots
    return callbacks
