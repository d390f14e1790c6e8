"""The OpenAI Agents SDK adapter: a code action whose MCP calls are approved on the run.

Real kernel in the real sandbox, the project's test MCP server over stdio, and the SDK's own scripted
test model (`agents.testing.ScriptedModel`) playing the agent's model. Several tests also guard the SDK
behaviour the adapter relies on (nested `Agent.as_tool` approvals surfacing on the outer run and
resuming from the outer `RunState`): they fail loudly if a new SDK version changes it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import (
    Agent,
    RunConfig,
    RunContextWrapper,
    Runner,
    RunResult,
    RunState,
    ToolApprovalItem,
    ToolCallOutputItem,
    set_tracing_disabled,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from server_asks_support import TRICKY, asking_code
from servers.fixtures import stdio_server

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutor,
    ElicitationRequest,
    generate_mcp_sources,
)
from ipybox.integrations.openai_agents import ipybox_tool, ipybox_tools

pytestmark = pytest.mark.anyio

set_tracing_disabled(True)

TWO_CALLS = (
    "from ipybox_kernel import ToolCallRejected\n"
    "from mcptools.test import greet, add\n"
    "with open('side_effect.txt', 'a') as f:\n    f.write('ran\\n')\n"
    "print(greet.run({'name': 'a'}), flush=True)\n"
    "try:\n"
    "    print('sum', add.run({'a': 1, 'b': 2}))\n"
    "except ToolCallRejected as e:\n"
    "    print('rejected:', e.reason)\n"
)

TWO_GREETINGS = (
    "from mcptools.test import greet\n"
    "with open('side_effect.txt', 'a') as f:\n    f.write('ran\\n')\n"
    "print(greet.run({'name': 'a'}))\n"
    "print(greet.run({'name': 'b'}))\n"
)


def scripted(code: str, call_id: str = "call_1") -> ScriptedModel:
    """The agent's model: one code action, then a final answer."""
    return ScriptedModel(
        [[function_call("execute_code", {"code": code}, call_id=call_id)], [assistant_message("done")]]
    )


def tool_outputs(result: RunResult) -> list[Any]:
    return [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def arguments(item: ToolApprovalItem) -> dict[str, Any]:
    raw: Any = item.raw_item
    return json.loads(raw.arguments)


async def answer_all(
    agent: Agent[Any],
    result: RunResult,
    decide: Callable[[ToolApprovalItem, RunState[Any]], None],
    *,
    rebuild: Callable[[], Agent[Any]] | None = None,
) -> tuple[RunResult, list[tuple[str, dict[str, Any]]]]:
    """Answer interruptions until the run ends; with ``rebuild``, each pause goes through
    ``to_string`` and is restored into a newly built agent, as a server handling a later request would."""
    seen: list[tuple[str, dict[str, Any]]] = []
    while result.interruptions:
        state = result.to_state()
        if rebuild is not None:
            agent = rebuild()
            state = await RunState.from_string(agent, state.to_string())
        for item in state.get_interruptions():
            seen.append((str(item.tool_name), arguments(item)))
            decide(item, state)
        result = await Runner.run(agent, state)
    return result, seen


def approve_greet_reject_add(item: ToolApprovalItem, state: RunState[Any]) -> None:
    if item.tool_name == "test__add":
        state.reject(item, rejection_message="not now")
    else:
        state.approve(item)


@pytest.fixture
def side_effect(module_workspace: Path) -> Iterator[Path]:
    path = module_workspace / "side_effect.txt"
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


async def test_each_mcp_call_is_an_interruption_a_rejection_is_caught_in_the_code_and_the_code_runs_once(
    executor: CodeExecutor, side_effect: Path
) -> None:
    agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=scripted(TWO_CALLS))
    with anyio.fail_after(60):
        result, seen = await answer_all(agent, await Runner.run(agent, "go"), approve_greet_reject_add)
    assert seen == [("test__greet", {"name": "a"}), ("test__add", {"a": 1, "b": 2})]
    assert tool_outputs(result) == ["Hello, a!\nrejected: not now\n"]
    assert result.final_output == "done"
    assert side_effect.read_text() == "ran\n"


async def test_always_approve_lets_the_next_call_of_that_tool_run_without_an_interruption(
    executor: CodeExecutor, side_effect: Path
) -> None:
    agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=scripted(TWO_GREETINGS))

    def always(item: ToolApprovalItem, state: RunState[Any]) -> None:
        state.approve(item, always_approve=True)

    with anyio.fail_after(60):
        result, seen = await answer_all(agent, await Runner.run(agent, "go"), always)
    assert seen == [("test__greet", {"name": "a"})]
    assert tool_outputs(result) == ["Hello, a!\nHello, b!\n"]
    assert side_effect.read_text() == "ran\n"


