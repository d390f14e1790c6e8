"""``ipybox mcp`` in a process whose global OpenTelemetry tracer provider writes every span, as it
ends, as one JSON line to a file: what ``opentelemetry-instrument ipybox mcp`` or an application's
own setup does, with an exporter a test can read.

Run it as ``python tests/servers/traced_ipybox_mcp.py SPANS_FILE [ipybox mcp options...]``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """Appends each span (name, ids, parent, attributes) to a file as a line of JSON."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._path.open("a", encoding="utf-8") as f:
            for span in spans:
                assert span.context is not None
                record = {
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
                    "attributes": dict(span.attributes or {}),
                }
                f.write(json.dumps(record, default=str) + "\n")
        return SpanExportResult.SUCCESS


def main() -> int:
    spans, *options = sys.argv[1:]
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(spans))))
    trace.set_tracer_provider(provider)
    from ipybox.mcp_server import main as ipybox_mcp

    return ipybox_mcp(options)


if __name__ == "__main__":
    sys.exit(main())
