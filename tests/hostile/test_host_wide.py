"""Kernel code aiming at what acts on the whole host: kernel settings, the sandbox's own mounts, the
directory the host shares with the kernel.

The kernel runs as the host's uid 0 without capabilities when ipybox runs as root (as here and in
CI), and some kernel interfaces check only the uid. Each case reproduces an attack that once worked
and shows it contained.
"""

# The suite checks the kernel's host-side run directory, which is private.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from ipybox import CodeExecutor, KernelStartError, Limits, SandboxConfig
from ipybox._kernel import SANDBOX_SOCKET_DIR, Kernel, default_python
from ipybox._kernel._process import SIGPENDING

from .conftest import kernel_of, run

pytestmark = pytest.mark.anyio

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


@pytest.fixture(scope="module")
async def executor(module_workspace: Path, tools_dir: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="auto") as ex:
        yield ex


async def still_works(executor: CodeExecutor) -> None:
    result = await run(executor, "print(6 * 7)")
    assert result.text == "42\n"


async def test_the_core_pattern_attack_leaves_the_host_setting_unchanged_and_runs_nothing_on_the_host(
    executor: CodeExecutor,
) -> None:
    # The attack: a pipe core pattern naming a workspace script, then a crash. Had the write gone
    # through, the host's kernel would have run the script as host root, outside every namespace.
    before = CORE_PATTERN.read_text()
    marker = executor.workspace / "ran-on-the-host"
    code = f"""
import os, signal, subprocess, sys
script = os.path.join(os.getcwd(), "pwn.sh")
with open(script, "w") as f:
    f.write("#!/bin/sh\\ntouch {marker}\\n")
os.chmod(script, 0o755)
try:
    with open("/proc/sys/kernel/core_pattern", "w") as f:
        f.write("|" + script)
    print("written")
except OSError as exc:
    print("refused", exc.errno)
child = subprocess.run([sys.executable, "-c", "import os; os.abort()"])
print("child", child.returncode)
"""
    try:
        result = await run(executor, code)
        after = CORE_PATTERN.read_text()
    finally:
        if CORE_PATTERN.read_text() != before:
            # Only reached if the sandbox regressed: put the host back as it was.
            CORE_PATTERN.write_text(before)
    assert "refused 30" in result.text  # EROFS
    assert f"child {-6}" in result.text
    assert after == before
    assert not marker.exists()
    await still_works(executor)


SCAN_PROC = """
import os
writable = []
for root, dirs, files in os.walk("/proc"):
    if root == "/proc":
        # The sandbox's own processes: writing to them changes only the sandbox.
        dirs[:] = [d for d in dirs if not d.isdigit() and d not in ("self", "thread-self")]
    for name in files:
        path = os.path.join(root, name)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            continue
        writable.append(path)
print(writable)
"""


async def test_nothing_in_proc_outside_the_sandboxs_own_processes_opens_for_writing(executor: CodeExecutor) -> None:
    # /proc/sys alone had 763 writable files (every sysctl), /proc/pressure 3.
    result = await run(executor, SCAN_PROC)
    assert result.text == "[]\n"


async def test_sysctls_sysrq_and_pressure_triggers_are_refused_and_the_host_values_stay(executor: CodeExecutor) -> None:
    # What each write would do on the host: drop its caches, make it panic a second after an oops,
    # rename it, change its swapping, drive sysrq (reboot, crash), and set a kernel-side memory pressure trigger.
    attempts = {
        "/proc/sys/vm/drop_caches": "3",
        "/proc/sys/kernel/panic": "1",
        "/proc/sys/kernel/hostname": "pwned",
        "/proc/sys/vm/swappiness": "1",
        "/proc/sysrq-trigger": "h",  # harmless (help to the log) should the sandbox regress
        "/proc/pressure/memory": "some 150000 1000000",
    }
    readable = ["/proc/sys/kernel/panic", "/proc/sys/kernel/hostname", "/proc/sys/vm/swappiness"]
    before = {path: Path(path).read_text() for path in readable}
    code = f"""
for path, value in {attempts!r}.items():
    try:
        with open(path, "w") as f:
            f.write(value)
        print(path, "written")
    except OSError as exc:
        print(path, "refused", exc.errno)
"""
    try:
        result = await run(executor, code)
        after = {path: Path(path).read_text() for path in readable}
    finally:
        for path, value in before.items():
            if Path(path).read_text() != value:
                Path(path).write_text(value)  # only if the sandbox regressed
    assert "written" not in result.text
    assert after == before


