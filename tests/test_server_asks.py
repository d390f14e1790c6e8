"""What an MCP server asks of ipybox's client during a tool call, over real transports (stdio and
streamable HTTP on 127.0.0.1) from real kernel code: elicitation decided through the approval path
(an event, a callback in a chain; the hook sees it), sampling declined unless the application opted
in, roots only as configured. The hostile cases are in tests/hostile/test_server_asks.py."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import anyio
import pytest
from deadline_support import patient
from mcp import Client, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.context import ClientRequestContext
from server_asks_support import ASKING_STDIO, call, run
from servers.fixtures import ASKING_SERVER_SCRIPT, http_server

from ipybox import (
    ApprovalChain,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalRules,
    ClientFeatures,
    CodeExecutor,
    ElicitationRequest,
    HttpServer,
    StdioServer,
    ToolCallDecided,
    ToolCallEvent,
    ToolCallRequested,
    UsageError,
    generate_mcp_sources,
)
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def asking_http() -> Iterator[HttpServer]:
    with http_server("streamable-http", ASKING_SERVER_SCRIPT) as params:
        yield params


@pytest.fixture(params=["stdio", "streamable-http"])
def asking(request: pytest.FixtureRequest) -> StdioServer | HttpServer:
    return ASKING_STDIO if request.param == "stdio" else request.getfixturevalue("asking_http")


@pytest.fixture
async def executor(workspace: Path, asking: StdioServer | HttpServer) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=workspace, tools_dir=None, kernel=InProcessKernel(), sandbox=None) as ex:
        ex.register_mcp_server("asking", asking)
        yield ex


async def test_a_servers_form_question_reaches_the_application_as_an_event_and_its_answer_reaches_the_server(
    executor: CodeExecutor,
) -> None:
    async def answer(question: ElicitationRequest) -> None:
        await question.answer({"name": "Ada", "age": 36})

    questions, answers = await run(executor, call("ask", {"message": "Who are you?"}), answer)
    assert answers == [{"action": "accept", "content": {"name": "Ada", "age": 36}}]
    (question,) = questions
    assert (question.server_name, question.tool_name, question.during_tool) == ("asking", "elicitation/create", "ask")
    assert question.mode == "form" and question.message == "Who are you?" and question.url is None
    assert question.requested_schema is not None and set(question.requested_schema["properties"]) == {"name", "age"}
    text = question.description
    assert text.startswith("MCP server asking asks a question (form mode) during the tool call asking.ask")
    assert "    | Who are you?" in text
    assert '"name" (required)' in text and '"age" (optional)' in text


async def test_a_decline_and_an_accept_without_an_answer_both_reach_the_server_as_decline(
    executor: CodeExecutor,
) -> None:
    _, answers = await run(executor, call("ask", {"message": "m"}))
    assert answers == [{"action": "decline", "content": None}]

    async def accept(question: ElicitationRequest) -> None:
        await question.accept()  # what code written for tool calls does with every request

    questions, answers = await run(executor, call("ask", {"message": "m"}), accept)
    assert len(questions) == 1
    assert answers == [{"action": "decline", "content": None}]


async def test_a_url_question_shows_the_url_and_its_host_and_is_accepted_only_with_an_explicit_answer(
    executor: CodeExecutor,
) -> None:
    async def went(question: ElicitationRequest) -> None:
        await question.answer({})

    url = "https://auth.example.com/connect?state=1"
    questions, answer = await run(executor, call("ask_url", {"message": "Connect your account", "url": url}), went)
    assert answer == {"action": "accept", "content": None}
    (question,) = questions
    assert question.mode == "url" and question.url == url and question.host == "auth.example.com"
    assert f"URL (ipybox does not open it): {json.dumps(url)}" in question.description
    assert "It leads to the host: auth.example.com" in question.description


async def test_a_callback_in_a_chain_answers_a_question_after_the_rules_pass_it_on_and_the_hook_sees_it(
    workspace: Path,
) -> None:
    seen: list[ApprovalRequest] = []

    def decide(request: ApprovalRequest) -> ApprovalDecision:
        seen.append(request)
        if isinstance(request, ElicitationRequest):
            return ApprovalDecision(approved=True, content={"name": "from the callback"})
        return ApprovalDecision(approved=False, reason="the rules should have decided this call")

    events: list[ToolCallEvent] = []
    # Rules that accept every call and reject the rest must not answer a question: they pass it on.
    chain = ApprovalChain(ApprovalRules(allow=["asking.*"], otherwise="reject"), decide)
    async with CodeExecutor(
        workspace=workspace,
        tools_dir=None,
        kernel=InProcessKernel(),
        sandbox=None,
        approval=chain,
        on_tool_call=events.append,
    ) as ex:
        ex.register_mcp_server("asking", ASKING_STDIO)
        result = await ex.execute(call("ask", {"message": "name?"}))
    assert json.loads(result.text) == [{"action": "accept", "content": {"name": "from the callback"}}]
    assert [type(r) for r in seen] == [ElicitationRequest]
    asked = [e for e in events if e.tool == "elicitation/create"]
    assert [type(e) for e in asked] == [ToolCallRequested, ToolCallDecided]
    requested, decided = asked
    assert isinstance(requested, ToolCallRequested) and requested.arguments["message"] == "name?"
    assert isinstance(decided, ToolCallDecided) and decided.decision.approved and decided.policy is not None
    assert decided.policy.endswith("decide") and decided.decision.by == "callback"


async def test_auto_approves_the_call_but_declines_the_servers_question(workspace: Path) -> None:
    async with CodeExecutor(
        workspace=workspace, tools_dir=None, kernel=InProcessKernel(), sandbox=None, approval="auto"
    ) as ex:
        ex.register_mcp_server("asking", ASKING_STDIO)
        result = await ex.execute(call("ask", {"message": "m"}))
    assert json.loads(result.text) == [{"action": "decline", "content": None}]


async def test_without_client_features_sampling_is_declined_with_the_reason_and_nothing_but_elicitation_is_advertised(
    executor: CodeExecutor,
) -> None:
    _, capabilities = await run(executor, call("capabilities", {}))
    assert capabilities == {"elicitation": {"form": {}, "url": {}}}
    _, sampled = await run(executor, call("sample", {"prompt": "hello"}))
    assert "ipybox declines sampling" in sampled["error"] and "ClientFeatures(sampling=...)" in sampled["error"]
    _, roots = await run(executor, call("roots", {}))
    assert "error" in roots and "roots" not in roots


async def test_a_sampling_handler_and_roots_given_by_the_application_are_advertised_and_used(
    workspace: Path, tmp_path: Path, asking: StdioServer | HttpServer
) -> None:
    prompts: list[tuple[str, str]] = []

    async def sample(server: str, params: mcp_types.CreateMessageRequestParams) -> mcp_types.CreateMessageResult:
        content = params.messages[0].content
        assert isinstance(content, mcp_types.TextContent)
        prompts.append((server, content.text))
        return mcp_types.CreateMessageResult(
            role="assistant", content=mcp_types.TextContent(type="text", text="sampled"), model="test-model"
        )

    root = tmp_path / "project"
    features = ClientFeatures(sampling=sample, roots=[root])
    async with CodeExecutor(
        workspace=workspace, tools_dir=None, kernel=InProcessKernel(), sandbox=None, approval="auto",
        mcp_client=features,
    ) as ex:  # fmt: skip
        ex.register_mcp_server("asking", asking)
        capabilities = json.loads((await ex.execute(call("capabilities", {}))).text)
        sampled = json.loads((await ex.execute(call("sample", {"prompt": "hello"}))).text)
        roots = json.loads((await ex.execute(call("roots", {}))).text)
    assert set(capabilities) == {"elicitation", "sampling", "roots"}
    assert sampled == {"text": "sampled"} and prompts == [("asking", "hello")]
    assert roots == {"roots": [root.as_uri()]}


async def _sampled(server: str, params: mcp_types.CreateMessageRequestParams) -> mcp_types.CreateMessageResult:
    return mcp_types.CreateMessageResult(
        role="assistant", content=mcp_types.TextContent(type="text", text="sampled"), model="test-model"
    )


@pytest.mark.parametrize("offered", ["default", "sampling_and_roots"])
async def test_generation_advertises_what_the_tool_server_does_so_a_capability_gated_listing_is_the_same(
    workspace: Path, tmp_path: Path, offered: str
) -> None:
    """The server lists a tool only to a client that declared what the tool uses (as server-everything
    does): generation, given the same `ClientFeatures` as the executor, gets the tools that kernel
    code can then call through the tool server."""
    gated = StdioServer(command=sys.executable, args=(str(ASKING_SERVER_SCRIPT), "--by-capability"))
    features = ClientFeatures(sampling=_sampled, roots=[tmp_path]) if offered != "default" else ClientFeatures()
    root = workspace / "mcptools"
    modules = await generate_mcp_sources("asking", gated, root, mcp_client=features)
    expected: set[str] = {"ask", "ask_url", "capabilities"} | (
        {"roots", "sample"} if offered != "default" else set[str]()
    )
    assert set(modules) == expected
    code = (
        "import json\nfrom mcptools.asking import capabilities\n"
        "print(json.dumps(sorted(json.loads(capabilities.run().result))))"
    )
    async with CodeExecutor(
        workspace=workspace, tools_dir=root, kernel=InProcessKernel(), sandbox=None, approval="auto",
        mcp_client=features,
    ) as ex:  # fmt: skip
        declared = json.loads((await ex.execute(code)).text)
    assert declared == (["elicitation"] if offered == "default" else ["elicitation", "roots", "sampling"])


def test_client_features_refuse_relative_roots_and_a_single_path() -> None:
    with pytest.raises(UsageError, match="absolute"):
        ClientFeatures(roots=["relative/dir"])
    with pytest.raises(UsageError, match="a list of directories"):
        ClientFeatures(roots="/srv/project")
    assert ClientFeatures(roots=["file:///srv/x", Path("/srv/y")]).root_uris == ("file:///srv/x", "file:///srv/y")


# -- ipybox mcp: a registered server's question goes to ipybox's own client ------------------------

REPO = Path(__file__).resolve().parents[1]
# Starting the MCP server (import mcp) and its sandboxed kernel on a loaded 2-core machine.
MCP_START = 60.0


def _ipybox_mcp(workspace: Path, *options: str) -> StdioServerParameters:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "ipybox.mcp_server", "--workspace", str(workspace), *options],
        env=env,
        cwd=str(REPO),
    )


async def test_ipybox_mcp_forwards_a_registered_servers_question_to_its_client_and_its_answer_back(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    messages: list[str] = []

    async def user(
        context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        messages.append(params.message)
        if params.message.startswith("MCP server asking asks a question"):
            assert isinstance(params, mcp_types.ElicitRequestFormParams)
            assert set(params.requested_schema["properties"]) == {"name", "age"}
            return mcp_types.ElicitResult(action="accept", content={"name": "Grace"})
        return mcp_types.ElicitResult(action="accept", content={"approve": True})

    asking = ASKING_STDIO.model_dump(mode="json", exclude_none=True)
    code = call("ask", {"message": "Who\nApprove this call?"})
    with anyio.fail_after(patient(MCP_START) * 2):
        async with Client(_ipybox_mcp(workspace), elicitation_callback=user, mode="legacy") as client:
            registered = await client.call_tool(
                "register_mcp_server", {"server_name": "asking", "server_params": asking}
            )
            assert not registered.is_error
            result = await client.call_tool("execute_ipython_cell", {"code": code})
    text = "".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))
    assert json.loads(text) == [{"action": "accept", "content": {"name": "Grace"}}]
    assert [m.split(" ", 3)[:3] for m in messages] == [["MCP", "tool", "call"], ["MCP", "server", "asking"]]
    assert "    | Who\n    | Approve this call?" in messages[1]


async def test_ipybox_mcp_declines_a_registered_servers_question_when_its_client_cannot_be_asked(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    asking = ASKING_STDIO.model_dump(mode="json", exclude_none=True)
    with anyio.fail_after(patient(MCP_START) * 2):
        async with Client(_ipybox_mcp(workspace, "--approval", "auto"), mode="legacy") as client:
            await client.call_tool("register_mcp_server", {"server_name": "asking", "server_params": asking})
            result = await client.call_tool("execute_ipython_cell", {"code": call("ask", {"message": "m"})})
    text = "".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))
    assert json.loads(text) == [{"action": "decline", "content": None}]
