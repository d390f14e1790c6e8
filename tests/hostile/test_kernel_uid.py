"""Under host root, the sandboxed kernel runs as a host uid of its own: what it takes from a per-user
kernel counter is that uid's, the files it can own are its own, and the host's files it writes stay
their owner's on disk.

These run only where ipybox runs as root (as here and in CI): an unprivileged host's kernel has
that user's uid, which is not shared with root.
"""

# The suite checks the kernel's host-side processes and private directory.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from ipybox import CodeExecutor
from ipybox.sandbox import _kerneluid

from .conftest import kernel_of, run

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel gets a uid of its own only when ipybox runs as root"),
]

# F_SETPIPE_SZ, and the size a pipe may grow to without CAP_SYS_RESOURCE (fs.pipe-max-size).
F_SETPIPE_SZ = 1031
BIG_PIPE = 1 << 20


@pytest.fixture(scope="module")
async def executor(module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, approval="auto") as ex:
        yield ex


def host_ids(pid: int) -> tuple[list[int], list[int]]:
    """The real, effective, saved and filesystem uids and gids of a host process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return [int(v) for v in fields["Uid"].split()], [int(v) for v in fields["Gid"].split()]


def kernel_host_uid(executor: CodeExecutor) -> int:
    kernel = kernel_of(executor)
    assert kernel._sandbox_pid is not None
    uids, gids = host_ids(kernel._sandbox_pid)
    assert len(set(uids)) == 1 and len(set(gids)) == 1, (uids, gids)
    return uids[0]


async def test_the_kernel_its_sandboxs_init_and_bwrap_run_under_a_host_uid_of_their_own(
    executor: CodeExecutor, workspace: Path
) -> None:
    kernel = kernel_of(executor)
    uid = kernel_host_uid(executor)
    assert uid != 0
    # bwrap itself, the sandbox's init (the kernel's parent) and every process the kernel starts.
    assert kernel._sandbox_pid is not None
    init = int(Path(f"/proc/{kernel._sandbox_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert host_ids(kernel.pid)[0] == [uid] * 4
    assert host_ids(init)[0] == [uid] * 4
    seconds = f"30.{secrets.randbelow(10**6)}"  # names this test's child among the host's processes
    result = await run(executor, f"import subprocess\nchild = subprocess.Popen(['sleep', {seconds!r}])")
    try:
        children = [
            int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p)) == f"sleep\0{seconds}\0".encode()
        ]
        assert children and all(host_ids(p)[0] == [uid] * 4 for p in children), result.text
    finally:
        await run(executor, "child.kill(); child.wait()")
    # The uid has no account; what asks for the user's name still gets one.
    named = await run(executor, "import getpass\nprint(getpass.getuser())")
    assert named.text == "ipybox\n", named.text
    # No supplementary group (root's groups, or any other) reaches the sandbox.
    status = dict(line.split(":", 1) for line in Path(f"/proc/{kernel._sandbox_pid}/status").read_text().splitlines())
    assert status["Groups"].split() == [], status["Groups"]
    # Each kernel gets its own: a second executor's kernel does not share the first one's counters.
    async with CodeExecutor(workspace=workspace, approval="auto") as other:
        assert kernel_host_uid(other) not in (0, uid)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# Grow pipes to 1 MiB (256 pages charged to the pipe owner's user) until the user's soft limit
# (fs.pipe-user-pages-soft) refuses; keep them open.
TAKE_PIPE_PAGES = f"""
import fcntl, os
held, grown, error = [], 0, None
for _ in range(400):
    r, w = os.pipe()
    held.append((r, w))
    try:
        fcntl.fcntl(w, {F_SETPIPE_SZ}, {BIG_PIPE})
    except OSError as exc:
        error = exc.errno
        break
    grown += 1