async def test_a_state_restored_from_a_string_into_a_new_agent_resumes_the_same_paused_execution(
    executor: CodeExecutor, side_effect: Path
) -> None:
    model = scripted(TWO_CALLS)

    def build() -> Agent[Any]:
        return Agent(name="coder", tools=[ipybox_tool(executor)], model=model)

    agent = build()
    with anyio.fail_after(60):
        result, seen = await answer_all(agent, await Runner.run(agent, "go"), approve_greet_reject_add, rebuild=build)
    assert [name for name, _ in seen] == ["test__greet", "test__add"]
    assert tool_outputs(result) == ["Hello, a!\nrejected: not now\n"]
    assert side_effect.read_text() == "ran\n"


async def test_a_resume_whose_execution_is_gone_reports_execution_lost_and_runs_nothing(
    tools_dir: Path, workspace: Path
) -> None:
    code = (
        "with open('ran.txt', 'a') as f:\n    f.write('x')\n"
        "from mcptools.test import greet\nprint(greet.run({'name': 'gone'}))"
    )
    model = scripted(code)
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as first:
        agent = Agent(name="coder", tools=[ipybox_tool(first)], model=model)
        with anyio.fail_after(60):
            result = await Runner.run(agent, "go")
        saved = result.to_state().to_string()
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as second:
        agent = Agent(name="coder", tools=[ipybox_tool(second)], model=model)
        state = await RunState.from_string(agent, saved)
        for item in state.get_interruptions():
            state.approve(item)
        with anyio.fail_after(60):
            result = await Runner.run(agent, state)
        [output] = tool_outputs(result)
        assert output.startswith("execution lost, nothing was re-run")
        assert (await second.execute("from pathlib import Path\nprint(Path('ran.txt').read_text())")).text == "x\n"


@dataclass
class App:
    """An application's run context: who approves, and where progress goes."""

    allowed: set[str]
    asked: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    progress: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])


async def test_an_approval_handler_decides_each_call_while_the_tool_waits_with_no_interruption(
    executor: CodeExecutor, side_effect: Path
) -> None:
    def approve(ctx: RunContextWrapper[App], request: ApprovalRequest) -> bool | ApprovalDecision:
        ctx.context.asked.append((request.tool_name, json.dumps(dict(request.tool_args), sort_keys=True)))
        if request.tool_name in ctx.context.allowed:
            return True
        return ApprovalDecision(approved=False, reason=f"{request.tool_name} is not for today")

    tool = ipybox_tool(executor, approval=approve)
    agent = Agent[App](name="coder", tools=[tool], model=scripted(TWO_CALLS))
    app = App(allowed={"greet"})
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go", context=app)
    assert result.interruptions == []
    assert app.asked == [("greet", '{"name": "a"}'), ("add", '{"a": 1, "b": 2}')]
    assert tool_outputs(result) == ["Hello, a!\nrejected: add is not for today\n"]
    assert side_effect.read_text() == "ran\n"


async def test_without_an_approver_the_calls_the_executor_leaves_open_are_rejected(executor: CodeExecutor) -> None:
    code = "from mcptools.test import greet\ngreet.run({'name': 'n'})"
    agent = Agent(name="coder", tools=[ipybox_tool(executor, approval=None)], model=scripted(code))
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go")
    [output] = tool_outputs(result)
    assert "ToolCallRejected" in output and "nobody can approve test.greet" in output


async def test_needs_approval_shows_the_code_before_it_runs_and_a_rejected_action_never_runs(
    executor: CodeExecutor, side_effect: Path
) -> None:
    async def review_deletions(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        return "delete_item" in params["code"]

    code = "with open('side_effect.txt', 'a') as f:\n    f.write('ran\\n')\nfrom mcptools.test import delete_item\n"
    tool = ipybox_tool(executor, needs_approval=review_deletions)
    agent = Agent(name="coder", tools=[tool], model=scripted(code))
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go")
        [item] = result.interruptions
        assert item.tool_name == "execute_code" and arguments(item) == {"code": code}
        state = result.to_state()
        state.reject(item, rejection_message="no deletions")
        result = await Runner.run(agent, state)
    assert tool_outputs(result) == ["no deletions"]
    assert not side_effect.exists()
    # Code the policy lets through runs at once.
    agent = Agent(name="coder", tools=[tool], model=scripted("print(6 * 7)"))
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go")
    assert result.interruptions == [] and tool_outputs(result) == ["42\n"]


async def test_images_the_code_displays_reach_the_model_as_image_inputs_next_to_the_text(
    executor: CodeExecutor,
) -> None:
    code = (
        "from mcptools.test import make_image\n"
        "print('one image')\n"
        "make_image.run({'color': 'blue'})  # the kernel displays the images a tool returns\n"
    )
    model = scripted(code)
    agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=model)
    with anyio.fail_after(60):
        await answer_all(agent, await Runner.run(agent, "go"), lambda item, state: state.approve(item))
    second: Any = model.calls[1].input
    [output] = [item["output"] for item in second if item.get("type") == "function_call_output"]
    kinds = [part["type"] for part in output]
    assert kinds == ["input_text", "input_image"]
    assert output[0]["text"].startswith("one image")
    assert output[1]["image_url"].startswith("data:image/png;base64,iVBORw0KGgo")


