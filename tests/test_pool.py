"""KernelPool: executors take ready, sandboxed kernels from it, each kernel once, and only when it was
started with the executor's own settings.

Real sandboxed kernels, the real tool server and the project's test MCP server over stdio. Which
kernel an executor got is told by the kernel's process id, never by timing.
"""

# The kernel an executor runs and the kernels waiting in a pool are internal; their pids prove which is which.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from approval_support import collect
from servers.fixtures import wait_for_exit

from ipybox import (
    CodeExecutionError,
    CodeExecutor,
    KernelPool,
    KernelStartError,
    Limits,
    UsageError,
)

pytestmark = pytest.mark.anyio

# How long a pool may take to start its kernels on a busy two-core machine.
FILL_TIMEOUT = 60


@pytest.fixture(scope="module")
async def pool(module_workspace: Path, tools_dir: Path) -> AsyncGenerator[KernelPool]:
    async with KernelPool(size=2, workspace=module_workspace, tools_dir=tools_dir) as pool:
        yield pool


async def full(pool: KernelPool) -> set[int]:
    """Wait until the pool is full; the pids of its ready kernels."""
    with anyio.fail_after(FILL_TIMEOUT):
        await pool.wait_until_full()
    return {pid(lease.kernel) for lease in pool._ready}


def pid(kernel: object) -> int:
    assert kernel is not None
    return kernel.pid  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]


def running(executor: CodeExecutor) -> int:
    return pid(executor._kernels.kernel)


async def test_an_executor_from_a_warm_pool_runs_a_kernel_that_was_waiting_in_it(
    pool: KernelPool, tools_dir: Path
) -> None:
    waiting = await full(pool)
    async with CodeExecutor(workspace=pool.workspace, tools_dir=tools_dir, pool=pool) as executor:
        taken = running(executor)
        assert taken in waiting
        assert (await executor.execute("print(6 * 7)")).text == "42\n"
    # The pool starts another in its place.
    refilled = await full(pool)
    assert taken not in refilled and len(refilled) == pool.size


async def test_a_pooled_kernel_is_never_handed_out_twice_nor_after_a_reset(pool: KernelPool, tools_dir: Path) -> None:
    seen: list[int] = []
    waiting = await full(pool)
    async with CodeExecutor(workspace=pool.workspace, tools_dir=tools_dir, pool=pool) as first:
        seen.append(running(first))
        await first.execute("x = 1")
        await full(pool)
        await first.reset()
        # A pool kernel is clean, so the fresh kernel after a reset comes from the pool too.
        seen.append(running(first))
        with pytest.raises(CodeExecutionError, match="NameError"):
            await first.execute("x")
    waiting |= await full(pool)
    async with CodeExecutor(workspace=pool.workspace, tools_dir=tools_dir, pool=pool) as second:
        seen.append(running(second))
    assert len(set(seen)) == 3 and set(seen) <= waiting
    assert not set(seen) & await full(pool)


