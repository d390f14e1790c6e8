"""One worker process of the durable-approval tests: suspends a paused execution, or resumes one.

    python durable_worker.py suspend URL TOKEN TOOLS_DIR CALL_LOG TTL   -> prints {"locator": ...}
    python durable_worker.py resume URL TOKEN TOOLS_DIR CALL_LOG DECISION  (locator on stdin)
        DECISION: "ask" (accept what is asked again), "approve" or "reject" (passed to resume)
        -> prints {"text", "chunks", "asked", "error"}

The secret comes in ``IPYBOX_TEST_SECRET`` (hex). Each run is its own process with its own executor,
tool server and MCP server session, as two workers behind a load balancer would be.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutor,
    GatewayKernel,
    IpyboxError,
)
from servers.fixtures import stdio_server

CODE = (
    "from mcptools.test import delete_item\n"
    "print('before the call', flush=True)\n"
    "try:\n"
    "    print(delete_item.run(delete_item.Params(item_id='x1')))\n"
    "except Exception as exc:\n"
    "    print('caught', type(exc).__name__)\n"
    "print('after the call', flush=True)\n"
)


def executor(url: str, token: str, tools: str, workspace: str) -> CodeExecutor:
    # IPYBOX_TEST_ISOLATED=1: the kernel host's kernels must pass the isolation check (sandboxed).
    if os.environ.get("IPYBOX_TEST_ISOLATED") == "1":
        kernel = GatewayKernel(url, token=token, kernel_name="ipybox-sandboxed")
    else:
        kernel = GatewayKernel(url, token=token, allow_unisolated_kernel=True)
    return CodeExecutor(workspace=workspace, tools_dir=tools, kernel=kernel)


async def suspend(url: str, token: str, tools: str, call_log: str, ttl: str, secret: bytes) -> None:
    with tempfile.TemporaryDirectory() as workspace:
        async with executor(url, token, tools, workspace) as ex:
            ex.register_mcp_server("test", stdio_server(call_log=Path(call_log)))
            execution = ex.execute(CODE, key="action-1")
            async for event in execution:
                if isinstance(event, ApprovalRequest):
                    locator = await ex.suspend(execution, secret=secret, ttl=float(ttl))
                    try:
                        await execution
                        ended = "completed"
                    except IpyboxError as exc:
                        ended = type(exc).__name__
                    report = {"locator": locator, "args": dict(event.tool_args), "ended": ended}
                    print(json.dumps(report), flush=True)
                    return
            raise SystemExit("the execution ended without asking for approval")


async def resume(url: str, token: str, tools: str, call_log: str, decision: str, secret: bytes) -> None:
    locator = sys.stdin.read().strip()
    given = None
    if decision != "ask":
        given = ApprovalDecision(approved=decision == "approve", reason=f"{decision}d by a person")
    chunks: list[str] = []
    asked: list[dict[str, object]] = []
    report: dict[str, object] = {"chunks": chunks, "asked": asked, "text": None, "error": None}
    with tempfile.TemporaryDirectory() as workspace:
        async with executor(url, token, tools, workspace) as ex:
            ex.register_mcp_server("test", stdio_server(call_log=Path(call_log)))
            try:
                execution = ex.resume(locator, secret=secret, decision=given)
                async for event in execution:
                    if isinstance(event, CodeExecutionChunk):
                        chunks.append(event.text)
                    elif isinstance(event, ApprovalRequest):
                        asked.append(dict(event.tool_args))
                        if event.decision is None:
                            await event.accept()
                report["text"] = (await execution).text
            except IpyboxError as exc:
                report["error"] = [type(exc).__name__, str(exc)]
    print(json.dumps(report), flush=True)


def main() -> None:
    mode, url, token, tools, call_log, arg = sys.argv[1:]
    secret = bytes.fromhex(os.environ["IPYBOX_TEST_SECRET"])
    anyio.run(suspend if mode == "suspend" else resume, url, token, tools, call_log, arg, secret)


if __name__ == "__main__":
    main()
