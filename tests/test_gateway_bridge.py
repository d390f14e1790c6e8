"""The bridge between a remote kernel's tool comm and the host's ToolServer, driven with the
messages the kernel side sends (ipybox_kernel._remote), against a real ToolServer on its socket."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from ipybox._approval._decisions import ApprovalDecision
from ipybox._gateway._bridge import ToolBridge
from ipybox._toolserver._channel import ToolRequest
from ipybox._toolserver._server import ToolServer

pytestmark = pytest.mark.anyio

TOKEN = secrets.token_urlsafe(32)
DEADLINE = 30.0


@dataclass
class HeldGate:
    """Approves every call, but holds the ones for ``hold`` until released or cancelled."""

    asked: list[str] = field(default_factory=list[str])
    waiting: anyio.Event = field(default_factory=anyio.Event)
    cancelled: anyio.Event = field(default_factory=anyio.Event)

    async def __call__(
        self,
        request: ToolRequest,
        /,
        *,
        server: str,
        annotations: Mapping[str, Any] | None,
        input_schema: Mapping[str, Any] | None = None,
    ) -> ApprovalDecision:
        self.asked.append(request.tool)
        if request.tool == "hold":
            self.waiting.set()
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled.set()
        return ApprovalDecision(approved=True)


@dataclass
class Answers:
    """What the bridge sent to the kernel, and a wake-up for each."""

    sent: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    changed: anyio.Event = field(default_factory=anyio.Event)

    def __call__(self, answer: dict[str, Any]) -> None:
        self.sent.append(answer)
        self.changed.set()
        self.changed = anyio.Event()

    async def reply(self, call_id: str) -> dict[str, Any]:
        with anyio.fail_after(DEADLINE):
            while True:
                for answer in self.sent:
                    if answer["id"] == call_id and "line" in answer:
                        return json.loads(answer["line"])
                await self.changed.wait()


@dataclass
class Rig:
    bridge: ToolBridge
    answers: Answers
    gate: HeldGate


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncGenerator[Rig]:
    gate = HeldGate()
    server = ToolServer(socket_path=tmp_path / "tools.sock", token=TOKEN, gate=gate)

    async def echo(arguments: Mapping[str, Any]) -> str:
        return f"echo {arguments.get('text')}"

    for tool in ("echo", "hold"):
        server.register_builtin("ipybox", tool, echo)
    answers = Answers()
    async with anyio.create_task_group() as tg:
        await tg.start(server.run)
        yield Rig(ToolBridge(server.socket_path, answers, tg, max_calls=2), answers, gate)
        tg.cancel_scope.cancel()


def request(call_id: str, tool: str = "echo", seq: int = 1) -> dict[str, Any]:
    line = {
        "token": TOKEN,
        "seq": seq,
        "execution": None,
        "server": "ipybox",
        "tool": tool,
        "arguments": {"text": "hi"},
    }
    return {"id": call_id, "line": json.dumps(line)}


async def test_a_request_is_acknowledged_and_answered_with_the_tool_servers_reply(rig: Rig) -> None:
    rig.bridge.receive(request("a"))
    reply = await rig.answers.reply("a")
    assert (reply["ok"], reply["text"], reply["seq"]) == (True, "echo hi", 1)
    assert rig.answers.sent[0] == {"id": "a", "ack": True}


async def test_a_request_resent_before_its_answer_runs_once_and_one_resent_after_it_not_again(rig: Rig) -> None:
    rig.bridge.receive(request("b", "hold"))
    with anyio.fail_after(DEADLINE):
        await rig.gate.waiting.wait()
    rig.bridge.receive(request("b", "hold"))
    assert rig.answers.sent == [{"id": "b", "ack": True}, {"id": "b", "ack": True}]
    rig.bridge.receive(request("c"))
    await rig.answers.reply("c")
    rig.bridge.receive(request("c"))
    assert rig.gate.asked == ["hold", "echo"]


async def test_a_cancelled_request_cancels_its_pending_approval(rig: Rig) -> None:
    rig.bridge.receive(request("d", "hold"))
    with anyio.fail_after(DEADLINE):
        await rig.gate.waiting.wait()
    rig.bridge.receive({"id": "d", "cancel": True})
    with anyio.fail_after(DEADLINE):
        await rig.gate.cancelled.wait()
    assert not any("line" in answer for answer in rig.answers.sent)


async def test_calls_beyond_the_limit_at_once_are_refused_and_malformed_messages_ignored(rig: Rig) -> None:
    for call_id in ("e1", "e2"):
        rig.bridge.receive(request(call_id, "hold"))
    rig.bridge.receive(request("e3"))
    reply = await rig.answers.reply("e3")
    assert reply["error"] == "too_large" and "at most 2 tool calls at once" in reply["message"]
    for junk in ({"id": "x" * 65, "line": "{}"}, {"id": 7, "line": "{}"}, {"id": "f"}, {"id": "g", "line": "{}\n{}"}):
        rig.bridge.receive(junk)
    assert (await rig.answers.reply("g"))["error"] == "bad_request"
    assert {answer["id"] for answer in rig.answers.sent} == {"e1", "e2", "e3", "g"}
