"""MCP tool calls from the sandboxed kernel through CodeExecutor: approval, policies, results.

Real kernel in the real sandbox, generated modules, the project's test MCP server.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
from collections.abc import AsyncGenerator, Generator
from pathlib import Path

import anyio
import pytest
from approval_support import CATCH_REJECTED, collect
from servers.fixtures import stdio_server

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalRules,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    ExecutionCancelled,
    ExecutionLost,
    HttpServer,
    StdioServer,
    Timeouts,
    UsageError,
    generate_mcp_sources,
)
from ipybox._approval._policies import Approval
from ipybox._engine import _execution
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
async def asking(tools_dir: Path, module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir) as ex:
        yield ex


async def test_an_accepted_call_runs_and_the_request_shows_what_the_host_will_run(asking: CodeExecutor) -> None:
    code = "from mcptools.test import greet\nprint(greet.run(greet.Params(name='sandbox')))"
    requests, result = await collect(asking, code)
    assert result.text == "Hello, sandbox!\n"
    [request] = requests
    assert (request.server_name, request.tool_name, dict(request.tool_args)) == ("test", "greet", {"name": "sandbox"})
    assert "test_server.py" in request.server and "--transport stdio" in request.server
    assert request.id.endswith(":1") and request.decision == ApprovalDecision(approved=True)


async def test_a_rejected_call_raises_tool_call_rejected_that_code_can_catch(asking: CodeExecutor) -> None:
    _, result = await collect(asking, CATCH_REJECTED, {"delete_item": False}, reason="not today")
    assert result.text == "caught: not today\n"


async def test_an_uncaught_rejection_fails_the_execution_with_the_reason(asking: CodeExecutor) -> None:
    with pytest.raises(CodeExecutionError) as info:
        await collect(asking, "from mcptools.test import delete_item\ndelete_item.run({'item_id': 'a1'})",
                      {"delete_item": False}, reason="destructive")  # fmt: skip
    assert info.value.ename == "ToolCallRejected"
    assert "destructive" in info.value.evalue


async def test_structured_results_validate_into_nested_result_models(asking: CodeExecutor) -> None:
    code = (
        "from mcptools.test import compute_stats\n"
        "r = compute_stats.run(compute_stats.Params(values=[1, 2, 3, 4]))\n"
        "type(r).__name__, r.model_dump()"
    )
    _, result = await collect(asking, code)
    assert result.text.startswith("('Result', {")
    assert "'mean': 2.5" in result.text


async def test_image_content_from_a_tool_reaches_the_result_images(asking: CodeExecutor) -> None:
    _, result = await collect(asking, "from mcptools.test import make_image\nmake_image.run({'color': 'blue'})")
    assert [image.mime for image in result.images] == ["image/png"]
    assert result.images[0].data.startswith(PNG_MAGIC)


async def test_a_tool_error_is_a_readable_exception_naming_server_and_tool(asking: CodeExecutor) -> None:
    with pytest.raises(CodeExecutionError) as info:
        await collect(asking, "from mcptools.test import fail\nfail.run({'message': 'boom'})")
    assert "boom" in info.value.evalue
    assert "fail" in info.value.evalue and "test" in info.value.evalue
    assert (await asking.execute("'still working'")).text == "'still working'\n"


async def test_an_unknown_server_or_tool_is_a_clear_error_in_the_kernel(asking: CodeExecutor) -> None:
    code = (
        "from ipybox_kernel import call_tool, ToolNotFound\n"
        "for server, tool in [('nope', 'x'), ('test', 'nope')]:\n"
        "    try:\n"
        "        call_tool(server, tool, {})\n"
        "    except ToolNotFound as e:\n"
        "        print(e)"
    )
    _, result = await collect(asking, code)
    assert "no MCP server named 'nope'" in result.text
    assert "has no tool named 'nope'" in result.text


async def test_parallel_calls_from_threads_in_one_cell_each_get_their_own_approval(asking: CodeExecutor) -> None:
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from mcptools.test import add\n"
        "with ThreadPoolExecutor(4) as pool:\n"
        "    sums = list(pool.map(lambda i: add.run({'a': i, 'b': 100}).result, range(8)))\n"
        "sums"
    )
    requests, result = await collect(asking, code)
    assert result.text == f"{[i + 100 for i in range(8)]}\n"
    assert len(requests) == 8
    assert len({r.id for r in requests}) == 8


async def test_a_thread_or_task_left_running_neither_prints_into_the_next_execution_nor_calls_tools_as_it(
    asking: CodeExecutor,
) -> None:
    started = (
        "import asyncio, threading\n"
        "from ipybox_kernel import ToolCallRejected, acall_tool, call_tool\n"
        "release, release_task, stray_done = threading.Event(), asyncio.Event(), threading.Event()\n"
        "outcomes = {}\n"
        "def thread_body():\n"
        "    release.wait()\n"
        "    print('printed by the stray thread')\n"
        "    try:\n"
        "        call_tool('test', 'greet', {'name': 'thread'})\n"
        "        outcomes['thread'] = 'ran'\n"
        "    except ToolCallRejected as e:\n"
        "        outcomes['thread'] = e.reason\n"
        "    stray_done.set()\n"
        "async def task_body():\n"
        "    await release_task.wait()\n"
        "    print('printed by the stray task')\n"
        "    try:\n"
        "        await acall_tool('test', 'greet', {'name': 'task'})\n"
        "        outcomes['task'] = 'ran'\n"
        "    except ToolCallRejected as e:\n"
        "        outcomes['task'] = e.reason\n"
        "threading.Thread(target=thread_body).start()\n"
        "stray_task = asyncio.ensure_future(task_body())\n"
    )
    requests, _ = await collect(asking, started)
    assert requests == []
    released = (
        "release.set()\n"
        "assert stray_done.wait(30)\n"
        "release_task.set()\n"
        "await asyncio.wait_for(stray_task, 30)\n"
        "print('the next execution')\n"
    )
    requests, result = await collect(asking, released)
    assert result.text == "the next execution\n"
    assert requests == []
    _, result = await collect(asking, "print(outcomes['thread'])\nprint(outcomes['task'])")
    assert result.text.count("left running after the code action that started it ended") == 2


async def test_a_thread_pool_made_by_one_execution_works_for_the_next_as_its_own(asking: CodeExecutor) -> None:
    made = "from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(1)\npool.submit(int).result()"
    _, result = await collect(asking, made)
    assert result.text == "0\n"
    code = (
        "from mcptools.test import add\n"
        "print(pool.submit(lambda: add.run({'a': 2, 'b': 3}).result).result())\n"
        "pool.submit(print, 'printed by the pool').result()\n"
    )
    requests, result = await collect(asking, code)
    assert result.text == "5\nprinted by the pool\n"
    assert [r.tool_name for r in requests] == ["add"]


async def test_a_subprocess_of_the_running_execution_calls_tools_as_it(asking: CodeExecutor) -> None:
    script = "from mcptools.test import add\nprint(add.run({'a': 20, 'b': 22}).result)"
    code = (
        "import subprocess, sys\n"
        f"print(subprocess.run([sys.executable, '-c', {script!r}], capture_output=True, text=True).stdout)"
    )
    requests, result = await collect(asking, code)
    assert result.text.strip() == "42"
    assert [r.tool_name for r in requests] == ["add"]


async def test_asyncio_gather_over_async_wrappers_fans_out(asking: CodeExecutor) -> None:
    code = (
        "import asyncio\n"
        "from mcptools.test import add\n"
        "results = await asyncio.gather(*(add.arun({'a': i, 'b': i}) for i in range(5)))\n"
        "[r.result for r in results]"
    )
    requests, result = await collect(asking, code)
    assert result.text == "[0, 2, 4, 6, 8]\n"
    assert len(requests) == 5


async def test_an_awaited_execution_under_ask_rejects_at_once_and_names_the_fix(asking: CodeExecutor) -> None:
    code = (
        "from ipybox_kernel import ToolCallRejected\n"
        "from mcptools.test import greet\n"
        "try:\n"
        "    greet.run({'name': 'x'})\n"
        "except ToolCallRejected as e:\n"
        "    print(e.reason)"
    )
    with anyio.fail_after(30):
        result = await asking.execute(code)
    assert "iterate it" in result.text and "approval='auto'" in result.text


async def test_answer_by_request_id_is_idempotent(asking: CodeExecutor) -> None:
    execution = asking.execute("from mcptools.test import lookup\nlookup.run({'key': 'k'})")
    async for event in execution:
        if isinstance(event, ApprovalRequest):
            assert execution.answer(event.id, True) is True
            assert execution.answer(event.id, False, "too late") is False
            with pytest.raises(ExecutionLost):
                execution.answer(f"{execution.id}:99", True)
    assert (await execution).text == "Result(result='value of k')\n"


async def test_waiting_for_approval_does_not_count_against_the_execution_timeout(asking: CodeExecutor) -> None:
    timeout = 1.0
    execution = asking.execute("from mcptools.test import greet\ngreet.run({'name': 'late'})", timeout=timeout)
    async for event in execution:
        if isinstance(event, ApprovalRequest):
            # The point of this test is time passing while the approval is pending.
            await anyio.sleep(timeout * 2)
            await event.accept()
    assert (await execution).text == "'Hello, late!'\n"


async def test_an_approval_timeout_rejects_with_a_reason(tools_dir: Path, workspace: Path) -> None:
    async with CodeExecutor(
        workspace=workspace,
        tools_dir=tools_dir,
        kernel=InProcessKernel(),
        sandbox=None,
        timeouts=Timeouts(approval=0.5),
    ) as ex:
        code = (
            "from ipybox_kernel import ToolCallRejected\nfrom mcptools.test import greet\n"
            "try:\n    greet.run({'name': 'x'})\nexcept ToolCallRejected as e:\n    print(e.reason)"
        )
        seen: list[ApprovalRequest] = []
        async for event in ex.execute(code):
            if isinstance(event, ApprovalRequest):
                seen.append(event)  # and never answered
            elif isinstance(event, CodeExecutionResult):
                assert event.text == "no approval decision within 0.5 s\n"
        assert seen[0].decision is not None and seen[0].decision.by == "timeout"


def _not_delete(request: ApprovalRequest) -> bool:
    return request.tool_name != "delete_item"


@pytest.mark.parametrize(
    ("approval", "expected"),
    [
        ("auto", {"add": True, "lookup": True, "delete_item": True}),
        # Annotations are known once the server runs, and it is started only for an approved call (add).
        (
            ApprovalRules(allow=["test.add"], allow_read_only=True, otherwise="reject"),
            {"add": True, "lookup": True, "delete_item": False},
        ),
        (ApprovalRules(allow=["test.*"], deny=["test.delete_*"]), {"add": True, "lookup": True, "delete_item": False}),
        (_not_delete, {"add": True, "lookup": True, "delete_item": False}),
    ],
    ids=["auto", "read-only rule", "allow and deny globs", "sync callback"],
)
async def test_approval_policies_decide_without_asking(
    tools_dir: Path, workspace: Path, approval: Approval, expected: dict[str, bool]
) -> None:
    code = (
        "from ipybox_kernel import ToolCallRejected, call_tool\n"
        "outcome = {}\n"
        "for tool, args in [('add', {'a': 1, 'b': 2}), ('lookup', {'key': 'k'}), ('delete_item', {'item_id': 'i'})]:\n"
        "    try:\n        call_tool('test', tool, args)\n        outcome[tool] = True\n"
        "    except ToolCallRejected:\n        outcome[tool] = False\n"
        "import json; print(json.dumps(outcome))"
    )
    async with CodeExecutor(
        workspace=workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None, approval=approval
    ) as ex:
        result = await ex.execute(code)
    assert json.loads(result.text) == expected


async def test_an_async_callback_policy_sees_the_request(tools_dir: Path, workspace: Path) -> None:
    seen: list[str] = []

    async def approve(request: ApprovalRequest) -> ApprovalDecision:
        seen.append(str(request))
        return ApprovalDecision(approved=False, reason="callback says no")

    async with CodeExecutor(
        workspace=workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None, approval=approve
    ) as ex:
        code = (
            "from ipybox_kernel import ToolCallRejected, call_tool\n"
            "try:\n    call_tool('test', 'greet', {'name': 'cb'})\nexcept ToolCallRejected as e:\n    print(e.reason)"
        )
        assert (await ex.execute(code)).text == "callback says no\n"
    assert seen == ['test.greet(name="cb")']


async def test_servers_registered_at_run_time_are_callable(
    workspace: Path, streamable_http_server: HttpServer, sse_server: HttpServer
) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=None, approval="auto") as ex:
        ex.register_mcp_server("web", streamable_http_server)
        ex.register_mcp_server("events", sse_server)
        code = (
            "from ipybox_kernel import call_tool\n"
            "web = call_tool('web', 'add', {'a': 1, 'b': 2})\n"
            "events = call_tool('events', 'add', {'a': 3, 'b': 4})\n"
            "web.structured, events.structured"
        )
        assert (await ex.execute(code)).text == "({'result': 3}, {'result': 7})\n"


async def test_the_kernel_cannot_read_the_server_manifest(asking: CodeExecutor, tools_dir: Path) -> None:
    manifest = tools_dir / ".ipybox" / "servers.json"
    assert manifest.exists()
    _, result = await collect(asking, f"import os\nos.path.exists({str(manifest)!r})")
    assert result.text == "False\n"


async def test_the_kernel_cannot_write_to_the_generated_tools(asking: CodeExecutor, tools_dir: Path) -> None:
    target = tools_dir / "test" / "greet.py"
    code = f"try:\n    open({str(target)!r}, 'a').write('# pwned')\nexcept OSError as e:\n    print(e.errno)"
    _, result = await collect(asking, code)
    # A read-only mount (EROFS); under host root the kernel's own uid is refused first (EACCES).
    assert result.text in (f"{errno.EROFS}\n", f"{errno.EACCES}\n"), result.text
    assert "pwned" not in target.read_text()


async def test_a_forged_request_from_kernel_code_gets_nothing_run_on_the_host(
    tools_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    code = (
        "import json, os, socket\n"
        "def send(payload):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    s.connect(os.environ['IPYBOX_TOOL_SOCKET'])\n"
        "    s.sendall(json.dumps(payload).encode() + b'\\n')\n"
        "    reply = s.makefile().readline()\n"
        "    s.close()\n"
        "    return json.loads(reply)['error']\n"
        "token = os.environ['IPYBOX_TOOL_TOKEN']\n"
        "print(send({'token': 'forged-token-xxxxxxxxxxxx', 'seq': 1, 'server': 'test', 'tool': 'greet',"
        " 'arguments': {'name': 'x'}}))\n"
        f"print(send({{'token': token, 'seq': 2, 'server': 'evil', 'tool': 'x', 'command': 'touch {marker}'}}))\n"
        f"print(send({{'token': token, 'seq': 3, 'server': 'evil', 'tool': 'x', 'arguments': {{}}}}))"
    )
    calls: list[str] = []

    def approve(request: ApprovalRequest) -> bool:
        calls.append(str(request))
        return True

    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, approval=approve) as ex:
        result = await ex.execute(code)
    assert result.text == "unauthorized\nbad_request\nunknown_server\n"
    assert calls == []
    assert not marker.exists()


async def test_package_installs_from_kernel_code_are_approved_and_importable(tools_dir: Path, workspace: Path) -> None:
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as ex:
        requests, result = await collect(ex, "%pip install six==1.16.0\nimport six\nsix.__version__")
        assert [(r.server_name, r.tool_name, dict(r.tool_args)) for r in requests] == [
            ("ipybox", "install_package", {"package": "six==1.16.0"})
        ]
        assert result.text.endswith("'1.16.0'\n")
        await ex.reset()
        assert (await ex.execute("import six; six.__version__")).text == "'1.16.0'\n"


async def test_install_refuses_urls_and_options(asking: CodeExecutor) -> None:
    for spec in ("--index-url=http://evil/ x", "pkg @ https://evil.example/x.whl", ""):
        with pytest.raises(UsageError):
            await asking.install(spec)


def test_register_mcp_server_needs_a_running_executor(workspace: Path) -> None:
    with pytest.raises(UsageError, match="running CodeExecutor"):
        CodeExecutor(workspace=workspace).register_mcp_server("x", StdioServer(command="true"))


def test_a_bad_approval_policy_is_a_usage_error(workspace: Path) -> None:
    with pytest.raises(UsageError, match="approval must be"):
        CodeExecutor(workspace=workspace, approval="sometimes")  # type: ignore[arg-type]


async def test_a_tool_without_required_arguments_is_called_as_run_with_nothing(asking: CodeExecutor) -> None:
    requests, result = await collect(asking, "from mcptools.test import get_time\ntype(get_time.run()).__name__")
    assert result.text == "'Result'\n"
    assert [(r.tool_name, dict(r.tool_args)) for r in requests] == [("get-time", {})]


async def test_sources_generated_while_the_kernel_runs_are_importable_and_the_manifest_stays_hidden(
    workspace: Path, tmp_path: Path
) -> None:
    tools = tmp_path / "latetools"
    tools.mkdir()
    async with CodeExecutor(workspace=workspace, tools_dir=tools, approval="auto") as ex:
        await generate_mcp_sources("late", stdio_server(), tools)
        ex.register_mcp_server("late", stdio_server())
        manifest = tools / ".ipybox" / "servers.json"
        assert manifest.exists()
        code = (
            "import os\nfrom latetools.late import greet\n"
            f"print(greet.run({{'name': 'late'}}))\nos.path.exists({str(manifest)!r})"
        )
        result = await ex.execute(code)
        assert result.text == "Hello, late!\nFalse\n"


async def test_an_executions_own_approval_policy_overrides_the_executors(asking: CodeExecutor) -> None:
    code = "from mcptools.test import greet\nprint(greet.run({'name': 'own'}))"
    # A fresh kernel: code that earlier tests left under "ask" would make "auto" refuse every call.
    await asking.reset()
    # The executor asks; this execution is approved by its own policy, without an event.
    events = [event async for event in asking.execute(code, approval="auto")]
    assert not any(isinstance(event, ApprovalRequest) for event in events)
    assert (await asking.execute(code, approval="auto")).text == "Hello, own!\n"
    # And the next execution without one asks again.
    requests, _ = await collect(asking, code)
    assert len(requests) == 1


async def test_an_execution_paused_longer_than_its_ttl_is_cancelled_and_its_key_lost(asking: CodeExecutor) -> None:
    await asking.execute("after_ttl = 'kept'")
    code = "from mcptools.test import greet\ngreet.run({'name': 'ttl'})\nafter_ttl = 'ran on'"
    execution = asking.execute(code, key="paused-forever", ttl=0.5)
    with anyio.fail_after(30):
        async for event in execution.events():
            if isinstance(event, ApprovalRequest):
                break  # nobody answers
        with pytest.raises(ExecutionCancelled, match=r"ttl of 0\.5 s"):
            await execution
    assert execution.expired
    with pytest.raises(ExecutionLost, match="ttl"):
        asking.attach("paused-forever")
    with pytest.raises(ExecutionLost, match="not run again"):
        asking.execute(code, key="paused-forever")
    assert (await asking.execute("after_ttl")).text == "'kept'\n"


async def test_a_keyed_execution_is_released_once_its_outcome_was_delivered(asking: CodeExecutor) -> None:
    execution = asking.execute("released = 1", key="deliver-once")
    assert asking.attach("deliver-once") is execution
    await execution
    with pytest.raises(ExecutionLost, match="already delivered"):
        asking.attach("deliver-once")
    with pytest.raises(ExecutionLost, match="not run again"):
        asking.execute("released = 1", key="deliver-once")
    # Iterating to the end delivers too, including an error.
    failing = asking.execute("raise ValueError('x')", key="deliver-error")
    with pytest.raises(CodeExecutionError):
        async for _ in failing:
            pass
    with pytest.raises(ExecutionLost):
        asking.attach("deliver-error")


class _Records(logging.Handler):
    """Keeps the records of one logger and wakes a waiting test when one arrives."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.arrived = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.arrived.set()


