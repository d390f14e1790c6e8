"""Kernel code against the host's network proxy: byte budgets, request heads, address entries, the log.

Everything the proxy reads comes from kernel code, which has the forwarder's token (it is in its
environment) and so can write any bytes into the proxy socket. Servers here listen on 127.0.0.1 in
the test process; names lead there through ``Network.hosts``.
"""

from __future__ import annotations

import ast
import ipaddress
import logging
import random
import textwrap
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import anyio
import pytest
from network_support import Sink, WebServer, exchange, proxy_log, serving

from ipybox import ApprovalRequest, CodeExecutor, Network, NetworkEvent, UsageError
from ipybox._approval._decisions import ApprovalDecision
from ipybox.network._proxy import NetworkProxy
from ipybox.network._quota import BURST, INTERVAL

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


_TOKEN = "t" * 32


@pytest.fixture
def web_port() -> Iterator[int]:
    with serving() as server:
        yield server.port


@pytest.fixture
async def proxy(tmp_path: Path, web_port: int) -> AsyncGenerator[NetworkProxy]:
    """A proxy for a running code action that lists a name no test sends and the web server's
    address, and asks nothing."""

    async def never(host: str, port: int, execution_id: str, line: int | None) -> ApprovalDecision:
        raise AssertionError("nothing here may be asked")

    network = Network(allow=["listed.test", f"127.0.0.1:{web_port}"], connect_timeout=5)
    proxy = NetworkProxy(network, socket_path=tmp_path / "p.sock", token=_TOKEN, running=lambda: "e1", ask=never)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.run)
        yield proxy
        tg.cancel_scope.cancel()


