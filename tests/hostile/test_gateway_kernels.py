"""Kernels of the shipped gateway kernelspec (deploy/gateway/ipybox-sandboxed) against what local
kernels are held to: hooks an earlier cell left cannot call tools, the clock during approvals is
bounded though the host cannot see the kernel's CPU time, and each kernel has a host uid of its own
when the gateway runs as root.

One real Kernel Gateway (ipc transport, the kernelspec installed) serves the whole module, and two
executors share it: one with the default limits, one whose code actions may wait for approvals
long (`Limits.approval_wait`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import anyio
import pytest
from approval_support import collect
from deadline_support import patient
from servers.gateway import SANDBOXED, Gateway, run_sandboxed_gateway

from ipybox import (
    ApprovalRequest,
    CodeExecutor,
    ExecutionTimeout,
    GatewayKernel,
    Limits,
    Timeouts,
)
from ipybox._approval._rendering import LEFT_RUNNING_WARNING
from ipybox._kernel._leftrunning import UNSEEN

from .test_clock import CALL, COMPUTE_WHILE_WAITING, TIMEOUT, call_approved_late
from .test_kernel_uid import (
    RELEASE_PIPE_PAGES,
    TAKE_PIPE_PAGES,
    host_ids,
    host_root_grows_a_pipe,
    kernelspec_launcher,
)
from .test_left_running import CELL_2 as LEFT_CELL_2
from .test_left_running import LEAVE
from .test_left_running import SETUP as LEFT_SETUP
from .test_main_thread_leftovers import CELL_2, SETUP

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

# A kernel start in the gateway's sandbox on a loaded 2-core machine.
START_TIMEOUT = 60.0
# Bounds a wrong outcome (a cell computing on while nobody answers), not the expected one.
DEADLINE = 120.0
# What the patient executor's code actions may wait for approvals in all.
APPROVAL_WAIT = 600


@pytest.fixture(scope="module")
def sandboxed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with run_sandboxed_gateway(tmp_path_factory.mktemp("jupyter")) as gateway:
        yield gateway


def _executor(gateway: Gateway, workspace: Path, tools_dir: Path, limits: Limits | None = None) -> CodeExecutor:
    # A kernel that computes in one thread takes seconds to take an interrupt on a loaded machine.
    timeouts = Timeouts(start=patient(START_TIMEOUT), interrupt_grace=DEADLINE / 4)
    kernel = GatewayKernel(gateway.url, token=gateway.token, kernel_name=SANDBOXED)
    return CodeExecutor(
        workspace=workspace, tools_dir=tools_dir, kernel=kernel, approval="ask", timeouts=timeouts, limits=limits
    )


@pytest.fixture(scope="module")
async def strict(
    sandboxed_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory, tools_dir: Path
) -> AsyncGenerator[CodeExecutor]:
    """Default limits: no approval budget."""
    async with _executor(sandboxed_gateway, tmp_path_factory.mktemp("strict"), tools_dir) as executor:
        # Imports made and the MCP server started: timed cells reach their call at once.
        requests, result = await collect(executor, CALL)
        assert (len(requests), result.text) == (1, "3\n")
        # The kernel's first code action: no earlier one could have left code in it.
        assert requests[0].left_running is None
        yield executor


@pytest.fixture(scope="module")
async def patient_executor(
    sandboxed_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory, tools_dir: Path
) -> AsyncGenerator[CodeExecutor]:
    """Code actions may wait `APPROVAL_WAIT` seconds for approvals."""
    limits = Limits(approval_wait=APPROVAL_WAIT)
    async with _executor(sandboxed_gateway, tmp_path_factory.mktemp("patient"), tools_dir, limits) as executor:
        requests, result = await collect(executor, CALL)
        assert (len(requests), result.text) == (1, "3\n")
        yield executor


async def test_a_pre_run_cell_hook_an_earlier_cell_left_cannot_call_tools_in_the_next_one(strict: CodeExecutor) -> None:
    requests, _ = await collect(strict, SETUP + "get_ipython().events.register('pre_run_cell', leftover)")
    assert requests == [], [r.description for r in requests]
    requests, _ = await collect(strict, CELL_2)
    assert requests == [], [r.description for r in requests]
    requests, result = await collect(
        strict, "get_ipython().events.unregister('pre_run_cell', leftover)\nprint(outcomes)"
    )
    assert requests == []
    outcomes = eval(result.text)  # a list of strings the cell printed
    assert outcomes, result.text
    assert set(outcomes) == {"ToolCallRejected: outside the code action's own code"}, outcomes


async def test_a_call_of_a_thread_an_earlier_cell_left_is_asked_with_the_statement_that_its_origin_is_unknown(
    strict: CodeExecutor,
) -> None:
    # Cell 1 leaves a thread that copies cell 2's execution id and calls as cell 2. The host cannot
    # see a gateway kernel's threads, so it cannot tell that thread from cell 2's own code: the
    # request says so, first in every rendering, instead of passing as cell 2's.
    requests, result = await collect(strict, LEFT_SETUP + LEAVE["threading.Thread"])
    assert (requests, result.text) == ([], "")
    requests, result = await collect(strict, LEFT_CELL_2)
    assert result.text == "left -> ran\n", result.text
    [request] = requests
    assert request.left_running == UNSEEN
    # Right under the headline.
    assert request.description.split("\n")[1] == f"{LEFT_RUNNING_WARNING} {UNSEEN}", request.description


async def test_a_thread_that_computes_while_a_call_waits_for_approval_runs_into_the_timeout(
    strict: CodeExecutor,
) -> None:
    # The host cannot see a gateway kernel's CPU time: the clock stops while the call waits, but for
    # at most the execution's own timeout in all (no approval budget is set).
    requests: list[ApprovalRequest] = []
    began = anyio.current_time()
    with anyio.fail_after(DEADLINE), pytest.raises(ExecutionTimeout):
        async for event in strict.execute(COMPUTE_WHILE_WAITING, timeout=TIMEOUT):
            if isinstance(event, ApprovalRequest):
                requests.append(event)
    # The timeout and the pause (each 2 s), then the interrupt: never the wait a person could take.
    assert anyio.current_time() - began >= 2 * TIMEOUT
    [request] = requests
    assert request.decision is not None and not request.decision.approved
    # Interrupted, not restarted: the kernel (and the spinning thread) lives on.
    requests, result = await collect(strict, "stop.set()\nprint('stopped')")
    assert (requests, result.text) == ([], "stopped\n")


async def test_with_an_approval_budget_a_cell_that_only_waits_for_a_long_approval_does_not_time_out(
    patient_executor: CodeExecutor,
) -> None:
    await call_approved_late(patient_executor.execute(CALL, timeout=TIMEOUT))


def _kernel_pids(marker: str) -> list[int]:
    """Host pids of processes whose command line holds ``marker``."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


