"""OpenTelemetry spans of code actions and of the tool calls they make.

One span per code action (``ipybox.code_action``) and, under it, one ``execute_tool {tool}`` span
per tool call and asked connection, with the attributes of the OpenTelemetry GenAI semantic
conventions for tool execution and ipybox's own (``ipybox.*``: server, transport, the approval).
Only ``opentelemetry-api`` is used: without an SDK configured by the application every span is a
no-op.

A tool call reaches the host on the `ToolServer`'s task, not the code action's, so its parent is
not the current context: the `ApprovalGate` ties the call to the running execution (by the kernel's
id for it, which only selects *whether* the call belongs to the running execution) and takes the
parent span from that execution's driver, a host object. Kernel code cannot name another span.

Kernel code and MCP servers choose tool names, argument values, reasons and error names: every
string attribute is cut to `MAX_ATTRIBUTE_CHARS` (SECURITY.md, "Traces").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

if TYPE_CHECKING:
    from ipybox._approval._decisions import ApprovalDecision
    from ipybox._exceptions import IpyboxError
    from ipybox.network._policy import NetworkEvent

    from ._callsite import CallSite
    from ._results import ActionAccount, CodeExecutionResult

__all__ = (
    "ACTION_SPAN",
    "MAX_ATTRIBUTE_CHARS",
    "MAX_VALUE_CHARS",
    "ActionTracer",
    "Tracing",
    "account_attributes",
    "bounded",
    "tool_span_name",
    "value_json",
)

ACTION_SPAN = "ipybox.code_action"
"""The name of a code action's span."""
# Characters of one string attribute chosen by kernel code or a server (a tool name, a reason).
MAX_ATTRIBUTE_CHARS = 512
# Characters of the JSON of arguments or of a result, when the application opts in to values.
MAX_VALUE_CHARS = 16_384


@dataclass(frozen=True, kw_only=True)
class Tracing:
    """How a `CodeExecutor` reports its code actions and tool calls as OpenTelemetry spans.

    Attributes:
        tracer_provider: Where the spans go; None: OpenTelemetry's global tracer provider, a no-op
            until the application configures an SDK (``opentelemetry.trace.set_tracer_provider``).
        values: Record each tool call's arguments and result (``gen_ai.tool.call.arguments``,
            ``gen_ai.tool.call.result``, as JSON cut to 16,384 characters). Off by default: kernel
            code chose the arguments and the tool the result, and either may hold personal data or
            secrets a trace backend should not keep.
    """

    tracer_provider: TracerProvider | None = None
    values: bool = False


