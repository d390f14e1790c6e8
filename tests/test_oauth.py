"""OAuth 2.1 for remote MCP servers, against a real OAuth-protected server on 127.0.0.1
(`servers/oauth_server.py`, with its own authorization server): generation and kernel calls share
one authorization, tokens stay on the host, a token that expires or lacks scope during a running
code action is refreshed or stepped up, and refusals say what happened."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.auth_utils import resource_url_from_server_url
from servers.fixtures import stop_process

import ipybox
from ipybox import CodeExecutionResult, CodeExecutor, GenerationError, UsageError, generate_mcp_sources
from ipybox.oauth import (
    AuthorizationRequest,
    FileTokenStore,
    LoopbackAuthorizer,
    OAuth,
    TokenStore,
    import_tokens,
)

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).parent / "servers" / "oauth_server.py"
# Far above what any step takes; only catches a hang.
DEADLINE = 120.0


@dataclass
class Notes:
    """A running OAuth-protected server and its log."""

    url: str
    log: Path

    def events(self, kind: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [entry for entry in lines if entry["event"] == kind]


@contextmanager
def notes_server(log: Path, *args: str) -> Generator[Notes]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(log), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("URL "), line
        yield Notes(line.removeprefix("URL ").strip(), log)
    finally:
        stop_process(process)
        assert process.stdout is not None
        process.stdout.close()


@dataclass
class Person:
    """Approves at the authorization server like a person would: follows the authorization URL to the
    redirect (the test authorization server approves at once)."""

    seen: list[AuthorizationRequest] = field(default_factory=list[AuthorizationRequest])

    async def __call__(self, request: AuthorizationRequest) -> str:
        self.seen.append(request)
        async with httpx2.AsyncClient() as client:
            response = await client.get(request.url, follow_redirects=False)
        assert response.status_code in (302, 307), response.text
        return response.headers["location"]


def params(url: str, **oauth: Any) -> dict[str, Any]:
    return {"url": url, "oauth": {"redirect_uri": "http://127.0.0.1:1/callback", **oauth}}


async def run_code(executor: CodeExecutor, code: str) -> str:
    result = None
    with anyio.fail_after(DEADLINE):
        async for event in executor.execute(code):
            if isinstance(event, CodeExecutionResult):
                result = event
    assert result is not None
    return result.text or ""


def stored(store: FileTokenStore, url: str) -> dict[str, Any]:
    record = store.load(resource_url_from_server_url(url))
    assert record is not None
    return dict(record)


async def test_generation_and_kernel_calls_share_one_authorization_and_the_token_never_reaches_the_kernel(
    tmp_path: Path,
) -> None:
    workspace, root = tmp_path / "ws", tmp_path / "ws" / "mcptools"
    workspace.mkdir()
    store = FileTokenStore(tmp_path / "tokens")
    person = Person()
    oauth = OAuth(authorize=person, store=store)
    with notes_server(tmp_path / "log.jsonl") as notes:
        modules = await generate_mcp_sources("notes", params(notes.url), root, oauth=oauth)
        assert modules == ["read_notes", "whoami", "write_note"]
        record = stored(store, notes.url)
        secrets = [record["tokens"]["access_token"], record["tokens"]["refresh_token"]]
        path = store.path(resource_url_from_server_url(notes.url))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        # Nothing under the tools directory holds a token: not the manifest, not a module.
        for file in root.rglob("*"):
            if file.is_file():
                assert not any(s in file.read_text(errors="replace") for s in secrets), file

        probe = f"""
import json, os, sys
from mcptools.notes import read_notes, whoami
secrets = {secrets!r}
found = [k for k, v in os.environ.items() if any(s in v for s in secrets)]
skip = ("/proc", "/sys", "/dev", "/usr", sys.prefix, sys.base_prefix)
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(skip)]
    for name in files:
        try:
            with open(os.path.join(top, name), "rb") as f:
                data = f.read(4_000_000)
        except OSError:
            continue
        if any(s.encode() in data for s in secrets):
            found.append(os.path.join(top, name))
try:
    open({str(path)!r}).read()
    store = "readable"
except OSError as exc:
    store = type(exc).__name__
