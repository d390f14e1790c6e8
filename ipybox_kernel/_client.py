"""Tool calls from the sandboxed kernel to the host's ToolServer: `call_tool` and `acall_tool`.

Standard library only: the kernel must not pay for (or be able to misuse) an MCP client. How a
request travels is ``ipybox_kernel._transport``'s business; this module turns each reply into a
`ToolOutput` or one of the exceptions of ``ipybox_kernel._errors``.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any, cast

from ._errors import (
    ERROR_TYPES,
    MCPServerCrashed,
    MCPServerStartError,
    ToolCallError,
    ToolCallRejected,
    ToolCallTimeout,
    ToolOutput,
)
from ._protocol import EXECUTION_ENV, ErrorKind
from ._transport import IN_PROCESS, Abort, CallSite, call_executor, kernel_setting, note_unmarked, round_trip

__all__ = ("acall_tool", "call_tool")

_DECODER = json.JSONDecoder()
# Image types Jupyter front ends render; other content stays in ToolOutput.content only.
_DISPLAYED_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/svg+xml"})


def call_tool(server_name: str, tool_name: str, arguments: dict[str, Any] | None = None) -> ToolOutput:
    """Call a tool of an MCP server registered on the host, and wait for the result.

    The host asks the application to approve the call first. Safe to call from several threads at
    once. Images in the result are displayed when running in IPython.

    Args:
        server_name: The name the server is registered under on the host.
        tool_name: The tool's name as the server lists it.
        arguments: The tool's arguments; must be JSON-serializable.

    Raises:
        ToolCallRejected: The application rejected the call.
        ToolCallError: The call failed; the subclass says how.
    """
    execution = _calling_execution(server_name, tool_name)
    line = round_trip(server_name, tool_name, arguments, execution, None, call_site())
    output = _parse_reply(server_name, tool_name, line, execution)
    _display_images(output)
    return output


async def acall_tool(server_name: str, tool_name: str, arguments: dict[str, Any] | None = None) -> ToolOutput:
    """Like `call_tool`, for ``await`` on asyncio; gathered calls run concurrently.

    The call runs in a worker thread. Cancelling the awaiting task closes the call's connection,
    which cancels the call (or its pending approval) on the host.

    Raises:
        ToolCallRejected: The application rejected the call.
        ToolCallError: The call failed; the subclass says how.
    """
    import asyncio
    import contextvars

    execution = _calling_execution(server_name, tool_name)
    site = call_site()  # here: the worker thread's stack holds nothing of the cell
    abort = Abort()
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()

    def work() -> ToolOutput:
        line = context.run(round_trip, server_name, tool_name, arguments, execution, abort, site)
        return _parse_reply(server_name, tool_name, line, execution)

    future = loop.run_in_executor(call_executor(), work)
    try:
        output = await future
    except asyncio.CancelledError:
        abort.abort()
        raise
    _display_images(output)
    return output


def _parse_reply(server_name: str, tool_name: str, line: bytes, execution: str | None = None) -> ToolOutput:
    try:
        # The host writes UTF-8 without a BOM: json.loads would first look for another encoding.
        reply: Any = _DECODER.decode(line.decode("utf-8", "surrogatepass"))
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ToolCallError(server_name, tool_name, "the tool server sent a reply that is not a JSON object")
    fields: dict[str, Any] = reply  # pyright: ignore[reportUnknownVariableType]
    if execution is not None and fields.get("unmarked") is True:
        note_unmarked(execution)
    if fields.get("ok") is True:
        return ToolOutput(
            structured=fields.get("structured"),
            text=fields.get("text") or "",
            content=fields.get("content") or [],
        )
    kind = fields.get("error")
    message = str(fields.get("message") or f"the call to tool {tool_name!r} of MCP server {server_name!r} failed")
    # A kind this kernel does not know (a newer host's) is a plain failure.
    error = ERROR_TYPES.get(cast("ErrorKind", kind), ToolCallError) if isinstance(kind, str) else ToolCallError
    if error is ToolCallRejected:
        raise ToolCallRejected(server_name, tool_name, message, reason=fields.get("reason"))
    if error is ToolCallTimeout:
        raise ToolCallTimeout(server_name, tool_name, message, timeout=fields.get("timeout"))
    if error is MCPServerStartError:
        raise MCPServerStartError(server_name, tool_name, message, output=fields.get("output"))
    if error is MCPServerCrashed:
        raise MCPServerCrashed(server_name, tool_name, message, output=fields.get("output"))
    raise error(server_name, tool_name, message)


# Modules whose frames are the way to a call, not its site: the generated tool modules and this package.
_PLUMBING = ("mcptools.", "ipybox_kernel.")


def call_site() -> CallSite:
    """Where the running cell made the call: the line of the cell's code, and the module the call
    came through when not from the cell's own code (a skill, a library).

    The line is that of the innermost frame running the cell's own code (the cell's top level or a
    function it defines); a function of an earlier cell called from this one gives the line that
    called it. None when no frame of the running cell is on the stack (a thread, a callback). The
    host shows the text of that line from its own copy of the code, so a report can only point at
    a line of the code it ran.
    """
    frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]
    module: str | None = None
    frames: list[Any] = []
    cell_file: str | None = None
    while frame is not None:
        code = frame.f_code
        frames.append(frame)
        name = frame.f_globals.get("__name__")
        if module is None and isinstance(name, str) and name != "__main__" and not name.startswith(_PLUMBING):
            module = name
        if module is None and name == "__main__":
            module = ""  # the first frame that is not plumbing is the user's own: no module to name
        back = frame.f_back
        # A cell's top level runs from IPython's run_code (as a coroutine with top-level await).
        if code.co_name == "<module>" and back is not None and back.f_code.co_name == "run_code":
            cell_file = code.co_filename
            break
        frame = back
    if cell_file is None:
        return CallSite(line=None, module=module or None)
    line = next(f.f_lineno for f in frames if f.f_code.co_filename == cell_file)
    return CallSite(line=line, module=module or None)


# Why a call from outside the running cell's code is refused before it reaches the host.
_OUTSIDE_CELL = (
    "ipybox refused this call: it was made while a code action ran, but not by that code action's "
    "own code or anything it started (an IPython event hook such as post_run_cell, or an input or AST "
    "transformer, which an earlier code action may have registered), so a person would see it beside "
    "code that did not make it; call tools from the code action itself"
)


def _calling_execution(server_name: str, tool_name: str) -> str | None:
    """The IPython parent msg_id of the cell this code belongs to, for a call about to be made.

    In a thread, the cell that started it (ipybox_kernel._context); in a subprocess of the kernel,
    the cell that ran when it started; None outside an ipybox kernel, and in a thread that carries
    no cell of its own (started by ``_thread`` or C code): ipykernel's fallback for those is the
    cell that runs now, whatever started them. The host allows a call only while the cell it names
    runs.

    Raises:
        ToolCallRejected: The context belongs to the running cell but is not its code (see
            ``_context.outside_cell_code``).
    """
    from ._context import outside_cell_code

    kernel, msg_id = _kernel_execution()
    if kernel is not None and msg_id is not None and outside_cell_code(msg_id):
        raise ToolCallRejected(server_name, tool_name, _OUTSIDE_CELL, reason="outside the code action's own code")
    return msg_id


def _kernel_execution() -> tuple[Any, str | None]:
    """The kernel this code runs in (None in a subprocess, or an in-process kernel's cell) and the
    execution it belongs to (see `_calling_execution`)."""
    from ._context import execution_of

    # In an in-process kernel's cell, the process's IPython (if any) is the host's, not the kernel.
    kernel = None if IN_PROCESS.get() is not None else _ipykernel()
    msg_id = kernel_setting(EXECUTION_ENV) if kernel is None else execution_of(kernel, inherited=False)
    return kernel, msg_id if isinstance(msg_id, str) and msg_id else None


# The ipykernel this process runs, once found: there is one for the process's life (a forked child
# inherits it, as it inherits IPython's shell), and finding it cost every tool call a module lookup
# and IPython's singleton checks.
_found_kernel: Any = None


def _ipykernel() -> Any:
    global _found_kernel
    if _found_kernel is None:
        # Not IPython.get_ipython: a lazy attribute of the package, imported again on every access.
        getipython = sys.modules.get("IPython.core.getipython")
        try:
            _found_kernel = getipython.get_ipython().kernel  # pyright: ignore[reportOptionalMemberAccess]
        except AttributeError:
            return None
    return _found_kernel


def _display_images(output: ToolOutput) -> None:
    """Show image results as cell outputs, so they reach the execution's result."""
    images = [
        item for item in output.content if item.get("type") == "image" and item.get("mimeType") in _DISPLAYED_IMAGES
    ]
    if not images:
        return
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:
        return
    from IPython.display import display  # pyright: ignore[reportUnknownVariableType]

    for item in images:
        mime: str = item["mimeType"]
        data = item.get("data")
        if not isinstance(data, str):
            continue
        if mime == "image/svg+xml":
            # SVG is text in a MIME bundle; MCP sends every image base64-encoded.
            data = base64.b64decode(data).decode("utf-8", errors="replace")
        display({mime: data}, raw=True)
