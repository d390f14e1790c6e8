"""`CodeExecutor(kernel=...)` takes any `KernelSource`: a `LocalKernel` with settings of its own, a
`KernelPool`, and a source of the application's own (here one that wraps `LocalKernel` and records
what the executor gives it). A kernel on a gateway is the gateway tests' (``tests/test_gateway_*.py``).

Real sandboxed kernels and the project's test MCP server over stdio; which kernel an executor runs is
told by its process id.
"""

# The kernel an executor runs, and its host side, are internal; their pids and paths prove which is which.
# pyright: reportPrivateUsage=false

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from approval_support import collect

from ipybox import (
    CodeExecutor,
    KernelHost,
    KernelPool,
    KernelSettings,
    KernelSource,
    Limits,
    LocalKernel,
)
from ipybox._kernel import KernelHandle

pytestmark = pytest.mark.anyio

# How long a pool may take to start its kernels on a busy two-core machine.
FILL_TIMEOUT = 60


def pid(executor: CodeExecutor) -> int:
    kernel = executor._kernels.kernel
    assert kernel is not None
    return kernel.pid  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]


async def test_a_local_kernel_with_settings_of_its_own_runs_with_them(workspace: Path, tools_dir: Path) -> None:
    settings = KernelSettings(
        workspace=workspace, env={"GREETING": "hi"}, limits=Limits(output_chars=400), tools_dir=tools_dir
    )
    async with CodeExecutor(kernel=LocalKernel(settings)) as executor:
        assert (executor.workspace, executor.tools_dir, executor.limits) == (
            workspace.resolve(),
            tools_dir.resolve(),
            settings.limits,
        )
        code = "import os\nprint(os.getcwd(), os.environ['GREETING'])\nprint('x' * 500)"
        result = await executor.execute(code)
        assert result.text.startswith(f"{workspace.resolve()} hi\n") and result.truncated_chars > 0
        # Its tools are registered and reached through the executor's tool server, with approval.
        requests, called = await collect(
            executor, "from mcptools.test import greet\nprint(greet.run(greet.Params(name='src')))"
        )
        assert called.text == "Hello, src!\n" and [r.tool_name for r in requests] == ["greet"]


async def test_a_pool_given_as_kernel_hands_over_a_waiting_kernel(workspace: Path) -> None:
    async with KernelPool(size=1, workspace=workspace, tools_dir=None) as pool:
        with anyio.fail_after(FILL_TIMEOUT):
            await pool.wait_until_full()
        kernel = pool._ready[0].kernel
        assert kernel is not None
        async with CodeExecutor(kernel=pool) as executor:
            assert pid(executor) == kernel.pid
            assert executor.workspace == pool.workspace and executor.tools_dir is None
            assert (await executor.execute("print(6 * 7)")).text == "42\n"


class Recording:
    """A source of the application's own: local kernels, and what the executor gave for each."""

    remote = False

    def __init__(self) -> None:
        self.local = LocalKernel()
        self.hosts: list[KernelHost] = []

    def settings_for(self, requested: KernelSettings) -> KernelSettings:
        return self.local.settings_for(requested)

    @asynccontextmanager
    async def open(self, host: KernelHost) -> AsyncGenerator[KernelHandle]:
        self.hosts.append(host)
        async with self.local.open(host) as kernel:
            yield kernel


async def test_any_kernel_source_is_given_the_executors_host_side_for_each_kernel(workspace: Path) -> None:
    source = Recording()
    as_protocol: KernelSource = source  # what pyright checks: the class has the protocol's shape
    async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=as_protocol) as executor:
        first = pid(executor)
        token = "import os\nprint(os.environ['IPYBOX_TOOL_TOKEN'], os.environ['IPYBOX_TOOL_SOCKET'])"
        assert (await executor.execute(token)).text.split() == [source.hosts[0].token, str(source.hosts[0].tool_socket)]
        await executor.reset()
        assert pid(executor) != first
    # The first kernel and its replacement, on the same private directory, with what the executor resolved.
    assert [host.restarting for host in source.hosts] == [False, True]
    assert {host.home for host in source.hosts} == {source.hosts[0].tool_socket.parent}
    assert {host.settings.workspace for host in source.hosts} == {workspace.resolve()}
    assert source.hosts[0].settings.sandbox is not None and source.hosts[0].settings.sandbox != "auto"
    assert not source.hosts[0].home.exists()