async def test_an_executor_takes_its_pools_settings_and_refuses_others_instead_of_starting_cold(
    pool: KernelPool, tools_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # It used to start a kernel of its own and log why: the pool was then no help, silently.
    other = Limits(memory=2 * 1024**3)
    with pytest.raises(UsageError, match=r"differ from its KernelPool's in limits: leave them out of CodeExecutor"):
        CodeExecutor(workspace=pool.workspace, tools_dir=tools_dir, limits=other, pool=pool)
    with pytest.raises(UsageError, match=r"differ from its KernelPool's in sandbox, env"):
        CodeExecutor(workspace=pool.workspace, sandbox=None, env={"A": "b"}, pool=pool)
    waiting = await full(pool)
    # Given none of them (not even the workspace), it runs with the pool's, on one of its kernels.
    with caplog.at_level(logging.WARNING, logger="ipybox._kernel._pool"):
        async with CodeExecutor(pool=pool) as executor:
            assert running(executor) in waiting
            assert (executor.workspace, executor.tools_dir, executor.limits) == (
                pool.workspace,
                tools_dir.resolve(),
                pool.settings.limits,
            )
            assert (await executor.execute("import os\nprint(os.getcwd())")).text == f"{pool.workspace}\n"
    assert not [r for r in caplog.records if "KernelPool" in r.getMessage()]


async def test_a_kernel_killed_while_waiting_in_the_pool_is_not_handed_out(pool: KernelPool, tools_dir: Path) -> None:
    await full(pool)
    victim = pool._ready[0].kernel
    assert victim is not None
    os.killpg(victim.pid, signal.SIGKILL)
    with anyio.fail_after(FILL_TIMEOUT):
        await victim.exited.wait()
    async with CodeExecutor(workspace=pool.workspace, tools_dir=tools_dir, pool=pool) as executor:
        assert running(executor) != victim.pid
        assert (await executor.execute("print('alive')")).text == "alive\n"


async def test_an_executor_from_a_pool_calls_tools_with_approval_and_keeps_its_packages_across_a_reset(
    pool: KernelPool, tools_dir: Path
) -> None:
    code = "from mcptools.test import greet\nprint(greet.run(greet.Params(name='pool')))"
    guarded = (
        "from ipybox_kernel import ToolCallRejected\nfrom mcptools.test import greet\n"
        "try:\n    greet.run(greet.Params(name='pool'))\nexcept ToolCallRejected as e:\n    print('rejected:', e)"
    )
    await full(pool)
    async with CodeExecutor(workspace=pool.workspace, tools_dir=tools_dir, pool=pool) as executor:
        first = running(executor)
        requests, result = await collect(executor, code)
        assert result.text == "Hello, pool!\n" and [r.tool_name for r in requests] == ["greet"]
        # As if installed with executor.install: a package in the executor's private directory.
        assert executor._side.home is not None
        (executor._side.home / "packages" / "pool_marker.py").write_text("VALUE = 'kept'\n")
        await executor.reset()
        assert running(executor) != first
        # The new kernel came with its own tool socket and token; the host serves both now.
        _, rejected = await collect(executor, guarded, {"greet": False}, reason="not now")
        assert rejected.text.startswith("rejected:") and "not now" in rejected.text
        _, accepted = await collect(executor, code)
        assert accepted.text == "Hello, pool!\n"
        assert (await executor.execute("import pool_marker; print(pool_marker.VALUE)")).text == "kept\n"


async def test_closing_a_pool_leaves_no_process_cgroup_directory_or_socket_behind(workspace: Path) -> None:
    async with KernelPool(size=2, workspace=workspace, tools_dir=None) as pool:
        await full(pool)
        async with CodeExecutor(workspace=workspace, tools_dir=None, pool=pool) as executor:
            await executor.execute("print(1)")
            taken = executor._side.home
        await full(pool)
        leases = list(pool._ready)
        kernels = [lease.kernel for lease in leases if lease.kernel is not None]
        processes = [p for k in kernels for p in tree(k.pid)]
        cgroups = [c for p in processes if (c := cgroup_of(p)) is not None]
        paths = [taken, *(lease.home for lease in leases), *(k.run_dir for k in kernels)]
        assert len(processes) >= 2 and all(p is not None and p.exists() for p in paths[1:])
    for process in processes:
        await wait_for_exit(process)
    assert not [p for p in paths if p is not None and p.exists()]
    assert not [c for c in cgroups if c.exists()]


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    found, pending = [root], [root]
    while pending:
        pid = pending.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        found += map(int, children)
        pending += map(int, children)
    return found


def cgroup_of(pid: int) -> Path | None:
    """The ipybox pids cgroup ``pid`` runs in, if any."""
    try:
        line = Path(f"/proc/{pid}/cgroup").read_text().splitlines()[0]
    except OSError:
        return None
    path = Path("/sys/fs/cgroup") / line.split("::", 1)[-1].lstrip("/")
    return path if path.name.startswith("ipybox-") else None


async def test_a_pool_with_separate_workspaces_gives_each_executor_its_own_directories(workspace: Path) -> None:
    async with KernelPool(size=1, workspace=workspace, separate_workspaces=True) as pool:
        await full(pool)
        dirs: list[tuple[Path, Path | None]] = []
        for _ in range(2):
            async with CodeExecutor(pool=pool) as executor:
                dirs.append((executor.workspace, executor.tools_dir))
                await executor.execute("open('note.txt', 'w').write('mine')")
        await full(pool)
        [unused] = pool._ready
    (first, first_tools), (second, second_tools) = dirs
    assert first != second and first.parent == second.parent == workspace.resolve()
    assert first_tools is not None and second_tools is not None and first_tools != second_tools
    assert not first_tools.is_relative_to(workspace) and first_tools.name == "mcptools"
    # The taken kernels' directories are the caller's; the pool removed those it never handed out.
    assert (first / "note.txt").read_text() == (second / "note.txt").read_text() == "mine"
    assert not any(path.exists() for path in (unused.home, *unused.dirs))


async def test_an_executor_does_not_wait_for_a_pool_whose_kernels_fail_to_start(workspace: Path) -> None:
    # Too little address space for the kernel to start.
    starved = Limits(memory=64 * 1024**2)
    async with KernelPool(size=1, workspace=workspace, tools_dir=None, limits=starved) as pool:
        with anyio.fail_after(FILL_TIMEOUT), pytest.raises(KernelStartError):
            await pool.wait_until_full()
        # It starts its own kernel at once, and that start's error says why.
        with anyio.fail_after(FILL_TIMEOUT), pytest.raises(KernelStartError, match="exited during start-up"):
            async with CodeExecutor(workspace=workspace, tools_dir=None, limits=starved, pool=pool):
                pass
