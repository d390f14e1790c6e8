"""A user outside a clone: build the wheel, install it into a fresh venv, run it there.

Nothing else checks that the wheel carries everything the installed ``ipybox`` and its adapters need.
The dependencies the wheel's metadata names (with every extra, later) are installed by uv from its
cache, as ``scripts/setup.sh`` left it: pip fetching and compiling ~90 packages from an empty cache
took most of this test's ~340 s and none of what it shows. pip then installs the wheel itself with
no index and no other source, so it installs nothing else: every requirement it declares must be met.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import anyio
import pytest
from deadline_support import patient
from install_support import REPO, uv_command, wheel_requirements
from mcp import Client, StdioServerParameters, types

import ipybox

pytestmark = [pytest.mark.anyio, pytest.mark.install, pytest.mark.timeout(600)]

# uv installing the dependencies from its cache (the index asked for versions only), or pip the
# wheel alone.
INSTALL_TIMEOUT = 120.0
EXTRAS = ("langchain", "pydantic-ai", "openai-agents", "gateway")
# The installed server's start (import mcp), its first sandboxed kernel and one cell.
RUN_TIMEOUT = 90.0


def _readme_example() -> str:
    """The first Python block of the README's "Use" section, the script a new user saves as example.py."""
    readme = (REPO / "README.md").read_text()
    use = readme[readme.index("\n## Use\n") :]
    found = re.search(r"```python\n(.*?)```", use, re.DOTALL)
    assert found is not None, "the README's Use section has no python block"
    return found.group(1)


async def _install(venv: Path, wheel: Path, extras: tuple[str, ...], env: dict[str, str]) -> None:
    """``ipybox[extras]`` from ``wheel`` into ``venv``: what its metadata asks for by uv, then the
    wheel by pip, with no index, no links and no configuration (so from nothing but the wheel)."""
    python = str(venv / "bin" / "python")
    # Copies, not links into uv's cache: nothing done in the venv can change the cache.
    uv = [*uv_command(), "pip", "install", "--quiet", "--link-mode=copy", "--python", python]
    await anyio.run_process([*uv, *wheel_requirements(wheel, extras)], env=env)
    target = f"ipybox[{','.join(extras)}] @ {wheel.as_uri()}" if extras else str(wheel)
    offline = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CACHE_DIR"}
    offline["PIP_CONFIG_FILE"] = os.devnull
    await anyio.run_process([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", target], env=offline)


async def test_the_built_wheel_installs_with_pip_into_a_fresh_venv_serves_mcp_and_runs_the_readme_example(
    tmp_path: Path, ipybox_wheel: Path
) -> None:
    # pip's cache lives in a temporary directory (the wheel's build cache too), so pip reuses nothing
    # from earlier runs and leaves nothing.
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PIP_CACHE_DIR": str(tmp_path / "pip-cache")}
    venv, wheel = tmp_path / "venv", ipybox_wheel
    assert wheel.name == f"ipybox-{ipybox.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        assert f"ipybox-{ipybox.__version__}.dist-info/licenses/LICENSE" in archive.namelist()

    with anyio.fail_after(patient(INSTALL_TIMEOUT)):
        await anyio.run_process([sys.executable, "-m", "venv", str(venv)], env=env)
        await _install(venv, wheel, (), env)
        version = await anyio.run_process([str(venv / "bin" / "ipybox"), "--version"], env=env, cwd=tmp_path)
    assert version.stdout.decode() == f"ipybox {ipybox.__version__}\n"

    workspace, server_tmp = tmp_path / "ws", tmp_path / "tmp"
    workspace.mkdir()
    server_tmp.mkdir()
    server = StdioServerParameters(
        command=str(venv / "bin" / "ipybox"),
        args=["mcp", "--workspace", str(workspace)],
        env={"PATH": os.environ["PATH"], "TMPDIR": str(server_tmp)},
        cwd=str(tmp_path),
    )
    with anyio.fail_after(patient(RUN_TIMEOUT)):
        async with Client(server, mode="legacy") as client:
            assert client.server_info is not None and client.server_info.version == ipybox.__version__
            code = "import sys, ipybox_kernel; print(sys.prefix, ipybox_kernel.__file__); 6 * 7"
            result = await client.call_tool("execute_ipython_cell", {"code": code})
    assert not result.is_error
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    # The kernel runs in the fresh venv on the installed package, not on this checkout.
    prefix, kernel_package, answer = content.text.split()
    assert (prefix, answer) == (str(venv), "42")
    assert kernel_package.startswith(f"{venv}/lib/")

    # The README's example as a user runs it: a file in a directory of their own, outside the repo, run
    # by the venv's python, its one approval answered on stdin.
    project = tmp_path / "project"
    project.mkdir()
    (project / "example.py").write_text(_readme_example())
    python = venv / "bin" / "python"
    with anyio.fail_after(patient(RUN_TIMEOUT)):
        example = await anyio.run_process(
            [str(python), "example.py"],
            input=b"y\n",
            env={"PATH": os.environ["PATH"], "TMPDIR": str(server_tmp)},
            cwd=project,
        )
    prompt = f"weather.get_forecast(city=\"lisbon\") via '{python} -m ipybox.examples.weather', allow? [y/N] "
    assert example.stdout.decode() == prompt + "lisbon: 7.5 °C, sunny\n\n"
    assert (project / "mcptools" / "weather" / "get_forecast.py").is_file()

    # The framework extras, from the same wheel, as a user of an adapter installs them; then the
    # LangChain example agent, copied out of the repo, runs on them (offline, answers on stdin).
    # Without the gateway extra a remote kernel is refused with the command that installs it.
    check_gateway = (
        "from ipybox import CodeExecutor, GatewayKernel, UsageError\n"
        "try:\n"
        "    CodeExecutor(kernel=GatewayKernel('http://127.0.0.1:9'))\n"
        "    print('gateway ok')\n"
        "except UsageError as e:\n"
        "    print(e)\n"
    )
    refused = await anyio.run_process([str(python), "-c", check_gateway], env=env, cwd=project)
    assert "pip install 'ipybox[gateway]'" in refused.stdout.decode(), refused.stdout
    with anyio.fail_after(patient(INSTALL_TIMEOUT)):
        await _install(venv, wheel, EXTRAS, env)
        imported = await anyio.run_process(
            [
                str(python),
                "-c",
                "from ipybox.integrations.langchain import IpyboxTool\n"
                "from ipybox.integrations.pydantic_ai import IpyboxToolset\n"
                "from ipybox.integrations.openai_agents import ipybox_tool\n"
                "from ipybox._gateway._remotekernel import RemoteKernel\n"
                "print('adapters ok')",
            ],
            env=env,
            cwd=project,
        )
    assert imported.stdout.decode() == "adapters ok\n"
    shutil.copy(REPO / "integrations" / "langchain_agent.py", project / "langchain_agent.py")
    with anyio.fail_after(patient(RUN_TIMEOUT)):
        agent = await anyio.run_process(
            [str(python), "langchain_agent.py"],
            input=b"y\nno mail today\n",
            env={"PATH": os.environ["PATH"], "TMPDIR": str(server_tmp)},
            cwd=project,
        )
    out = agent.stdout.decode()
    assert out.count("[approval] MCP tool call weather.") == 2, out
    assert "kernel> report not sent: no mail today" in out, out