# Hosts in brackets that are not an IPv6 address, or with something other than ':PORT' after them,
# unbracketed IPv6, zone ids, ports out of range, and heads h11 refuses: in CONNECT targets and in
# absolute URLs.
_MALFORMED_AUTHORITIES = [
    "[::1",
    "[zzz]:80",
    "[]:80",
    "[]",
    "[::1]x:80",
    "[::1]x",
    "[::1]:x",
    "[::1]:",
    "[::1]:80:80",
    "[[::1]]:80",
    "[::1]]:80",
    "[127.0.0.1]:80",
    "[v1.x]:80",
    "[fe80::1%25eth0]:80",
    "::1:80",
    "a]b:80",
    "a[b]:80",
    ":80",
    "example.org:65536",
    "example.org:0",
    "example.org:-1",
    "example.org:+80",
    "%31%32%37.0.0.1:80",
    "a..b:80",
    "-a.test:80",
]
_MALFORMED_HEADS = [
    # A request line of 12 KB of terminal escapes, for the host's log (first: later warnings are
    # rate-limited).
    b"GET http://listed.test/" + b"\x1b[2J\x07" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    *(f"CONNECT {authority} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for authority in _MALFORMED_AUTHORITIES),
    *(f"GET http://{authority}/p HTTP/1.1\r\nHost: x\r\n\r\n".encode() for authority in _MALFORMED_AUTHORITIES),
    b"CONNECT example.org HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://b\xc3\xbccher.de/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http:///p HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://user@/p HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http:/listed.test/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET ftp://listed.test/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /p HTTP/1.1\r\nHost: [::1\r\n\r\n",
    b"GET http://listed.test/ HTTP/1.1\r\nHost: listed.test\r\nHost: [::1]\r\n\r\n",
    b"POST http://listed.test/ HTTP/1.1\r\nHost: listed.test\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
]


async def test_malformed_hosts_in_connect_targets_urls_and_host_fields_get_a_400_never_a_traceback(
    proxy: NetworkProxy,
) -> None:
    # Then a fuzz of authorities built from the characters that matter to parsing them: each must be
    # a 400, or a valid destination that is not listed (403), never an error of the proxy.
    alphabet = "[]:%@.-/?#0123456789abcdef"
    fuzz = random.Random(25)
    authorities = ["".join(fuzz.choices(alphabet, k=fuzz.randint(0, 12))) for _ in range(300)]
    fuzzed = [
        f"{method} {prefix}{a} HTTP/1.1\r\nHost: {a}\r\n\r\n".encode()
        for a in authorities
        for method, prefix in [("CONNECT", ""), ("GET", "http://")]
    ]
    first = f"{_TOKEN}\n".encode()
    with proxy_log() as records:
        malformed = [await exchange(proxy.socket_path, first + head) for head in _MALFORMED_HEADS]
        others = [await exchange(proxy.socket_path, first + head) for head in fuzzed]
    for head, reply in zip(_MALFORMED_HEADS, malformed, strict=True):
        assert reply.startswith(b"HTTP/1.1 400 ipybox: "), (head, reply[:200])
    for head, reply in zip(fuzzed, others, strict=True):
        assert reply[:13] in (b"HTTP/1.1 400 ", b"HTTP/1.1 403 "), (head, reply[:200])
        assert b"allowlist" in reply or not reply.startswith(b"HTTP/1.1 403"), (head, reply[:200])
    assert [r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR] == []
    # What kernel code wrote reaches the log short, on one line, without control characters.
    assert all(len(r.getMessage()) < 1000 and r.getMessage().isprintable() for r in records)


async def test_a_request_goes_where_its_url_says_and_its_host_field_is_that_url_s_host(
    proxy: NetworkProxy, web_port: int
) -> None:
    first = f"{_TOKEN}\n".encode()
    head = f"GET http://127.0.0.1:{web_port}/x HTTP/1.1\r\nHost: metadata.internal\r\n\r\n"
    reply = await exchange(proxy.socket_path, first + head.encode())
    assert reply.endswith(f"hello /x for 127.0.0.1:{web_port}".encode())


@pytest.fixture
def internal() -> Iterator[WebServer]:
    """A service on the host's loopback."""
    with serving() as server:
        yield server


# Asks the proxy for the service on the host's loopback by address literals in several forms.
_LOOPBACK = """
import os, http.client
proxy = os.environ["HTTP_PROXY"].removeprefix("http://")
for host in ("127.0.0.1", "127.1.2.3", "[::ffff:127.0.0.1]", "[::1]", "0.0.0.0", "[::]"):
    connection = http.client.HTTPConnection(proxy, timeout=60)
    connection.request("GET", f"http://{{host}}:{port}/secret")
    response = connection.getresponse()
    print(response.status, response.read().decode() if response.status == 200 else response.reason)
"""


async def test_a_network_entry_wide_enough_to_hold_the_host_reaches_it_only_when_the_application_says_so(
    tmp_path: Path, internal: WebServer
) -> None:
    code = textwrap.dedent(_LOOPBACK.format(port=internal.port))
    wide = ["0.0.0.0/0:*", "[::/0]:*"]
    async with CodeExecutor(workspace=tmp_path, network=Network(allow=wide)) as executor:
        lines = (await executor.execute(code)).text.splitlines()
    assert len(lines) == 6
    for line in lines:
        assert line.startswith("403 ipybox: ") and "Network(networks_reach_host=True)" in line, line
    assert internal.paths == []
    async with CodeExecutor(workspace=tmp_path, network=Network(allow=wide, networks_reach_host=True)) as executor:
        lines = (await executor.execute(code)).text.splitlines()
    assert lines[0] == f"200 hello /secret for 127.0.0.1:{internal.port}"
    assert internal.paths and set(internal.paths) == {"/secret"}


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("168.63.129.16", "cloud metadata"),
        ("0.1.2.3", "0.0.0.0/8"),
        ("::ffff:169.254.169.254", "(IPv4 169.254.169.254) is a link-local"),
        ("2002:7f00:1::", "(IPv4 127.0.0.1) is a loopback"),
    ],
)
def test_network_entries_do_not_reach_loopback_link_local_or_metadata_but_single_address_entries_do(
    address: str, why: str
) -> None:
    ip = ipaddress.ip_address(address)
    wide = Network(allow=["0.0.0.0/0:*", "[::/0]:*", "169.254.0.0/16", "100.64.0.0/10", "[fd00::/8]"])
    refusal = wide.refusal(ip, 80)
    assert refusal is not None and why in refusal and "networks_reach_host=True" in refusal
    assert Network(allow=["0.0.0.0/0:*", "[::/0]:*"], networks_reach_host=True).refusal(ip, 80) is None
    assert Network(allow=[f"[{address}]" if ip.version == 6 else address]).refusal(ip, 80) is None
    # Private networks are what network entries are for.
    assert wide.refusal(ipaddress.ip_address("10.1.2.3"), 80) is None