def bounded(text: str, limit: int = MAX_ATTRIBUTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were cut: for what kernel code or a server chose."""
    return text if len(text) <= limit else f"{text[:limit]}...(+{len(text) - limit:,} characters)"


def tool_span_name(tool: str) -> str:
    """The name of a tool call's span (GenAI conventions: ``execute_tool {gen_ai.tool.name}``)."""
    return f"execute_tool {bounded(tool, 256)}"


def account_attributes(account: ActionAccount) -> dict[str, int | float]:
    """What a code action's tool calls came to, as the attributes of its span (and of a framework's
    record of it)."""
    return {
        "ipybox.tool_calls": account.tool_calls,
        "ipybox.tool_calls.approved": account.approved,
        "ipybox.tool_calls.rejected": account.rejected,
        "ipybox.approval.wait_total": account.approval_wait,
        "ipybox.tool.time_total": account.tool_time,
        "ipybox.network.connections": account.connections,
        "ipybox.network.bytes_total": account.network_bytes,
        "ipybox.output.bytes_total": account.output_bytes,
    }


def value_json(value: Any) -> str:
    """``value`` (tool arguments or a result) as JSON cut to `MAX_VALUE_CHARS`: only when the application opts in."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except ValueError:  # a circular structure cannot come from JSON; kept safe anyway
        text = repr(value)
    return bounded(text, MAX_VALUE_CHARS)


class ActionTracer:
    """Starts and ends the spans of one executor's code actions and tool calls."""

    def __init__(self, settings: Tracing) -> None:
        from ipybox import __version__

        provider = settings.tracer_provider
        self._provider = provider
        # The global API's tracer follows a provider the application sets later.
        self._tracer: Tracer = (
            trace.get_tracer("ipybox", __version__) if provider is None else provider.get_tracer("ipybox", __version__)
        )
        self.values = settings.values

    def configured(self) -> bool:
        """Whether spans go anywhere: an SDK (or another real provider) is configured. Asked once per
        code action, never cached: the application may configure the SDK after ipybox is imported,
        and the global provider is followed as it changes."""
        provider = trace.get_tracer_provider() if self._provider is None else self._provider
        return not isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))

    def start_action(
        self, *, execution_id: str, key: str | None, code: str, parent: otel_context.Context | None
    ) -> Span:
        """The span of a code action, a child of ``parent`` (the context ``execute()`` was called in).

        With no tracer configured it is the API's span that records nothing but carries the caller's
        trace (passed on to MCP servers), made without hashing the code or building attributes.
        """
        if not self.configured():
            return self._tracer.start_span(ACTION_SPAN, context=parent, kind=SpanKind.INTERNAL)
        encoded = code.encode("utf-8", "surrogatepass")
        attributes: dict[str, Any] = {
            "ipybox.execution.id": execution_id,
            "ipybox.code.size": len(encoded),
            "ipybox.code.sha256": hashlib.sha256(encoded).hexdigest(),
        }
        if key is not None:
            attributes["ipybox.execution.key"] = bounded(key)
        return self._tracer.start_span(ACTION_SPAN, context=parent, kind=SpanKind.INTERNAL, attributes=attributes)

    @staticmethod
    def end_action(
        span: Span, result: CodeExecutionResult | None, error: IpyboxError | None, account: ActionAccount
    ) -> None:
        """Record the outcome of a code action and what its tool calls came to, and end its span."""
        if not span.is_recording():
            span.end()
            return
        span.set_attributes(account_attributes(account))
        if result is not None:
            span.set_attribute("ipybox.execution.outcome", "ok")
            span.set_attribute("ipybox.output.chars", len(result.text))
            span.set_attribute("ipybox.output.truncated_chars", result.truncated_chars)
        elif error is not None:
            span.set_attribute("ipybox.execution.outcome", "error")
            span.set_attribute("error.type", type(error).__name__)
            ename = getattr(error, "ename", None)  # CodeExecutionError: the kernel's exception name
            if isinstance(ename, str):
                span.set_attribute("ipybox.code.error_name", bounded(ename))
            output = getattr(error, "output", None)
            if isinstance(output, str):
                span.set_attribute("ipybox.output.chars", len(output))
            # The class only: an error's text may hold the code's output.
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        else:
            span.set_attribute("ipybox.execution.outcome", "unknown")
        span.end()

    @staticmethod
    def resumed(span: Span | None, linked: set[int]) -> None:
        """Record that the span current here (a framework's run taking up a paused code action) took
        up the code action of ``span``: a link to it and an event ``ipybox.resumed``, once per span
        (``linked``: those already recorded, and the code action's parent)."""
        if span is None or not span.is_recording():
            return
        here = trace.get_current_span().get_span_context()
        if not here.is_valid or here.span_id in linked:
            return
        linked.add(here.span_id)
        span.add_link(here, {"ipybox.link": "resumed_by"})
        span.add_event(
            "ipybox.resumed",
            {
                "ipybox.resumed_by.trace_id": f"{here.trace_id:032x}",
                "ipybox.resumed_by.span_id": f"{here.span_id:016x}",
            },
        )

    @staticmethod
    def traces_under(parent: Span | None) -> bool:
        """Whether a tool call under ``parent`` (its code action's span) gets a span at all: not under
        a span that records nothing (no SDK configured, or not sampled), so that tracing that is off
        costs a call next to nothing."""
        return parent is None or parent.is_recording()

    def start_tool(
        self,
        parent: Span | None,
        *,
        call_id: str | None,
        server: str,
        tool: str,
        transport: str | None,
        arguments: Mapping[str, Any],
        stray: bool,
        call_site: CallSite | None = None,
    ) -> Span:
        """The span of one tool call (or asked connection), a child of its code action's span.

        ``parent`` None: no code action runs, and the span is a root of its own.
        """
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": bounded(tool),
            "gen_ai.tool.type": "extension",
            "ipybox.mcp.server": bounded(server),
        }
        if call_id is not None:
            attributes["gen_ai.tool.call.id"] = call_id
        if transport is not None:
            attributes["ipybox.mcp.transport"] = transport
        if stray:
            attributes["ipybox.tool.call.stray"] = True
        if call_site is not None:
            if call_site.line is not None:
                attributes["code.line.number"] = call_site.line
            if call_site.module is not None:
                attributes["ipybox.call_site.module"] = bounded(call_site.module)
        if self.values:
            attributes["gen_ai.tool.call.arguments"] = value_json(arguments)
            # The line's text may hold argument values too.
            if call_site is not None and call_site.text is not None:
                attributes["ipybox.call_site.text"] = bounded(call_site.text)
        # An explicit parent, never the current context: the call runs on the ToolServer's task.
        context = otel_context.Context() if parent is None else trace.set_span_in_context(parent)
        return self._tracer.start_span(
            tool_span_name(tool), context=context, kind=SpanKind.INTERNAL, attributes=attributes
        )

    @staticmethod
    def decided(span: Span, decision: ApprovalDecision, policy: str | None, waited: float) -> None:
        """Record the approval of a call on its span."""
        attributes: dict[str, Any] = {
            "ipybox.approval.decision": "approved" if decision.approved else "rejected",
            "ipybox.approval.decided_by": decision.by,
            "ipybox.approval.wait": waited,
        }
        if policy is not None:
            attributes["ipybox.approval.policy"] = bounded(policy)
        if decision.reason is not None:
            attributes["ipybox.approval.reason"] = bounded(decision.reason)
        span.set_attributes(attributes)  # at once: the SDK takes a lock per call

    @staticmethod
    def network_event(span: Span, event: NetworkEvent) -> None:
        """A connection of the code action (opened, asked, answered, refused, over a limit, closed) as
        an event ``ipybox.network.{kind}`` on its span: the destination, never the traffic."""
        attributes: dict[str, Any] = {"server.address": bounded(event.host), "server.port": event.port}
        if event.address is not None:
            attributes["network.peer.address"] = event.address
        if event.reason is not None:
            attributes["ipybox.network.reason"] = bounded(event.reason)
        if event.kind in ("closed", "limit"):
            attributes["ipybox.network.bytes"] = event.bytes
        span.add_event(f"ipybox.network.{event.kind}", attributes)

    def finished(self, span: Span, error: str | None, duration: float, result: Any = None) -> None:
        """Record how a call ended and end its span (``error``: None or the kind the kernel got)."""
        span.set_attribute("ipybox.tool.duration", duration)
        if error is not None:
            span.set_attribute("error.type", bounded(error))
            span.set_status(Status(StatusCode.ERROR))
        elif self.values and result is not None:
            span.set_attribute("gen_ai.tool.call.result", value_json(result))
        span.end()
