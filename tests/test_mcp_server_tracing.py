"""``ipybox mcp`` continues its client's trace: a real client calls ``execute_ipython_cell`` under
its own span, and the server (a subprocess with a global SDK writing spans to a file) makes the code
action a child of the mcp SDK's server span, which is the child of the client's span; the code's
call to a registered server carries the same trace on."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from deadline_support import patient
from mcp import Client, StdioServerParameters, types
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from servers.fixtures import TRACING_SERVER_SCRIPT
from tracing_support import provider_for, traceparent

from ipybox._engine._tracing import ACTION_SPAN

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "tests" / "servers" / "traced_ipybox_mcp.py"
# Starting the server (import mcp) and its first sandboxed kernel on a loaded 2-core machine.
START_TIMEOUT = 60.0
CALL = "from ipybox_kernel import call_tool\nprint(call_tool('tracing', 'trace_context', {}).text)"


def server_params(tmp_path: Path, spans: Path) -> StdioServerParameters:
    workspace, tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    tmp.mkdir()
    config = tmp_path / "ipybox.json"
    tracing = {"command": sys.executable, "args": [str(TRACING_SERVER_SCRIPT)]}
    config.write_text(json.dumps({"mcpServers": {"tracing": tracing}, "approval": {"allow": ["tracing.*"]}}))
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env["TMPDIR"] = str(tmp)
    args = [str(LAUNCHER), str(spans), "--workspace", str(workspace), "--config", str(config)]
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(REPO))


async def spans_of(path: Path, names: set[str]) -> list[dict[str, Any]]:
    """The server's spans, once every one named in ``names`` was written (the code action's span
    ends just after its result is delivered, so possibly after the client had its answer)."""
    with anyio.fail_after(patient(30)):
        while True:
            lines = path.read_text().splitlines() if path.exists() else []
            spans = [json.loads(line) for line in lines]
            if names <= {span["name"] for span in spans}:
                return spans
            await anyio.sleep(0.05)


def one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [span] = [span for span in spans if span["name"] == name]
    return span


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


SERVER_SPAN = "tools/call execute_ipython_cell"
TOOL_SPAN = "execute_tool trace_context"
SEND_SPAN = "MCP send tools/call trace_context"


async def test_ipybox_mcp_continues_its_clients_trace_down_to_the_servers_its_code_calls(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    agent = provider_for(exporter).get_tracer("agent")
    spans_file = tmp_path / "spans.jsonl"
    with anyio.fail_after(patient(START_TIMEOUT)):
        async with Client(server_params(tmp_path, spans_file)) as client:
            with agent.start_as_current_span("agent turn"):
                result = await client.call_tool("execute_ipython_cell", {"code": CALL})
    assert not result.is_error, text(result)
    received = json.loads(text(result))
    [turn] = exporter.get_finished_spans()
    assert turn.context is not None
    spans = await spans_of(spans_file, {SERVER_SPAN, ACTION_SPAN, TOOL_SPAN, SEND_SPAN})
    server, action, tool, send = (one(spans, name) for name in (SERVER_SPAN, ACTION_SPAN, TOOL_SPAN, SEND_SPAN))
    # One trace, from the client's span down to the request the code's tool call sent.
    assert {span["trace_id"] for span in (server, action, tool, send)} == {f"{turn.context.trace_id:032x}"}
    assert server["parent_id"] == f"{turn.context.span_id:016x}" and server["kind"] == "SERVER"
    assert action["parent_id"] == server["span_id"]
    assert tool["parent_id"] == action["span_id"]
    assert send["parent_id"] == tool["span_id"] and send["kind"] == "CLIENT"
    assert received["traceparent"].split("-")[1:3] == [send["trace_id"], send["span_id"]]
    assert traceparent(turn).split("-")[1] == send["trace_id"]


async def test_a_forged_trace_context_from_the_client_starts_a_new_trace_and_its_baggage_goes_no_further(
    tmp_path: Path,
) -> None:
    # The client chooses _meta: a malformed traceparent is ignored (the code action is a root of a new
    # trace), and the baggage it sends does not reach the servers the code calls.
    spans_file = tmp_path / "spans.jsonl"
    meta: Any = {"traceparent": "00-not-a-trace-context-01", "baggage": "user.id=from-the-client"}
    with anyio.fail_after(patient(START_TIMEOUT)):
        async with Client(server_params(tmp_path, spans_file)) as client:
            result = await client.call_tool("execute_ipython_cell", {"code": CALL}, meta=meta)
    assert not result.is_error, text(result)
    received = json.loads(text(result))
    assert received["baggage"] is None
    spans = await spans_of(spans_file, {SERVER_SPAN, ACTION_SPAN, SEND_SPAN})
    server, action, send = (one(spans, name) for name in (SERVER_SPAN, ACTION_SPAN, SEND_SPAN))
    assert server["parent_id"] is None and action["parent_id"] == server["span_id"]
    assert received["traceparent"].split("-")[1:3] == [send["trace_id"], send["span_id"]]
    assert send["trace_id"] == server["trace_id"]
