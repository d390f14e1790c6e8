"""Code actions that abuse resources: processes, memory, disk, CPU, output, the stack, the process itself.

Each must end in a clear error or a bounded result, leave the host alone, and leave the executor usable.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncGenerator, Generator
from pathlib import Path

import pytest

from ipybox import CodeExecutor, ExecutionTimeout, KernelDied, Limits, Timeouts
from ipybox.sandbox._cgroup import cgroup_available, pids_cgroups_available

from .conftest import descendants, kernel_of, run, wait_until_gone

pytestmark = pytest.mark.anyio

# How many processes the bounded fork bomb tries to hold at once; well above any sane limit for a
# kernel, well below what hurts this host (pid_max is 32768 here).
FORK_BOMB_CEILING = 300
# A sandbox that bounded processes would stop a fork bomb below this many.
REASONABLE_PROCESS_LIMIT = 256
# Limits.memory for the memory tests: the least a kernel starts with (its address space needs it).
SANDBOX_MEMORY = 1024**3
MiB = 1024**2


async def still_works(executor: CodeExecutor) -> None:
    result = await run(executor, "print(6 * 7)")
    assert result.text == "42\n"


@pytest.fixture(scope="module")
async def executor(module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, tools_dir=None, limits=Limits(output_chars=10_000)) as ex:
        yield ex


def fork_bomb(ceiling: int) -> str:
    """Kernel code: a fork bomb from a small interpreter that stops at ``ceiling`` live processes.

    A small interpreter forks far faster than the kernel itself; its children wait for a signal
    (the sandbox's end kills them).
    """
    bomb = (
        "import os, signal\n"
        "children, error = 0, None\n"
        f"while children < {ceiling}:\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        error = e.strerror; break\n"
        "    if pid == 0:\n        os.closerange(0, 64); signal.pause(); os._exit(0)\n"
        "    children += 1\n"
        "print(children, error)\n"
    )
    return (
        "import subprocess, sys\n"
        f"out = subprocess.run([sys.executable, '-I', '-S', '-c', {bomb!r}], capture_output=True, text=True)\n"
        "print(out.stdout.strip() or out.stderr.strip())\n"
    )


async def test_a_fork_bomb_dies_with_the_kernel_and_leaves_no_process_behind(workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=None, timeouts=Timeouts(execution=60)) as ex:
        sandbox = kernel_of(ex).pid
        result = await run(ex, fork_bomb(FORK_BOMB_CEILING))
        forked = int(result.text.split()[0])
        assert forked > 0
        assert len(descendants(sandbox)) > forked
        await ex.reset()
        assert descendants(sandbox) == set()
        await still_works(ex)


@pytest.mark.skipif(
    not pids_cgroups_available(),
    reason="this host offers no writable pids cgroup; RLIMIT_NPROC does not bind root, so nothing bounds processes",
)
async def test_the_sandbox_bounds_the_number_of_processes_a_kernel_can_create(workspace: Path) -> None:
    limits = Limits(processes=REASONABLE_PROCESS_LIMIT // 2)
    async with CodeExecutor(workspace=workspace, tools_dir=None, timeouts=Timeouts(execution=60), limits=limits) as ex:
        result = await run(ex, fork_bomb(FORK_BOMB_CEILING))
        await ex.reset()
        assert int(result.text.split()[0]) < REASONABLE_PROCESS_LIMIT, result.text


async def test_a_memory_bomb_in_a_child_process_is_bounded_too(executor: CodeExecutor) -> None:
    code = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n        b = bytearray(8 * 1024**3); os._exit(0)\n"
        "    except MemoryError:\n        os._exit(7)\n"
        "print(os.waitpid(pid, 0)[1] >> 8)\n"
    )
    result = await run(executor, code)
    assert result.text == "7\n"
    await still_works(executor)


# Kernel code: put 300 MiB in /tmp, fork four children that each fill 300 MiB and say so (or die
# trying), then add up what is held at once: the children still alive, the kernel, /tmp.
CHILDREN_AND_TMPFS = """
import os, signal
with open('/tmp/fill', 'wb') as f:
    for _ in range(300):
        f.write(b'x' * 2**20)
children = []
for _ in range(4):
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        block = bytearray(300 * 2**20)
        os.write(tell, b'1')
        signal.pause()
    os.close(tell)
    os.read(ready, 1)  # a byte once the child holds its memory, end-of-file if it was killed first
    children.append(pid)
def resident(pid):
    try:
        return int(open(f'/proc/{pid}/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, IndexError):
        return 0
held = sum(resident(pid) for pid in children) + resident(os.getpid()) + os.stat('/tmp/fill').st_blocks * 512
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
os.remove('/tmp/fill')
print(held // 2**20)
"""


@pytest.mark.skipif(not cgroup_available("memory"), reason="this host offers no writable memory cgroup controller")
async def test_the_sandbox_as_a_whole_stays_under_the_memory_limit_with_several_children_and_tmpfs(
    workspace: Path,
) -> None:
    # Limits.memory used to bound each process's address space only: four children and /tmp held
    # 1.5 GiB under a 1 GiB limit.
    limits = Limits(memory=SANDBOX_MEMORY)
    async with CodeExecutor(workspace=workspace, tools_dir=None, limits=limits) as ex:
        result = await run(ex, CHILDREN_AND_TMPFS)
        assert int(result.text) * MiB <= SANDBOX_MEMORY, result.text
        await still_works(ex)


@pytest.mark.skipif(not cgroup_available("memory"), reason="this host offers no writable memory cgroup controller")
async def test_a_kernel_killed_at_the_sandboxs_memory_limit_raises_kernel_died_naming_the_limit(
    workspace: Path,
) -> None:
    # /dev/shm's pages count towards the limit; then the kernel grows past what is left.
    code = (
        "with open('/dev/shm/fill', 'wb') as f:\n"
        "    for _ in range(800):\n        f.write(b'x' * 2**20)\n"
        "blocks = [bytearray(10 * 2**20) for _ in range(40)]\n"
    )
    async with CodeExecutor(workspace=workspace, tools_dir=None, limits=Limits(memory=SANDBOX_MEMORY)) as ex:
        with pytest.raises(KernelDied) as died:
            await run(ex, code)
        assert died.value.reason is not None
        assert "Limits.memory (1024 MiB" in died.value.reason
        assert "out-of-memory killer" in died.value.reason
        # A fresh kernel, in a fresh sandbox: /dev/shm is empty again.
        assert (await run(ex, "import os; print(os.listdir('/dev/shm'))")).text == "[]\n"


@pytest.fixture
def small_workspace(tmp_path: Path) -> Generator[Path]:
    """A workspace on its own 16 MB tmpfs, so filling it is quick and harmless."""
    path = tmp_path / "small"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


async def test_filling_the_workspace_raises_a_clear_no_space_error_and_the_kernel_keeps_going(
    small_workspace: Path,
) -> None:
    async with CodeExecutor(workspace=small_workspace, tools_dir=None) as ex:
        code = (
            "import errno\n"
            "try:\n"
            "    with open('fill', 'wb') as f:\n"
            "        while True:\n            f.write(b'x' * 1024 * 1024)\n"
            "except OSError as e:\n    print(errno.errorcode[e.errno])\n"
        )
        assert (await run(ex, code)).text == "ENOSPC\n"
        # The host still reads and writes the workspace, and after cleanup so does the kernel.
        assert (small_workspace / "fill").stat().st_size > 0
        assert (await run(ex, "import os\nos.remove('fill')\nopen('ok', 'w').write('ok')\nprint('ok')")).text == "ok\n"
        await still_works(ex)


async def test_the_sandbox_tmp_cannot_hold_more_than_its_size_limit(workspace: Path) -> None:
    limit = 256 * 1024**2
    async with CodeExecutor(workspace=workspace, tools_dir=None, limits=Limits(tmp_bytes=limit)) as ex:
        code = (
            "import os\n"
            "fd = os.open('/tmp/fill', os.O_CREAT | os.O_WRONLY)\n"
            f"try:\n    os.posix_fallocate(fd, 0, {2 * limit}); print('held', os.fstat(fd).st_blocks * 512)\n"
            "except OSError as e:\n    print('refused', e.strerror)\n"
            "finally:\n    os.close(fd); os.remove('/tmp/fill')\n"
        )
        result = await run(ex, code)
        assert result.text.startswith("refused"), result.text


async def test_cpu_spinning_children_die_when_a_timeout_restarts_the_kernel(workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=None) as ex:
        run_dir = kernel_of(ex).run_dir
        code = (
            "import os, signal\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "for _ in range(2):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"  # a daemon: its own session, out of the kernel's process group
            "        while True:\n            pass\n"
            "while True:\n    try:\n        pass\n    except KeyboardInterrupt:\n        pass\n"
        )
        with pytest.raises(ExecutionTimeout) as caught:
            await ex.execute(code, timeout=1)
        assert caught.value.restarted
        await wait_until_gone(str(run_dir))
        await still_works(ex)


async def test_a_flood_from_a_subprocess_writing_to_fd_1_is_capped(executor: CodeExecutor) -> None:
    code = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import os\\nfor _ in range(50): os.write(1, b\"y\" * 1_000_000)'])\n"
        "print('done')\n"
    )
    result = await run(executor, code, timeout=60)
    assert len(result.text) < 20_000
    assert result.truncated_chars > 0 or "done" in result.text
    await still_works(executor)


async def test_a_million_tiny_outputs_of_every_kind_are_capped(executor: CodeExecutor) -> None:
    code = (
        "import sys\n"
        "from IPython.display import display\n"
        "out, err = sys.stdout.write, sys.stderr.write\n"
        "for i in range(1_000_000):\n"
        "    out('x\\n')\n"
        "    if i % 100 == 0:\n        err('e')\n"
        "    if i % 10_000 == 0:\n        display(i)\n"
    )
    result = await run(executor, code, timeout=110)
    assert result.truncated_chars > 1_900_000
    assert len(result.text) < 11_000
    await still_works(executor)


async def test_unbounded_recursion_is_a_recursion_error_and_a_blown_c_stack_kills_only_the_kernel(
    executor: CodeExecutor,
) -> None:
    code = "def f(n):\n    return f(n + 1)\ntry:\n    f(0)\nexcept RecursionError:\n    print('RecursionError')\n"
    assert (await run(executor, code)).text == "RecursionError\n"
    # Python-to-Python calls do not use the C stack in 3.11; repr of a deep nest does.
    code = "import sys\nsys.setrecursionlimit(10**8)\nx = []\nfor _ in range(10**6):\n    x = [x]\nrepr(x)\n"
    with pytest.raises(KernelDied):
        await executor.execute(code)
    await still_works(executor)


async def test_sigkill_to_itself_and_abort_end_in_kernel_died(executor: CodeExecutor) -> None:
    for code in ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "import os\nos.abort()"):
        with pytest.raises(KernelDied):
            await executor.execute(code)
        await still_works(executor)
    assert os.getpid() > 0
