"""Starts the IPython kernel inside the sandbox: resource limits first, then ipykernel.

Run as ``python -m ipybox_kernel._launch [--memory N] [--cpu N] [--files N] [--sigpending N]
[--output N] [--message-bytes N] -f CONN``.
The limits are set before any user code can run, hard limit equal to soft limit; without
capabilities the kernel cannot raise them again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import traceback
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ._stream import FdDrain

# Marks the display message that reports how much output the kernel dropped for one execution.
TRUNCATED_MIME = "application/vnd.ipybox.truncated+json"
# Messages ipykernel sends that are small by construction; any other kind the guard does not trim
# is measured before it is sent.
_SMALL_TYPES = frozenset(
    {"status", "kernel_info_reply", "interrupt_reply", "shutdown_reply", "clear_output", "iopub_welcome"}
)
# Characters of an exception's name kept: a class name; anything longer was made up to be long.
_NAME_CHARS = 1000
# Characters an exception's value and each end of its traceback keep however small the output
# budget: a tiny budget must not hide what was raised (the host's limit has room for this much).
_ERROR_CHARS = 1000


def _set_limit(which: int, value: int | None) -> None:
    if value is not None:
        resource.setrlimit(which, (value, value))


class _OutputGuard:
    """Caps the output one execution sends to the host, and the size of every message, at the source.

    Everything the kernel sends goes through ``Session.send``; output beyond the budget is cut here so
    that a ``print('x' * 10**8)`` never crosses the wire. The host enforces its own cap as well and
    does not rely on this one.

    The host also refuses any message larger than ``message_bytes`` (ipybox._kernel.message_limit:
    6 bytes per character of ``budget``, plus room for headers), and a refused reply would leave
    the execution waiting forever. So what legitimate code can make larger is trimmed here: the
    exception in ``error`` and ``execute_reply`` (``raise ValueError('x' * 10**8)``), the echoed
    code, display metadata; other kinds of message that would not fit are dropped.
    """

    def __init__(self, session: Any, budget: int, message_bytes: int | None = None) -> None:
        self._send = session.send
        self._budget = budget
        self._message_bytes = message_bytes
        self._used = 0
        self._dropped = 0
        session.send = self.send

    def reset(self, *_: object) -> None:
        self._used = 0
        self._dropped = 0

    def report(self, *_: object) -> None:
        # ipykernel flushes the cell's buffered stream output only after post_execute; flush now so
        # that what this cell printed is counted in this cell's report.
        sys.stdout.flush()
        sys.stderr.flush()
        if self._dropped:
            from IPython.display import publish_display_data  # pyright: ignore[reportUnknownVariableType]

            dropped, self._dropped = self._dropped, 0
            publish_display_data({TRUNCATED_MIME: {"dropped": dropped}})

    def send(self, stream: Any, msg_or_type: Any, content: Any = None, *args: Any, **kwargs: Any) -> Any:
        msg = cast("dict[str, Any]", msg_or_type) if isinstance(msg_or_type, dict) else {}
        msg_type: Any = msg_or_type if isinstance(msg_or_type, str) else msg.get("header", {}).get("msg_type")
        body: Any = content if content is not None else msg.get("content")
        if not isinstance(body, dict):
            return self._send(stream, msg_or_type, content, *args, **kwargs)
        fields = cast("dict[str, Any]", body)
        if msg_type == "stream" and isinstance(fields.get("text"), str):
            text: str = fields["text"]
            room = max(self._budget - self._used, 0)
            if len(text) > room:
                self._dropped += len(text) - room
                if room == 0:
                    return None
                fields["text"] = text = text[:room]
            self._used += len(text)
        elif msg_type in ("display_data", "execute_result", "update_display_data"):
            data: Any = fields.get("data")
            if isinstance(data, dict) and TRUNCATED_MIME not in data:
                bundle = cast("dict[str, Any]", data)
                size = sum(_size(v) for v in bundle.values())
                # Not part of the output, but sent with it; display_id could be made as long as any.
                size += sum(_size(fields.get(extra) or "") for extra in ("metadata", "transient"))
                if self._used + size > self._budget:
                    self._dropped += size
                    return None
                self._used += size
        elif msg_type in ("error", "execute_reply"):
            self._trim_error(fields)
        elif msg_type == "execute_input" and isinstance(fields.get("code"), str):
            fields["code"] = _cut(fields["code"], self._budget)
        elif msg_type not in _SMALL_TYPES and self._message_bytes is not None:
            # Comms (widgets) and the rest: nobody on the host reads them, so one that would not
            # fit is dropped rather than trimmed.
            buffers: Any = kwargs.get("buffers") or ()
            if _size(fields) > self._message_bytes or any(len(b) > self._message_bytes for b in buffers):
                return None
        return self._send(stream, msg_or_type, content, *args, **kwargs)

    def _trim_error(self, fields: dict[str, Any]) -> None:
        """Keep an exception's name, value and traceback to about the output budget together. Not
        counted against the budget: an execution's error always arrives."""
        if isinstance(fields.get("ename"), str):
            fields["ename"] = _cut(fields["ename"], _NAME_CHARS)
        quarter = max(self._budget // 4, _ERROR_CHARS)
        if isinstance(fields.get("evalue"), str):
            fields["evalue"] = _cut(fields["evalue"], quarter)
        lines: Any = fields.get("traceback")
        if isinstance(lines, list):
            kept = [_cut(line, quarter) if isinstance(line, str) else "" for line in cast("list[Any]", lines)]
            if sum(map(len, kept)) > 2 * quarter:
                # The first frames say where it started, the last ones what was raised.
                head = _fit(kept, quarter)
                tail = _fit(kept[::-1], quarter)[::-1]
                cut = len(kept) - len(head) - len(tail)
                kept = [*head, f"[ipybox: {cut} traceback lines cut]", *tail]
            fields["traceback"] = kept
        payload: Any = fields.get("payload")
        if payload and self._message_bytes is not None and _size(payload) > self._message_bytes // 2:
            # Pager text (``obj?``) and the like; the host does not show payloads.
            fields["payload"] = []


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [ipybox: {len(text) - limit} characters cut]"


def _fit(lines: list[str], room: int) -> list[str]:
    """The leading lines that fit in ``room`` characters (at least one)."""
    kept: list[str] = []
    for line in lines:
        if kept and len(line) > room:
            break
        kept.append(line)
        room -= len(line)
    return kept


def _size(value: Any) -> int:
    """A string's characters; anything else's length as ASCII-escaped JSON, which is at least the
    bytes ipykernel sends for it."""
    if isinstance(value, str):
        return len(value)
    try:
        return len(json.dumps(value, default=repr))
    except (TypeError, ValueError, RecursionError):
        return 0


# What `%pip install` understands; every other option is refused rather than ignored, so a cell never
# carries on as though an option it relies on (an index, a requirements file) had been applied.
_PIP_QUIET = ("-q", "--quiet")
_PIP_USAGE = "usage: %pip install [-q|--quiet] PACKAGE [PACKAGE ...]"


def _pip_magic(line: str) -> None:
    """``%pip install PKG ...``: the host installs (the kernel has no network), after approval."""
    import importlib
    import shlex

    from IPython.core.error import UsageError

    from ipybox_kernel import call_tool

    words = shlex.split(line)
    if not words or words[0] != "install":
        command = f"'%pip {words[0]}'" if words else "'%pip' alone"
        raise UsageError(f"{command} is not supported in ipybox: only '%pip install' is ({_PIP_USAGE})")
    options = [word for word in words[1:] if word.startswith("-")]
    packages = [word for word in words[1:] if not word.startswith("-")]
    refused = [option for option in options if option not in _PIP_QUIET]
    if refused:
        raise UsageError(
            f"%pip install: {', '.join(map(repr, refused))} not supported in ipybox: the host installs binary "
            f"wheels by name from its package index, with its own settings; remove the option ({_PIP_USAGE})"
        )
    if not packages:
        raise UsageError(f"%pip install: no package named ({_PIP_USAGE})")
    for spec in packages:
        output = call_tool("ipybox", "install_package", {"package": spec})
        if not options:
            print(output.text.strip().splitlines()[-1] if output.text.strip() else f"installed {spec}")
    importlib.invalidate_caches()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ipybox_kernel._launch")
    parser.add_argument("--memory", type=int)
    parser.add_argument("--cpu", type=int)
    parser.add_argument("--files", type=int)
    parser.add_argument("--sigpending", type=int)
    parser.add_argument("--output", type=int)
    parser.add_argument("--message-bytes", type=int)
    # Written to once the kernel's sockets are bound (the host connects only then; see ipybox._kernel).
    parser.add_argument("--ready-fd", type=int)
    ours, rest = parser.parse_known_args(argv)
    _set_limit(resource.RLIMIT_AS, ours.memory)
    _set_limit(resource.RLIMIT_CPU, ours.cpu)
    _set_limit(resource.RLIMIT_NOFILE, ours.files)
    _set_limit(resource.RLIMIT_SIGPENDING, ours.sigpending)

    # ipykernel's debugger needs debugpy, whose import is a third of the kernel's start-up time, and
    # it could only listen on a network the sandbox does not have. Without it the kernel reports
    # ``debugger: false`` and starts faster. User code can still import debugpy later.
    sys.modules["debugpy"] = None  # pyright: ignore[reportArgumentType]
    from ipykernel.kernelapp import IPKernelApp

    app: Any = IPKernelApp.instance()
    try:
        _initialize(app, rest, ours.output, ours.message_bytes)
        _explain_memory_errors(app.shell, ours.memory)
    except BaseException:
        # ipykernel may have started threads already; they would keep a half-initialized kernel
        # alive forever. Report and leave now (the host shows this output in KernelStartError).
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    del sys.modules["debugpy"]
    _workspace_last()
    from ._netproxy import start_forwarder

    # Before any user code, so HTTP_PROXY & co. are set for it and for the processes it starts.
    if start_forwarder() is None:
        from ._nonet import explain_missing_network

        explain_missing_network()
    if ours.ready_fd is not None:
        os.write(ours.ready_fd, b"1")
        # User code has no business with the host's end of start-up.
        os.close(ours.ready_fd)
    app.start()


def _explain_memory_errors(shell: Any, limit: int | None) -> None:
    """Give a MemoryError that has no message one naming the kernel's memory limit.

    Python raises a bare MemoryError when an allocation fails; here that is nearly always the
    address-space limit the host set (``Limits.memory``), which the code cannot know of.
    """
    if limit is None:
        return
    text = f"the allocation would take this process past its memory limit ({limit / 1024**2:g} MiB, Limits.memory)"

    def explain(self: Any, etype: Any, value: BaseException, tb: Any, tb_offset: Any = None) -> None:
        if not value.args:
            value.args = (text,)
        self.showtraceback((etype, value, tb), tb_offset=tb_offset)

    shell.set_custom_exc((MemoryError,), explain)


def _workspace_last() -> None:
    """Make modules in the working directory (the workspace) importable, after everything else.

    The host starts the kernel with ``python -P`` so that nothing in the workspace, which kernel code
    can write, shadows the launcher; IPython then adds no working-directory entry either. Appended
    last, a ``pydantic.py`` or ``mcptools.py`` planted there cannot shadow installed packages, the
    tools package or ``ipybox_kernel`` in a later kernel, and ``import mymodule`` still works.
    """
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    sys.path.append("")


def _initialize(app: Any, rest: list[str], output: int | None, message_bytes: int | None) -> None:
    app.initialize(
        [
            *rest,
            # No history database on disk and no colour codes in tracebacks.
            "--HistoryManager.enabled=False",
            "--InteractiveShell.colors=nocolor",
            # A flush that returns at once when there is nothing to send (see _stream).
            "--IPKernelApp.outstream_class=ipybox_kernel._stream.QuickFlushStream",
            # ipykernel sleeps 0.5 ms before every execute_reply, for front ends that stop
            # listening at the reply. The host reads until the execution's idle status instead,
            # which the IOPub thread sends after all of the execution's output.
            "--IPythonKernel._execute_sleep=0",
        ]
    )
    from ._stream import FdDrain  # imports ipykernel: only once main() has kept debugpy out

    app.shell.register_magic_function(_pip_magic, "line", "pip")
    prepare(app.shell, app.kernel, app.session, output, message_bytes, drain=FdDrain(sys.stdout, sys.stderr))


def prepare(
    shell: Any, kernel: Any, session: Any, output: int | None, message_bytes: int | None, *, drain: FdDrain | None
) -> None:
    """Hook ipybox's per-execution guards into a kernel: local ones at launch, remote ones by a cell.

    ``drain`` runs after each execution, before the output guard reports, and before each tool
    call's output mark (None: nothing to drain).
    """
    from ._context import announce_execution, carry_execution_context, mark_cell_code
    from ._imports import install_missing_tools_hint
    from ._marks import OutputMarks
    from ._transport import set_output_mark

    # An import of a tool package the kernel lacks says why and what to do.
    install_missing_tools_hint()

    # Threads keep the cell that started them, so their output and tool calls are not taken for
    # those of the cell that runs when they print or call.
    carry_execution_context(kernel)
    # Tool calls from hooks that run outside the cell's own code are refused (ipybox_kernel._client).
    mark_cell_code(shell, kernel)
    shell.events.register("pre_execute", lambda: announce_execution(kernel))
    if drain is not None:
        # Before the output guard's report, which counts what the execution printed.
        shell.events.register("post_execute", drain)
    # Before the output guard wraps the session's send, so that what the guard drops is not counted.
    marks = OutputMarks(kernel, session, (sys.stdout, sys.stderr), drain.take if drain is not None else None)
    shell.events.register("pre_execute", marks.begin)
    set_output_mark(marks.before_call)
    if output is not None:
        guard = _OutputGuard(session, output, message_bytes)
        shell.events.register("pre_execute", guard.reset)
        shell.events.register("post_execute", guard.report)


if __name__ == "__main__":
    main(sys.argv[1:])
