"""A real Jupyter Kernel Gateway on 127.0.0.1 for the tests (and bench/gateway.py), and a TCP relay
in front of it that a test can cut to drop the websocket."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from .fixtures import stop_process

__all__ = ("Gateway", "Relay", "gateway", "relay", "run_gateway")

# A cold start of the gateway (tornado, jupyter_server) on a loaded 2-core machine stays well below this.
START_TIMEOUT = 60.0
STOP_GRACE = 10.0
# Between two readiness probes of a starting gateway: a probe is one refused connect.
_PROBE_INTERVAL = 0.05


@dataclass(frozen=True)
class Gateway:
    url: str
    token: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def kernel_ids(self) -> list[str]:
        """The gateway's running kernels (listing is enabled on this gateway)."""
        response = httpx.get(f"{self.url}/api/kernels", headers=self.headers(), timeout=30)
        response.raise_for_status()
        return [kernel["id"] for kernel in response.json()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def run_gateway(
    *, rate_limit: bool = False, options: tuple[str, ...] = (), env: Mapping[str, str] | None = None
) -> Generator[Gateway]:
    """Run ``jupyter kernelgateway`` with a token and kernel listing on; kill it (and its kernels) after.

    ``rate_limit=False`` turns off jupyter_server's IOPub rate limit, as docs/remote.md asks
    operators to do; ``options`` are more command-line options, ``env`` more environment variables
    (``JUPYTER_PATH`` for kernelspecs of its own, say).
    """
    token = secrets.token_urlsafe(24)
    port = _free_port()
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
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, cwd=cwd, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        try:
            gateway = Gateway(f"http://127.0.0.1:{port}", token)
            _wait_ready(gateway, process, log)
            yield gateway
        finally:
            stop_process(process)


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
    """Forwards TCP connections from its own port to the gateway's; `cut` drops the open ones."""

    url: str
    _streams: list[anyio.abc.SocketStream] = field(default_factory=list[anyio.abc.SocketStream])

    async def cut(self) -> None:
        streams, self._streams = self._streams, []
        for stream in streams:
            await stream.aclose()


@asynccontextmanager
async def relay(target_url: str) -> AsyncGenerator[Relay]:
    """A relay to ``target_url`` (``http://127.0.0.1:PORT``) that runs until the context exits."""
    target_port = int(target_url.rsplit(":", 1)[1])
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    hop = Relay(f"http://127.0.0.1:{port}")

    async def pump(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
        try:
            async for chunk in source:
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            await sink.aclose()

    async def serve(client: anyio.abc.SocketStream) -> None:
        upstream = await anyio.connect_tcp("127.0.0.1", target_port)
        hop._streams += [client, upstream]
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump, client, upstream)
            tg.start_soon(pump, upstream, client)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield hop
        tg.cancel_scope.cancel()
