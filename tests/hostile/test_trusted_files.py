"""What the host trusts later: the tools directory, its server manifest, and what the kernel imports.

Kernel code writes the workspace, and a later executor on the same workspace must not run, mount,
write through or import anything it left there. Each case plants the files as an attacker would
(from kernel code, or directly where only an unsandboxed run could have) and starts a second
executor with the usual arguments.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ipybox import CodeExecutor, KernelStartError, StdioServer, UsageError, generate_mcp_sources
from ipybox._manifest import manifest_lock, save_manifest_entry

from .conftest import plain_server, run

pytestmark = pytest.mark.anyio

CALL_EVIL = (
    "from ipybox_kernel import call_tool\n"
    "try:\n"
    "    call_tool('evil', 'x', {})\n"
    "except Exception as e:\n"
    "    print(type(e).__name__)"
)


def evil_server(marker: Path) -> StdioServer:
    """Server parameters whose command, if the host ever starts it, leaves ``marker`` behind."""
    return StdioServer(command="/bin/sh", args=("-c", f"touch {marker}"))


async def test_kernel_code_cannot_plant_a_server_manifest_that_the_next_executor_would_run(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace)  # CodeExecutor's defaults: workspace "." and tools_dir "mcptools"
    marker = tmp_path / "host-command-ran"
    manifest = json.dumps({"evil": evil_server(marker).model_dump(mode="json")})
    plant = (
        "import os\n"
        "try:\n"
        "    os.makedirs('mcptools/.ipybox', exist_ok=True)\n"
        f"    open('mcptools/.ipybox/servers.json', 'w').write({manifest!r})\n"
        "    os.chmod('mcptools/.ipybox', 0o700)\n"
        "    os.chmod('mcptools/.ipybox/servers.json', 0o600)\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)"
    )
    async with CodeExecutor() as ex:
        await ex.execute(plant)
    async with CodeExecutor() as ex:
        result = await ex.execute(CALL_EVIL)
    assert not marker.exists()
    assert result.text == "ToolNotFound\n"
    # Whatever the kernel wrote went to the read-only mount or the tmpfs hiding the manifest.
    assert not (workspace / "mcptools" / ".ipybox" / "servers.json").exists()


async def test_a_tools_dir_an_unsandboxed_kernel_replaced_with_a_symlink_is_refused_before_anything_uses_it(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace)
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "secret.txt").write_text("host secret")
    # An older ipybox, or sandbox=None: the kernel could do this with the workspace's tools dir.
    async with CodeExecutor(sandbox=None) as ex:
        replace = "shutil.rmtree('mcptools', ignore_errors=True)\n"
        await ex.execute(f"import os, shutil\n{replace}os.symlink({str(host_dir)!r}, 'mcptools')")
    with pytest.raises(UsageError, match=r"goes through the symlink '.*/mcptools'.*delete the link"):
        CodeExecutor()
    with pytest.raises(UsageError, match=r"goes through the symlink '.*/mcptools'"):
        await generate_mcp_sources("test", plain_server(), "mcptools")
    assert [p.name for p in host_dir.iterdir()] == ["secret.txt"]


async def test_a_symlink_the_kernel_plants_above_a_nested_tools_dir_stops_the_next_kernel_start_and_generation(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace)
    host_dir = tmp_path / "host-dir"
    (host_dir / "mcptools").mkdir(parents=True)
    async with CodeExecutor(tools_dir="sub/mcptools") as ex:
        # The tools dir is a mount point and cannot be moved, but the directory holding it can.
        result = await ex.execute(f"import os\nos.rename('sub', 'moved')\nos.symlink({str(host_dir)!r}, 'sub')")
        assert result.text == ""
        with pytest.raises(KernelStartError, match=r"goes through the symlink '.*/sub' inside"):
            await ex.reset()
        with pytest.raises(UsageError, match=r"goes through the symlink '.*/sub' inside"):
            await generate_mcp_sources("test", plain_server(), "sub/mcptools")
    assert list((host_dir / "mcptools").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")
async def test_a_tools_dir_of_another_user_or_one_others_can_write_is_refused(workspace: Path, tmp_path: Path) -> None:
    tools = tmp_path / "mcptools"
    tools.mkdir()
    tools.chmod(0o777)
    with pytest.raises(UsageError, match=r"can be written by others \(mode 0o777\).*chmod go-w"):
        async with CodeExecutor(workspace=workspace, tools_dir=tools):
            pass
    tools.chmod(0o755)
    os.chown(tools, 65534, 65534)
    with pytest.raises(UsageError, match=r"belongs to uid 65534, not to this process"):
        async with CodeExecutor(workspace=workspace, tools_dir=tools):
            pass
    with pytest.raises(UsageError, match=r"belongs to uid 65534"):
        await generate_mcp_sources("test", plain_server(), tools)


def _manifest_dir_is_a_symlink(manifest: Path, elsewhere: Path) -> None:
    manifest.parent.rename(elsewhere)
    manifest.parent.symlink_to(elsewhere)


def _manifest_is_a_symlink(manifest: Path, elsewhere: Path) -> None:
    manifest.rename(elsewhere)
    manifest.symlink_to(elsewhere)


def _manifest_is_readable_by_others(manifest: Path, elsewhere: Path) -> None:
    manifest.chmod(0o644)


def _manifest_dir_is_writable_by_others(manifest: Path, elsewhere: Path) -> None:
    manifest.parent.chmod(0o777)


def _manifest_is_a_fifo(manifest: Path, elsewhere: Path) -> None:
    manifest.unlink()
    os.mkfifo(manifest, 0o600)


def _manifest_of_another_user(manifest: Path, elsewhere: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    os.chown(manifest, 65534, 65534)


@pytest.mark.parametrize(
    ("tamper", "complaint"),
    [
        (_manifest_dir_is_a_symlink, "is a symlink or not a directory"),
        (_manifest_is_a_symlink, "is a symlink"),
        (_manifest_is_readable_by_others, "has mode 0o644, not 0600"),
        (_manifest_dir_is_writable_by_others, "can be written by others"),
        (_manifest_is_a_fifo, "is not a regular file"),
        (_manifest_of_another_user, "belongs to uid 65534"),
    ],
    ids=["dir symlink", "file symlink", "file readable by others", "dir writable by others", "fifo", "other owner"],
)
async def test_a_server_manifest_that_is_not_a_private_file_of_the_host_is_refused_before_it_is_read(
    workspace: Path, tmp_path: Path, tamper: Callable[[Path, Path], None], complaint: str
) -> None:
    tools = tmp_path / "mcptools"
    tools.mkdir()
    marker = tmp_path / "host-command-ran"
    with manifest_lock(tools):
        save_manifest_entry(tools, "evil", evil_server(marker))
    tamper(tools / ".ipybox" / "servers.json", tmp_path / "elsewhere")
    with pytest.raises(UsageError, match=complaint) as info:
        async with CodeExecutor(workspace=workspace, tools_dir=tools):
            pass
    assert "/mcptools/.ipybox" in str(info.value) and "generate the server packages again" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("shape", ["modules", "packages"])
async def test_modules_planted_in_the_workspace_shadow_neither_the_tools_nor_their_imports_nor_the_kernel_launcher(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    monkeypatch.chdir(workspace)
    await generate_mcp_sources("test", plain_server(), "mcptools")
    plant = (
        "import os\n"
        "def plant(name):\n"
        f"    path = f'{{name}}/__init__.py' if {shape == 'packages'} else f'{{name}}.py'\n"
        "    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)\n"
        "    open(path, 'w').write(f'open(\"shadowed-{name}\", \"w\").close()\\n')\n"
        # A package named like the tools directory cannot be made: the real one is mounted there.
        "open('mcptools.py', 'w').write('open(\"shadowed-mcptools\", \"w\").close()\\n')\n"
        "for name in ('pydantic', 'ipybox_kernel', 'argparse'):\n"
        "    plant(name)\n"
        "open('mymodule.py', 'w').write('VALUE = \"mine\"\\n')"
    )
    async with CodeExecutor(approval="auto") as ex:
        await run(ex, plant)
    # A tools directory generated before ipybox made it a regular package: a namespace package
    # loses to any plain module of the same name further down sys.path.
    (workspace / "mcptools" / "__init__.py").unlink(missing_ok=True)
    code = (
        "import argparse, ipybox_kernel, mcptools, pydantic, mymodule\n"
        "from mcptools.test import greet\n"
        "print(greet.run(greet.Params(name='x')))\n"
        "print(mymodule.VALUE)\n"
        "import os\n"
        "modules = (argparse, ipybox_kernel, mcptools, pydantic)\n"
        "print([m.__name__ for m in modules if m.__file__.startswith(os.getcwd())])"
    )
    async with CodeExecutor(approval="auto") as ex:
        result = await run(ex, code)
    assert sorted(p.name for p in workspace.glob("shadowed-*")) == []
    assert result.text == "Hello, x!\nmine\n[]\n"
    assert (workspace / "mcptools" / "__init__.py").is_file()