@pytest.fixture
def unanswered_warnings(monkeypatch: pytest.MonkeyPatch) -> Generator[_Records]:
    # The grace is 10 s in production; a short one keeps the tests fast and changes nothing else.
    monkeypatch.setattr(_execution, "UNANSWERED_WARNING_AFTER", 0.2)
    handler = _Records()
    _execution.logger.addHandler(handler)
    try:
        yield handler
    finally:
        _execution.logger.removeHandler(handler)


async def test_an_approval_request_left_unanswered_after_the_consumer_moved_on_is_logged_with_the_fix(
    asking: CodeExecutor, unanswered_warnings: _Records
) -> None:
    execution = asking.execute("from mcptools.test import greet\nprint(greet.run({'name': 'late'}))")
    requests: list[ApprovalRequest] = []
    with anyio.fail_after(30):
        async with contextlib.aclosing(execution.events()) as events:
            async for event in events:
                if isinstance(event, ApprovalRequest):
                    requests.append(event)
                    break  # the consumer moves on without answering
        await unanswered_warnings.arrived.wait()
    [request] = requests
    [record] = unanswered_warnings.records
    message = record.getMessage()
    assert request.id in message and 'test.greet(name="late")' in message
    assert "request.accept()" in message and "approval policy" in message
    await request.accept()
    assert (await execution).text == "Hello, late!\n"


