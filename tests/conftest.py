from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import time
from collections.abc import AsyncGenerator, Generator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import anyio
import pytest
from install_support import build_wheel

from ipybox import CodeExecutor, generate_mcp_sources

pytest_plugins = ("servers.fixtures", "servers.gateway")

# The fast tier (`bash scripts/test.sh --fast`, `pytest -m fast`): tests that start no sandboxed kernel
# and no npm server, under 2 minutes on 2 cores. Whole files, and single tests by their node id.
FAST = {
    "tests/test_names.py",
    "tests/test_release.py",
    "tests/test_public_api.py",
    "tests/test_layout.py",
    "tests/test_testing.py",
    "tests/test_zmtp.py",
    "tests/test_config_errors.py",
    "tests/test_gateway_bridge.py",
    "tests/test_kernel_client.py",
    "tests/test_seccomp.py",
    "tests/test_protocol.py",
    "tests/test_unixsocket.py",
    "tests/test_requests.py",
    "tests/test_locator.py",
    "tests/test_docs.py::test_the_api_reference_documents_every_public_name_and_nothing_else",
    "tests/test_docs.py::test_every_cookbook_notebook_is_in_the_site_navigation",
    "tests/test_snippets.py::test_the_pages_have_python_blocks_to_check",
    # Approval semantics, on ipybox.testing.InProcessKernel (the sandbox changes nothing about them).
    "tests/test_tools.py::test_approval_policies_decide_without_asking",
    "tests/test_tools.py::test_an_async_callback_policy_sees_the_request",
    "tests/test_tools.py::test_an_approval_timeout_rejects_with_a_reason",
}


# Fixtures whose "in_process" parameter runs a test on ipybox.testing.InProcessKernel: those runs are fast.
IN_PROCESS_FIXTURES = ("executor", "asking")


# The slowest files, slowest first (docs/development.md, "How long the tests take"): run first, so the
# workers of `scripts/test.sh` (`--dist loadfile --no-loadscope-reorder`, which keeps this order) never
# start one of them at the end while the others have nothing left to do. pytest-xdist's own order,
# most tests first, put these one- and two-test files last. Ordered by each file's wall time in a whole
# run on three workers (2026-11-28, `IPYBOX_TEST_CPU`, a machine at load 4-5): test_durable_adapters.py
# took 189 s, test_mcp_server.py 184 s, test_cookbook.py 142 s, test_oauth.py 132 s, ...
SLOWEST_FIRST = (
    "tests/integrations/test_durable_adapters.py",
    "tests/test_mcp_server.py",
    "tests/test_cookbook.py",
    "tests/test_oauth.py",
    "tests/test_mcp_conformance.py",
    "tests/test_durable_approvals.py",
    "tests/test_install.py",
    "tests/test_setup.py",
    "tests/test_conformance.py",
    "tests/test_toolserver.py",
    "tests/test_plugin.py",
    "tests/test_server_asks.py",
    "tests/test_snippets.py",
    "tests/test_codegen_typecheck.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(SLOWEST_FIRST)}
    # Stable: the other files, and the tests within each file, keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    for item in items:
        params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
        in_process = any(params.get(name) == "in_process" for name in IN_PROCESS_FIXTURES)
        if in_process or {item.nodeid.split("::")[0], item.nodeid.split("[")[0]} & FAST:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # jupyter_client's zmq.asyncio sockets need asyncio; ipybox does not claim trio support.
    return "asyncio"


@pytest.fixture(scope="module")
def module_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="module")
async def executor(module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    """One sandboxed executor shared by the tests of a module that do not break its kernel."""
    async with CodeExecutor(workspace=module_workspace) as ex:
        yield ex


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def generated_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mcptools/test/...` generated from the project's test MCP server (stdio), once per worker:
    a generation starts the server (seconds of CPU importing mcp), the same for every module."""
    # Imported here: at conftest import time the plugin is not registered yet, so pytest could not
    # rewrite its asserts.
    from servers.fixtures import stdio_server

    root = tmp_path_factory.mktemp("generated-tools") / "mcptools"
    # On an event loop of its own, in a thread: a session-scoped async fixture would keep anyio's test
    # runner open for the whole session, and sync tests that call anyio.run (the CLI's) would fail.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(anyio.run, partial(generate_mcp_sources, "test", stdio_server(), root)).result()
    return root


@pytest.fixture(scope="module")
def tools_dir(generated_tools: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A module's own copy of `generated_tools`: its tests may register servers in it or change it."""
    root = tmp_path_factory.mktemp("tools") / "mcptools"
    shutil.copytree(generated_tools, root, symlinks=True)
    return root


@pytest.fixture(scope="session")
def ipybox_wheel(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The wheel built from this checkout, once per run, with an empty uv cache.

    pytest-xdist's workers share it: the first to need it builds it into the run's temporary
    directory (common to the workers of one run, new for each run) while the others wait on a lock.
    """
    if worker_id == "master":
        return build_wheel(tmp_path_factory.mktemp("wheel"))
    work = tmp_path_factory.getbasetemp().parent / "wheel"
    work.mkdir(exist_ok=True)
    with (work / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted((work / "dist").glob("ipybox-*.whl"))
        return built[0] if built else build_wheel(work)


# Where the suite's time goes (docs/development.md): with IPYBOX_TEST_CPU=DIR, each worker writes one
# JSON line per test to DIR: its wall time and the CPU time of this process and of the processes it
# waited for (kernels, servers, builds), setup and teardown included. CPU time hardly moves with load,
# so a run on a busy machine still shows which files cost the most.
_CPU_REPORT = os.environ.get("IPYBOX_TEST_CPU", "")


if _CPU_REPORT:
    _report_dir = Path(_CPU_REPORT)

    def _cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
        wall, cpu = time.monotonic(), _cpu()
        try:
            return (yield)
        finally:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            entry = {"test": item.nodeid, "wall": time.monotonic() - wall, "cpu": _cpu() - cpu}
            with open(_report_dir / f"{worker}.jsonl", "a") as report:
                report.write(json.dumps(entry) + "\n")
