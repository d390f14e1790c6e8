"""KernelPool with a skills directory and with network: executors that have them take warm kernels,
and each executor's own policy holds on every pooled kernel it takes.

Real sandboxed kernels and the real proxy; the web servers listen on 127.0.0.1 in this process
(tests/network_support.py) and are reached through address entries of `Network.allow` only. Which
kernel an executor runs is told by the kernel's process id, never by timing.
"""

# The kernel an executor runs and the kernels waiting in a pool are internal; their pids and tokens
# prove which is which.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from network_support import WebServer, serving

from ipybox import CodeExecutor, KernelPool, Network, NetworkEvent, UsageError, save_skill

pytestmark = pytest.mark.anyio

# How long a pool may take to start its kernels on a busy two-core machine.
FILL_TIMEOUT = 60

DOUBLE = '"""Doubles."""\n\n\ndef run(x: int) -> int:\n    return 2 * x\n'
TRIPLE = '"""Triples."""\n\n\ndef run(x: int) -> int:\n    return 3 * x\n'


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[WebServer, WebServer]]:
    """Two services on the host's loopback: one the executors here allow, one nothing may ever reach."""
    with serving() as web, serving() as internal:
        yield web, internal


async def full(pool: KernelPool) -> dict[int, str]:
    """Wait until the pool is full; its ready kernels' pids and tokens."""
    with anyio.fail_after(FILL_TIMEOUT):
        await pool.wait_until_full()
    return {lease.kernel.pid: lease.token for lease in pool._ready if lease.kernel is not None}


def running(executor: CodeExecutor) -> int:
    kernel = executor._kernels.kernel
    assert kernel is not None
    return kernel.pid  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]


async def text(executor: CodeExecutor, code: str) -> str:
    return (await executor.execute(textwrap.dedent(code))).text


# -- skills ------------------------------------------------------------------------------------


async def test_an_executor_with_a_skills_dir_takes_pooled_kernels_that_import_skills_saved_before_and_since(
    workspace: Path,
) -> None:
    skills = workspace.parent / "skills"
    save_skill(skills, "double", DOUBLE, description="Doubles a number")
    use = "from skills.double import run as d\nfrom skills.triple import run as t\nprint(d(5), t(5))"
    async with KernelPool(size=2, workspace=workspace, tools_dir=None, skills_dir=skills) as pool:
        waiting = await full(pool)
        # Saved while the pooled kernels wait: the mount is the directory, not a copy.
        save_skill(skills, "triple", TRIPLE, description="Triples a number")
        async with CodeExecutor(workspace=workspace, tools_dir=None, skills_dir=skills, pool=pool) as executor:
            first = running(executor)
            assert first in waiting
            assert await text(executor, use) == "10 15\n"
            listed = "import ipybox_kernel\nprint(sorted(s.name for s in ipybox_kernel.list_skills()))"
            assert await text(executor, listed) == "['double', 'triple']\n"
            # Read-only in the kernel, as in an executor's own kernel.
            plant = """
                import errno, os, skills
                try:
                    open(os.path.join(skills.__path__[0], "planted.py"), "w")
                except OSError as e:
                    print(errno.errorcode[e.errno])
                """
            assert await text(executor, plant) == "EROFS\n"
            assert not (skills / "planted.py").exists()
            waiting |= await full(pool)
            await executor.reset()
            second = running(executor)
            assert second in waiting and second != first
            assert await text(executor, use) == "10 15\n"
            # The executor saves into the directory the pooled kernel mounted.
            await executor.save_skill("quadruple", DOUBLE.replace("2 *", "4 *"), description="Quadruples")
            assert await text(executor, "from skills.quadruple import run\nprint(run(5))") == "20\n"


# -- network -----------------------------------------------------------------------------------

# From kernel code: one request through the proxy by absolute URL (the sandbox's own loopback is
# not proxied, so 127.0.0.1 is not reached through HTTP_PROXY by urllib), the status line or body.
FETCH = """
import http.client, os

def fetch(port, path="/pooled"):
    connection = http.client.HTTPConnection(os.environ["HTTP_PROXY"].removeprefix("http://"), timeout=30)
    connection.request("GET", f"http://127.0.0.1:{port}{path}")
    response = connection.getresponse()
    return response.read().decode() if response.status == 200 else f"{response.status} {response.reason}"
"""


