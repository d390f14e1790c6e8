"""Running code and answering the approval requests of its tool calls, for the tests of tool calls."""

from __future__ import annotations

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor

# Kernel code that calls the test server's delete_item and prints the reason it was rejected with.
CATCH_REJECTED = (
    "from ipybox_kernel import ToolCallRejected\n"
    "from mcptools.test import delete_item\n"
    "try:\n"
    "    delete_item.run({'item_id': 'a1'})\n"
    "except ToolCallRejected as e:\n"
    "    print('caught:', e.reason)"
)


async def collect(
    executor: CodeExecutor, code: str, decide: dict[str, bool] | None = None, *, reason: str = "no"
) -> tuple[list[ApprovalRequest], CodeExecutionResult]:
    """Run code, answering approval requests by tool name (default: accept)."""
    requests: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for event in executor.execute(code):
        if isinstance(event, ApprovalRequest):
            requests.append(event)
            if (decide or {}).get(event.tool_name, True):
                await event.accept()
            else:
                await event.reject(reason)
        elif isinstance(event, CodeExecutionResult):
            result = event
    assert result is not None
    return requests, result
