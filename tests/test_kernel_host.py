"""``ipybox kernel-host``: a long-lived local kernel host (issue #31), run as a real subprocess.

A code action suspended at its approval in one process (A) is resumed in another (B) from its
locator, with the kernels on the host sandboxed (the executors require the isolation check to pass).
The host listens on 127.0.0.1 only, refuses requests without its token, and keeps the token off
command lines and in a file only its owner reads.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from deadline_support import patient
from servers.fixtures import stop_process
from servers.gateway import Gateway, _wait_ready
from test_durable_approvals import BEFORE_AND_AFTER, calls, resumed, suspended

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

# The host writes its token file first, then starts the gateway.
TOKEN_FILE_TIMEOUT = 60.0
_PROBE_INTERVAL = 0.05


@dataclass(frozen=True)
class Host:
    gateway: Gateway
    process: subprocess.Popen[bytes]
    token_file: Path
    port: int


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_host(directory: Path) -> Host:
    port = _free_port()
    token_file = directory / "kernel-host.token"
    log = directory / "host.log"
    command = [sys.executable, "-m", "ipybox", "kernel-host", "--port", str(port), "--token-file", str(token_file)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + patient(TOKEN_FILE_TIMEOUT)
    while not token_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError(f"the kernel host wrote no token file:\n{log.read_text()[-4000:]}")
        time.sleep(_PROBE_INTERVAL)  # a starting process: nothing to wait on but its file
    gateway = Gateway(f"http://127.0.0.1:{port}", token_file.read_text().strip(), log)
    try:
        _wait_ready(gateway, process, log)
    except BaseException:
        stop_process(process)
        raise
    return Host(gateway, process, token_file, port)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    started = _start_host(tmp_path_factory.mktemp("kernel-host"))
    try:
        yield started
    finally:
        stop_process(started.process)


async def test_suspended_on_the_kernel_host_in_one_process_and_resumed_in_another_it_runs_once(
    host: Host, tools_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers' executors use the host's sandboxed kernelspec and require the isolation check.
    monkeypatch.setenv("IPYBOX_TEST_ISOLATED", "1")
    call_log, secret = tmp_path / "calls.log", secrets.token_bytes(32)
    locator = await suspended(host.gateway, tools_dir, call_log, secret)
    report = await resumed(host.gateway, tools_dir, call_log, secret, locator, "ask")
    assert report["error"] is None, host.gateway.log_tail()
    assert report["asked"] == [{"item_id": "x1"}]
    assert report["text"] == BEFORE_AND_AFTER
    assert calls(call_log) == ["delete_item x1"]


def test_the_kernel_host_refuses_requests_without_its_token(host: Host) -> None:
    url = host.gateway.url
    for headers in ({}, {"Authorization": f"token {secrets.token_urlsafe(32)}"}, {"Authorization": "Bearer x"}):
        assert httpx.get(f"{url}/api/kernelspecs", headers=headers, timeout=30).status_code in (401, 403)
        started = httpx.post(f"{url}/api/kernels", headers=headers, json={}, timeout=30)
        assert started.status_code in (401, 403)
    # With the token: it serves the sandboxed kernelspec, and only that one.
    specs = httpx.get(f"{url}/api/kernelspecs", headers=host.gateway.headers(), timeout=30)
    assert specs.status_code == 200
    assert list(specs.json()["kernelspecs"]) == ["ipybox-sandboxed"]


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as the kernel writes them) of the sockets listening on ``port``."""
    found: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(address)
    return found


def _processes_under(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _own_addresses() -> set[str]:
    """This machine's IPv4 addresses: its name's, and the one it would send from (no packet is sent)."""
    found = {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the route
            found.add(str(probe.getsockname()[0]))
        except OSError:
            pass  # no route off this machine
    return found


def test_the_kernel_host_listens_on_loopback_only_and_keeps_its_token_off_command_lines(host: Host) -> None:
    # 127.0.0.1, as the kernel lists it: nothing on another address or the wildcard.
    assert _listening(host.port) == ["0100007F"]
    # Not reachable on this machine's other addresses.
    for address in _own_addresses():
        if address.startswith("127."):
            continue
        with socket.socket() as probe, pytest.raises(OSError):
            probe.settimeout(5)
            probe.connect((address, host.port))
    assert stat.S_IMODE(host.token_file.stat().st_mode) == 0o600
    processes = _processes_under(host.process.pid)
    assert len(processes) >= 2  # the host and its gateway
    for pid in processes:
        assert host.gateway.token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_stopped_kernel_host_removes_its_token_file_and_frees_its_port(tmp_path: Path) -> None:
    stopped = _start_host(tmp_path)
    stopped.process.send_signal(signal.SIGTERM)
    stopped.process.wait(patient(TOKEN_FILE_TIMEOUT))
    assert not stopped.token_file.exists()
    assert _listening(stopped.port) == []


def test_a_kernel_host_whose_port_is_taken_exits_instead_of_moving_elsewhere(tmp_path: Path) -> None:
    token_file = tmp_path / "kernel-host.token"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        command = [sys.executable, "-m", "ipybox", "kernel-host", "--port", str(port), "--token-file", str(token_file)]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=patient(120), check=False)
    assert done.returncode != 0
    assert not token_file.exists()