async def test_a_consumer_busy_with_an_approval_request_is_not_warned_about(
    asking: CodeExecutor, unanswered_warnings: _Records
) -> None:
    code = "from mcptools.test import greet\nprint(greet.run({'name': 'slow'}))"
    with anyio.fail_after(30):
        async for event in asking.execute(code):
            if isinstance(event, ApprovalRequest):
                # A person thinks it over for longer than the grace while the consumer holds the event.
                with anyio.move_on_after(1.0):
                    await unanswered_warnings.arrived.wait()
                await event.accept()
    assert unanswered_warnings.records == []


async def test_a_keyed_execution_with_a_ttl_paused_on_approval_is_not_warned_about(
    asking: CodeExecutor, unanswered_warnings: _Records
) -> None:
    code = "from mcptools.test import greet\ngreet.run({'name': 'adapter'})"
    # Paused on purpose the way framework adapters leave it; the ttl is five graces long.
    execution = asking.execute(code, key="adapter-pause", ttl=1.0)
    seen: list[object] = []
    with anyio.fail_after(30), pytest.raises(ExecutionCancelled, match="ttl"):
        async for event in execution:
            seen.append(event)  # looked at, never answered
    assert execution.expired
    assert any(isinstance(event, ApprovalRequest) for event in seen)
    assert unanswered_warnings.records == []
