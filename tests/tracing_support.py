"""Reading spans back: a tracer provider that exports to the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ("provider_for", "traceparent")


def provider_for(exporter: InMemorySpanExporter) -> TracerProvider:
    """A provider whose spans end up in ``exporter`` as each one ends."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def traceparent(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` header that names ``span`` as the parent."""
    assert span.context is not None
    flags = int(span.context.trace_flags)  # sampled, and (W3C level 2) a random trace id
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{flags:02x}"
