"""`ipybox.testing.InProcessKernel`: the kernel handle it runs, the executor on it, and where it is refused.

The handle is driven as the executor drives any kernel (`KernelHandle`); the executor tests run its
real tool server and approval gate against the test MCP server, with code that calls tools through
the generated modules.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from approval_support import collect
from deadline_support import patient

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutor,
    ExecutionCancelled,
    KernelPool,
    Network,
    SandboxConfig,
    UsageError,
)
from ipybox._exceptions import KernelDied
from ipybox._kernel import Display, Error, KernelEvent, Mark, Reply, Stream
from ipybox._kernel._inprocess import InProcessShell
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio


@pytest.fixture
async def shell(tmp_path: Path) -> AsyncGenerator[InProcessShell]:
    async with InProcessShell.start(
        tool_socket=tmp_path / "tools.sock", token="t", ipython_dir=tmp_path / "ipython", workspace=tmp_path
    ) as kernel:
        yield kernel


async def run(kernel: InProcessShell, code: str) -> list[KernelEvent]:
    return [event async for event in kernel.execute(code)]


# -- the handle -----------------------------------------------------------------------------------


async def test_a_cell_sends_its_output_results_and_errors_as_a_kernel_does_and_keeps_its_state(
    shell: InProcessShell,
) -> None:
    events = await run(shell, "x = 20\nprint('a', x)\nprint('b')")
    assert "".join(e.text for e in events if isinstance(e, Stream)) == "a 20\nb\n"
    assert events[-1] == Reply("ok", 1)
    events = await run(shell, "from IPython.display import display\ndisplay({'k': 1}, raw=True)\nx + 1")
    assert events == [
        Display("display_data", {"k": 1}, {}),
        Display("execute_result", {"text/plain": "21"}, {}),
        Reply("ok", 2),
    ]
    events = await run(shell, "import sys\nprint('err', file=sys.stderr)\n1 / 0")
    assert events[0] == Stream("stderr", "err\n")
    error, reply = events[1:]
    assert isinstance(error, Error) and (error.ename, error.evalue) == ("ZeroDivisionError", "division by zero")
    assert reply == Reply("error", 3)


async def test_top_level_await_runs_on_the_kernels_own_loop_across_cells(shell: InProcessShell) -> None:
    await run(shell, "async def f():\n    return 7")
    events = await run(shell, "import asyncio\nfirst = asyncio.get_running_loop()\nawait f()")
    assert events == [Display("execute_result", {"text/plain": "7"}, {}), Reply("ok", 2)]
    events = await run(shell, "await asyncio.sleep(0)\nasyncio.get_running_loop() is first")
    assert events[0] == Display("execute_result", {"text/plain": "True"}, {})


async def test_an_interrupt_raises_keyboard_interrupt_in_the_running_cell_which_keeps_the_state(
    shell: InProcessShell,
) -> None:
    await run(shell, "kept = 'yes'")
    events: list[KernelEvent] = []
    with anyio.fail_after(patient(10)):
        async for event in shell.execute("print('spinning', flush=True)\nwhile True:\n    pass"):
            events.append(event)
            if event == Stream("stdout", "spinning\n"):
                shell.interrupt()
    assert [e.ename for e in events if isinstance(e, Error)] == ["KeyboardInterrupt"]
    assert events[-1] == Reply("error", 2)
    assert (await run(shell, "kept"))[0] == Display("execute_result", {"text/plain": "'yes'"}, {})


async def test_cpu_seconds_count_the_cells_thread_and_not_its_waits(shell: InProcessShell) -> None:
    before = shell.cpu_seconds()
    assert before is not None
    await run(shell, "import time\ntime.sleep(0.3)")
    slept = shell.cpu_seconds()
    assert slept is not None and slept - before < 0.2
    await run(shell, "n = 0\nwhile n < 3_000_000:\n    n += 1")
    computed = shell.cpu_seconds()
    assert computed is not None and computed - slept > 0.05


async def test_a_killed_kernel_has_exited_and_refuses_to_run_more(shell: InProcessShell) -> None:
    await shell.kill_and_wait()
    assert shell.exited.is_set()
    with pytest.raises(KernelDied):
        await run(shell, "1")


async def test_output_before_a_mark_comes_before_it_and_no_new_mark_is_made_without_new_output(
    shell: InProcessShell,
) -> None:
    # The mark a tool request would carry, as ipybox_kernel's transport asks for it.
    code = (
        "from ipybox_kernel._transport import IN_PROCESS\nfrom ipybox_kernel._protocol import EXECUTION_ENV\n"
        "settings = IN_PROCESS.get()\n"
        "cell = settings.env[EXECUTION_ENV]\n"
        "print('before', end='')\n"
        "first = settings.output_mark(cell)\n"
        "again = settings.output_mark(cell)\n"
        "other = settings.output_mark('another cell')\n"
        "print(first, again, other)"
    )
    events = await run(shell, code)
    assert events[:2] == [Stream("stdout", "before"), Mark(1)]
    assert events[2] == Stream("stdout", "1 1 None\n")


# -- the executor on it ---------------------------------------------------------------------------


@pytest.fixture
async def executor(tools_dir: Path, workspace: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None) as ex:
        yield ex


async def test_generated_modules_call_the_real_tool_server_and_each_call_is_asked_after_its_output(
    executor: CodeExecutor,
) -> None:
    code = (
        "from mcptools.test import greet\n"
        "for name in ('a', 'b'):\n"
        "    print('asking', name)\n"
        "    print(greet.run({'name': name}))"
    )
    seen: list[str] = []
    async for event in executor.execute(code):
        if isinstance(event, ApprovalRequest):
            seen.append(f"request {event.tool_args['name']}")
            await event.accept()
        elif isinstance(event, CodeExecutionChunk):
            seen.extend(line for line in event.text.splitlines() if line.startswith("asking"))
    assert seen == ["asking a", "request a", "asking b", "request b"]


async def test_calls_nobody_is_shown_are_told_to_skip_marks_and_their_output_still_arrives(
    executor: CodeExecutor,
) -> None:
    # Under "auto" the host says so in the first reply, and the kernel stops flushing and marking
    # its output before that execution's calls; under "ask" every call keeps its mark.
    code = (
        "from mcptools.test import greet\n"
        "from ipybox_kernel import _client, _transport\n"
        "for name in ('a', 'b', 'c'):\n"
        "    print('asking', name)\n"
        "    greet.run({'name': name})\n"
        "print('unmarked', _transport._unmarked == _client._calling_execution('test', 'greet'))"
    )
    auto = await executor.execute(code, approval="auto")
    assert auto.text == "asking a\nasking b\nasking c\nunmarked True\n"
    seen: list[str] = []
    async for event in executor.execute(code, approval="ask"):
        if isinstance(event, ApprovalRequest):
            seen.append(f"request {event.tool_args['name']}")
            await event.accept()
        elif isinstance(event, CodeExecutionChunk):
            seen.extend(line for line in event.text.splitlines() if line.startswith(("asking", "unmarked")))
    assert seen == ["asking a", "request a", "asking b", "request b", "asking c", "request c", "unmarked False"]


async def test_the_cells_working_directory_is_the_workspace(executor: CodeExecutor) -> None:
    await executor.execute("with open('here.txt', 'w') as f:\n    f.write('x')")
    assert (executor.workspace / "here.txt").read_text() == "x"


async def test_cancelling_an_execution_blocked_on_an_approval_interrupts_it_and_keeps_the_kernel(
    executor: CodeExecutor,
) -> None:
    await executor.execute("kept = 1")
    execution = executor.execute("from mcptools.test import greet\ngreet.run({'name': 'never'})")
    with anyio.fail_after(patient(10)), pytest.raises(ExecutionCancelled):
        async for event in execution.events():
            if isinstance(event, ApprovalRequest):
                execution.cancel()
    # The tool call was aborted, so KeyboardInterrupt reached the cell at once: no restart.
    assert (await executor.execute("kept")).text == "1\n"


async def test_interrupting_a_cell_blocked_on_a_tool_call_does_not_stall_a_traced_host(
    executor: CodeExecutor,
) -> None:
    # Under a trace function (coverage, a debugger) Python 3.11 makes every other thread that enters
    # a function wait in a busy loop while an interrupt is pending for a thread blocked on a reply:
    # the host's event loop stalled until that reply came, here never. Coverage traces already.
    def trace(frame: object, event: str, arg: object) -> None:
        return None

    traced = sys.gettrace() is None
    if traced:
        sys.settrace(trace)
    try:
        execution = executor.execute("from mcptools.test import greet\ngreet.run({'name': 'never'})")
        with anyio.fail_after(patient(10)), pytest.raises(ExecutionCancelled):
            async for event in execution.events():
                if isinstance(event, ApprovalRequest):
                    execution.cancel()
    finally:
        if traced:
            sys.settrace(None)
    assert (await executor.execute("print('after')")).text == "after\n"


async def test_a_thread_without_the_cells_context_cannot_call_tools(executor: CodeExecutor) -> None:
    code = textwrap.dedent(
        """
        import threading
        from ipybox_kernel import ToolServerUnavailable, call_tool
        failed = []
        def call():
            try:
                call_tool('test', 'greet', {'name': 't'})
            except ToolServerUnavailable as exc:
                failed.append(type(exc).__name__)
        t = threading.Thread(target=call)
        t.start(); t.join()
        print(failed)
        """
    )
    assert (await executor.execute(code, approval="auto")).text == "['ToolServerUnavailable']\n"


async def test_two_in_process_executors_each_reach_their_own_tool_server(tools_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        CodeExecutor(workspace=tmp_path / "a", tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None) as a,
        CodeExecutor(workspace=tmp_path / "b", tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None) as b,
    ):
        code = "from mcptools.test import greet\nprint(greet.run({'name': 'x'}))"
        requests, _ = await collect(a, code)
        assert len(requests) == 1
        # b's policy rejects; were its calls sent to a's server (a pooled connection), a would ask.
        with pytest.raises(CodeExecutionError, match="ToolCallRejected"):
            await b.execute(code, approval=lambda request: False)
        requests, _ = await collect(a, code)
        assert len(requests) == 1


# -- where it is refused --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({}, "pass sandbox=None"),
        ({"sandbox": SandboxConfig()}, "pass sandbox=None"),
        ({"sandbox": None, "network": Network(allow=["example.com"])}, "host's own network"),
    ],
)
def test_it_needs_sandbox_none_and_no_network_policy(
    workspace: Path, settings: dict[str, object], complaint: str
) -> None:
    with pytest.raises(UsageError, match=complaint):
        CodeExecutor(workspace=workspace, kernel=InProcessKernel(), **settings)  # pyright: ignore[reportArgumentType]


async def test_it_is_refused_with_a_kernel_pool(workspace: Path) -> None:
    pool = KernelPool(1, workspace=workspace)
    with pytest.raises(UsageError, match="one source"):
        CodeExecutor(workspace=workspace, kernel=InProcessKernel(), sandbox=None, pool=pool)


def test_a_process_serving_the_mcp_server_refuses_in_process_kernels(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from ipybox import CodeExecutor, KernelSettings, UsageError
        from ipybox.mcp_server import ServerConfig, build_server
        from ipybox.testing import InProcessKernel

        from pathlib import Path
        build_server(ServerConfig(kernel=KernelSettings(workspace=Path(".").resolve(), sandbox=None)))
        try:
            CodeExecutor(kernel=InProcessKernel(), sandbox=None)
        except UsageError as exc:
            print("refused:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: InProcessKernel runs code unsandboxed in this process and is refused here")
    assert "MCP server" in done.stdout