print(json.dumps({{"found": found, "store": store, "notes": read_notes.run().result, "who": whoami.run().result}}))
"""
        async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto", oauth=oauth) as executor:
            seen = json.loads(await run_code(executor, probe))
    assert seen == {
        "found": [],
        "store": "FileNotFoundError",
        "notes": "three notes",
        "who": f"ipybox {ipybox.__version__}",
    }
    # One authorization, by generation; the tool server's session used the stored token.
    assert len(person.seen) == 1 and len(notes.events("authorize")) == 1


async def test_a_token_that_expires_during_a_running_code_action_is_refreshed_without_the_kernel_noticing(
    tmp_path: Path,
) -> None:
    workspace, root = tmp_path / "ws", tmp_path / "ws" / "mcptools"
    workspace.mkdir()
    store = FileTokenStore(tmp_path / "tokens")
    # The log is in the workspace, so that the kernel's loop can see when the refresh happened.
    with notes_server(workspace / "log.jsonl", "--lifetime", "2") as notes:
        await generate_mcp_sources("notes", params(notes.url), root, oauth=OAuth(authorize=Person(), store=store))
        # The executor starts from the store alone, as a later process would.
        oauth = OAuth(authorize=Person(), store=store)
        code = """
import time
from mcptools.notes import read_notes
calls = 0
deadline = time.monotonic() + 100
while '"refresh_token"' not in open("log.jsonl").read() and time.monotonic() < deadline:
    assert read_notes.run().result == "three notes"
    calls += 1
    time.sleep(0.2)
