"""Fault injection: misbehaving MCP servers, a kernel killed from outside, a deleted run directory,
shutdown and cancellation at the worst moment.

Each case must end in a clear error, leave no process and no run directory behind, and the next
execution must work.
"""

# The checks look at the executor's run directories and kernel, which are private.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutor,
    ExecutionCancelled,
    KernelDied,
    KernelStartError,
    StdioServer,
    Timeouts,
)

from .conftest import FAULTY_SERVER, descendants, kernel_of, run, run_dirs, wait_until_gone

pytestmark = pytest.mark.anyio

# A hung tool is given this long before the call times out; long enough for a healthy call.
HUNG_TOOL_TIMEOUT = 3.0
# A huge tool result: well above the output cap, well below the channel's line limit.
HUGE_RESULT = 8 * 1024 * 1024


def faulty(pid_file: Path) -> StdioServer:
    return StdioServer(command=sys.executable, args=(str(FAULTY_SERVER), "--pid-file", str(pid_file)))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def assert_nothing_left(dirs: list[Path], pids: Sequence[int] = ()) -> None:
    for path in dirs:
        assert not path.exists(), f"run directory {path} was left behind"
        await wait_until_gone(str(path))
    for pid in pids:
        assert not alive(pid), f"process {pid} outlived the executor"


CALL = "from ipybox_kernel import call_tool\nout = call_tool('faulty', {tool!r}, {args!r})\nprint(out.text[:40])\n"
CATCH = (
    "from ipybox_kernel import call_tool, ToolCallError\n"
    "try:\n    call_tool('faulty', {tool!r}, {args!r}); print('returned')\n"
    "except ToolCallError as e:\n    print(type(e).__name__, '|', e)\n"
)


