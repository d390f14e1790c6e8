"""A real Jupyter Kernel Gateway on 127.0.0.1 for the tests (and bench/gateway.py), and a TCP relay
in front of it that a test can cut to drop the websocket, keep down, and bring back."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from .fixtures import stop_process

__all__ = ("SANDBOXED", "Gateway", "Relay", "gateway", "relay", "run_gateway", "run_sandboxed_gateway")

REPO = Path(__file__).resolve().parents[2]
# The shipped kernelspec that runs each gateway kernel in a sandbox (deploy/gateway/).
SANDBOXED = "ipybox-sandboxed"

# A cold start of the gateway (tornado, jupyter_server) on a loaded 2-core machine stays well below this.
START_TIMEOUT = 60.0
STOP_GRACE = 10.0
# Between two readiness probes of a starting gateway (a probe is one refused connect), or two looks
# at a kernel's websocket connections.
_PROBE_INTERVAL = 0.05


@dataclass(frozen=True)
class Gateway:
    url: str
    token: str
    log: Path | None = None

    def log_tail(self, lines: int = 60) -> str:
        """The end of the gateway's own log, for a failure's report."""
        if self.log is None or not self.log.exists():
            return "(no gateway log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def kernel_ids(self) -> list[str]:
        """The gateway's running kernels (listing is enabled on this gateway)."""
        response = httpx.get(f"{self.url}/api/kernels", headers=self.headers(), timeout=30)
        response.raise_for_status()
        return [kernel["id"] for kernel in response.json()]

    async def wait_disconnected(self, kernel_id: str) -> None:
        """Return once the gateway has no websocket open to the kernel (and so buffers its messages
        for the session that was connected); the caller bounds the wait."""
        async with httpx.AsyncClient(headers=self.headers(), timeout=30) as http:
            while True:
                response = await http.get(f"{self.url}/api/kernels/{kernel_id}")
                if not response.json()["connections"]:
                    return
                # The gateway notices a closed connection on its own loop; nothing tells us when.
                await anyio.sleep(_PROBE_INTERVAL)

    async def delete(self, kernel_id: str, *, missing_ok: bool = False) -> None:
        async with httpx.AsyncClient(headers=self.headers(), timeout=30) as http:
            response = await http.delete(f"{self.url}/api/kernels/{kernel_id}")
            if not (missing_ok and response.status_code == 404):
                response.raise_for_status()

    async def restart(self, kernel_id: str) -> None:
        """Restart the kernel's process (its id stays): as the gateway does when the process dies."""
        async with httpx.AsyncClient(headers=self.headers(), timeout=60) as http:
            (await http.post(f"{self.url}/api/kernels/{kernel_id}/restart")).raise_for_status()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def run_gateway(
    *,
    rate_limit: bool = False,
    options: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    token: str | None = None,
) -> Generator[Gateway]:
    """Run ``jupyter kernelgateway`` with a token and kernel listing on; kill it (and its kernels) after.

    ``rate_limit=False`` turns off jupyter_server's IOPub rate limit, as docs/remote.md asks
    operators to do; ``options`` are more command-line options, ``env`` more environment variables
    (``JUPYTER_PATH`` for kernelspecs of its own, say). ``port`` and ``token``: those of a gateway
    that ran before (to start it again), else a free port and a fresh token.
    """
    token = token or secrets.token_urlsafe(24)
    port = port or _free_port()
    args = [
        os.path.join(os.path.dirname(sys.executable), "jupyter-kernelgateway"),
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port_retries=0",
        f"--KernelGatewayApp.auth_token={token}",
        "--JupyterWebsocketPersonality.list_kernels=True",
    ]
    if not rate_limit:
        args.append("--ZMQChannelsWebsocketConnection.limit_rate=False")
    args += options
    with tempfile.TemporaryDirectory(prefix="ipybox-gateway-") as cwd:
        log = Path(cwd) / "gateway.log"
        (Path(cwd) / "runtime").mkdir(mode=0o700)
        with log.open("wb") as out:
            process = subprocess.Popen(
                args,
                cwd=cwd,
                # Its own runtime directory: the kernels' connection files are then this gateway's
                # only, not also those of notebooks or other gateways the suite runs meanwhile.
                env={**os.environ, "JUPYTER_RUNTIME_DIR": str(Path(cwd) / "runtime"), **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        try:
            gateway = Gateway(f"http://127.0.0.1:{port}", token, log)
            _wait_ready(gateway, process, log)
            yield gateway
        finally:
            stop_process(process)


@contextmanager
def run_sandboxed_gateway(jupyter: Path) -> Generator[Gateway]:
    """A stock Kernel Gateway on the ipc transport with the shipped kernelspec installed under
    ``jupyter`` (an empty directory), as docs/remote.md says."""
    shutil.copytree(REPO / "deploy" / "gateway" / SANDBOXED, jupyter / "kernels" / SANDBOXED)
    with run_gateway(options=("--KernelManager.transport=ipc",), env={"JUPYTER_PATH": str(jupyter)}) as gateway:
        yield gateway


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    """One Kernel Gateway for the whole session, started on first use."""
    with run_gateway() as running:
        yield running


def _wait_ready(gateway: Gateway, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the kernel gateway exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{gateway.url}/api", headers=gateway.headers(), timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(_PROBE_INTERVAL)  # polling a starting process: nothing to wait on but its port
    raise RuntimeError(f"the kernel gateway did not answer GET /api within {START_TIMEOUT} s")


@dataclass(eq=False)
class Relay:
    """Forwards TCP connections from its own port to the gateway's; `cut` drops the open ones.

    `down` keeps the path down for new connections until `up`; `swallow` throws away what clients
    send from then on (as a connection that breaks with data in flight).
    """

    url: str
    _streams: list[anyio.abc.SocketStream] = field(default_factory=list[anyio.abc.SocketStream])
    _up: anyio.Event = field(default_factory=anyio.Event)
    _hold: bool = False
    _swallow: tuple[int, anyio.Event] | None = None

    def __post_init__(self) -> None:
        self._up.set()

    async def cut(self) -> None:
        """Close every open connection, both ways; the next ones go through unless the path is `down`."""
        streams, self._streams = self._streams, []
        for stream in streams:
            await stream.aclose()
        self._swallow = None

    def down(self, *, hold: bool = False) -> None:
        """New connections are closed at once (a proxy without its backend), or with ``hold`` left
        unanswered until `up` (a path that drops packets: they go through once it is back)."""
        if self._up.is_set():
            self._up = anyio.Event()
        self._hold = hold

    def up(self) -> None:
        self._up.set()

    def swallow(self, size: int) -> anyio.Event:
        """Throw away what clients send, until `cut`; the event is set once ``size`` bytes were."""
        self._swallow = (size, anyio.Event())
        return self._swallow[1]

    def swallowed(self, chunk: bytes) -> bool:
        if self._swallow is None:
            return False
        left, done = self._swallow
        self._swallow = (left - len(chunk), done)
        if left <= len(chunk):
            done.set()
        return True


@asynccontextmanager
async def relay(target_url: str) -> AsyncGenerator[Relay]:
    """A relay to ``target_url`` (``http://127.0.0.1:PORT``) that runs until the context exits."""
    target_port = int(target_url.rsplit(":", 1)[1])
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    hop = Relay(f"http://127.0.0.1:{port}")

    async def pump(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, *, from_client: bool) -> None:
        try:
            async for chunk in source:
                if from_client and hop.swallowed(chunk):
                    continue
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            await sink.aclose()

    async def serve(client: anyio.abc.SocketStream) -> None:
        if not hop._up.is_set():
            if not hop._hold:
                await client.aclose()
                return
            await hop._up.wait()
        upstream = await anyio.connect_tcp("127.0.0.1", target_port)
        hop._streams += [client, upstream]
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(pump, client, upstream, from_client=True))
            tg.start_soon(partial(pump, upstream, client, from_client=False))

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield hop
        tg.cancel_scope.cancel()
