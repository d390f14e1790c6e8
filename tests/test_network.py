"""Network egress: the allowlist, asked destinations, address checks and limits, from kernel code.

Every server here listens on 127.0.0.1 in this process; names such as ``web.test`` lead there only
through ``Network.hosts``, so no test resolves or reaches anything outside this machine.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import sys
import textwrap
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
import trustme
from mcp import Client, StdioServerParameters, types
from mcp.client.context import ClientRequestContext
from network_support import WebServer, exchange, proxy_log, serving

from ipybox import (
    ApprovalRequest,
    ApprovalRules,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    Network,
    NetworkEvent,
    NetworkRequest,
    UsageError,
)
from ipybox._approval._decisions import ApprovalDecision
from ipybox._engine._callsite import CallSite
from ipybox.network._policy import address_problem
from ipybox.network._proxy import NetworkProxy

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def web() -> Iterator[WebServer]:
    with serving() as server:
        yield server


@pytest.fixture(scope="module")
def internal() -> Iterator[WebServer]:
    """A service on the host's loopback that no test allows: nothing may ever reach it."""
    with serving() as server:
        yield server


@pytest.fixture(scope="module")
def tls_web(ca: trustme.CA) -> Iterator[WebServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("tls.test").configure_cert(context)  # pyright: ignore[reportUnknownMemberType]
    with serving(context) as server:
        yield server


@pytest.fixture(scope="module")
def net_workspace(tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA) -> Path:
    path = tmp_path_factory.mktemp("net")
    ca.cert_pem.write_to_path(str(path / "ca.pem"))
    return path


# Names that lead to the host's loopback, a private network, cloud metadata and an IPv4-mapped
# IPv6 loopback: all listed by name, none allowed by an address entry.
_TRAPS = {"sneaky.test": "127.0.0.1", "metadata.test": "169.254.169.254", "private.test": "10.0.0.1"}
_TRAPS6 = {"mapped.test": "::ffff:127.0.0.1"}


@pytest.fixture(scope="module")
async def net(
    net_workspace: Path, web: WebServer, tls_web: WebServer, internal: WebServer
) -> AsyncGenerator[tuple[CodeExecutor, list[NetworkEvent]]]:
    events: list[NetworkEvent] = []
    network = Network(
        allow=[
            f"web.test:{web.port}",
            f"tls.test:{tls_web.port}",
            # The web servers' own ports on the host's loopback, and nothing else there.
            f"127.0.0.1:{web.port}",
            f"127.0.0.1:{tls_web.port}",
            f"localhost:{internal.port}",
            *(f"{name}:{internal.port}" for name in _TRAPS | _TRAPS6),
            "metadata.test",
        ],
        hosts={"web.test": "127.0.0.1", "tls.test": "127.0.0.1", **_TRAPS, **_TRAPS6},
        on_event=events.append,
    )
    async with CodeExecutor(workspace=net_workspace, network=network) as executor:
        yield executor, events


async def _run(executor: CodeExecutor, code: str) -> str:
    result = await executor.execute(textwrap.dedent(code))
    return result.text


async def test_an_allowed_destination_is_reachable_with_urllib_and_httpx_over_http_and_https(
    net: tuple[CodeExecutor, list[NetworkEvent]], web: WebServer, tls_web: WebServer
) -> None:
    executor, events = net
    text = await _run(
        executor,
        f"""
        import ssl, urllib.request, httpx
        ca = ssl.create_default_context(cafile="ca.pem")
        print(urllib.request.urlopen("http://web.test:{web.port}/plain").read().decode())
        print(httpx.get("http://web.test:{web.port}/httpx").text)
        print(urllib.request.urlopen("https://tls.test:{tls_web.port}/tunnel", context=ca).read().decode())
        print(httpx.get("https://tls.test:{tls_web.port}/httpx-tunnel", verify=ca).text)
        """,
    )
    assert text.splitlines() == [
        f"hello /plain for web.test:{web.port}",
        f"hello /httpx for web.test:{web.port}",
        f"hello /tunnel for tls.test:{tls_web.port}",
        f"hello /httpx-tunnel for tls.test:{tls_web.port}",
    ]
    allowed = [e for e in events if e.kind == "allowed"]
    assert {(e.host, e.address) for e in allowed} >= {("web.test", "127.0.0.1"), ("tls.test", "127.0.0.1")}


async def test_an_unlisted_destination_is_denied_with_an_error_that_names_the_allowlist(
    net: tuple[CodeExecutor, list[NetworkEvent]], web: WebServer
) -> None:
    executor, events = net
    text = await _run(
        executor,
        """
        import urllib.request, urllib.error, httpx
        try:
            urllib.request.urlopen("http://unlisted.test/")
        except urllib.error.HTTPError as e:
            print(e.code, e.reason)
        try:
            httpx.get("https://unlisted.test/")
        except httpx.ProxyError as e:
            print(e)
        """,
    )
    first, second = text.splitlines()
    assert first.startswith("403 ipybox: unlisted.test:80 is not in this executor's network allowlist (Network.allow)")
    assert second.startswith("403 ipybox: unlisted.test:443 is not in this executor's network allowlist")
    assert [e.reason is not None and "allowlist" in e.reason for e in events if e.host == "unlisted.test"] == [
        True,
        True,
    ]


async def test_loopback_private_and_metadata_addresses_are_refused_even_when_a_listed_name_leads_there(
    net: tuple[CodeExecutor, list[NetworkEvent]], internal: WebServer
) -> None:
    executor, _ = net
    # localhost is resolved by the host's own resolver; the others through Network.hosts.
    names = ["localhost", *_TRAPS, *_TRAPS6]
    text = await _run(
        executor,
        f"""
        import os, http.client
        # localhost is in NO_PROXY (it is the sandbox's own loopback): ask the proxy directly.
        proxy = os.environ["HTTP_PROXY"].removeprefix("http://")
        def fetch(label, url):
            connection = http.client.HTTPConnection(proxy, timeout=30)
            connection.request("GET", url)
            response = connection.getresponse()
            print(label, response.status, response.reason)
        for name in {names!r}:
            fetch(name, f"http://{{name}}:{internal.port}/secret")
        fetch("metadata:80", "http://metadata.test/latest/meta-data/")
        """,
    )
    lines = text.splitlines()
    assert len(lines) == len(names) + 1
    for line in lines:
        assert " 403 ipybox: " in line and "non-public addresses" in line, line
    assert "loopback" in lines[0] and "127.0.0.1" in lines[0]
    assert "169.254.169.254 is a link-local address" in lines[-1]
    assert "10.0.0.1 is a private address" in text
    assert "::ffff:7f00:1 (IPv4 127.0.0.1) is a loopback address" in text
    assert internal.paths == []


async def test_kernel_code_cannot_bypass_the_proxy_with_raw_sockets_its_own_dns_or_the_proxy_socket(
    net: tuple[CodeExecutor, list[NetworkEvent]], web: WebServer, internal: WebServer
) -> None:
    executor, _ = net
    text = await _run(
        executor,
        f"""
        import os, socket
        def attempt(what, fn):
            try:
                fn()
                print(what, "worked")
            except OSError as e:
                print(what, type(e).__name__, e.errno)
        attempt("loopback", lambda: socket.create_connection(("127.0.0.1", {web.port}), timeout=5))
        attempt("outside", lambda: socket.create_connection(("10.0.0.1", 80), timeout=5))
        attempt("dns", lambda: socket.getaddrinfo("example.org", 443))
        path = os.environ["IPYBOX_NET_SOCKET"]
        attempt("replace socket", lambda: os.unlink(path))

        def talk(first):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.sendall(first + b"CONNECT unlisted.test:443 HTTP/1.1\\r\\nHost: unlisted.test:443\\r\\n\\r\\n")
            print(s.recv(200).split(b"\\r\\n")[0].decode())
            s.close()
        talk(b"not-the-token\\n")
        talk(os.environ["IPYBOX_TOOL_TOKEN"].encode() + b"\\n")
        """,
    )
    lines = text.splitlines()
    assert lines[0] == "loopback ConnectionRefusedError 111"
    assert lines[1] == "outside OSError 101"  # ENETUNREACH: the sandbox has no route
    assert lines[2].startswith("dns gaierror")
    assert lines[3].startswith("replace socket") and "worked" not in lines[3]
    assert lines[4].startswith("HTTP/1.1 403 ipybox: wrong or missing token")
    # With the token the socket is just another way to the same proxy: the same policy applies.
    assert lines[5].startswith("HTTP/1.1 403 ipybox: unlisted.test:443 is not in this executor's network allowlist")
    assert internal.paths == []


async def test_a_connection_is_closed_when_the_code_action_that_opened_it_ends(
    net: tuple[CodeExecutor, list[NetworkEvent]], web: WebServer
) -> None:
    executor, _ = net
    await _run(
        executor,
        f"""
        import os, socket, threading
        tunnel = socket.create_connection(("127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])))
        tunnel.sendall(b"CONNECT web.test:{web.port} HTTP/1.1\\r\\nHost: web.test\\r\\n\\r\\n")
        assert tunnel.recv(100).startswith(b"HTTP/1.1 200")
        tunnel.settimeout(60)
        ended = threading.Event()
        threading.Thread(target=lambda: (tunnel.recv(1), ended.set())).start()
        """,
    )
    text = await _run(executor, "print(ended.wait(timeout=60))")
    assert text.strip() == "True"


@pytest.fixture(scope="module")
async def asking(net_workspace: Path, web: WebServer) -> AsyncGenerator[CodeExecutor]:
    network = Network(
        # The web server's port on the host's loopback may be reached, but no name is listed.
        allow=[f"127.0.0.1:{web.port}"],
        unlisted="ask",
        hosts={
            "web.test": "127.0.0.1",
            "other.test": "127.0.0.1",
            "meta.test": "169.254.169.254",
            "a.search_x.evil.test": "127.0.0.1",
        },
    )
    async with CodeExecutor(workspace=net_workspace, network=network) as executor:
        yield executor


_FETCH = """
import urllib.request, urllib.error
for name in {names!r}:
    try:
        print(urllib.request.urlopen(f"http://{{name}}:{port}/asked").read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.reason)
"""


async def _answer_each(
    executor: CodeExecutor, code: str, answers: list[str], approval: ApprovalRules | None = None
) -> tuple[list[NetworkRequest], str]:
    asked: list[NetworkRequest] = []
    text = ""
    async for item in executor.execute(code, approval=approval):
        if isinstance(item, NetworkRequest):
            answer = answers[len(asked)]
            asked.append(item)
            if answer == "reject":
                await item.reject("not today")
            else:
                await item.accept(remember=answer == "remember")
        elif isinstance(item, CodeExecutionResult):
            text = item.text
    return asked, text


async def test_an_unlisted_destination_with_ask_becomes_an_approval_event_and_both_answers_work(
    asking: CodeExecutor, web: WebServer
) -> None:
    # Two destinations: a rejected one is not asked again in the same code action.
    code = _FETCH.format(names=["web.test", "other.test"], port=web.port)
    asked, text = await _answer_each(asking, code, ["reject", "accept"])
    assert text.splitlines() == [
        f"403 ipybox: the application rejected the connection to web.test:{web.port}: not today",
        f"hello /asked for other.test:{web.port}",
    ]
    first = asked[0]
    assert (first.host, first.port, first.server_name, first.tool_name) == ("web.test", web.port, "ipybox", "connect")
    assert first.id.startswith(first.execution_id + ":")
    assert dict(first.tool_args) == {"host": "web.test", "port": web.port}
    assert first.rule_name == f"network:web.test:{web.port}"


async def test_a_network_request_names_the_line_that_opened_the_connection_or_says_it_is_unknown(
    asking: CodeExecutor, web: WebServer
) -> None:
    # The cell's own line (urllib through the forwarder), then one from a thread, which has no line.
    code = _FETCH.format(names=["web.test"], port=web.port) + textwrap.dedent(
        f"""
        import threading
        t = threading.Thread(target=lambda: urllib.request.urlopen("http://other.test:{web.port}/t").read())
        t.start(); t.join()
        """
    )
    asked, _ = await _answer_each(asking, code, ["accept", "accept"])
    cell, thread = asked
    line = 'print(urllib.request.urlopen(f"http://{name}:' + str(web.port) + '/asked").read().decode())'
    # Line 4 as the kernel counts: IPython drops the code's leading blank line, and the host alike.
    assert cell.call_site == CallSite(line=4, text=line, module=None)
    assert f"Made at: line 4 of the code action: {line}" in cell.description
    assert thread.call_site == CallSite(line=None, text=None, module=None)
    assert "Made at: an unknown line" in thread.description


@pytest.mark.parametrize("forged", [10**8, 40, 0])
async def test_a_forged_calling_line_shows_no_text_the_host_did_not_run(
    asking: CodeExecutor, web: WebServer, forged: int
) -> None:
    # Kernel code rewrites what the forwarder sends: a line past the end of this code action (40: a
    # line of the longer code action run before it), a huge one, zero. The host shows no text for
    # any of them; its copy of this code has 4 lines.
    await asking.execute("\n".join(f"earlier_{i} = {i}" for i in range(50)))
    code = (
        "import urllib.request, ipybox_kernel._netproxy as n\n"
        f"n._note_line = lambda sock, line: n._LINES.__setitem__(sock.getsockname()[1], {forged})\n"
        f"urllib.request.urlopen('http://web.test:{web.port}/forged').read()\n"
        "print('done')"
    )
    asked, text = await _answer_each(asking, code, ["accept"])
    assert text.strip() == "done"
    assert asked[0].call_site == CallSite(line=None, text=None, module=None)
    assert "earlier_" not in asked[0].description and "Made at: an unknown line" in asked[0].description


async def test_a_forged_calling_line_inside_the_code_can_only_point_at_another_line_of_it(
    asking: CodeExecutor, web: WebServer
) -> None:
    code = (
        "import urllib.request, ipybox_kernel._netproxy as n\n"
        "n._note_line = lambda sock, line: n._LINES.__setitem__(sock.getsockname()[1], 1)\n"
        f"urllib.request.urlopen('http://web.test:{web.port}/forged').read()"
    )
    asked, _ = await _answer_each(asking, code, ["accept"])
    first = "import urllib.request, ipybox_kernel._netproxy as n"
    assert asked[0].call_site == CallSite(line=1, text=first, module=None)


async def test_an_approved_destination_still_cannot_reach_a_non_public_address(asking: CodeExecutor) -> None:
    asked, text = await _answer_each(asking, _FETCH.format(names=["meta.test"], port=80), ["accept"])
    assert len(asked) == 1
    assert text.startswith("403 ipybox: meta.test leads only to non-public addresses (169.254.169.254 is a link-local")


async def test_allow_for_this_executor_is_remembered_and_approval_rules_match_destinations(
    asking: CodeExecutor, web: WebServer
) -> None:
    code = _FETCH.format(names=["other.test"], port=web.port)
    asked, text = await _answer_each(asking, code, ["remember"])
    assert len(asked) == 1 and text.startswith("hello")
    asked, text = await _answer_each(asking, code, [])
    assert asked == [] and text.startswith("hello")
    # Each execution's own rules get a fresh kernel: after code that ran under other rules (or "ask"),
    # its connections would be refused whatever the rules say (SECURITY.md, "Attribution of requests").
    await asking.reset()
    rules = ApprovalRules(allow_net=["web.test:*"], otherwise="reject")
    code = _FETCH.format(names=["web.test"], port=web.port)
    asked, text = await _answer_each(asking, code, [], approval=rules)
    assert asked == [] and text.startswith("hello")
    await asking.reset()
    rules = ApprovalRules(deny_net=["web.test:*"])
    asked, text = await _answer_each(asking, code, [], approval=rules)
    assert asked == [] and "is denied by the approval rules" in text
    await asking.reset()  # the next tests run under the executor's "ask" again


async def test_a_tool_glob_never_approves_a_network_destination(asking: CodeExecutor, web: WebServer) -> None:
    """Issue #25, class 2: ``*.search_*`` (the docstring's own example) and ``*`` approved the
    unlisted host ``a.search_x.evil.test``, tool names and ``network:host:port`` being matched by the
    same globs. Tool globs now match tool calls only: the connection is asked about."""
    code = _FETCH.format(names=["a.search_x.evil.test"], port=web.port)
    for pattern in ("*.search_*", "*", "*.*"):
        # A fresh kernel for each policy: after code under another one, the connection would be
        # refused without asking (SECURITY.md, "Attribution of requests").
        await asking.reset()
        rules = ApprovalRules(allow=[pattern])
        asked, text = await _answer_each(asking, code, ["reject"], approval=rules)
        assert [r.host for r in asked] == ["a.search_x.evil.test"], pattern
        assert text.startswith("403 ipybox: the application rejected the connection"), pattern
    await asking.reset()  # the next tests run under the executor's "ask" again
    with pytest.raises(UsageError, match=r"names a network destination.*allow_net.*'\*\.evil\.test:\*'"):
        ApprovalRules(allow=["network:*.evil.test:*"])


def test_tool_globs_match_the_server_and_the_tool_part_each_on_its_own() -> None:
    def decides(pattern: str, server: str, tool: str) -> bool:
        request = ApprovalRequest(id="e:1", server_name=server, tool_name=tool, tool_args={}, server="s")
        return ApprovalRules(allow=[pattern]).decide(request) is not None

    assert decides("*.search_*", "github", "search_issues")
    assert not decides("*.search_*", "a.search_x", "delete")  # '*' does not span the dot
    assert decides("my.server.x", "my.server", "x") and not decides("github.*", "github.evil", "x")
    assert decides("*", "any.server", "any_tool")


async def test_limits_on_connections_bytes_and_idle_time_hold_and_are_reported(
    net_workspace: Path, web: WebServer
) -> None:
    events: list[NetworkEvent] = []
    network = Network(
        allow=[f"web.test:{web.port}", f"127.0.0.1:{web.port}"],
        hosts={"web.test": "127.0.0.1"},
        max_connections=2,
        max_bytes=100_000,
        idle_timeout=1.0,
        on_event=events.append,
    )
    async with CodeExecutor(workspace=net_workspace, network=network) as executor:
        opened = f"""
        import os, socket, urllib.request, urllib.error
        proxy = ("127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1]))
        def tunnel():
            s = socket.create_connection(proxy)
            s.sendall(b"CONNECT web.test:{web.port} HTTP/1.1\\r\\nHost: web.test\\r\\n\\r\\n")
            s.settimeout(60)
            return s, s.recv(200).split(b"\\r\\n")[0].decode()
        held = [tunnel(), tunnel()]
        print([status for _, status in held])
        print(tunnel()[1])
        # Closed by the proxy once it has been idle for a second: recv returns the end of stream.
        print(held[0][0].recv(1))
        """
        lines = (await _run(executor, opened)).splitlines()
        assert lines[0] == "['HTTP/1.1 200 Connection established', 'HTTP/1.1 200 Connection established']"
        assert lines[1].startswith("HTTP/1.1 503 ipybox: the executor has 2 network connections open")
        assert lines[2] == "b''"
        text = await _run(
            executor,
            f"""
            import urllib.request, http.client
            try:
                urllib.request.urlopen("http://web.test:{web.port}/big/300000").read()
            except (http.client.IncompleteRead, ConnectionError) as e:
                print(type(e).__name__)
            try:
                urllib.request.urlopen("http://web.test:{web.port}/small")
            except urllib.error.HTTPError as e:
                print(e.code, e.reason)
            """,
        )
        over, refused = text.splitlines()
        assert over in ("IncompleteRead", "ConnectionResetError")
        assert refused.startswith("403 ipybox: this code action moved more than 100000 bytes")
        # The budget is per code action: the next one starts afresh.
        assert (await _run(executor, f'print(urllib.request.urlopen("http://web.test:{web.port}/again").read())')) == (
            f"b'hello /again for web.test:{web.port}'\n"
        )
    reasons = [e.reason or "" for e in events if e.kind == "limit"]
    assert any("Network.max_connections" in r for r in reasons)
    assert any("Network.idle_timeout" in r for r in reasons)
    assert any("Network.max_bytes" in r for r in reasons)


async def test_without_a_network_the_kernel_has_no_proxy_and_no_route(executor: CodeExecutor) -> None:
    text = await _run(
        executor,
        """
        import os, socket
        print(sorted(k for k in os.environ if "PROXY" in k.upper() or k == "IPYBOX_NET_SOCKET"))
        try:
            socket.create_connection(("10.0.0.1", 80), timeout=5)
        except OSError as e:
            print(e.errno)
        """,
    )
    assert text.splitlines() == ["[]", "101"]


def test_network_needs_the_sandbox(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="network= needs the sandbox"):
        CodeExecutor(workspace=tmp_path, sandbox=None, network=Network(allow=["example.org"]))


async def test_a_code_error_from_a_refused_connection_reaches_the_caller_as_a_code_execution_error(
    net: tuple[CodeExecutor, list[NetworkEvent]],
) -> None:
    executor, _ = net
    with pytest.raises(CodeExecutionError) as raised:
        await executor.execute('import urllib.request; urllib.request.urlopen("http://unlisted.test/")')
    assert "not in this executor's network allowlist" in raised.value.evalue


async def test_the_mcp_server_passes_allow_net_and_ask_net_to_its_kernels(tmp_path: Path, web: WebServer) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    options = ["--allow-net", f"127.0.0.1:{web.port}", "--ask-net"]
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "ipybox.mcp_server", "--workspace", str(workspace), *options], env=env
    )
    asked: list[str] = []

    async def user(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    # Both through the proxy by absolute URL (the sandbox's own loopback is not proxied): the
    # listed address, then a name that is not listed, asked, and leads to that address.
    code = textwrap.dedent(
        f"""
        import os, http.client
        for host in ("127.0.0.1", "localhost"):
            connection = http.client.HTTPConnection(os.environ["HTTP_PROXY"].removeprefix("http://"), timeout=30)
            connection.request("GET", f"http://{{host}}:{web.port}/mcp")
            print(connection.getresponse().read().decode())
        """
    )
    with anyio.fail_after(90):
        async with Client(server, elicitation_callback=user, mode="legacy") as client:
            result = await client.call_tool("execute_ipython_cell", {"code": code})
    text = "".join(block.text for block in result.content if isinstance(block, types.TextContent))
    assert f"hello /mcp for 127.0.0.1:{web.port}" in text
    assert f"hello /mcp for localhost:{web.port}" in text
    assert len(asked) == 1 and asked[0].startswith(f"Network connection from kernel code to localhost:{web.port},")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("", "is empty"),
        ("*", "not a valid host name"),
        ("*.org", "whole top-level domain"),
        ("a.*.example.org", "not a valid host name"),
        ("exa mple.org", "not a valid host name"),
        ("example.org:0", "the port must be 1-65535"),
        ("example.org:http", "the port must be 1-65535"),
        ("10.0.0.1/8", "write the network address"),
        ("[2001:db8::1", "'[' without ']'"),
        ("bücher.de", "IDNA"),
    ],
)
def test_an_invalid_allow_entry_is_refused_naming_what_to_write(entry: str, problem: str) -> None:
    with pytest.raises(UsageError, match="Network allow entry") as raised:
        Network(allow=[entry])
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"allow": "example.org"}, "not a single string"),
        ({"unlisted": "allow"}, "'deny' or 'ask'"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"idle_timeout": 0}, "idle_timeout"),
        ({"hosts": {"*.x.org": "10.0.0.1"}}, "Network hosts maps host names"),
        ({"hosts": {"x.org": "not-an-address"}}, "Network hosts maps host names"),
    ],
)
def test_invalid_network_options_are_refused_naming_the_option(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        Network(**options)


def test_entries_match_names_wildcards_addresses_and_ports_by_the_documented_rules() -> None:
    network = Network(
        allow=["Example.org.", "*.example.net", "api.test:8443", "files.test:*", "10.1.0.0/16:5432", "[2001:db8::1]"]
    )
    allowed = [
        ("example.org", 443),
        ("example.org", 80),
        ("a.example.net", 443),
        ("a.b.example.net", 80),
        ("api.test", 8443),
        ("files.test", 1),
        ("10.1.2.3", 5432),
        ("2001:db8::1", 443),
    ]
    refused = [
        ("example.org", 8080),
        ("www.example.org", 443),
        ("example.net", 443),
        ("xexample.net", 443),
        ("api.test", 443),
        ("10.1.2.3", 443),
        ("10.2.0.1", 5432),
        ("2001:db8::2", 443),
    ]
    assert [network.listed(host, port) for host, port in allowed] == [True] * len(allowed)
    assert [network.listed(host, port) for host, port in refused] == [False] * len(refused)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.53", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "not a public address"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::ffff:169.254.169.254", "(IPv4 169.254.169.254) is a link-local"),
        ("64:ff9b::a00:1", "(IPv4 10.0.0.1) is a private"),
        ("2002:7f00:1::", "(IPv4 127.0.0.1) is a loopback"),
    ],
)
def test_non_public_addresses_and_their_ipv6_disguises_are_named(address: str, kind: str) -> None:
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None and kind in problem


