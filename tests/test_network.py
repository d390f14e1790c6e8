"""Network egress: the allowlist, asked destinations, address checks and limits, from kernel code.

Every server here listens on 127.0.0.1 in this process; names such as ``web.test`` lead there only
through ``Network.hosts``, so no test resolves or reaches anything outside this machine.
"""

from __future__ import annotations

import http.server
import ssl
import textwrap
import threading
from collections.abc import AsyncGenerator, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pytest
import trustme

from ipybox import (
    ApprovalRules,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    Network,
    NetworkEvent,
    NetworkRequest,
    UsageError,
)

pytestmark = pytest.mark.anyio


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        cast("_Server", self.server).paths.append(self.path)
        if self.path.startswith("/big/"):
            body = b"x" * int(self.path.removeprefix("/big/"))
        else:
            body = f"hello {self.path} for {self.headers['Host']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.paths: list[str] = []
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    @property
    def port(self) -> int:
        return self.server_address[1]


@contextmanager
def _serving(tls: ssl.SSLContext | None = None) -> Generator[_Server]:
    server = _Server(tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def web() -> Iterator[_Server]:
    with _serving() as server:
        yield server


@pytest.fixture(scope="module")
def internal() -> Iterator[_Server]:
    """A service on the host's loopback that no test allows: nothing may ever reach it."""
    with _serving() as server:
        yield server


@pytest.fixture(scope="module")
def tls_web(ca: trustme.CA) -> Iterator[_Server]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("tls.test").configure_cert(context)  # pyright: ignore[reportUnknownMemberType]
    with _serving(context) as server:
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
    net_workspace: Path, web: _Server, tls_web: _Server, internal: _Server
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
    net: tuple[CodeExecutor, list[NetworkEvent]], web: _Server, tls_web: _Server
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
    net: tuple[CodeExecutor, list[NetworkEvent]], web: _Server
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
    net: tuple[CodeExecutor, list[NetworkEvent]], internal: _Server
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
    net: tuple[CodeExecutor, list[NetworkEvent]], web: _Server, internal: _Server
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
    net: tuple[CodeExecutor, list[NetworkEvent]], web: _Server
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
async def asking(net_workspace: Path, web: _Server) -> AsyncGenerator[CodeExecutor]:
    network = Network(
        # The web server's port on the host's loopback may be reached, but no name is listed.
        allow=[f"127.0.0.1:{web.port}"],
        unlisted="ask",
        hosts={"web.test": "127.0.0.1", "other.test": "127.0.0.1"},
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
    asking: CodeExecutor, web: _Server
) -> None:
    code = _FETCH.format(names=["web.test", "web.test"], port=web.port)
    asked, text = await _answer_each(asking, code, ["reject", "accept"])
    assert text.splitlines() == [
        f"403 ipybox: the application rejected the connection to web.test:{web.port}: not today",
        f"hello /asked for web.test:{web.port}",
    ]
    first = asked[0]
    assert (first.host, first.port, first.server_name, first.tool_name) == ("web.test", web.port, "ipybox", "connect")
    assert first.id.startswith(first.execution_id + ":")
    assert dict(first.tool_args) == {"host": "web.test", "port": web.port}
    assert first.rule_name == f"network:web.test:{web.port}"


async def test_allow_for_this_executor_is_remembered_and_approval_rules_match_destinations(
    asking: CodeExecutor, web: _Server
) -> None:
    code = _FETCH.format(names=["other.test"], port=web.port)
    asked, text = await _answer_each(asking, code, ["remember"])
    assert len(asked) == 1 and text.startswith("hello")
    asked, text = await _answer_each(asking, code, [])
    assert asked == [] and text.startswith("hello")
    rules = ApprovalRules(allow=["network:web.test:*"], otherwise="reject")
    code = _FETCH.format(names=["web.test"], port=web.port)
    asked, text = await _answer_each(asking, code, [], approval=rules)
    assert asked == [] and text.startswith("hello")
    rules = ApprovalRules(deny=["network:web.*"])
    asked, text = await _answer_each(asking, code, [], approval=rules)
    assert asked == [] and "is denied by the approval rules" in text


async def test_limits_on_connections_bytes_and_idle_time_hold_and_are_reported(
    net_workspace: Path, web: _Server
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
