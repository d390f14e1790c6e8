"""What code in the sandboxed kernel can and cannot do (real kernel, real bwrap)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path

import anyio
import pytest

from ipybox import CodeExecutor, Limits, SandboxConfig, UsageError
from ipybox._kernel import bytecode_missing
from ipybox.sandbox._cgroup import pids_cgroups_available

pytestmark = pytest.mark.anyio

# An interpreter's start, a sandboxed kernel's start and one cell, on a loaded machine.
START_TIMEOUT = 60.0


async def run(executor: CodeExecutor, code: str) -> str:
    return (await executor.execute(code)).text


def attempt(action: str) -> str:
    """Kernel code that prints 'ok' if ``action`` succeeded and the exception name if not."""
    return f"try:\n    {action}\n    print('ok')\nexcept BaseException as e:\n    print(type(e).__name__)"


async def test_the_workspace_is_writable(executor: CodeExecutor, module_workspace: Path) -> None:
    assert await run(executor, attempt("open('note.txt', 'w').write('hi')")) == "ok\n"
    assert (module_workspace / "note.txt").read_text() == "hi"


@pytest.mark.parametrize("target", ["/etc/ipybox-probe", "/usr/ipybox-probe", f"{sys.prefix}/ipybox-probe"])
async def test_code_cannot_write_to_the_system_or_the_venv(executor: CodeExecutor, target: str) -> None:
    assert await run(executor, attempt(f"open({target!r}, 'w')")) in ("OSError\n", "PermissionError\n")
    assert not Path(target).exists()


async def test_tmp_in_the_sandbox_is_private(executor: CodeExecutor) -> None:
    name = f"/tmp/ipybox-probe-{id(executor)}"
    assert await run(executor, attempt(f"open({name!r}, 'w').write('x')")) == "ok\n"
    assert not Path(name).exists()


async def test_dev_shm_in_the_sandbox_is_private(executor: CodeExecutor) -> None:
    name = f"/dev/shm/ipybox-probe-{id(executor)}"
    await run(executor, attempt(f"open({name!r}, 'w').write('x')"))
    assert not Path(name).exists()


@pytest.fixture
def home_secret() -> Generator[Path]:
    with tempfile.TemporaryDirectory(dir=Path.home(), prefix=".ipybox-test-") as d:
        secret = Path(d) / "api_key.txt"
        secret.write_text("sk-planted")
        yield secret


async def test_code_cannot_read_a_file_planted_in_the_host_home(executor: CodeExecutor, home_secret: Path) -> None:
    assert await run(executor, attempt(f"open({str(home_secret)!r}).read()")) == "FileNotFoundError\n"
    # Only the path to the interpreter (pyenv lives in root's home here) may show in the home dir.
    listing = await run(
        executor, f"import os\nos.path.exists({str(Path.home())!r}) and os.listdir({str(Path.home())!r})"
    )
    assert home_secret.parent.name not in listing


async def test_etc_shadow_is_masked(executor: CodeExecutor) -> None:
    assert await run(executor, "open('/etc/shadow').read()") == "''\n"


async def test_there_is_no_network_interface_but_loopback(executor: CodeExecutor) -> None:
    assert await run(executor, "import socket\n[name for _, name in socket.if_nameindex()]") == "['lo']\n"


async def test_dns_does_not_resolve(executor: CodeExecutor) -> None:
    assert await run(executor, attempt("__import__('socket').getaddrinfo('pypi.org', 443)")) == "gaierror\n"


async def test_code_cannot_reach_a_tcp_server_on_the_host_loopback(executor: CodeExecutor) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = attempt(f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=5)")
        assert await run(executor, code) == "ConnectionRefusedError\n"
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()


async def test_udp_to_the_host_loopback_never_arrives(executor: CodeExecutor) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as host:
        host.bind(("127.0.0.1", 0))
        port = host.getsockname()[1]
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.sendto(b'from-sandbox', ('127.0.0.1', {port}))"
        )
        await run(executor, code)
        # Loopback delivery is synchronous: had the sandbox's datagram arrived, it would be queued
        # ahead of this marker.
        host.sendto(b"marker", ("127.0.0.1", port))
        host.settimeout(5)
        assert host.recv(64) == b"marker"


async def test_code_cannot_reach_the_internet(executor: CodeExecutor) -> None:
    code = attempt("__import__('socket').create_connection(('1.1.1.1', 443), timeout=5)")
    assert await run(executor, code) == "OSError\n"


@pytest.mark.parametrize(
    "command",
    [
        "mount -t tmpfs none /mnt",
        "mount -o remount,rw /usr",
        f"mount -o remount,bind,rw {sys.prefix}",
        "unshare -U -r true",
        "unshare -m true",
    ],
)
async def test_code_cannot_mount_remount_or_create_namespaces(executor: CodeExecutor, command: str) -> None:
    code = f"import subprocess\nsubprocess.run({command.split()!r}, capture_output=True).returncode != 0"
    assert await run(executor, code) == "True\n"


async def test_the_kernel_has_no_capabilities_and_no_new_privileges(executor: CodeExecutor) -> None:
    code = (
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "status['CapEff'].strip(), status['NoNewPrivs'].strip()"
    )
    assert await run(executor, code) == "('0000000000000000', '1')\n"


async def test_host_processes_are_invisible(executor: CodeExecutor) -> None:
    code = "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:2]"
    pids = eval((await executor.execute(code)).text)
    assert pids[0] <= 3


async def test_extra_read_only_and_read_write_paths_are_mounted(workspace: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    rw = tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "data.txt").write_text("readable")
    config = SandboxConfig(ro_paths=[ro], rw_paths=[rw])
    async with CodeExecutor(workspace=workspace, sandbox=config) as ex:
        assert await run(ex, f"open({str(ro / 'data.txt')!r}).read()") == "'readable'\n"
        assert await run(ex, attempt(f"open({str(ro / 'new.txt')!r}, 'w')")) in ("OSError\n",)
        assert await run(ex, attempt(f"open({str(rw / 'new.txt')!r}, 'w').write('w')")) == "ok\n"
    assert (rw / "new.txt").read_text() == "w"
    assert not (ro / "new.txt").exists()


def test_sandbox_paths_must_be_absolute_and_exist(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="must be absolute"):
        SandboxConfig(ro_paths=["relative/dir"])
    with pytest.raises(UsageError, match="does not exist"):
        SandboxConfig(rw_paths=[tmp_path / "missing"])


async def test_a_bad_sandbox_argument_is_a_usage_error(workspace: Path) -> None:
    with pytest.raises(UsageError, match="sandbox must be"):
        CodeExecutor(workspace=workspace, sandbox="docker")  # type: ignore[arg-type]


async def test_the_private_tmp_and_dev_shm_are_capped_and_dev_is_read_only(workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace, limits=Limits(tmp_bytes=4 * 1024**2)) as ex:
        code = (
            "import os\n"
            "def fill(path):\n"
            "    try:\n"
            "        with open(path, 'wb') as f:\n"
            "            for _ in range(64):\n"
            "                f.write(b'x' * 1024**2)\n"
            "        return 'filled'\n"
            "    except OSError as e:\n"
            "        return type(e).__name__ + ' ' + str(e.errno)\n"
            "print(fill('/tmp/big'), fill('/dev/shm/big'), fill('/dev/big'))\n"
            "print(open('/dev/null', 'w').write('ok'))"
        )
        result = await ex.execute(code)
    assert result.text == "OSError 28 OSError 28 OSError 30\n2\n"


async def test_files_in_etc_that_are_not_world_readable_are_masked_or_unreadable(workspace: Path) -> None:
    planted = Path("/etc") / f"ipybox-test-{id(workspace)}.key"
    planted.write_text("root-only secret")
    code = f"try:\n    print(repr(open({str(planted)!r}).read()))\nexcept OSError as e:\n    print(e.errno)"
    try:
        planted.chmod(0o600)
        async with CodeExecutor(workspace=workspace) as ex:
            result = await ex.execute(code)
    finally:
        planted.unlink()
    # Masked (empty) for a kernel with host root's uid; refused by its mode for one with a uid of its
    # own (tests/hostile/test_kernel_uid.py checks which uid the kernel has).
    assert result.text in ("''\n", f"{errno.EACCES}\n"), result.text


@pytest.mark.skipif(not pids_cgroups_available(), reason="this host offers no writable pids cgroup controller")
async def test_a_fork_bomb_stops_at_the_process_limit_and_the_executor_keeps_working(workspace: Path) -> None:
    code = (
        "import os\n"
        "children = []\n"
        "try:\n"
        "    for _ in range(10_000):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            os.read(os.open('/dev/zero', os.O_RDONLY), 1) and __import__('time').sleep(60)\n"
        "            os._exit(0)\n"
        "        children.append(pid)\n"
        "except OSError as e:\n"
        "    print('stopped:', type(e).__name__)\n"
        "for pid in children:\n"
        "    os.kill(pid, 9)\n"
        "    os.waitpid(pid, 0)\n"
        "print(len(children) < 100)"
    )
    async with CodeExecutor(workspace=workspace, limits=Limits(processes=64)) as ex:
        result = await ex.execute(code)
        assert result.text == "stopped: BlockingIOError\nTrue\n"
        assert (await ex.execute("1 + 1")).text == "2\n"


def test_the_environment_has_compiled_bytecode_for_the_sandboxed_kernel() -> None:
    # The sandbox mounts the environment read-only; without bytecode every kernel start compiles
    # IPython and ipykernel again (scripts/setup.sh installs with --compile-bytecode).
    assert not bytecode_missing()


async def test_a_venv_interpreter_reached_through_a_path_with_dotdot_starts_the_sandboxed_kernel(
    tmp_path: Path,
) -> None:
    # `../venv/bin/python` as a user types it in a sibling directory; the directory before `..`
    # exists on the host only, so a path that still holds it cannot be run inside the sandbox.
    (tmp_path / "project").mkdir()
    (tmp_path / "venv").symlink_to(sys.prefix)
    (tmp_path / "ws").mkdir()
    script = (
        "import anyio, sys\n"
        "from ipybox import CodeExecutor\n"
        "async def main():\n"
        "    async with CodeExecutor(workspace=sys.argv[1], tools_dir=None) as executor:\n"
        "        print((await executor.execute('6 * 7')).text, end='')\n"
        "anyio.run(main)\n"
    )
    with anyio.fail_after(START_TIMEOUT):
        run = await anyio.run_process(
            ["../venv/bin/python", "-c", script, str(tmp_path / "ws")], cwd=tmp_path / "project", check=False
        )
    assert (run.returncode, run.stdout.decode()) == (0, "42\n"), run.stderr.decode()


# A workspace on a filesystem without idmapped mounts (ramfs): ipybox as root cannot give the kernel
# a uid of its own there, runs it as root's and says why.
ON_RAMFS = """
import anyio, logging, sys
from ipybox import CodeExecutor
logging.basicConfig(level=logging.WARNING)
async def main():
    async with CodeExecutor(workspace=sys.argv[1], tools_dir=None) as ex:
        print((await ex.execute("import os\\nprint(os.getuid())")).text, end="")