def test_a_public_address_has_no_problem() -> None:
    assert address_problem(ipaddress.ip_address("93.184.215.14")) is None
    assert address_problem(ipaddress.ip_address("2606:4700::1111")) is None


async def test_the_proxy_refuses_strays_bad_tokens_and_malformed_oversized_or_unfinished_requests(
    tmp_path: Path,
) -> None:
    running: list[str | None] = [None]

    async def never(host: str, port: int, execution_id: str, line: int | None) -> ApprovalDecision:
        raise AssertionError("nothing here may be asked")

    token = "t" * 32
    network = Network(allow=["example.org"], connect_timeout=0.5)
    proxy = NetworkProxy(network, socket_path=tmp_path / "p.sock", token=token, running=lambda: running[0], ask=never)
    first = f"{token}\n".encode()
    connect = b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org\r\n\r\n"
    replies: dict[str, bytes] = {}
    with proxy_log() as records:
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.run)
            replies["stray"] = await exchange(proxy.socket_path, first + connect)
            running[0] = "e1"
            replies["wrong"] = await exchange(proxy.socket_path, b"x" * 32 + b"\n" + connect)
            replies["garbage"] = await exchange(proxy.socket_path, first + b"\x16\x03\x01 hello\r\n\r\n")
            replies["origin"] = await exchange(
                proxy.socket_path, first + b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n"
            )
            replies["huge"] = await exchange(
                proxy.socket_path, first + b"GET http://example.org/ HTTP/1.1\r\nX: " + b"a" * 70_000
            )
            replies["silent"] = await exchange(proxy.socket_path, first + b"CONNECT example.org:443 HTTP/1.1\r\n")
            tg.cancel_scope.cancel()
    assert replies["silent"].startswith(b"HTTP/1.1 504 ipybox: no answer within 0.5 s (Network.connect_timeout)")
    assert replies["stray"].startswith(b"HTTP/1.1 403 ipybox: no code action of this executor is running")
    assert replies["wrong"].startswith(b"HTTP/1.1 403 ipybox: wrong or missing token")
    assert replies["garbage"].startswith(b"HTTP/1.1 400 ipybox: not an HTTP/1.1 proxy request")
    assert replies["origin"].startswith(b"HTTP/1.1 400 ipybox: the proxy takes CONNECT")
    assert replies["huge"] == b"" or replies["huge"].startswith(
        b"HTTP/1.1 431 ipybox: the request head is larger than 16384 bytes"
    )
    assert any("the request head is larger than 16384 bytes" in r.getMessage() for r in records)
    events = [cast("dict[str, Any]", r.__dict__["network_event"]) for r in records if "network_event" in r.__dict__]
    assert events == [
        {
            "kind": "denied",
            "host": "example.org",
            "port": 443,
            "execution_id": None,
            "address": None,
            "reason": events[0]["reason"],
            "bytes": 0,
        }
    ]
    assert "no code action of this executor is running" in events[0]["reason"]
    assert not (tmp_path / "p.sock").exists()