async def test_an_mcp_server_that_writes_garbage_and_dies_mid_call_is_a_crash_and_is_restarted(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("faulty", faulty(pid_file))
        dirs = run_dirs(ex)
        result = await run(ex, CATCH.format(tool="garbage_then_exit", args={}))
        assert result.text.startswith("MCPServerCrashed | "), result.text
        assert "faulty" in result.text
        first = int(pid_file.read_text())
        assert (await run(ex, CALL.format(tool="echo", args={"text": "back"}))).text == "back\n"
        second = int(pid_file.read_text())
        assert second != first
    await assert_nothing_left(dirs, [first, second])


async def test_a_non_json_line_from_the_server_does_not_break_the_call_or_the_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("faulty", faulty(pid_file))
        dirs = run_dirs(ex)
        result = await run(ex, CATCH.format(tool="garbage_then_answer", args={"text": "fine"}))
        # Either the answer gets through or the call fails with a named error; never a hang.
        assert result.text == "returned\n" or " | " in result.text, result.text
        assert (await run(ex, CALL.format(tool="echo", args={"text": "back"}))).text == "back\n"
        pid = int(pid_file.read_text())
    await assert_nothing_left(dirs, [pid])


async def test_a_hung_mcp_server_times_out_and_the_next_call_gets_a_working_server(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with CodeExecutor(
        workspace=tmp_path, tools_dir=None, approval="auto", timeouts=Timeouts(tool=HUNG_TOOL_TIMEOUT)
    ) as ex:
        ex.register_mcp_server("faulty", faulty(pid_file))
        dirs = run_dirs(ex)
        with anyio.fail_after(60):
            result = await run(ex, CATCH.format(tool="hang", args={}))
        assert result.text.startswith("ToolCallTimeout | "), result.text
        hung = int(pid_file.read_text())
        with anyio.fail_after(60):
            result = await run(ex, CATCH.format(tool="echo", args={"text": "back"}))
        assert result.text == "returned\n", result.text
        pids = [hung, int(pid_file.read_text())]
    await assert_nothing_left(dirs, pids)


async def test_a_huge_tool_result_arrives_whole_in_the_kernel_and_the_output_stays_capped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("faulty", faulty(pid_file))
        dirs = run_dirs(ex)
        code = (
            "from ipybox_kernel import call_tool\n"
            f"out = call_tool('faulty', 'huge', {{'size': {HUGE_RESULT}}})\n"
            "print(len(out.text))\n"
            "out\n"
        )
        result = await run(ex, code, timeout=60)
        assert result.text.startswith(f"{HUGE_RESULT}\n")
        assert len(result.text) <= ex.limits.output_chars + 200
        assert (await run(ex, "print('after')")).text == "after\n"
        pid = int(pid_file.read_text())
    await assert_nothing_left(dirs, [pid])


async def test_a_kernel_killed_from_outside_mid_execution_is_kernel_died_and_a_new_one_takes_over(
    tmp_path: Path,
) -> None:
    async with CodeExecutor(workspace=tmp_path, tools_dir=None) as ex:
        dirs = run_dirs(ex)
        old = kernel_of(ex)
        execution = ex.execute("import threading\nprint('running', flush=True)\nthreading.Event().wait()\n")
        with anyio.fail_after(30), pytest.raises(KernelDied):
            async for event in execution:
                if isinstance(event, CodeExecutionChunk):
                    os.kill(old.pid, signal.SIGKILL)
        assert (await run(ex, "print('fresh')")).text == "fresh\n"
        assert kernel_of(ex) is not old
        assert not old.run_dir.exists()
        await wait_until_gone(str(old.run_dir))
        dirs.append(kernel_of(ex).run_dir)
    await assert_nothing_left(dirs)


def sandbox_init_and_kernel(sandbox: int) -> tuple[int, int]:
    """Host pids of bwrap's init in the sandbox's PID namespace and of the kernel process below it."""
    python = os.path.realpath(sys.executable)
    kernel = next(pid for pid in descendants(sandbox) if os.readlink(f"/proc/{pid}/exe") == python)
    init = int(Path(f"/proc/{kernel}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return init, kernel


async def test_a_kernel_that_dies_while_its_sandbox_init_is_stopped_is_still_kernel_died(tmp_path: Path) -> None:
    """A stopped init never reaps the kernel, so bwrap does not exit; the host watches the kernel itself."""
    async with CodeExecutor(workspace=tmp_path, tools_dir=None) as ex:
        dirs = run_dirs(ex)
        old = kernel_of(ex)
        init, kernel = sandbox_init_and_kernel(old.pid)
        os.kill(init, signal.SIGSTOP)
        execution = ex.execute("import threading\nprint('running', flush=True)\nthreading.Event().wait()\n")
        with anyio.fail_after(30), pytest.raises(KernelDied):
            async for event in execution:
                if isinstance(event, CodeExecutionChunk):
                    os.kill(kernel, signal.SIGKILL)
        # The stopped init went down with the sandbox.
        await wait_until_gone(str(old.run_dir))
        assert (await run(ex, "print('fresh')")).text == "fresh\n"
        dirs.append(kernel_of(ex).run_dir)
    await assert_nothing_left(dirs, [init, kernel])


async def test_deleting_the_kernels_run_directory_under_it_does_not_strand_anything(tmp_path: Path) -> None:
    async with CodeExecutor(workspace=tmp_path, tools_dir=None) as ex:
        dirs = run_dirs(ex)
        await run(ex, "x = 41")
        shutil.rmtree(kernel_of(ex).run_dir)
        # The kernel's connections were made already; the deleted files are not needed any more.
        assert (await run(ex, "print(x + 1)")).text == "42\n"
        await ex.reset()
        assert (await run(ex, "print('after reset')")).text == "after reset\n"
        dirs.append(kernel_of(ex).run_dir)
    await assert_nothing_left(dirs)


ECHO = CATCH.format(tool="echo", args={"text": "x"})


async def test_deleting_the_executors_private_directory_while_idle_keeps_tools_working_and_is_repaired(
    tmp_path: Path,
) -> None:
    """A /tmp cleaner removes ipybox-*/ (tool socket, packages) while the kernel idles."""
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("faulty", faulty(tmp_path / "pid"))
        dirs = run_dirs(ex)
        home = dirs[0]
        shutil.rmtree(home)
        # The sandbox's bind mount still holds the socket's inode: the running kernel keeps its tools.
        assert (await run(ex, ECHO)).text == "returned\n"
        with pytest.raises(KernelDied):
            await ex.execute("import os\nos._exit(3)")
        # The replacement kernel gets the directory and a freshly bound socket back.
        with anyio.fail_after(60):
            assert (await run(ex, ECHO)).text == "returned\n"
        assert (home / "tools.sock").is_socket()
        assert (home / "packages").is_dir()
        assert home.stat().st_mode & 0o777 == 0o700
        dirs.append(kernel_of(ex).run_dir)
    await assert_nothing_left(dirs)


async def test_deleting_the_executors_private_directory_then_reset_recovers(tmp_path: Path) -> None:
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("faulty", faulty(tmp_path / "pid"))
        dirs = run_dirs(ex)
        await run(ex, "x = 1")
        shutil.rmtree(dirs[0])
        with anyio.fail_after(60):
            await ex.reset()
            assert (await run(ex, "print('x' in globals())")).text == "False\n"
            assert (await run(ex, ECHO)).text == "returned\n"
        dirs.append(kernel_of(ex).run_dir)
    await assert_nothing_left(dirs)


async def test_a_private_directory_that_cannot_be_restored_is_a_kernel_start_error_and_the_next_attempt_works(
    tmp_path: Path,
) -> None:
    """After the deletion someone else creates a directory of the same name: ipybox must not use it."""
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("faulty", faulty(tmp_path / "pid"))
        dirs = run_dirs(ex)
        home = dirs[0]
        shutil.rmtree(home)
        home.mkdir()
        home.chmod(0o777)
        with anyio.fail_after(60):
            with pytest.raises(KernelStartError, match=str(home)) as info:
                await ex.reset()
            assert "does not own exclusively" in str(info.value)
            assert not (home / "tools.sock").exists()
            # The cause goes away; the next execution gets a fresh attempt, not the old error.
            home.rmdir()
            assert (await run(ex, ECHO)).text == "returned\n"
        dirs.append(kernel_of(ex).run_dir)
    await assert_nothing_left(dirs)


async def test_stopping_the_executor_while_a_call_waits_for_approval_runs_nothing_and_cleans_up(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "pid"
    marker = tmp_path / "ran"
    code = (
        "from ipybox_kernel import call_tool\n"
        "call_tool('faulty', 'echo', {'text': 'x'})\n"
        f"open({str(marker)!r}, 'w').write('ran')\n"
    )
    async with CodeExecutor(workspace=tmp_path, tools_dir=None, approval="ask") as ex:
        ex.register_mcp_server("faulty", faulty(pid_file))
        dirs = run_dirs(ex)
        execution = ex.execute(code)
        with anyio.fail_after(30):
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    break
    with pytest.raises(ExecutionCancelled):
        await execution
    assert not marker.exists()
    # A server is started only for an approved call: this one never was.
    assert not pid_file.exists()
    await assert_nothing_left(dirs)
    # A new executor on the same workspace works.
    async with CodeExecutor(workspace=tmp_path, tools_dir=None) as ex:
        assert (await run(ex, "print('next')")).text == "next\n"


async def test_cancelling_the_host_task_detaches_a_keyed_execution_and_cancel_stops_the_code_keeping_the_kernel(
    tmp_path: Path,
) -> None:
    """Cancelling the task that iterates an execution started with a key does not stop the code (it
    can be re-attached by key); ``Execution.cancel()`` does, and the kernel keeps its state."""
    async with CodeExecutor(workspace=tmp_path, tools_dir=None) as ex:
        dirs = run_dirs(ex)
        await run(ex, "state = 'kept'")
        code = "import threading\nprint('spinning', flush=True)\nthreading.Event().wait()\n"
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def consume() -> None:
                    async for event in ex.execute(code, key="spin"):
                        if isinstance(event, CodeExecutionChunk):
                            tg.cancel_scope.cancel()

                tg.start_soon(consume)
        execution = ex.attach("spin")
        assert not execution.done
        execution.cancel()
        with anyio.fail_after(30), pytest.raises(ExecutionCancelled):
            await execution
        assert (await run(ex, "print(state)")).text == "kept\n"
    await assert_nothing_left(dirs)


async def test_cancelling_the_last_task_awaiting_an_execution_without_a_key_stops_the_code(tmp_path: Path) -> None:
    """Without a key nobody can come back to the execution: when the last task awaiting it is
    cancelled (a timeout around ``await``), the code is interrupted; while another task still
    awaits it, it runs on."""
    marker = tmp_path / "finished"
    code = (
        "import threading\nprint('sleeping', flush=True)\nthreading.Event().wait()\n"
        f"open({str(marker)!r}, 'w').write('x')\n"
    )
    async with CodeExecutor(workspace=tmp_path, tools_dir=None) as ex:
        dirs = run_dirs(ex)
        await run(ex, "state = 'kept'")
        execution = ex.execute(code)

        async def wait_for_it() -> None:
            await execution

        with anyio.fail_after(30):
            async with anyio.create_task_group() as outer:
                outer.start_soon(wait_for_it)
                async with anyio.create_task_group() as inner:
                    inner.start_soon(wait_for_it)
                    async with contextlib.aclosing(execution.events()) as events:
                        async for event in events:
                            if isinstance(event, CodeExecutionChunk):
                                break
                    inner.cancel_scope.cancel()
                # One waiter is left: the code runs on.
                assert not execution.cancel_requested
                outer.cancel_scope.cancel()
            assert execution.cancel_requested
            with pytest.raises(ExecutionCancelled):
                await execution
        assert not marker.exists()
        assert (await run(ex, "print(state)")).text == "kept\n"
    await assert_nothing_left(dirs)


async def test_a_kernel_that_cannot_start_raises_kernel_start_error_from_async_with(tmp_path: Path) -> None:
    with pytest.raises(KernelStartError, match="exited during start-up"):
        async with CodeExecutor(workspace=tmp_path, tools_dir=None, env={"PYTHONHOME": str(tmp_path / "gone")}):
            pass
    assert list(tmp_path.iterdir()) == []