MOUNTS = """
import json, os, stat
rw = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    if "rw" not in fields[5].split(","):
        continue
    point = fields[4]
    try:
        device = stat.S_ISCHR(os.stat(point).st_mode)
    except OSError:
        device = False
    if not device:
        rw.append(point)
print(json.dumps(rw))
"""


async def test_the_only_writable_mounts_are_the_workspace_tmp_dev_shm_and_the_covered_proc(
    executor: CodeExecutor,
) -> None:
    # bwrap's root tmpfs and the tmpfs mounts masking /etc entries used to take writes, uncapped.
    result = await run(executor, MOUNTS)
    writable = set(json.loads(result.text))
    assert writable == {str(executor.workspace), "/tmp", "/dev/shm", "/proc", "/dev/pts"}


async def test_writes_to_the_sandbox_root_and_masked_etc_directories_fail(executor: CodeExecutor) -> None:
    targets = ["/new-file", "/etc/ssh/planted", "/usr/planted"]
    if executor.tools_dir is not None:
        targets.append(str(executor.tools_dir / ".ipybox" / "servers.json"))
    code = f"""
for path in {targets!r}:
    try:
        open(path, "w").write("x" * 4096)
        print(path, "written")
    except OSError as exc:
        print(path, "refused")
"""
    result = await run(executor, code)
    assert result.text.count("refused") == len(targets), result.text


async def test_the_kernel_writes_nothing_into_the_host_run_directory(executor: CodeExecutor) -> None:
    # Its sockets are bound in its own size-capped /tmp; the run dir (connection file) is read-only.
    run_dir = kernel_of(executor).run_dir
    before = sorted(os.listdir(run_dir))
    code = f"""
import os
try:
    open({str(run_dir / "big")!r}, "wb").write(b"x" * 2**20)
    print("written")
except OSError as exc:
    print("refused", exc.errno)
print(sorted(os.listdir({SANDBOX_SOCKET_DIR!r})))
"""
    result = await run(executor, code)
    assert result.text.splitlines()[0] == "refused 30"
    assert all(name.startswith("zmq-") for name in json.loads(result.text.splitlines()[1].replace("'", '"')))
    assert sorted(os.listdir(run_dir)) == before
    await still_works(executor)


async def test_a_tools_dir_swapped_for_a_symlink_after_its_check_is_not_mounted(tmp_path: Path) -> None:
    # The executor checks the tools dir before each start; kernel code of another executor on the
    # same workspace could swap a directory on its way for a symlink right after. The sandbox
    # mounts the directory it opened and checked, component by component, not the path again.
    workspace = tmp_path / "workspace"
    tools = workspace / "sub" / "mcptools"
    tools.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere" / "mcptools"
    elsewhere.mkdir(parents=True)
    (elsewhere / "secret.txt").write_text("host secret")
    (workspace / "sub").rename(workspace / "moved")
    (workspace / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "IPYTHONDIR": "/tmp/.ipython", "JPY_PARENT_PID": "1"}
    with pytest.raises(KernelStartError, match="changed since it was checked"):
        async with Kernel.start(
            python=default_python(),
            env=env,
            workspace=workspace,
            sandbox=SandboxConfig(),
            tools_dir=tools,
            hidden=(),
            limits=Limits(),
            start_timeout=30,
        ):
            pass


# -- kernel resources the sandbox would share with the host: sockets, per-user counters -------------

# Kernel code: create a socket of each family and type the sandbox has no use for, AF_VSOCK first,
# and stop at the first that opens (each open one could make the host load a module). Nothing is
# connected: on a VM, vsock's CID 2 is the hypervisor. Then the families the kernel does use.
SOCKET_FAMILIES = """
import errno, socket
AF_VSOCK, AF_NETLINK = 40, 16
unused = [(AF_VSOCK, kind, 0) for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET)]
unused += [(family, kind, 0) for family in range(3, 46) if family not in (10, AF_NETLINK)
           for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW)]
unused += [(AF_NETLINK, socket.SOCK_RAW, protocol) for protocol in range(1, 23)]
# SCTP, DCCP, L2TP, UDP-Lite, MPTCP: inet protocols the host loads as modules.
unused += [(family, kind, protocol) for family in (2, 10) for protocol in (132, 33, 115, 136, 262)
           for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET)]
opened, errors = None, set()
for family, kind, protocol in unused:
    try:
        socket.socket(family, kind, protocol).close()
    except OSError as exc:
        errors.add(errno.errorcode[exc.errno])
    else:
        opened = (family, kind, protocol)
        break
print("opened", opened)
print("errors", sorted(errors))
socket.socket(AF_NETLINK, socket.SOCK_RAW, 0).close()
socket.socketpair()
print("in use", socket.if_nameindex(), socket.getaddrinfo("localhost", 80, flags=socket.AI_ADDRCONFIG)[0][4])
"""


