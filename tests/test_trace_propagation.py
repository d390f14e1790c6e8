"""Trace context passed on to MCP servers the way the mcp SDK passes it (W3C ``traceparent`` in the
request's ``_meta``, SEP-414): a real test server over stdio and streamable HTTP returns what it
received, checked against the spans read back from the SDK's in-memory exporter."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, context
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from servers.fixtures import TRACING_SERVER_SCRIPT, http_server
from tracing_support import provider_for, traceparent

from ipybox import CodeExecutor, HttpServer, StdioServer, Tracing
from ipybox._engine._tracing import ACTION_SPAN
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

TRACING_STDIO = StdioServer(command=sys.executable, args=(str(TRACING_SERVER_SCRIPT),))
CALL = "from ipybox_kernel import call_tool\nprint(call_tool('tracing', 'trace_context', {}).text)"


@pytest.fixture(scope="module")
def tracing_http() -> Iterator[HttpServer]:
    with http_server("streamable-http", TRACING_SERVER_SCRIPT) as params:
        yield params


@pytest.fixture(params=["stdio", "streamable-http"])
def tracing_server(request: pytest.FixtureRequest) -> StdioServer | HttpServer:
    return TRACING_STDIO if request.param == "stdio" else request.getfixturevalue("tracing_http")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


async def received(workspace: Path, server: StdioServer | HttpServer, tracing: Tracing | None) -> dict[str, Any]:
    """What the tracing server was told, for one call from kernel code under ``tracing``."""
    async with CodeExecutor(
        workspace=workspace, tools_dir=None, kernel=InProcessKernel(), sandbox=None, approval="auto", tracing=tracing
    ) as executor:
        executor.register_mcp_server("tracing", server)
        result = await executor.execute(CALL)
    return json.loads(result.text)


async def test_an_mcp_server_is_told_the_tool_calls_span_as_the_parent_of_its_request(
    workspace: Path, tracing_server: StdioServer | HttpServer, exporter: InMemorySpanExporter
) -> None:
    fields = await received(workspace, tracing_server, Tracing(tracer_provider=provider_for(exporter)))
    [call] = [span for span in exporter.get_finished_spans() if span.name == "execute_tool trace_context"]
    [action] = [span for span in exporter.get_finished_spans() if span.name == ACTION_SPAN]
    assert call.parent is not None and action.context is not None and call.parent.span_id == action.context.span_id
    # No SDK is set globally, so the mcp SDK's own client span records nothing and passes the call's on.
    assert fields["traceparent"] == traceparent(call)
    assert fields["baggage"] is None


async def test_with_tracing_off_the_caller_of_execute_is_still_the_servers_parent(
    workspace: Path, tracing_server: StdioServer | HttpServer, exporter: InMemorySpanExporter
) -> None:
    # The application traces its agent; ipybox records nothing (the global API, no SDK) but does not
    # break the trace between the agent and the MCP server. The agent's baggage is not passed on.
    agent = provider_for(exporter).get_tracer("agent")
    token = context.attach(baggage.set_baggage("user.id", "secret-user"))
    try:
        with agent.start_as_current_span("agent tool"):
            fields = await received(workspace, tracing_server, None)
    finally:
        context.detach(token)
    [outer] = exporter.get_finished_spans()
    assert fields["traceparent"] == traceparent(outer)
    assert fields["baggage"] is None


async def test_without_any_trace_the_server_is_told_none(
    workspace: Path, tracing_server: StdioServer | HttpServer
) -> None:
    fields = await received(workspace, tracing_server, None)
    assert fields == {"traceparent": None, "tracestate": None, "baggage": None}