async def _host_uid(executor: CodeExecutor) -> int:
    """The host uid of the executor's kernel, found by a unique command of its own."""
    seconds = f"60.{secrets.randbelow(10**6)}"
    requests, result = await collect(executor, f"import subprocess\nchild = subprocess.Popen(['sleep', {seconds!r}])")
    assert (requests, result.text) == ([], "")
    try:
        [pid] = _kernel_pids(f"sleep\0{seconds}\0")
        uids, gids = host_ids(pid)
    finally:
        await collect(executor, "child.kill(); child.wait()")
    assert len(set(uids)) == 1 and len(set(gids)) == 1, (uids, gids)
    return uids[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel gets a uid of its own only when the gateway runs as root")
async def test_under_a_root_gateway_each_kernel_runs_as_a_host_uid_of_its_own(
    strict: CodeExecutor, patient_executor: CodeExecutor
) -> None:
    first, second = await _host_uid(strict), await _host_uid(patient_executor)
    assert 0 not in (first, second)
    assert first != second
    # Counted per uid, so it bounds the kernel's processes and threads (root would be exempt).
    requests, result = await collect(strict, "import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC))")
    assert (requests, result.text) == ([], "(512, 512)\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel gets a uid of its own only when the gateway runs as root")
async def test_pipe_pages_a_gateway_kernel_exhausts_leave_host_root_able_to_grow_a_pipe(strict: CodeExecutor) -> None:
    if (await host_root_grows_a_pipe()).returncode != 0:
        pytest.skip("root's pipe page budget is already spent by other processes on this host")
    try:
        requests, result = await collect(strict, TAKE_PIPE_PAGES)
        host = await host_root_grows_a_pipe()
    finally:
        await collect(strict, RELEASE_PIPE_PAGES)
    assert requests == []
    grown, error = result.text.split()
    # The kernel did reach its uid's limit (EPERM), within the soft limit's 16,384 pages or so.
    assert error == "1" and 0 < int(grown) <= 64, result.text
    assert host.returncode == 0, host.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernelspec looks for a uid of the kernel's own only as root")
def test_where_bwrap_cannot_run_as_another_uid_the_kernelspec_says_so_loudly_and_runs_the_kernel_as_root(
    capfd: pytest.CaptureFixture[str],
) -> None:
    launcher = kernelspec_launcher()
    # Private directories where the launcher makes them (the kernel's uid must reach them).
    first, second = tempfile.mkdtemp(prefix="ipybox-kernel-"), tempfile.mkdtemp(prefix="ipybox-kernel-")
    try:
        # A bwrap that cannot start a sandbox (as on a host without unprivileged user namespaces).
        assert launcher.own_uid("/bin/false", first, launcher.python_dirs()) is None
        warning = capfd.readouterr().err
        assert "WARNING" in warning and "runs as the gateway's uid 0 (root)" in warning, warning
        # And with the real bwrap, the probe passes: a uid of its own, not root's.
        found = launcher.own_uid(shutil.which("bwrap"), second, launcher.python_dirs())
        assert found is not None and found[0] != 0, capfd.readouterr().err
    finally:
        shutil.rmtree(first)
        shutil.rmtree(second)