async def test_a_summary_catalogue_comes_with_a_search_tool_whose_stubs_the_model_then_calls(
    executor: CodeExecutor,
) -> None:
    assert [t.name for t in ipybox_tools(executor)] == ["execute_code"]  # small: the stubs are in the prompt
    tools = ipybox_tools(executor, catalogue="summary")
    assert [t.name for t in tools] == ["execute_code", "search_tools"]
    assert "class add:" not in tools[0].description and "call the `search_tools` tool" in tools[0].description
    add = "from mcptools.test import add\nprint(add.run(add.Params(a=2, b=3)).result)"
    model = ScriptedModel(
        [
            [function_call("search_tools", {"query": "add two numbers", "k": 2}, call_id="s1")],
            [function_call("execute_code", {"code": add}, call_id="c1")],
            [assistant_message("done")],
        ]
    )
    agent = Agent(name="coder", tools=list(tools), model=model)
    with anyio.fail_after(60):
        result, seen = await answer_all(agent, await Runner.run(agent, "go"), lambda item, state: state.approve(item))
    found, ran = tool_outputs(result)
    assert "class add:" in found and "class Params" in found
    assert [name for name, _ in seen] == ["test__add"] and ran == "5\n"


async def test_an_error_comes_back_as_the_tool_output_with_a_clean_traceback(executor: CodeExecutor) -> None:
    agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=scripted("print('before')\n1 / 0"))
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go")
    [output] = tool_outputs(result)
    assert output.startswith("before\n") and "ZeroDivisionError" in output
    assert "ipykernel" not in output and "\x1b[" not in output


async def test_progress_reaches_the_app_as_it_is_printed_each_chunk_once_across_resumes(
    executor: CodeExecutor,
) -> None:
    code = (
        "from mcptools.test import greet\n"
        "print('step 1', flush=True)\n"
        "greet.run({'name': 'p'})\n"
        "print('step 2', flush=True)\n"
        "greet.run({'name': 'q'})\n"
        "print('step 3')\n"
    )

    def show(ctx: ToolContext[App], chunk: CodeExecutionChunk) -> None:
        ctx.context.progress.append((ctx.tool_call_id, chunk.text))

    agent = Agent[App](name="coder", tools=[ipybox_tool(executor, on_output=show)], model=scripted(code, "call_p"))
    app = App(allowed=set())
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go", context=app)
        # Shown before the run pauses, unless the kernel's stdout reached the host after the approval
        # request (two channels, no order between them); then it is shown on the resume.
        assert app.progress in ([], [("call_p", "step 1\n")])
        result, _ = await answer_all(agent, result, lambda item, state: state.approve(item))
    assert app.progress == [("call_p", "step 1\n"), ("call_p", "step 2\n"), ("call_p", "step 3\n")]


async def test_a_run_config_model_for_every_agent_does_not_replace_the_kernel_driver(
    executor: CodeExecutor, side_effect: Path
) -> None:
    # RunConfig(model=...) overrides every agent's model; the nested kernel agent must keep its own.
    agent = Agent(name="coder", tools=[ipybox_tool(executor)])
    config = RunConfig(model=scripted(TWO_GREETINGS))
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go", run_config=config)
        assert [item.tool_name for item in result.interruptions] == ["test__greet"]
        state = result.to_state()
        state.approve(result.interruptions[0], always_approve=True)
        result = await Runner.run(agent, state, run_config=config)
    assert tool_outputs(result) == ["Hello, a!\nHello, b!\n"]