assert read_notes.run().result == "three notes"
print("refreshed after", calls > 0)
"""
        async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto", oauth=oauth) as executor:
            assert await run_code(executor, code) == "refreshed after True\n"
        refreshes = [e for e in notes.events("token") if e["grant"] == "refresh_token"]
        assert refreshes
        assert len(notes.events("authorize")) == 1  # no person was asked again
        # The token was refreshed before it ran out (a quarter of its lifetime early). On a busy
        # machine a call may still arrive just after the server's expiry: it is refused, refreshed and
        # sent again (the next test), never answered by asking a person.
        tokens = {e["token"] for e in notes.events("mcp") if not e["expired"] and e["known"]}
        assert len(tokens) >= 2


async def test_a_live_token_the_server_refuses_is_refreshed_and_the_call_sent_again_without_asking_anyone(
    tmp_path: Path,
) -> None:
    """The server stops accepting the access token while its expiry says it is live (revoked alone,
    as RFC 7009 allows, or a clock ahead of this side's): the call is refused once, the refresh token
    gets a new one, and the same call succeeds; the code never notices and no person is asked."""
    workspace, root = tmp_path / "ws", tmp_path / "ws" / "mcptools"
    workspace.mkdir()
    store, person = FileTokenStore(tmp_path / "tokens"), Person()
    with notes_server(tmp_path / "log.jsonl") as notes:
        oauth = OAuth(authorize=person, store=store)
        await generate_mcp_sources("notes", params(notes.url), root, oauth=oauth)
        revoked = stored(store, notes.url)["tokens"]["access_token"]
        async with httpx2.AsyncClient() as client:
            response = await client.post(notes.url.removesuffix("/mcp") + "/revoke", data={"token": revoked})
        assert response.status_code == 200 and notes.events("revoke")[0]["revoked"]
        code = "from mcptools.notes import read_notes\nprint(read_notes.run().result)"
        async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto", oauth=oauth) as executor:
            assert await run_code(executor, code) == "three notes\n"
        # (Generation's first request, sent without a token, is refused too: that starts authorization.)
        refused = [e["token"] for e in notes.events("mcp") if not e["known"] and e["token"]]
        assert refused == [revoked[:6]]
        assert [e["grant"] for e in notes.events("token")] == ["authorization_code", "refresh_token"]
        assert len(person.seen) == 1 and len(notes.events("authorize")) == 1
        assert stored(store, notes.url)["tokens"]["access_token"] != revoked


async def test_a_call_that_needs_more_scope_steps_up_during_a_running_code_action(tmp_path: Path) -> None:
    workspace, root = tmp_path / "ws", tmp_path / "ws" / "mcptools"
    workspace.mkdir()
    person = Person()
    oauth = OAuth(authorize=person, store=FileTokenStore(tmp_path / "tokens"))
    with notes_server(tmp_path / "log.jsonl") as notes:
        await generate_mcp_sources("notes", params(notes.url), root, oauth=oauth)
        code = (
            "from mcptools.notes import read_notes, write_note\n"
            "print(read_notes.run().result, write_note.run({'text': 'hi'}).result)"
        )
        async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto", oauth=oauth) as executor:
            assert await run_code(executor, code) == "three notes wrote hi\n"
    assert [e["scope"] for e in notes.events("authorize")] == [["notes:read"], ["notes:read", "notes:write"]]
    assert "scope=notes%3Aread+notes%3Awrite" in person.seen[-1].url


async def test_a_401_without_oauth_says_what_the_server_asked_for_and_what_to_configure(tmp_path: Path) -> None:
    with notes_server(tmp_path / "log.jsonl") as notes, pytest.raises(GenerationError) as info:
        await generate_mcp_sources("notes", {"url": notes.url}, tmp_path / "mcptools")
    message = str(info.value)
    assert "401 Unauthorized" in message
    assert 'resource_metadata="http://127.0.0.1:' in message
    assert f"ipybox generate notes --url {notes.url} --oauth" in message


async def test_an_insufficient_scope_refusal_names_the_scope_the_call_needs(tmp_path: Path) -> None:
    workspace, root = tmp_path / "ws", tmp_path / "ws" / "mcptools"
    workspace.mkdir()
    store = FileTokenStore(tmp_path / "tokens")
    with notes_server(tmp_path / "log.jsonl") as notes:
        await generate_mcp_sources("notes", params(notes.url), root, oauth=OAuth(authorize=Person(), store=store))
        # The same server with a static token that has only the read scope: no step-up possible.
        os.environ["IPYBOX_TEST_NOTES_TOKEN"] = stored(store, notes.url)["tokens"]["access_token"]
        header = {"url": notes.url, "headers": {"Authorization": "Bearer ${IPYBOX_TEST_NOTES_TOKEN}"}}
        await generate_mcp_sources("notes", header, root)
        code = """
from mcptools.notes import write_note
try:
    write_note.run({"text": "hi"})
except Exception as exc:
    print(exc)
"""
        try:
            async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto") as executor:
                text = await run_code(executor, code)
        finally:
            del os.environ["IPYBOX_TEST_NOTES_TOKEN"]
    assert "403 insufficient_scope" in text
    assert "scope 'notes:read notes:write'" in text
    assert "Server returned an error response" not in text


async def test_a_server_that_needs_a_person_fails_with_how_to_authorize_when_no_callback_is_given(
    tmp_path: Path,
) -> None:
    oauth = OAuth(store=FileTokenStore(tmp_path / "tokens"))
    with notes_server(tmp_path / "log.jsonl") as notes, pytest.raises(GenerationError) as info:
        await generate_mcp_sources("notes", params(notes.url), tmp_path / "mcptools", oauth=oauth)
    assert "OAuth authorization failed" in str(info.value)
    assert f"ipybox generate notes --url {notes.url} --oauth" in str(info.value)


LATER_PROCESS = """
import sys, anyio
from ipybox import generate_mcp_sources
from ipybox.oauth import FileTokenStore, OAuth
url, root, tokens = sys.argv[1:4]
params = {"url": url, "oauth": {"redirect_uri": "http://127.0.0.1:1/callback"}}
# No authorize callback: should a person be needed, this fails and says so.
oauth = OAuth(store=FileTokenStore(tokens))
print(anyio.run(lambda: generate_mcp_sources("notes", params, root, oauth=oauth)))
"""


def later_process(url: str, root: Path, tokens: Path) -> subprocess.CompletedProcess[str]:
    """Generation in a new process that has nothing but the token store."""
    return subprocess.run(
        [sys.executable, "-c", LATER_PROCESS, url, str(root), str(tokens)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


async def wait_until_expired(store: FileTokenStore, url: str) -> None:
    """Until the stored access token's expiry has passed: a known time on this machine's clock,
    which is the server's too."""
    import time

    await anyio.sleep(max(0.0, stored(store, url)["expires_at"] - time.time()) + 0.01)
    assert time.time() > stored(store, url)["expires_at"]


async def test_a_later_process_refreshes_an_expired_token_at_the_discovered_token_endpoint_without_a_person(
    tmp_path: Path,
) -> None:
    """The authorization server lives under /as, so its token endpoint is not the origin's /token
    that the SDK guesses when it has discovered nothing: process B refreshes only because the
    token endpoint was kept in the store beside the tokens."""
    store = FileTokenStore(tmp_path / "tokens")
    with notes_server(tmp_path / "log.jsonl", "--lifetime", "1", "--issuer-path", "/as") as notes:
        person = Person()
        await generate_mcp_sources(
            "notes", params(notes.url), tmp_path / "a", oauth=OAuth(authorize=person, store=store)
        )
        kept = stored(store, notes.url)["authorization_server"]
        assert kept["metadata"]["token_endpoint"] == notes.url.removesuffix("/mcp") + "/as/token"
        await wait_until_expired(store, notes.url)
        done = later_process(notes.url, tmp_path / "b", store.directory)
        assert done.returncode == 0, done.stderr
        assert "['read_notes', 'whoami', 'write_note']" in done.stdout
    assert len(person.seen) == 1 and len(notes.events("authorize")) == 1
    assert [e["grant"] for e in notes.events("token")] == ["authorization_code", "refresh_token"]
    # The expired token was never sent: process B refreshed before its first request.
    assert not [e for e in notes.events("mcp") if e["expired"]]


def import_by_cli(url: str, tokens: dict[str, Any], data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipybox", "auth", "import", "--url", url],
        input=json.dumps(tokens),
        env={**os.environ, "XDG_DATA_HOME": str(data)},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


async def test_tokens_obtained_elsewhere_are_imported_and_a_later_process_refreshes_them_without_a_person(
    tmp_path: Path,
) -> None:
    """Another client (here ipybox with a store of its own) was authorized; its refresh token and
    client id are handed to ``ipybox auth import`` on stdin, which discovers the token endpoint
    itself. A later process with only the imported store refreshes before its first call."""
    elsewhere = FileTokenStore(tmp_path / "elsewhere")
    with notes_server(tmp_path / "log.jsonl", "--issuer-path", "/as") as notes:
        await generate_mcp_sources("notes", params(notes.url), tmp_path / "a", oauth=OAuth(Person(), elsewhere))
        record = stored(elsewhere, notes.url)
        handed = {"client_id": record["client"]["client_id"], "refresh_token": record["tokens"]["refresh_token"]}
        done = import_by_cli(notes.url, handed, tmp_path / "data")
        assert done.returncode == 0, done.stderr
        assert f"refreshed at {notes.url.removesuffix('/mcp')}/as/token" in done.stdout
        imported = FileTokenStore(tmp_path / "data" / "ipybox" / "oauth")
        path = imported.path(resource_url_from_server_url(notes.url))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        later = later_process(notes.url, tmp_path / "b", imported.directory)
        assert later.returncode == 0, later.stderr
    assert len(notes.events("authorize")) == 1
    assert [e["grant"] for e in notes.events("token")] == ["authorization_code", "refresh_token"]


# -- hostile ------------------------------------------------------------------------------------


async def test_resource_metadata_naming_another_server_gets_no_token_for_it(tmp_path: Path) -> None:
    """A server whose metadata names another resource, to have the client get a token meant for that
    one and send it here, gets no flow at all: the SDK's resource check stops it before any request
    to the authorization server."""
    person = Person()
    oauth = OAuth(authorize=person, store=FileTokenStore(tmp_path / "tokens"))
    hostile = "https://victim.example/mcp"
    with (
        notes_server(tmp_path / "log.jsonl", "--hostile-resource", hostile) as notes,
        pytest.raises(GenerationError) as info,
    ):
        await generate_mcp_sources("notes", params(notes.url), tmp_path / "mcptools", oauth=oauth)
    assert "OAuth authorization failed" in str(info.value) and hostile in str(info.value)
    assert person.seen == []
    assert notes.events("register") == [] and notes.events("token") == []


@pytest.mark.parametrize("tamper", ["token_endpoint", "issuer_and_token_endpoint", "whole_discovery"])
async def test_a_store_rewritten_to_name_another_token_endpoint_never_sends_the_refresh_token_there(
    tmp_path: Path, tamper: str
) -> None:
    """Someone rewrites the stored discovery so that process B's refresh would carry the refresh
    token to their host (here a second real authorization server, which logs every request to its
    token endpoint): the record does not hold together, is not used, and B's refresh fails at the
    origin's guess instead; B, with no person to ask, stops and says how to authorize."""
    store = FileTokenStore(tmp_path / "tokens")
    with (
        notes_server(tmp_path / "log.jsonl", "--lifetime", "1", "--issuer-path", "/as") as notes,
        notes_server(tmp_path / "thief.jsonl") as thief,
    ):
        await generate_mcp_sources(
            "notes", params(notes.url), tmp_path / "a", oauth=OAuth(authorize=Person(), store=store)
        )
        key = resource_url_from_server_url(notes.url)
        record = stored(store, notes.url)
        metadata = record["authorization_server"]["metadata"]
        other = thief.url.removesuffix("/mcp")
        metadata["token_endpoint"] = f"{other}/token"
        if tamper != "token_endpoint":
            metadata["issuer"] = other
        if tamper == "whole_discovery":
            # Every part consistent with the thief's host: still not about this server's resource.
            record["authorization_server"]["resource_metadata"] = {
                "resource": thief.url,
                "authorization_servers": [other],
            }
            record["client"]["issuer"] = other
        store.save(key, record)
        await wait_until_expired(store, notes.url)
        done = later_process(notes.url, tmp_path / "b", store.directory)
    assert done.returncode != 0
    assert f"ipybox generate notes --url {notes.url} --oauth" in done.stderr
    assert thief.events("token_request") == []
    assert [e["grant"] for e in notes.events("token")] == ["authorization_code"]


def test_an_import_cannot_name_where_the_refresh_token_goes(tmp_path: Path) -> None:
    done = import_by_cli(
        "http://127.0.0.1:1/mcp",
        {"client_id": "c", "refresh_token": "r", "token_endpoint": "https://thief.example/token"},
        tmp_path / "data",
    )
    assert done.returncode == 2
    assert "token_endpoint: Extra inputs are not permitted" in done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("hostile", ["--hostile-resource", "--foreign-token-endpoint"])
async def test_an_import_from_a_server_whose_metadata_would_send_tokens_elsewhere_is_refused(
    tmp_path: Path, hostile: str
) -> None:
    """The server's resource metadata is about another resource, or its authorization server names a
    token endpoint on a third host (a real one, which logs what reaches it): nothing is stored and
    nothing is sent there."""
    store = FileTokenStore(tmp_path / "tokens")
    with notes_server(tmp_path / "thief.jsonl") as thief:
        value = thief.url if hostile == "--hostile-resource" else thief.url.removesuffix("/mcp") + "/token"
        with notes_server(tmp_path / "log.jsonl", hostile, value) as notes, pytest.raises(UsageError) as info:
            await import_tokens(notes.url, {"client_id": "c", "refresh_token": "r"}, store=store)
    assert value in str(info.value)
    assert store.load(resource_url_from_server_url(notes.url)) is None
    assert thief.events("token_request") == [] and notes.events("token_request") == []


def test_a_token_file_others_can_read_is_refused_with_what_to_do(tmp_path: Path) -> None:
    store = FileTokenStore(tmp_path / "tokens")
    store.save("https://a.example/mcp", {"tokens": {"access_token": "t", "token_type": "Bearer"}})
    path = store.path("https://a.example/mcp")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    with pytest.raises(UsageError, match=r"has mode 0o644, not 0600.*Revoke.*delete the file"):
        store.load("https://a.example/mcp")


def test_a_token_directory_others_can_write_or_a_symlinked_one_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(UsageError, match="can be written by others"):
        FileTokenStore(shared).load("https://a.example/mcp")
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UsageError, match="is a symlink"):
        FileTokenStore(tmp_path / "link").save("https://a.example/mcp", {})


def test_a_token_file_planted_for_another_url_is_not_used(tmp_path: Path) -> None:
    store = FileTokenStore(tmp_path / "tokens")
    store.save("https://a.example/mcp", {"tokens": {"access_token": "t", "token_type": "Bearer"}})
    store.path("https://a.example/mcp").rename(store.path("https://b.example/mcp"))
    assert store.load("https://b.example/mcp") is None


async def test_the_loopback_listener_answers_only_the_redirect_with_this_authorizations_state(
    tmp_path: Path,
) -> None:
    port = _free_port()
    redirect = f"http://127.0.0.1:{port}/callback"
    answers: list[int] = []

    def browser(url: str) -> None:
        # Another local process tries first: a forged code, a wrong path; then the real redirect.
        with httpx2.Client() as client:
            answers.append(client.get(f"{redirect}?code=forged&state=guess").status_code)
            answers.append(client.get(f"http://127.0.0.1:{port}/other?code=forged&state=s3cret").status_code)
            answers.append(client.get(f"{redirect}?code=real&state=s3cret").status_code)

    authorizer = LoopbackAuthorizer(open_browser=browser, timeout=DEADLINE)
    request = AuthorizationRequest("notes", "https://auth.example/authorize?state=s3cret&client_id=x", redirect)
    with anyio.fail_after(DEADLINE):
        landed = await authorizer(request)
    assert answers == [400, 400, 200]
    assert landed == f"{redirect}?code=real&state=s3cret"


@pytest.mark.parametrize(
    "url",
    ["http://auth.example/authorize?state=s", "file:///etc/passwd?state=s", "javascript:alert(1)//?state=s"],
)
async def test_an_authorization_url_that_is_neither_https_nor_local_is_not_opened(url: str) -> None:
    opened: list[str] = []
    authorizer = LoopbackAuthorizer(open_browser=opened.append)
    with pytest.raises(UsageError, match="neither HTTPS nor on this machine"):
        await authorizer(AuthorizationRequest("notes", url, f"http://127.0.0.1:{_free_port()}/callback"))
    assert opened == []


# -- the command line -------------------------------------------------------------------------


def test_ipybox_generate_oauth_authorizes_in_the_browser_and_keeps_the_token_out_of_the_tools_directory(
    tmp_path: Path,
) -> None:
    browser = tmp_path / "browser.py"
    # A browser: follows the authorization URL and its redirect to ipybox's loopback listener.
    browser.write_text("import sys, httpx2\nhttpx2.get(sys.argv[1], follow_redirects=True)\n")
    redirect = f"http://127.0.0.1:{_free_port()}/callback"
    env = {**os.environ, "BROWSER": f"{sys.executable} {browser} %s", "XDG_DATA_HOME": str(tmp_path / "data")}
    with notes_server(tmp_path / "log.jsonl") as notes:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "ipybox", "generate", "notes", "--url", notes.url, "--oauth"),
                *("--redirect-uri", redirect, "--root", str(tmp_path / "mcptools")),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "authorize access to MCP server 'notes' in your browser" in done.stderr
    record = stored(FileTokenStore(tmp_path / "data" / "ipybox" / "oauth"), notes.url)
    token = record["tokens"]["access_token"]
    manifest = json.loads((tmp_path / "mcptools" / ".ipybox" / "servers.json").read_text())
    assert manifest["notes"]["oauth"]["redirect_uri"] == redirect
    assert not [p for p in (tmp_path / "mcptools").rglob("*") if p.is_file() and token in p.read_text()]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SecretsManagerStore:
    """An application's own store (as one backed by a secrets manager or the OS keyring would be):
    records live in the application's hands, here a dict; ipybox writes no file of its own."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    calls: list[str] = field(default_factory=list[str])

    def load(self, url: str) -> dict[str, Any] | None:
        self.calls.append(f"load {url}")
        record = self.records.get(url)
        return None if record is None else json.loads(json.dumps(record))

    def save(self, url: str, record: Any) -> None:
        self.calls.append(f"save {url}")
        self.records[url] = json.loads(json.dumps(record))

    def delete(self, url: str) -> None:
        self.calls.append(f"delete {url}")
        self.records.pop(url, None)


async def test_an_applications_own_token_store_serves_generation_and_kernel_calls_and_no_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default store's place, so that a file written there by mistake would be seen.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    workspace, root = tmp_path / "ws", tmp_path / "ws" / "mcptools"
    workspace.mkdir()
    store = SecretsManagerStore()
    assert isinstance(store, TokenStore)
    with notes_server(tmp_path / "log.jsonl") as notes:
        await generate_mcp_sources("notes", params(notes.url), root, oauth=OAuth(authorize=Person(), store=store))
        key = resource_url_from_server_url(notes.url)
        assert list(store.records) == [key]
        assert store.records[key]["tokens"]["access_token"]
        # A later executor with the same store and no one to ask: the stored token is used.
        async with CodeExecutor(
            workspace=workspace, tools_dir=root, approval="auto", oauth=OAuth(store=store)
        ) as executor:
            text = await run_code(executor, "from mcptools.notes import read_notes\nprint(read_notes.run().result)")
    assert text == "three notes\n"
    assert len(notes.events("authorize")) == 1
    assert f"load {key}" in store.calls
    assert not (tmp_path / "xdg").exists()
    assert not [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and store.records[key]["tokens"]["access_token"] in p.read_text(errors="replace")
    ]