print(grown, error)
"""
RELEASE_PIPE_PAGES = "for r, w in held:\n    os.close(r); os.close(w)\ndel held"

# A root process without CAP_SYS_ADMIN and CAP_SYS_RESOURCE (most of a container's or a service's
# root processes): it is held to root's pipe page budget, the one a root-uid kernel would share.
HOST_BIG_PIPE = f"import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(w, {F_SETPIPE_SZ}, {BIG_PIPE})\nprint('grown')"


async def host_root_grows_a_pipe() -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process(
        ["setpriv", "--bounding-set", "-sys_admin,-sys_resource", sys.executable, "-c", HOST_BIG_PIPE], check=False
    )


async def test_pipe_pages_the_kernel_exhausts_are_its_own_uids_and_host_root_can_still_grow_a_pipe(
    executor: CodeExecutor,
) -> None:
    # Pipe buffers count per host uid (user_struct), and root without CAP_SYS_RESOURCE/CAP_SYS_ADMIN
    # has no exemption: a kernel running as host uid 0 that spent the budget left such root
    # processes with pipes that cannot grow (and, past the soft limit, one-page pipes).
    if (await host_root_grows_a_pipe()).returncode != 0:
        pytest.skip("root's pipe page budget is already spent by other processes on this host")
    try:
        result = await run(executor, TAKE_PIPE_PAGES)
        host = await host_root_grows_a_pipe()
    finally:
        await run(executor, RELEASE_PIPE_PAGES)
    grown, error = result.text.split()
    # The kernel did reach its uid's limit (EPERM), within the soft limit's 16,384 pages or so.
    assert error == "1" and 0 < int(grown) <= 64, result.text
    assert host.returncode == 0 and host.stdout == b"grown\n", host.stderr


async def test_the_workspace_is_the_kernels_and_what_it_writes_there_stays_the_workspace_owners_on_disk(
    executor: CodeExecutor,
) -> None:
    workspace = executor.workspace
    mine = workspace / f"host-{secrets.token_hex(4)}.txt"
    mine.write_text("host")
    mine.chmod(0o600)
    code = (
        "import os\n"
        f"print(open({str(mine)!r}).read())\n"
        f"open({str(mine)!r}, 'a').write('+kernel')\n"
        "os.makedirs('made/by', exist_ok=True)\n"
        "open('made/by/kernel.txt', 'w').write('k')\n"
        f"print(os.stat({str(mine)!r}).st_uid == os.getuid())"
    )
    result = await run(executor, code)
    assert result.text == "host\nTrue\n"
    assert mine.read_text() == "host+kernel"
    owner = os.stat(workspace)
    for path in (mine, workspace / "made", workspace / "made" / "by", workspace / "made" / "by" / "kernel.txt"):
        info = os.stat(path)
        assert (info.st_uid, info.st_gid) == (owner.st_uid, owner.st_gid), path


async def test_the_tool_socket_is_given_to_the_kernels_group_only(executor: CodeExecutor) -> None:
    # The host's sockets stay root's; the kernel's gid may connect, nobody else (the private
    # directory is root's 0700 too, so another uid cannot even reach them).
    home = executor._side.home
    assert home is not None
    uid = kernel_host_uid(executor)
    info = os.stat(home / "tools.sock")
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, uid, 0o620)
    assert os.stat(home).st_mode & 0o777 == 0o700
    stranger = uid + 1
    probe = await anyio.run_process(
        [
            "setpriv",
            f"--reuid={stranger}",
            f"--regid={stranger}",
            "--clear-groups",
            sys.executable,
            "-c",
            f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(home / 'tools.sock')!r})",
        ],
        check=False,
    )
    assert b"PermissionError" in probe.stderr, probe.stderr


KERNELSPEC_LAUNCHER = Path(__file__).resolve().parents[2] / "deploy" / "gateway" / "ipybox-sandboxed" / "launch.py"


def kernelspec_launcher() -> Any:
    """The shipped gateway kernelspec's launcher (a stdlib script of its own), loaded from its file."""
    spec = importlib.util.spec_from_file_location("ipybox_sandboxed_launch", KERNELSPEC_LAUNCHER)
    assert spec is not None and spec.loader is not None
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    return launcher


def _kernelspec_pick(candidates: list[int]) -> int:
    """The shipped gateway kernelspec's choice."""
    return kernelspec_launcher().pick_uid(candidates)


@pytest.mark.parametrize("pick", [_kerneluid._pick, _kernelspec_pick], ids=["local", "gateway_kernelspec"])
def test_a_uid_or_gid_a_running_process_holds_is_never_picked_for_a_kernel(pick: Callable[[list[int]], int]) -> None:
    # A process of a uid in the kernels' range that no account has (one left by an earlier kernel,
    # say): a kernel given that uid would share its per-user counters and could signal it.
    busy_uid, busy_gid, free = (secrets.randbelow(0x0FFD0000) + 0x70000000 for _ in range(3))
    holder = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={busy_uid}",
            f"--regid={busy_gid}",
            "--clear-groups",
            "sh",
            "-c",
            "echo up; exec sleep 600",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        # Says so once it runs with those ids (setpriv sets them before it execs the shell).
        assert holder.stdout is not None and holder.stdout.readline() == b"up\n"
        assert host_ids(holder.pid)[0] == [busy_uid] * 4
        assert pick([busy_uid, free]) == free
        assert pick([busy_gid, free]) == free
    finally:
        holder.kill()
        holder.communicate()
    assert pick([busy_uid, free]) == busy_uid
