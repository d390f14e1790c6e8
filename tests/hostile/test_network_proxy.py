"""Kernel code against the host's network proxy: byte budgets, request heads, address entries, the log.

Everything the proxy reads comes from kernel code, which has the forwarder's token (it is in its
environment) and so can write any bytes into the proxy socket. Servers here listen on 127.0.0.1 in
the test process; names lead there through ``Network.hosts``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from network_support import Sink

from ipybox import CodeExecutor, Network, NetworkEvent

pytestmark = pytest.mark.anyio


@pytest.fixture
def sink() -> Iterator[Sink]:
    server = Sink()
    try:
        yield server
    finally:
        server.close()


# Opens ``count`` connections one after the other, each the token line and a request head with
# ``size`` bytes right behind it in one write straight into the proxy socket (a CONNECT and the
# first bytes of its tunnel, or a POST and its body), and prints each reply's status line. The
# padding header makes the head arrive with the data rather than with the token line.
_HEAD_AND_DATA = """
import os, socket
token = os.environ["IPYBOX_TOOL_TOKEN"].encode() + b"\\n"
fields = b"Host: sink.test:{port}\\r\\nX-Pad: {pad}\\r\\n"
heads = [
    b"CONNECT sink.test:{port} HTTP/1.1\\r\\n" + fields + b"\\r\\n",
    b"POST http://sink.test:{port}/ HTTP/1.1\\r\\n" + fields + b"Content-Length: {size}\\r\\n\\r\\n",
]
for i in range({count}):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(os.environ["IPYBOX_NET_SOCKET"])
    s.sendall(token + heads[i % 2] + b"x" * {size})
    s.shutdown(socket.SHUT_WR)
    reply = b""
    try:
        while chunk := s.recv(65536):
            reply += chunk
    except ConnectionResetError:  # a refusal that left the data unread
        pass
    s.close()
    print(reply.split(b"\\r\\n")[0].decode() or "closed")
"""


async def test_bytes_sent_along_with_the_request_head_count_against_max_bytes(tmp_path: Path, sink: Sink) -> None:
    events: list[NetworkEvent] = []
    network = Network(
        allow=[f"sink.test:{sink.port}", f"127.0.0.1:{sink.port}"],
        hosts={"sink.test": "127.0.0.1"},
        max_bytes=100_000,
        on_event=events.append,
    )
    async with CodeExecutor(workspace=tmp_path, network=network) as executor:
        code = _HEAD_AND_DATA.format(port=sink.port, size=60_000, count=40, pad="p" * 300)
        result = await executor.execute(textwrap.dedent(code))
    statuses = result.text.splitlines()
    connected = [e for e in events if e.kind == "allowed"]
    # 40 connections of 60 KB each: 2.4 MB reached the sink when only the relay counted.
    assert sink.settled(len(connected)) == 100_000
    assert sum(e.bytes for e in events if e.kind == "closed") == 100_000
    limits = [e for e in events if e.kind == "limit"]
    assert limits and all("Network.max_bytes" in (e.reason or "") for e in limits)
    refused = "HTTP/1.1 403 ipybox: this code action moved more than 100000 bytes"
    assert len(statuses) == 40 and all(s.startswith(refused) or s == "closed" for s in statuses[len(connected) :])
    assert len(connected) == 2
