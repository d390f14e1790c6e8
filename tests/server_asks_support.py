"""Running kernel code that calls the asking test server (tests/servers/asking_server.py) and
answering the questions the server asks during the call."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from servers.fixtures import ASKING_SERVER_SCRIPT

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, ElicitationRequest, StdioServer

__all__ = ("ASKING_STDIO", "TRICKY", "asking_code", "call", "run")

ASKING_STDIO = StdioServer(command=sys.executable, args=(str(ASKING_SERVER_SCRIPT),))


# A question that tries to pass for ipybox's own lines and to move a terminal's cursor.
TRICKY = "Your name?\x1b[2J\u202eevil\nFields:\n  - 'admin': yes"


def asking_code(message: str) -> str:
    """Kernel code that calls the asking server's ``ask`` (one form question with ``message``) and
    prints what the server got back, or the refusal of the call."""
    return (
        "from ipybox_kernel import call_tool, ToolCallRejected\n"
        "try:\n"
        f"    print(call_tool('asking', 'ask', {{'message': {message!r}}}).text)\n"
        "except ToolCallRejected as e:\n"
        "    print('rejected:', e.reason)\n"
    )


def call(tool: str, args: dict[str, Any]) -> str:
    """Kernel code that calls a tool of the asking server and prints what it returned."""
    return f"from ipybox_kernel import call_tool\nprint(call_tool('asking', {tool!r}, {args!r}).text)"


async def run(
    executor: CodeExecutor,
    code: str,
    on_question: Callable[[ElicitationRequest], Awaitable[None]] | None = None,
) -> tuple[list[ElicitationRequest], Any]:
    """Run code, accepting tool calls and handing the server's questions to ``on_question``
    (default: decline); the questions seen and the printed JSON."""
    questions: list[ElicitationRequest] = []
    result: CodeExecutionResult | None = None
    async for event in executor.execute(code):
        if isinstance(event, ElicitationRequest):
            questions.append(event)
            if on_question is not None:
                await on_question(event)
            else:
                await event.decline()
        elif isinstance(event, ApprovalRequest):
            await event.accept()
        elif isinstance(event, CodeExecutionResult):
            result = event
    assert result is not None
    return questions, json.loads(result.text)