async def test_an_executor_with_a_network_takes_pooled_kernels_and_its_own_policy_holds_on_each(
    workspace: Path, servers: tuple[WebServer, WebServer]
) -> None:
    web, internal = servers
    events: list[NetworkEvent] = []
    network = Network(allow=[f"127.0.0.1:{web.port}"], on_event=events.append)
    check = f"print(fetch({web.port}))\nprint(fetch({internal.port}))"
    async with KernelPool(size=2, workspace=workspace, tools_dir=None, network=True) as pool:
        waiting = await full(pool)
        async with CodeExecutor(workspace=workspace, tools_dir=None, network=network, pool=pool) as executor:
            first = running(executor)
            assert first in waiting
            await text(executor, FETCH)
            allowed, denied = (await text(executor, check)).splitlines()
            assert allowed == f"hello /pooled for 127.0.0.1:{web.port}"
            assert denied.startswith(
                f"403 ipybox: 127.0.0.1:{internal.port} is not in this executor's network allowlist"
            )
            waiting |= await full(pool)
            await executor.reset()
            second = running(executor)
            assert second in waiting and second != first
            await text(executor, FETCH)
            assert (await text(executor, check)).splitlines() == [allowed, denied]
    assert internal.paths == []
    assert [(e.kind, e.port) for e in events if e.kind in ("allowed", "denied")] == [
        ("allowed", web.port),
        ("denied", internal.port),
    ] * 2


async def test_a_pooled_kernels_forwarder_is_refused_with_another_kernels_token(
    workspace: Path, servers: tuple[WebServer, WebServer]
) -> None:
    web, _ = servers
    # Kernel code speaking the forwarder's protocol on its own proxy socket, with the token it is given.
    speak = f"""
        import os, socket

        request = b"GET http://127.0.0.1:{web.port}/token HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"

        def speak(token):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(os.environ["IPYBOX_NET_SOCKET"])
                s.sendall(token.encode() + b"\\n" + request)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            return data.split(b"\\r\\n")[0].decode()

        own = os.environ["IPYBOX_TOOL_TOKEN"]
        """
    network = Network(allow=[f"127.0.0.1:{web.port}"])
    async with KernelPool(size=2, workspace=workspace, tools_dir=None, network=True) as pool:
        tokens = await full(pool)
        async with CodeExecutor(workspace=workspace, tools_dir=None, network=network, pool=pool) as executor:
            first = running(executor)
            [other] = [token for pid, token in tokens.items() if pid != first]
            await text(executor, speak)
            wrong, right = (await text(executor, f"print(speak({other!r}))\nprint(speak(own))")).splitlines()
            assert wrong.startswith("HTTP/1.1 403 ipybox: wrong or missing token")
            assert right == "HTTP/1.0 200 OK"
            tokens |= await full(pool)
            await executor.reset()
            assert running(executor) in tokens
            # The kernel before the reset had its own token: the proxy no longer takes it.
            await text(executor, speak)
            old, new = (await text(executor, f"print(speak({tokens[first]!r}))\nprint(speak(own))")).splitlines()
            assert old.startswith("HTTP/1.1 403 ipybox: wrong or missing token")
            assert new == "HTTP/1.0 200 OK"


async def test_an_executor_without_a_network_is_refused_a_pool_whose_kernels_are_made_for_one(
    workspace: Path,
) -> None:
    # It used to start a kernel of its own, logging why; a forwarder must never run without a policy.
    pool = KernelPool(size=1, workspace=workspace, tools_dir=None, network=True)
    with pytest.raises(
        UsageError, match=r"^the KernelPool's kernels are started with a network forwarder: give the executor a Network"
    ):
        CodeExecutor(workspace=workspace, tools_dir=None, pool=pool)
    plain = KernelPool(size=1, workspace=workspace, tools_dir=None)
    with pytest.raises(UsageError, match=r"started without a network forwarder: drop the executor's network="):
        CodeExecutor(workspace=workspace, tools_dir=None, pool=plain, network=Network(allow=["example.org"]))