async def test_the_example_agent_runs_offline_with_approvals_answered_at_the_terminal() -> None:
    script = Path(__file__).resolve().parents[2] / "integrations" / "openai_agents_agent.py"
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    with anyio.fail_after(110):
        run = await anyio.run_process([sys.executable, str(script)], input=b"a\nn\nnot today\n", env=env, check=False)
    out = run.stdout.decode()
    assert run.returncode == 0, run.stderr.decode()
    # One question for get_forecast (always approved: the second city asks nothing), one for the e-mail.
    assert out.count("The code wants to call weather__get_forecast") == 1
    assert out.count("The code wants to call weather__send_report") == 1
    assert "| lisbon:" in out and "| report not sent: not today" in out
    assert out.rstrip().endswith("the report was not sent.")


async def test_a_streamed_run_surfaces_the_same_interruptions_and_resumes_streamed(
    executor: CodeExecutor, side_effect: Path
) -> None:
    agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=scripted(TWO_CALLS))
    names: list[str | None] = []
    with anyio.fail_after(60):
        streamed = Runner.run_streamed(agent, "go")
        while True:
            async for _ in streamed.stream_events():
                pass
            if not streamed.interruptions:
                break
            state = streamed.to_state()
            for item in state.get_interruptions():
                names.append(item.tool_name)
                approve_greet_reject_add(item, state)
            streamed = Runner.run_streamed(agent, state)
    assert names == ["test__greet", "test__add"]
    assert streamed.final_output == "done"
    outputs = [item.output for item in streamed.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs == ["Hello, a!\nrejected: not now\n"]
    assert side_effect.read_text() == "ran\n"


async def test_a_code_action_started_while_another_is_paused_is_refused_at_once_instead_of_waiting(
    executor: CodeExecutor,
) -> None:
    # The kernel runs one action at a time: the second of two parallel calls would otherwise wait
    # behind the first, paused one, and the run would never end to ask for its approval.
    def action(name: str) -> str:
        return f"from mcptools.test import greet\nprint(greet.run({{'name': '{name}'}}))"

    calls = [function_call("execute_code", {"code": action(n)}, call_id=f"call_{n}") for n in ("a", "b")]
    agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=ScriptedModel([calls, [assistant_message("ok")]]))
    with anyio.fail_after(60):
        result = await Runner.run(agent, "go")
        [item] = result.interruptions
        result, _ = await answer_all(agent, result, lambda item, state: state.approve(item))
    outputs = sorted(tool_outputs(result))
    greeted = arguments(item)["name"]
    assert outputs[0] == f"Hello, {greeted}!\n"
    assert outputs[1].startswith("not run: another code action is paused in this kernel")


async def test_a_call_to_a_tool_without_a_generated_module_is_rejected_not_run(workspace: Path) -> None:
    # The nested agent has one approval tool per generated module; a call it has none for (kernel
    # code may call any tool of a registered server) cannot become an interruption, so it is
    # refused rather than run unasked.
    tools_dir = workspace / "mcptools"
    await generate_mcp_sources("test", stdio_server(), tools_dir)
    (tools_dir / "test" / "greet.py").unlink()
    async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
        code = "import ipybox_kernel\nipybox_kernel.call_tool('test', 'greet', {'name': 'raw'})"
        agent = Agent(name="coder", tools=[ipybox_tool(executor)], model=scripted(code))
        with anyio.fail_after(60):
            result = await Runner.run(agent, "go")
    assert result.interruptions == []
    [output] = tool_outputs(result)
    assert "ToolCallRejected" in output and "test.greet has no generated module this tool was built with" in output


async def test_an_approval_handler_answers_a_servers_question_and_a_plain_approval_declines_it(
    asking_executor: CodeExecutor,
) -> None:
    questions: list[ElicitationRequest] = []

    async def decide(ctx: RunContextWrapper[Any], request: ApprovalRequest) -> bool | ApprovalDecision:
        if isinstance(request, ElicitationRequest):
            questions.append(request)
            return ApprovalDecision(approved=True, content={"name": "Ada"}) if len(questions) == 1 else True
        return True

    tool = ipybox_tool(asking_executor, approval=decide)
    with anyio.fail_after(60):
        answered = await Runner.run(Agent(name="coder", tools=[tool], model=scripted(asking_code(TRICKY))), "go")
        declined = await Runner.run(Agent(name="coder", tools=[tool], model=scripted(asking_code("Name?"))), "go")
    assert [json.loads(out) for out in tool_outputs(answered) + tool_outputs(declined)] == [
        [{"action": "accept", "content": {"name": "Ada"}}],
        [{"action": "decline", "content": None}],
    ]
    assert questions[0].message == TRICKY
    assert "\x1b" not in questions[0].description and "\u202e" not in questions[0].description