anyio.run(main)
"""


def test_a_start_that_cannot_give_the_kernel_its_own_uid_says_so_and_runs_it_as_roots(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the kernel gets a uid of its own only when ipybox runs as root")
    workspace = tmp_path / "ramfs"
    workspace.mkdir()
    script = f'mount -t ramfs none {workspace} && chmod 755 {workspace} && exec "$0" -c "$1" "$2"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    done = subprocess.run(
        [*argv, sys.executable, ON_RAMFS, str(workspace)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert done.stdout == "0\n", done.stderr
    assert "the sandboxed kernel runs as host uid 0" in done.stderr
    assert f"an idmapped mount of {workspace}" in done.stderr


# A host without a memory controller: ipybox in a mount namespace where the controller's hierarchy
# is an empty tmpfs. The executor starts, runs code and says what is not limited.
WITHOUT_MEMORY_CGROUP = """
import anyio, logging, sys
from ipybox import CodeExecutor
logging.basicConfig(level=logging.WARNING)
async def main():
    async with CodeExecutor(workspace=sys.argv[1], tools_dir=None) as ex:
        print((await ex.execute("print(6 * 7)")).text, end="")
anyio.run(main)
"""


def test_a_start_without_a_memory_cgroup_says_the_sandbox_memory_is_not_limited(workspace: Path) -> None:
    hide = "mount -t tmpfs none /sys/fs/cgroup/memory 2>/dev/null || mount -t tmpfs none /sys/fs/cgroup"
    script = f'{hide} && exec "$0" -c "$1" "$2"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    done = subprocess.run(
        [*argv, sys.executable, WITHOUT_MEMORY_CGROUP, str(workspace)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    if "unshare failed" in done.stderr or "mount:" in done.stderr:
        pytest.skip(f"cannot hide the cgroup hierarchy here (needs root): {done.stderr.strip()}")
    assert done.stdout == "42\n", done.stderr
    assert "no memory cgroup for the kernel" in done.stderr
    assert "Limits.memory" in done.stderr