@pytest.mark.parametrize("entry", ["0.0.0.0", "0.0.0.0:*", "[::]", "[::]:80"])
def test_the_unspecified_address_is_no_allow_entry(entry: str) -> None:
    with pytest.raises(UsageError, match="the unspecified address, and connecting to it reaches this host"):
        Network(allow=[entry])


# Refused connections as fast as the proxy answers them: half with a wrong token, half to an
# unlisted destination.
_REFUSED = """
import os, socket
token = os.environ["IPYBOX_TOOL_TOKEN"].encode()
statuses = set()
for i in range({count}):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(os.environ["IPYBOX_NET_SOCKET"])
    s.sendall((token if i % 2 else b"wrong") + b"\\nCONNECT unlisted.test:443 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    statuses.add(s.recv(12))
    s.close()
print(sorted(statuses))
"""


async def test_thousands_of_refused_connections_leave_a_bounded_log_that_counts_what_it_left_out(
    tmp_path: Path,
) -> None:
    events: list[NetworkEvent] = []
    network = Network(allow=["listed.test"], on_event=events.append)
    count = 2000
    with proxy_log() as records:
        started = time.monotonic()
        async with CodeExecutor(workspace=tmp_path, network=network) as executor:
            result = await executor.execute(textwrap.dedent(_REFUSED.format(count=count)))
        elapsed = time.monotonic() - started
    assert result.text.strip() == "[b'HTTP/1.1 403']"
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    summaries = [r for r in warnings if "network_suppressed" in r.__dict__]
    logged = len(warnings) - len(summaries)
    windows = int(elapsed // INTERVAL) + 1
    assert logged <= BURST * windows and len(summaries) <= windows + 1
    # Nothing is lost: what was not logged is counted, and the application's callback saw it all.
    assert logged + sum(r.__dict__["network_suppressed"] for r in summaries) == count
    assert "were not logged" in summaries[-1].getMessage()
    assert len([e for e in events if e.kind == "denied"]) == count // 2


# Opens 300 connections into the proxy socket at once, each with the token and a request head that
# never ends, and holds them; then reads what each got, and makes one ordinary request.
_FLOOD = """
import os, socket, urllib.request
token = os.environ["IPYBOX_TOOL_TOKEN"].encode()
held = []
replies = {{}}
for _ in range(300):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["IPYBOX_NET_SOCKET"])  # blocking: waits while the listen backlog is full
    s.settimeout(120)
    try:
        s.sendall(token + b"\\nCONNECT web.test:{port} HTTP/1.1\\r\\nX-Slow: ")
    except (BrokenPipeError, ConnectionResetError):
        # Past the proxy's slots a connection is closed at once, which may beat the head.
        replies["closed"] = replies.get("closed", 0) + 1
        s.close()
        continue
    held.append(s)
for s in held:
    try:
        status = s.recv(12).decode() or "closed"
    except ConnectionResetError:
        status = "closed"
    replies[status] = replies.get(status, 0) + 1
    s.close()
print(sorted(replies.items()))
print(urllib.request.urlopen("http://web.test:{port}/after").read().decode())
"""


async def test_a_flood_of_unfinished_request_heads_holds_a_bounded_number_of_slots_and_then_the_proxy_serves(
    tmp_path: Path, web_port: int
) -> None:
    network = Network(
        allow=[f"web.test:{web_port}", f"127.0.0.1:{web_port}"],
        hosts={"web.test": "127.0.0.1"},
        max_connections=8,
        connect_timeout=3,
    )
    async with CodeExecutor(workspace=tmp_path, network=network) as executor:
        result = await executor.execute(textwrap.dedent(_FLOOD.format(port=web_port)))
    replies, after = result.text.splitlines()
    counts = dict(ast.literal_eval(replies))
    # Each held connection is a task of the proxy until its head times out: at most
    # max_connections + 32 of them; the rest are closed unanswered at once.
    assert counts.get("HTTP/1.1 504", 0) <= 8 + 32
    assert counts["closed"] >= 300 - (8 + 32)
    assert sum(counts.values()) == 300
    assert after == f"hello /after for web.test:{web_port}"


async def test_a_host_name_outside_ascii_is_refused_before_anyone_is_asked_and_idna_names_are_shown_as_sent(
    tmp_path: Path,
) -> None:
    asked: list[tuple[str, int]] = []

    async def ask(host: str, port: int, execution_id: str, line: int | None) -> ApprovalDecision:
        asked.append((host, port))
        return ApprovalDecision(approved=False, reason="no")

    network = Network(unlisted="ask")
    proxy = NetworkProxy(network, socket_path=tmp_path / "p.sock", token=_TOKEN, running=lambda: "e1", ask=ask)
    first = f"{_TOKEN}\n".encode()
    # "pypi.org" with a Cyrillic "р" and "о", in UTF-8, as a CONNECT target and in a URL; then in
    # its IDNA form, which is what a person is shown.
    lookalike = "руpi.оrg".encode()
    heads = [
        b"CONNECT " + lookalike + b":443 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://" + lookalike + b"/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT xn--pi-lmcb.xn--rg-qmc:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    replies: list[bytes] = []
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.run)
        replies += [await exchange(proxy.socket_path, first + head) for head in heads]
        tg.cancel_scope.cancel()
    assert [reply[:13] for reply in replies] == [b"HTTP/1.1 400 ", b"HTTP/1.1 400 ", b"HTTP/1.1 403 "]
    assert asked == [("xn--pi-lmcb.xn--rg-qmc", 443)]


_RETRIES = """
import urllib.request, urllib.error
for _ in range(30):
    try:
        urllib.request.urlopen("http://rejected.test/", timeout=60)
    except urllib.error.HTTPError as e:
        last = e.reason
print(last)
"""


async def test_a_destination_rejected_once_is_not_asked_again_in_the_same_code_action(tmp_path: Path) -> None:
    asked: list[str] = []

    def reject(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(str(request))
        return ApprovalDecision(approved=False, reason="not that one")

    network = Network(unlisted="ask")
    async with CodeExecutor(workspace=tmp_path, network=network, approval=reject) as executor:
        first = await executor.execute(_RETRIES)
        second = await executor.execute(_RETRIES)
    # 30 connections a code action, one question each time.
    assert asked == ["network connection to rejected.test:80"] * 2
    assert first.text == second.text
    assert first.text.startswith("ipybox: the application rejected the connection to rejected.test:80 earlier in")
    assert "not that one; it is asked again in the next code action" in first.text


async def test_what_follows_the_token_is_a_calling_line_only_when_it_is_a_plain_number(tmp_path: Path) -> None:
    # The forwarder's first line may carry the line of the code action that connected; kernel code
    # can send anything there. Anything but 1 to 9 plain digits is no line, and the connection is
    # still decided (the host then says the line is unknown); a wrong token is still refused.
    lines: list[int | None] = []

    async def ask(host: str, port: int, execution_id: str, line: int | None) -> ApprovalDecision:
        lines.append(line)
        return ApprovalDecision(approved=False, reason="no")

    proxy = NetworkProxy(
        Network(unlisted="ask"), socket_path=tmp_path / "p.sock", token=_TOKEN, running=lambda: "e1", ask=ask
    )
    firsts = [
        f"{_TOKEN} 7",
        f"{_TOKEN} 123456789",
        f"{_TOKEN} 1234567890",  # 10 digits: past any code a person reads
        f"{_TOKEN} 007",
        f"{_TOKEN} -3",
        f"{_TOKEN} 7\x1b[2J\u202e",
        f"{_TOKEN} 7 8",
        f"{_TOKEN}",
        f"{_TOKEN}x 7",  # the token must still match exactly
    ]
    replies: list[bytes] = []
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.run)
        for first in firsts:
            head = f"CONNECT web.test:{len(replies) + 1} HTTP/1.1\r\nHost: x\r\n\r\n"
            replies.append(await exchange(proxy.socket_path, f"{first}\n{head}".encode()))
        tg.cancel_scope.cancel()
    assert [reply[:13] for reply in replies] == [b"HTTP/1.1 403 "] * len(firsts)
    assert b"wrong or missing token" in replies[-1]
    assert lines == [7, 123456789, None, None, None, None, None, None]