async def test_vsock_and_every_other_socket_family_the_kernel_does_not_need_cannot_be_created(
    executor: CodeExecutor,
) -> None:
    # AF_VSOCK shares the VM's port space past the network namespace and the proxy; other families
    # and inet protocols made the host load their modules.
    result = await run(executor, SOCKET_FAMILIES)
    lines = result.text.splitlines()
    assert lines[0] == "opened None", result.text
    assert lines[1] == "errors ['EAFNOSUPPORT', 'EPROTONOSUPPORT', 'ESOCKTNOSUPPORT']", result.text
    # Route netlink (getifaddrs, if_nameindex, AI_ADDRCONFIG) and unix socket pairs still work.
    assert lines[2] == "in use [(1, 'lo')] ('127.0.0.1', 80)", result.text
    await still_works(executor)


# Kernel code: take as many inotify instances, fanotify groups and POSIX message queues as it can
# (up to past the host's per-user limits) and hold them until the next cell.
TAKE_COUNTERS = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
FAN_CLASS_NOTIF, FAN_REPORT_FID = 0, 0x200
held, report = [], []
for name, make in (
    ("inotify", lambda i: libc.inotify_init1(0)),
    ("fanotify", lambda i: libc.fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_FID, os.O_RDONLY)),
    ("mqueue", lambda i: libc.mq_open(f"/ipybox-{i}".encode(), os.O_CREAT | os.O_RDWR, 0o600, None)),
):
    count, error = 0, None
    for i in range(200):
        fd = make(i)
        if fd < 0:
            error = errno.errorcode[ctypes.get_errno()]
            break
        held.append(fd)
        count += 1
    report.append(f"{name} {count} {error}")
print(*report, sep="\\n")
"""
RELEASE_COUNTERS = "for fd in held:\n    os.close(fd)\nheld.clear()"


def host_creates(what: str) -> bool:
    """Whether this (host) process can create one inotify instance, fanotify group or message queue."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    name = f"/ipybox-host-{os.getpid()}".encode()
    make = {
        "inotify": lambda: libc.inotify_init1(0),
        "fanotify": lambda: libc.fanotify_init(0x200, os.O_RDONLY),
        "mqueue": lambda: libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None),
    }
    fd = make[what]()
    if fd < 0:
        return False
    os.close(fd)
    if what == "mqueue":
        libc.mq_unlink(name)
    return True


async def test_the_host_can_still_create_the_inotify_fanotify_and_mqueue_objects_the_kernel_tries_to_exhaust(
    executor: CodeExecutor,
) -> None:
    # Counted per user in every enclosing user namespace: as host root, a kernel holding 128 inotify
    # instances left every root process on the host without one. The kernel is refused at creation.
    try:
        result = await run(executor, TAKE_COUNTERS)
        host = {what: host_creates(what) for what in ("inotify", "fanotify", "mqueue")}
    finally:
        await run(executor, RELEASE_COUNTERS)
    assert result.text == "inotify 0 EPERM\nfanotify 0 EPERM\nmqueue 0 EPERM\n"
    assert host == {"inotify": True, "fanotify": True, "mqueue": True}
    await still_works(executor)


# A child of the kernel (single-threaded, so the blocked signal stays pending): block a real-time
# signal and queue it to itself until the kernel refuses.
QUEUE_SIGNALS = """
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
queued, error = 0, None
for _ in range(%d):
    if libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0)) != 0:
        error = errno.errorcode[ctypes.get_errno()]
        break
    queued += 1
print(queued, error)
"""


async def test_real_time_signals_the_kernel_queues_stop_at_a_small_share_of_the_hosts_user_limit(
    executor: CodeExecutor,
) -> None:
    # Pending signals count per user in every enclosing user namespace, and root has no exemption
    # for real-time ones: the kernel's queue (and its init's) is bounded far below the host's.
    child = QUEUE_SIGNALS % (4 * SIGPENDING)
    code = (
        "import subprocess, sys\n"
        f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout)"
    )
    result = await run(executor, code)
    queued, error = result.text.split()
    assert int(queued) <= SIGPENDING and error == "EAGAIN", result.text
    kernel = kernel_of(executor)
    assert kernel._sandbox_pid is not None
    init = Path(f"/proc/{kernel._sandbox_pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    limits = Path(f"/proc/{init}/limits").read_text()
    assert f"Max pending signals       {SIGPENDING}" in limits, limits
    await still_works(executor)
