"""The ipybox demo: an agent's code actions in the sandboxed kernel, calling MCP tools with approval.

1. Generate a typed Python API for an MCP server that ships with ipybox (ipybox.examples.weather).
2. Start a sandboxed kernel (bubblewrap: no network, read-only system, private workspace).
3. Run code actions like an agent would write them: state that persists, a parallel fan-out over
   the async tool wrappers, and a tool call the application rejects. Every tool call leaves the
   sandbox through one channel to the host, which asks this application before it runs.

Run it with `bash scripts/demo.sh` (sets everything up first).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    generate_mcp_sources,
    render_tool_stubs,
)

SERVER = {"command": sys.executable, "args": ["-m", "ipybox.examples.weather"]}

ACTIONS = [
    (
        "Look around: which tools are there, and what is the kernel allowed to do?",
        """
import socket, os
from mcptools.weather import list_cities
cities = list_cities.run()
print("cities:", [c.name for c in cities.result])
print("network interfaces:", [name for _, name in socket.if_nameindex()])
print("can read the host's home directory:", os.path.exists(os.path.expanduser("~/.bashrc")))
""",
    ),
    (
        "Fan out: fetch every forecast in parallel and keep only the summary.",
        """
import asyncio
from mcptools.weather import get_forecast
forecasts = await asyncio.gather(*(get_forecast.arun({"city": c.name}) for c in cities.result))
warmest = max(forecasts, key=lambda f: f.temperature)
print(f"{len(forecasts)} forecasts; warmest: {warmest.city} at {warmest.temperature} °C, {warmest.conditions}")
""",
    ),
    (
        "Try to send a report: this application rejects e-mail, the code catches the rejection.",
        """
from ipybox_kernel import ToolCallRejected
from mcptools.weather import send_report
try:
    report = send_report.Params(recipient="team@example.com", subject="Weather", body=f"warmest: {warmest.city}")
    send_report.run(report)
except ToolCallRejected as e:
    print("not sent:", e.reason)
""",
    ),
]


def decide(request: ApprovalRequest) -> tuple[bool, str | None]:
    """This application's policy: reading tools are fine, sending e-mail is not."""
    if request.tool_name == "send_report":
        return False, "this demo never sends e-mail"
    return True, None


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ipybox-demo-") as tmp:
        tools_dir = Path(tmp) / "mcptools"
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()

        written = await generate_mcp_sources("weather", SERVER, tools_dir)
        print(f"generated {tools_dir}/weather/: {', '.join(written)}")
        print("what the model is shown:\n" + render_tool_stubs(tools_dir))

        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir) as executor:
            for title, code in ACTIONS:
                print(f"\n=== {title}")
                try:
                    async for event in executor.execute(code.strip()):
                        match event:
                            case ApprovalRequest():
                                ok, reason = decide(event)
                                print(f"  [approval] {event} via {event.server!r}: {'accepted' if ok else 'rejected'}")
                                await (event.accept() if ok else event.reject(reason))
                            case CodeExecutionChunk():
                                pass  # streamed output; the result below holds all of it
                            case CodeExecutionResult():
                                print("  " + event.text.strip().replace("\n", "\n  "))
                except CodeExecutionError as error:
                    print(f"  the code raised {error.ename}: {error.evalue}")


if __name__ == "__main__":
    anyio.run(main)
