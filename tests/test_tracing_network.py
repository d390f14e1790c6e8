"""A code action's network connections on its span (events, never the traffic) and its account
(connections opened, bytes moved): the real sandbox and network proxy, a web server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from network_support import WebServer, serving
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracing_support import provider_for

from ipybox import CodeExecutor, Network, NetworkRequest, Tracing
from ipybox._engine._tracing import ACTION_SPAN

pytestmark = pytest.mark.anyio

BODY = 100_000


@pytest.fixture(scope="module")
def web() -> Iterator[WebServer]:
    with serving() as server:
        yield server


async def test_connections_are_events_of_the_code_actions_span_and_counted_on_its_account(
    workspace: Path, web: WebServer
) -> None:
    exporter = InMemorySpanExporter()
    # The host's loopback is reached only through an address entry (SECURITY.md, "Network").
    network = Network(allow=[f"web.test:{web.port}", f"127.0.0.1:{web.port}"], hosts={"web.test": "127.0.0.1"})
    code = (
        "import urllib.request, urllib.error\n"
        f"print(len(urllib.request.urlopen('http://web.test:{web.port}/big/{BODY}').read()))\n"
        "try:\n    urllib.request.urlopen('http://unlisted.test/secret?token=abc')\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    tracing = Tracing(tracer_provider=provider_for(exporter))
    async with CodeExecutor(workspace=workspace, network=network, tracing=tracing) as executor:
        result = await executor.execute(code)
    assert result.text.split() == [str(BODY), "403"]
    assert result.account.connections == 1
    assert result.account.network_bytes > BODY  # the response, its headers and the request
    [action] = [span for span in exporter.get_finished_spans() if span.name == ACTION_SPAN]
    events: dict[str, dict[str, Any]] = {event.name: dict(event.attributes or {}) for event in action.events}
    assert events["ipybox.network.allowed"] == {
        "server.address": "web.test",
        "server.port": web.port,
        "network.peer.address": "127.0.0.1",
    }
    assert events["ipybox.network.denied"]["server.address"] == "unlisted.test"
    assert "Network.allow" in events["ipybox.network.denied"]["ipybox.network.reason"]
    # Only the destination: no path, query or traffic of the request.
    assert "secret" not in str(events) and "token" not in str(events)
    attributes: dict[str, Any] = dict(action.attributes or {})
    assert attributes["ipybox.network.connections"] == 1
    assert attributes["ipybox.network.bytes_total"] >= result.account.network_bytes
    closed = events.get("ipybox.network.closed")
    if closed is not None:  # the relay may end after the code action (then the proxy closes it)
        assert closed["ipybox.network.bytes"] > BODY


async def test_an_asked_connections_span_names_the_line_that_opened_it(workspace: Path, web: WebServer) -> None:
    exporter = InMemorySpanExporter()
    network = Network(allow=[f"127.0.0.1:{web.port}"], unlisted="ask", hosts={"web.test": "127.0.0.1"})
    code = f"import urllib.request\nx = 1\nurllib.request.urlopen('http://web.test:{web.port}/asked').read()"
    tracing = Tracing(tracer_provider=provider_for(exporter), values=True)
    async with CodeExecutor(workspace=workspace, network=network, tracing=tracing) as executor:
        async for event in executor.execute(code):
            if isinstance(event, NetworkRequest):
                await event.accept()
    [connect] = [span for span in exporter.get_finished_spans() if span.name == "execute_tool connect"]
    attributes: dict[str, Any] = dict(connect.attributes or {})
    assert attributes["code.line.number"] == 3
    # The line's text only with values on (it may hold arguments), from the host's copy of the code.
    assert attributes["ipybox.call_site.text"] == code.splitlines()[2]
